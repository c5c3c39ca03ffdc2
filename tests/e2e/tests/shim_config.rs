//! Observation 8 (shim side, issue 8): a config error never loosens a limit. One typo anywhere
//! in `xcuda.json`, or a malformed environment override, is one error line on stderr naming
//! file (or variable), line and field, and the process fails closed: device allocations are
//! refused (a configured 20 % quota never becomes the 40 % default).

mod shim_support;

use e2e::EmuHost;
use shim_support::*;

const GOOD: &str =
    "{\n  \"memory\": {\"quota_fraction\": 0.2},\n  \"throttle\": {\"target_load\": 0.5}\n}\n";

fn with_file(text: &str, name: &str) -> (Vec<String>, String, std::path::PathBuf, u64) {
    let host = EmuHost::new();
    let cfg = host.root().join("xcuda.json");
    std::fs::write(&cfg, text).unwrap();
    let total = host.device().info().total_memory;
    let mut c = limited(&host, "shim_client", 0, name);
    c.env_remove("XCUDA_QUOTA_BYTES")
        .env("XCUDA_CONFIG", &cfg)
        .args(["ctx", "totalmem", "alloc", "1048576"]);
    let mut child = host.spawn(&mut c);
    let out = child.finish(T);
    (
        out.lines().map(str::to_string).collect(),
        child.stderr(),
        cfg,
        total,
    )
}

fn config_errors(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.contains("config error")).collect()
}

#[test]
fn configured_quota_applies_when_the_file_is_good() {
    let (out, err, _, total) = with_file(GOOD, "good");
    assert!(config_errors(&err).is_empty(), "{err}");
    assert_eq!(rc_of(&out, "alloc="), vec!["0"], "{out:?}");
    let t = out
        .iter()
        .find(|l| l.starts_with("totalmem=0"))
        .expect("totalmem");
    assert_eq!(e2e::num(t, "total") as u64, (total as f64 * 0.2) as u64);
}

#[test]
fn a_typo_anywhere_fails_closed_with_one_clear_line() {
    for (name, text, line, field) in [
        (
            "key",
            GOOD.replace("target_load", "target_lod"),
            3,
            "target_lod",
        ),
        (
            "value",
            GOOD.replace("0.2", "\"20%\""),
            2,
            "memory.quota_fraction",
        ),
        ("syntax", GOOD.replace("0.5}", "0.5},"), 4, ""),
    ] {
        let (out, err, cfg, _) = with_file(&text, name);
        let lines = config_errors(&err);
        assert_eq!(lines.len(), 1, "{name}: one error line: {err}");
        assert!(
            lines[0].contains(&format!("{}:{line}", cfg.display())),
            "{name}: file and line: {}",
            lines[0]
        );
        assert!(lines[0].contains(field), "{name}: field: {}", lines[0]);
        assert!(lines[0].contains("failing closed"), "{}", lines[0]);
        assert_eq!(
            rc_of(&out, "alloc="),
            vec!["2"],
            "{name}: allocation refused (OUT_OF_MEMORY): {out:?}"
        );
        let t = out
            .iter()
            .find(|l| l.starts_with("totalmem=0"))
            .expect("totalmem");
        assert_eq!(
            e2e::num(t, "total") as u64,
            0,
            "{name}: never the 40% default: {t}"
        );
    }
}

#[test]
fn malformed_env_override_fails_closed() {
    let host = EmuHost::new();
    let mut c = limited(&host, "shim_client", 0, "env");
    c.env("XCUDA_QUOTA_BYTES", "64MiB")
        .args(["ctx", "alloc", "1048576"]);
    let mut child = host.spawn(&mut c);
    let out: Vec<String> = child.finish(T).lines().map(str::to_string).collect();
    let err = child.stderr();
    let lines = config_errors(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("XCUDA_QUOTA_BYTES") && lines[0].contains("64MiB"),
        "{}",
        lines[0]
    );
    assert_eq!(rc_of(&out, "alloc="), vec!["2"], "{out:?}");
}
