//! Matching benchmark: our solver against `scipy.optimize.linear_sum_assignment` on the
//! same seeded matrices, in one run; prints a table of median times and ratios.
//!
//! `cargo bench -p cluster-matcher --bench matching -- [--quick] [--repeat N] [--no-10k] [--scipy-10k]`
//!
//! Python comes from `XSHARE_PYTHON` (default `<repo>/.venv/bin/python`); scipy times only
//! its solve. Every case checks that both totals agree.

#[path = "matching_common.rs"]
mod common;

use std::time::Instant;

use cluster_matcher::matching::{
    max_weight_matching, max_weight_matching_sparse, Matching, SparseWeights, WeightMatrix,
};
use common::*;

struct Row {
    case: String,
    ours: f64,
    base: Option<(String, f64)>,
    agree: String,
}

fn time_dense(w: &WeightMatrix, repeat: usize) -> (f64, Matching) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        let t = Instant::now();
        let m = max_weight_matching(w);
        times.push(t.elapsed().as_secs_f64());
        last = Some(m);
    }
    (median(&times), last.unwrap())
}

fn time_sparse(w: &SparseWeights, repeat: usize) -> (f64, Matching) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        let t = Instant::now();
        let m = max_weight_matching_sparse(w);
        times.push(t.elapsed().as_secs_f64());
        last = Some(m);
    }
    (median(&times), last.unwrap())
}

fn agree(a: f64, b: f64) -> String {
    let rel = (a - b).abs() / a.abs().max(b.abs()).max(1e-300);
    if rel <= 1e-9 {
        "equal".into()
    } else {
        format!("DIFFER {a} vs {b}")
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn vs_scipy(rows: &mut Vec<Row>, case: String, w: &WeightMatrix, repeat: usize, unmatched: bool) {
    let (ours, m) = time_dense(w, repeat);
    match run_scipy(w, repeat, unmatched) {
        Ok(s) => rows.push(Row {
            case,
            ours,
            base: Some(("scipy".into(), median(&s.seconds))),
            agree: agree(m.total_weight(), s.total),
        }),
        Err(e) => {
            eprintln!("scipy unavailable for {case}: {e}");
            rows.push(Row { case, ours, base: None, agree: "-".into() });
        }
    }
    print_row(rows.last().unwrap());
}

fn print_row(r: &Row) {
    match &r.base {
        Some((name, t)) => println!(
            "{:<44} {:>10.4} {:>7} {:>10.4} {:>8.3} {}",
            r.case, r.ours, name, t, r.ours / t, r.agree
        ),
        None => println!("{:<44} {:>10.4} {:>7} {:>10} {:>8} {}", r.case, r.ours, "-", "-", "-", r.agree),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let repeat = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|k| args.get(k + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(3usize);
    let no_10k = quick || args.iter().any(|a| a == "--no-10k");
    let scipy_10k = args.iter().any(|a| a == "--scipy-10k");
    let (s1, s2) = if quick { (500, 1000) } else { (2000, 4000) };

    println!("load average at start: {}  (repeats: {repeat}, times: median seconds)", load());
    println!("{:<44} {:>10} {:>7} {:>10} {:>8} {}", "case", "ours s", "vs", "base s", "ratio", "totals");
    let mut rows = Vec::new();
    for n in [s1, s2] {
        vs_scipy(&mut rows, format!("uniform {n}x{n}"), &uniform(n, n, 1000 + n as u64), repeat, false);
        vs_scipy(&mut rows, format!("structured {n}x{n}"), &structured(n, n, 2000 + n as u64), repeat, false);
    }
    let (r, c) = if quick { (200, 1600) } else { (1000, 8000) };
    vs_scipy(&mut rows, format!("uniform {r}x{c} (more jobs than GPUs)"), &uniform(r, c, 3), repeat, false);
    vs_scipy(&mut rows, format!("structured {c}x{r} (more GPUs than jobs)"), &structured(c, r, 4), repeat, false);

    // Sparse: each job allowed on 8 GPUs. Against scipy (with a zero column per row so
    // rows may stay unmatched) and against our own dense solver on the same pairs.
    let n = s2;
    let sp = sparse(n, n, 8, 5);
    let dense_form = densify(&sp);
    let (ts, ms) = time_sparse(&sp, repeat);
    match run_scipy(&dense_form, repeat, true) {
        Ok(s) => rows.push(Row {
            case: format!("sparse {n}x{n}, 8 GPUs per job"),
            ours: ts,
            base: Some(("scipy".into(), median(&s.seconds))),
            agree: agree(ms.total_weight(), s.total),
        }),
        Err(e) => eprintln!("scipy unavailable for sparse: {e}"),
    }
    print_row(rows.last().unwrap());
    let (td, md) = time_dense(&dense_form, repeat);
    rows.push(Row {
        case: format!("sparse {n}x{n}, 8 GPUs per job"),
        ours: ts,
        base: Some(("ourdense".into(), td)),
        agree: agree(ms.total_weight(), md.total_weight()),
    });
    print_row(rows.last().unwrap());

    if !no_10k {
        let n = 10_000;
        let w = uniform(n, n, 10_000);
        if scipy_10k {
            vs_scipy(&mut rows, format!("uniform {n}x{n}"), &w, 1, false);
        } else {
            let (t, m) = time_dense(&w, 1);
            rows.push(Row { case: format!("uniform {n}x{n}"), ours: t, base: None, agree: format!("total {:.6}", m.total_weight()) });
            print_row(rows.last().unwrap());
        }
        drop(w);
        let w = structured(n, n, 10_001);
        let (t, m) = time_dense(&w, 1);
        rows.push(Row { case: format!("structured {n}x{n}"), ours: t, base: None, agree: format!("total {:.6}", m.total_weight()) });
        print_row(rows.last().unwrap());
        drop(w);
        let sp = sparse(n, 2 * n, 8, 6);
        let (t, m) = time_sparse(&sp, repeat);
        rows.push(Row { case: format!("sparse {n}x{}, 8 GPUs per job", 2 * n), ours: t, base: None, agree: format!("total {:.6}", m.total_weight()) });
        print_row(rows.last().unwrap());
    }
    println!("load average at end: {}", load());
    if rows.iter().any(|r| r.agree.starts_with("DIFFER")) {
        eprintln!("totals differ: see table");
        std::process::exit(1);
    }
}
