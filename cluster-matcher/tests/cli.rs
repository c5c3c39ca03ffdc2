//! The `cluster-matcher` binary: help text, `plan` output, and errors for bad inputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cluster-matcher"));
    c.env("RUST_LOG", "warn");
    c
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xshare-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn help_teaches_the_flow() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let h = text(&out.stdout);
    for word in ["train", "evaluate", "predict", "plan", "serve", "alibaba", "Typical flow", "XSHARE_DATA_DIR"] {
        assert!(h.contains(word), "--help lacks `{word}`:\n{h}");
    }
    let h = text(&run(&["plan", "--help"]).stdout);
    assert!(h.contains("examples/cluster.json") && h.contains("--model"), "{h}");
}

#[test]
fn plan_prints_a_table_then_json() {
    let cluster = example("cluster.json");
    let workloads = example("workloads.json");
    let model = example("speed-predictor.json");
    let out = run(&[
        "plan",
        "--cluster", cluster.to_str().unwrap(),
        "--workloads", workloads.to_str().unwrap(),
        "--model", model.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("round 0"), "{s}");
    assert!(s.contains("OFFLINE") && s.contains("PRED"), "{s}");
    let json_start = s.find("\n{").expect("JSON after the table") + 1;
    let v: serde_json::Value = serde_json::from_str(&s[json_start..]).unwrap();
    let assignments = v["assignments"].as_array().unwrap();
    assert!(!assignments.is_empty());
    for a in assignments {
        assert_ne!(a["online"], "fraud", "payments tenant forbids sharing");
        if a["offline"] == "train-a3c" {
            assert!(a["online"] != "ranker" && a["online"] != "embedder", "search denies research-untrusted");
        }
        assert!(a["sm_percent"].as_f64().unwrap() >= 10.0);
    }
    assert!(v["skipped_gpus"].as_array().unwrap().iter().any(|s| s["reason"] == "tenant rule"));

    let out = run(&[
        "plan", "--json",
        "--cluster", cluster.to_str().unwrap(),
        "--workloads", workloads.to_str().unwrap(),
        "--model", model.to_str().unwrap(),
    ]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("--json prints only JSON");
}

/// `cluster-matcher plan ... | head -1`: the reader is gone before the output is written. The
/// command panicked on the broken pipe (exit 101); it ends quietly now. The pipe's reading end
/// is closed before the command starts, so every write fails, whatever the timing.
#[test]
fn plan_into_a_closed_pipe_ends_quietly() {
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut c = bin();
        c.arg("plan");
        if json {
            c.arg("--json");
        }
        let out = c
            .args(["--cluster", example("cluster.json").to_str().unwrap()])
            .args(["--workloads", example("workloads.json").to_str().unwrap()])
            .args(["--model", example("speed-predictor.json").to_str().unwrap()])
            .stdout(writer)
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(out.status.success() && !err.contains("panicked"), "json {json}: {:?}: {err}", out.status);
    }
}

#[test]
fn bad_inputs_fail_with_the_place_named() {
    let bad = tmp("cluster.json");
    std::fs::write(&bad, "{\n  \"nodes\": [\n    {\"name\": \"a\", \"gpus\": 1}\n  ]\n}\n").unwrap();
    let out = run(&[
        "plan",
        "--cluster", bad.to_str().unwrap(),
        "--workloads", example("workloads.json").to_str().unwrap(),
        "--model", example("speed-predictor.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(e.contains("cluster.json:3:") && e.contains("gpu_type"), "{e}");

    let model = tmp("model.json");
    let good = std::fs::read_to_string(example("speed-predictor.json")).unwrap();
    std::fs::write(&model, &good[..good.len() / 3]).unwrap();
    let out = run(&[
        "plan",
        "--cluster", example("cluster.json").to_str().unwrap(),
        "--workloads", example("workloads.json").to_str().unwrap(),
        "--model", model.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(e.contains("model file") && e.contains("model.json"), "{e}");
}

#[test]
fn predict_scores_a_gavel_pair() {
    let data = cluster_matcher::predictor::gavel::data_dir().join("gavel/simulation_throughputs.json");
    if !data.exists() {
        eprintln!("skipping: no Gavel data at {}", data.display());
        return;
    }
    let out = run(&[
        "predict",
        "--model", example("speed-predictor.json").to_str().unwrap(),
        "--gpu", "v100",
        "--offline", "ResNet-50 (batch size 64)",
        "--online", "LM (batch size 20)",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: f64 = text(&out.stdout).trim().parse().unwrap();
    assert!((0.0..=1.5).contains(&v));
    let out = run(&["predict", "--model", example("speed-predictor.json").to_str().unwrap(), "--gpu", "v100", "--offline", "NoSuchNet", "--online", "A3C"]);
    assert!(text(&out.stderr).contains("neither a profile file nor a Gavel job"));
}

#[test]
fn evaluate_refuses_fewer_than_two_folds() {
    // Panicked before (`--folds 0` divided by zero, `--folds 1` trained on nothing).
    for folds in ["0", "1"] {
        let out = run(&["evaluate", "--split", "pair", "--folds", folds, "--epochs", "1"]);
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains(&format!("--folds {folds}")) && err.contains("at least 2"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
