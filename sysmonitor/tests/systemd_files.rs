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
}
