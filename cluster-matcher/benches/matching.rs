//! Matching benchmark: our solver against `scipy.optimize.linear_sum_assignment` on the
//! same seeded matrices, in one run; prints median wall and thread-CPU times and ratios.
//!
//! ```text
//! cargo bench -p cluster-matcher --bench matching -- [--quick] [--repeat N]
//!     [--cases uniform,structured,rect,sparse,big,kplan,big-structured] [--scipy-10k]
//! ```
//! Default cases: all but `kplan` and `big-structured`. `--quick` shrinks 2000/4000 to 500/1000.
//! Python comes from `XSHARE_PYTHON` (default `<repo>/.venv/bin/python`); scipy times only
//! its solve. Every compared case checks that both totals agree (exit 1 if not). CPU time
//! (`/proc/thread-self/schedstat` here, `time.thread_time()` in Python) is printed beside
//! wall time because other builds share the machine.

#[path = "matching_common.rs"]
mod common;

use std::time::Instant;

use cluster_matcher::matching::{
    max_weight_matching, max_weight_matching_sparse, Matching, WeightMatrix,
};
use common::*;

/// Median wall and CPU seconds of `repeat` runs, and the last result.
fn timed(repeat: usize, mut f: impl FnMut() -> Matching) -> (f64, f64, Matching) {
    let (mut wall, mut cpu, mut last) = (Vec::new(), Vec::new(), None);
    for _ in 0..repeat.max(1) {
        let c0 = thread_cpu_seconds().unwrap_or(f64::NAN);
        let t = Instant::now();
        let m = f();
        wall.push(t.elapsed().as_secs_f64());
        cpu.push(thread_cpu_seconds().unwrap_or(f64::NAN) - c0);
        last = Some(m);
    }
    (median(&wall), median(&cpu), last.unwrap())
}

