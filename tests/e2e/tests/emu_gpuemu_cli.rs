//! The `gpuemu` inspector shows what processes do on the emulated GPU, and refuses bad input clearly.

use e2e::EmuHost;
use std::time::Duration;

#[test]
fn show_lists_processes_memory_and_mps_state() {
    let host = EmuHost::new();
    let mut c = host.client(&["ctx", "alloc", "268435456", "ready", "hang"]);
    c.wait_for_line("ready", Duration::from_secs(30))
        .expect("ready");
    host.start_mps();
    let out = host
        .command("gpuemu")
        .arg("show")
        .output()
        .expect("run gpuemu");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Tesla T4 (t4): 40 SMs"), "{text}");
    // 256 MiB allocated and the T4 context's 302 MiB.
    assert!(text.contains("memory: 558 / 15360 MiB used"), "{text}");
    assert!(
        text.contains(&format!("pid {:>7}      558 MiB  1 ctx", c.pid())),
        "{text}"
    );
    assert!(text.contains("mps: running"), "{text}");
}

#[test]
fn corrupt_state_file_is_a_clear_error() {
    let host = EmuHost::new();
    std::fs::write(host.state_path(), b"this is not a state file").unwrap();
    let out = host
        .command("gpuemu")
        .arg("show")
        .output()
        .expect("run gpuemu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains(&host.state_path().display().to_string())
            && err.contains("not a GPU emulator state file"),
        "{err}"
    );
    // The fake driver refuses it the same way instead of crashing the client.
    let mut c = host.client(&["ctx"]);
    c.finish(Duration::from_secs(30));
    assert!(
        c.stdout()
            .contains("fatal=cuInit CUDA_ERROR_NO_DEVICE(100)"),
        "{}",
        c.stdout()
    );
    assert!(
        c.stderr().contains("not a GPU emulator state file"),
        "{}",
        c.stderr()
    );
}
