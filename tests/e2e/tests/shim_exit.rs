//! Graceful exit end to end: an offline client terminated by SIGTERM/SIGINT mid-training under
//! MPS never hangs its neighbour when the shim is preloaded; without the shim the emulator's
//! MPS model hangs the neighbour (the control run).

mod shim_support;

use std::time::Duration;

use e2e::{field, EmuChild, EmuHost};
use shim_support::*;

fn neighbour(host: &EmuHost) -> EmuChild {
    let mut b = host.client(&["ctx", "ready", "wait", "spin", "1", "1000", "1", "ready"]);
    b.wait_for_line("ready", T).expect("neighbour ready");
    b
}

fn training_victim(host: &EmuHost, shimmed: bool) -> EmuChild {
    let args = ["ctx", "ready", "launch", "40", "1000000", "1000000"];
    let mut c = if shimmed { limited(host, "shim_client", 1 << 30, "victim") } else { unlimited(host, "shim_client") };
    let mut v = host.spawn(c.args(args));
    v.wait_for_line("ready", T).expect("victim ready");
    std::thread::sleep(Duration::from_millis(300));
    v
}

/// Sends `sig` to a training victim; returns whether the neighbour could still run a kernel.
fn neighbour_survives(shimmed: bool, sig: i32) -> (bool, String) {
    let host = EmuHost::new();
    let dev = host.device();
    dev.mps_start(std::process::id());
    let mut victim = training_victim(&host, shimmed);
    let mut b = neighbour(&host);
    victim.signal(sig);
    let st = victim.wait_timeout(T).expect("victim exits on the signal");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(sig), "the default action still happens: {st:?}");
    b.send_line("go");
    let ran = b.wait_for_line("spin=", Duration::from_secs(3)).is_some_and(|l| field(&l, "spin") == Some("0"));
    let status = format!("{:?} victim stderr: {}", dev.mps_status(), victim.stderr());
    if !ran {
        dev.mps_quit();
    }
    (ran, status)
}

#[test]
fn sigterm_under_mps_hangs_nobody_with_the_shim() {
    let (ran, st) = neighbour_survives(true, libc::SIGTERM);
    assert!(ran, "neighbour must run after the shimmed victim's SIGTERM: {st}");
    assert!(st.contains("poisoned: false"), "{st}");
}

#[test]
fn sigint_under_mps_hangs_nobody_with_the_shim() {
    let (ran, st) = neighbour_survives(true, libc::SIGINT);
    assert!(ran, "neighbour must run after the shimmed victim's SIGINT: {st}");
}

#[test]
fn sigterm_without_the_shim_hangs_the_neighbour() {
    let (ran, st) = neighbour_survives(false, libc::SIGTERM);
    assert!(!ran, "control: the emulator's MPS model must hang the neighbour: {st}");
    assert!(st.contains("poisoned: true"), "{st}");
}

#[test]
fn application_handler_still_checkpoints_and_nobody_hangs() {
    let host = EmuHost::new();
    let dev = host.device();
    dev.mps_start(std::process::id());
    let ckpt = host.root().join("ckpt.bin");
    let mut c = limited(&host, "offline", 1 << 30, "trainer");
    c.args(["--kernel-us", "5000", "--state-mb", "4", "--report-interval", "0.1", "--json", "--checkpoint"]).arg(&ckpt);
    let mut trainer = host.spawn(&mut c);
    assert!(trainer.wait_for_line("{", T).is_some(), "trainer progress: {}", trainer.stderr());
    let mut b = neighbour(&host);
    trainer.signal(libc::SIGTERM);
    let st = trainer.wait_timeout(T).expect("trainer exits");
    assert!(st.success(), "the application's own handler ran and it exited cleanly: {st:?} {}", trainer.stderr());
    let out = trainer.stdout();
    let fin = out.lines().find(|l| l.contains("\"final\":true")).unwrap_or_else(|| panic!("summary: {out}"));
    assert!(fin.contains(&format!("\"signal\":{}", libc::SIGTERM)), "{fin}");
    assert_eq!(std::fs::metadata(&ckpt).expect("checkpoint written").len(), 4 << 20);
    b.send_line("go");
    let l = b.wait_for_line("spin=", Duration::from_secs(5)).expect("neighbour runs");
    assert_eq!(field(&l, "spin"), Some("0"));
    assert!(!dev.mps_status().poisoned);
}