fn agree(a: f64, b: f64) -> (bool, String) {
    let rel = (a - b).abs() / a.abs().max(b.abs()).max(1e-300);
    if rel <= 1e-9 {
        (true, "equal".into())
    } else {
        (false, format!("DIFFER {a} vs {b}"))
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

struct Table {
    ok: bool,
}

impl Table {
    fn header() {
        println!(
            "{:<40} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  totals vs base",
            "case", "ours", "ours cpu", "base", "base cpu", "wall x", "cpu x"
        );
    }

    fn row(&mut self, case: &str, ours: (f64, f64), base: Option<(&str, f64, f64)>, note: String, ok: bool) {
        self.ok &= ok;
        match base {
            Some((name, w, c)) => println!(
                "{:<40} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.3} {:>9.3}  {} ({name})",
                case, ours.0, ours.1, w, c, ours.0 / w, ours.1 / c, note
            ),
            None => println!(
                "{:<40} {:>9.4} {:>9.4} {:>9} {:>9} {:>9} {:>9}  {}",
                case, ours.0, ours.1, "-", "-", "-", "-", note
            ),
        }
    }

    fn vs_scipy(&mut self, case: &str, w: &WeightMatrix, repeat: usize, allow_unmatched: bool) {
        let (tw, tc, m) = timed(repeat, || max_weight_matching(w));
        self.vs_scipy_with(case, (tw, tc), m.total_weight(), w, repeat, allow_unmatched);
    }

    fn vs_scipy_with(&mut self, case: &str, ours: (f64, f64), total: f64, w: &WeightMatrix, repeat: usize, allow_unmatched: bool) {
        match run_scipy(w, repeat, allow_unmatched) {
            Ok(s) => {
                let (ok, note) = agree(total, s.total);
                self.row(case, ours, Some(("scipy", median(&s.seconds), median(&s.cpu_seconds))), note, ok);
            }
            Err(e) => {
                eprintln!("scipy unavailable for {case}: {e}");
                self.row(case, ours, None, "scipy unavailable".into(), true);
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|k| args.get(k + 1));
    let quick = args.iter().any(|a| a == "--quick");
    let repeat: usize = value("--repeat").and_then(|s| s.parse().ok()).unwrap_or(3);
    let cases: Vec<&str> = value("--cases")
        .map(|s| s.split(',').collect())
        .unwrap_or_else(|| vec!["uniform", "structured", "rect", "sparse", "big"]);
    let want = |c: &str| cases.contains(&c);
    let scipy_10k = args.iter().any(|a| a == "--scipy-10k");
    let (s1, s2) = if quick { (500, 1000) } else { (2000, 4000) };

    println!("load average at start: {}  (repeats: {repeat}; seconds are medians)", load());
    Table::header();
    let mut t = Table { ok: true };
    for n in [s1, s2] {
        if want("uniform") {
            t.vs_scipy(&format!("uniform {n}x{n}"), &uniform(n, n, 1000 + n as u64), repeat, false);
        }
        if want("structured") {
            t.vs_scipy(&format!("structured {n}x{n}"), &structured(n, n, 2000 + n as u64), repeat, false);
        }
    }
    if want("rect") {
        let (r, c) = if quick { (200, 1600) } else { (1000, 8000) };
        t.vs_scipy(&format!("uniform {r}x{c}"), &uniform(r, c, 3), repeat, false);
        t.vs_scipy(&format!("structured {c}x{r}"), &structured(c, r, 4), repeat, false);
    }
    if want("sparse") {
        // Each job allowed on 8 GPUs: against scipy (one zero column per row, so rows may
        // stay unmatched) and against our own dense solver on the same allowed pairs.
        let n = s2;
        let sp = sparse(n, n, 8, 5);
        let dense_form = densify(&sp);
        let case = format!("sparse {n}x{n}, 8 GPUs/job");
        let (sw, sc, ms) = timed(repeat, || max_weight_matching_sparse(&sp));
        t.vs_scipy_with(&case, (sw, sc), ms.total_weight(), &dense_form, repeat, true);
        let (dw, dc, md) = timed(repeat, || max_weight_matching(&dense_form));
        let (ok, note) = agree(ms.total_weight(), md.total_weight());
        t.row(&case, (sw, sc), Some(("our dense", dw, dc)), note, ok);
    }
    if want("big") {
        let n = 10_000;
        let w = uniform(n, n, 10_000);
        if scipy_10k {
            t.vs_scipy(&format!("uniform {n}x{n}"), &w, 1, false);
        } else {
            let (tw, tc, m) = timed(1, || max_weight_matching(&w));
            t.row(&format!("uniform {n}x{n}"), (tw, tc), None, format!("total {:.6}", m.total_weight()), true);
        }
        drop(w);
        let sp = sparse(n, 2 * n, 8, 6);
        let (tw, tc, m) = timed(repeat, || max_weight_matching_sparse(&sp));
        t.row(&format!("sparse {n}x{}, 8 GPUs/job", 2 * n), (tw, tc), None, format!("total {:.6}", m.total_weight()), true);
    }
    if want("kplan") {
        // Up to k jobs per GPU on a cluster-sized sparse instance: additive weights with a
        // pairwise interference penalty and a per-GPU memory cap.
        let (g, j) = if quick { (1000, 2000) } else { (6000, 12000) };
        let sp = sparse(g, j, 8, 11);
        let mut r = Rng::new(12);
        let mem: Vec<f64> = (0..j).map(|_| 0.1 + 0.5 * r.f64()).collect();
        let f = |gpu: usize, s: &[usize]| -> Option<f64> {
            if s.iter().map(|&x| mem[x]).sum::<f64>() > 1.0 {
                return None;
            }
            let base: f64 = s.iter().map(|&x| sp.get(gpu, x)).sum::<Option<f64>>()?;
            Some(base * (1.0 - 0.15 * (s.len() as f64 - 1.0)))
        };
        for (k, passes) in [(2, 0), (2, 3), (3, 3)] {
            let c0 = thread_cpu_seconds().unwrap_or(f64::NAN);
            let t0 = Instant::now();
            let plan = cluster_matcher::matching::multi::best_k_plan_sparse(&sp, k, passes, f).unwrap();
            let (tw, tc) = (t0.elapsed().as_secs_f64(), thread_cpu_seconds().unwrap_or(f64::NAN) - c0);
            let one = max_weight_matching_sparse(&sp).total_weight();
            let placed: usize = plan.groups.iter().map(Vec::len).sum();
            t.row(
                &format!("k-plan {g}x{j} k={k} passes={passes}"),
                (tw, tc),
                None,
                format!("total {:.2} ({:.3}x one-per-GPU), {placed} jobs placed", plan.total, plan.total / one),
                true,
            );
        }
    }
    if want("big-structured") {
        let n = 10_000;
        let w = structured(n, n, 10_001);
        let (tw, tc, m) = timed(1, || max_weight_matching(&w));
        t.row(&format!("structured {n}x{n}"), (tw, tc), None, format!("total {:.6}", m.total_weight()), true);
    }
    println!("load average at end: {}", load());
    if !t.ok {
        eprintln!("totals differ: see table");
        std::process::exit(1);
    }
}
