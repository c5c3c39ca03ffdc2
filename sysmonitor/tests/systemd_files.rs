//! The shipped systemd units and example configs stay consistent with the binaries.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn unit(name: &str) -> String {
    std::fs::read_to_string(root().join("systemd").join(name)).unwrap()
}

#[test]
fn example_config_with_overrides_loads() {
    let (cfg, files) =
        sysmonitor::config::Config::load(&root().join("systemd/examples/sysmonitor.json")).unwrap();
    assert_eq!(files.len(), 2, "base + sysmonitor.d override");
    assert_eq!(
        cfg.machine.hold_base_ms, 60_000,
        "override applied over the base"
    );
    assert!(cfg.evictor.command.is_some());
    assert_eq!(cfg.offline_throttle, Default::default(), "the example shows the floor's defaults");
    // Every GPU's monitor reads this file: each needs its own metrics port.
    let port = |gpu| {
        let mut c = cfg.clone();
        c.finalize(Some(gpu));
        c.metrics_listen.unwrap()
    };
    assert_ne!(port(0), port(1));
}

#[test]
fn units_are_notify_with_watchdog_ordered_and_hardened() {
    let mon = unit("xshare-sysmonitor@.service");
    let mps = unit("xshare-mps-manager@.service");
    for u in [&mon, &mps] {
        for key in [
            "Type=notify",
            "WatchdogSec=",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "RuntimeDirectory=xshare",
            "ExecReload=/bin/kill -HUP $MAINPID",
            "--gpu %i",
        ] {
            assert!(u.contains(key), "missing {key}");
        }
    }
    assert!(mps.contains("After=xshare-sysmonitor@%i.service"));
    assert!(mps.contains("Requires=xshare-sysmonitor@%i.service"));
    assert!(mps.contains("Before=kubelet.service"), "pods start once MPS runs");
}

/// What the units allow matches what the documented configs need: the monitor sets the ledger
/// file's group (`ledger_group`, fchown: CAP_CHOWN; without it the monitor exited at start and
/// crash-looped), reads XIDs from /dev/kmsg under DevicePolicy=closed (DeviceAllow), and
/// neither unit overrides the config's `ledger_dir` through the environment (`check-config`
/// run from a shell showed another value than the service used).
#[test]
fn units_allow_what_the_documented_configs_need() {
    let mon = unit("xshare-sysmonitor@.service");
    let caps = |u: &str| -> Vec<String> {
        u.lines()
            .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
            .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    assert!(!mon.lines().any(|l| l.starts_with("User=")), "runs as root: the bounding set is what it keeps");
    assert!(caps(&mon).iter().any(|c| c == "CAP_CHOWN"), "ledger_group needs CAP_CHOWN: {:?}", caps(&mon));
    if mon.lines().any(|l| l == "DevicePolicy=closed") {
        assert!(mon.lines().any(|l| l == "DeviceAllow=/dev/kmsg r"), "xid_log /dev/kmsg under DevicePolicy=closed");
        assert!(caps(&mon).iter().any(|c| c == "CAP_SYSLOG"));
    }
    assert!(!mon.contains("ProtectKernelLogs=yes"), "it would hide /dev/kmsg");
    let readme = std::fs::read_to_string(root().join("systemd/README.md")).unwrap();
    assert!(readme.contains("\"ledger_group\": \"<group>\""), "the README still documents ledger_group");
    for name in ["xshare-sysmonitor@.service", "xshare-mps-manager@.service"] {
        let u = unit(name);
        assert!(!u.lines().any(|l| l.starts_with("Environment=XSHARE_LEDGER_DIR")), "{name} overrides ledger_dir unseen");
        if u.lines().any(|l| l == "DevicePolicy=closed") {
            assert!(u.contains("DeviceAllow=/dev/nvidiactl"), "{name}");
        }
    }
}

/// systemd itself parses both units without a complaint: no unknown or misplaced key, no bad
/// value (`systemd-analyze verify` exits 0 on unknown keys, so its output must be empty too).
/// `ExecStart` must name an executable file, so the units are checked with it pointing at the
/// built monitor; the rest of each unit is verified as shipped.
#[test]
fn systemd_parses_the_units_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let exe = env!("CARGO_BIN_EXE_sysmonitor");
    for name in ["xshare-sysmonitor@.service", "xshare-mps-manager@.service"] {
        let text = unit(name)
            .replace("/usr/bin/sysmonitor ", &format!("{exe} "))
            .replace("/usr/bin/mps-manager ", &format!("{exe} "));
        assert!(text.contains(exe), "{name}: ExecStart not found");
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .expect("systemd-analyze (package systemd) is needed to check the shipped units");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && said.trim().is_empty(), "{name}: {said}");
    }
}
