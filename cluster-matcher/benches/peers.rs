//! Our exact matcher against scipy's `linear_sum_assignment` and `lap.lapjv` on the same
//! seeded matrices, in one run, by family; prints median thread-CPU and wall seconds and
//! the ratio to the fastest peer (CPU time: the machine is shared).
//!
//! ```text
//! ./scripts/setup-bench-env.sh     # lap into .venv (scipy is already there)
//! cargo bench -p cluster-matcher --bench peers -- [--n 2000] [--repeat 3] [--families a,b]
//! ```
//! Families: `uniform` (U[0,1), no two rows alike), `near-tie` (the exact-ties matrix plus
//! 1e-6 noise: every row distinct, values a hair apart), `exact-ties` (3 GPU types x 10
//! online load levels x 26 job types, MuxFlow-like products, no noise), `rect-uniform`
//! and `rect-ties` (n/2 x 4n), `sparse-random` (2n x 2n, each job on 8 random GPUs),
//! `sparse-typed` (exact ties, jobs limited to GPU types and memory, ~50 % forbidden).
//! Ours: `max_weight_matching_auto` (class detection included in the time) for dense
//! inputs, `max_weight_matching_sparse` for the sparse-random edge list. Totals must agree
//! (exit 1 if not).

#[path = "matching_common.rs"]
mod common;

use std::io::Write;
use std::time::Instant;

use cluster_matcher::matching::classes::{matrix_classes, max_weight_matching_auto};
use cluster_matcher::matching::{
    max_weight_matching_sparse, Matching, SparseWeights, WeightMatrix, FORBIDDEN,
};
use common::*;

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

/// MuxFlow-like weights with exact ties: GPU = (type of 3, online load of 10 levels),
/// job = one of 26 types; `noise` adds U[0, noise) to every weight.
fn ties(rows: usize, cols: usize, seed: u64, noise: f64) -> WeightMatrix {
    let mut g = Rng::new(seed);
    let gpu_speed = [0.45, 0.75, 1.0];
    let job_speed: Vec<[f64; 3]> = (0..26)
        .map(|_| {
            let base = 0.3 + 0.7 * g.f64();
            [
                base * (0.4 + 0.3 * g.f64()),
                base * (0.7 + 0.2 * g.f64()),
                base,
            ]
        })
        .collect();
    let job_sens: Vec<f64> = (0..26).map(|_| 0.5 + 1.5 * g.f64()).collect();
    let gpus: Vec<(usize, f64)> = (0..rows)
        .map(|_| (g.below(3), 0.1 + 0.08 * g.below(10) as f64))
        .collect();
    let jobs: Vec<usize> = (0..cols).map(|_| g.below(26)).collect();
    let mut data = Vec::with_capacity(rows * cols);
    for &(t, load) in &gpus {
        for &k in &jobs {
            let w = gpu_speed[t] * job_speed[k][t] * (1.0 - load).powf(job_sens[k]);
            data.push(w + if noise > 0.0 { noise * g.f64() } else { 0.0 });
        }
    }
    WeightMatrix::new(rows, cols, data).unwrap()
}

/// Exact ties with constraints: a job may be limited to one GPU type (1 in 3 jobs) and
/// needs 4, 8 or 16 GiB against the GPU's 8, 12 or 24 GiB free.
fn sparse_typed(rows: usize, cols: usize, seed: u64) -> WeightMatrix {
    let base = ties(rows, cols, seed, 0.0);
    let mut g = Rng::new(seed ^ 0xabcdef);
    let gpu: Vec<(usize, u32)> = (0..rows)
        .map(|_| (g.below(3), [8, 12, 24][g.below(3)]))
        .collect();
    let job: Vec<(Option<usize>, u32)> = (0..cols)
        .map(|_| {
            (
                (g.below(3) == 0).then(|| g.below(3)),
                [4, 8, 16][g.below(3)],
            )
        })
        .collect();
    WeightMatrix::from_fn(rows, cols, |r, c| {
        let (t, free) = gpu[r];
        let (want, mem) = job[c];
        (want.is_none_or(|x| x == t) && mem <= free).then(|| base.row(r)[c])
    })
    .unwrap()
}

struct Peers {
    scipy: Option<(f64, f64, f64)>,
    lap: Option<(f64, f64, f64)>,
}

fn run_peers(w: &WeightMatrix, repeat: usize, allow_unmatched: bool) -> Result<Peers, String> {
    let path = std::env::temp_dir().join(format!(
        "xshare-peers-{}-{}x{}.f64",
        std::process::id(),
        w.rows(),
        w.cols()
    ));
    let mut buf = Vec::with_capacity(w.as_slice().len() * 8);
    for x in w.as_slice() {
        buf.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&buf))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let script = repo_root().join("scripts/bench_peers.py");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(&script)
        .arg(&path)
        .arg(w.rows().to_string())
        .arg(w.cols().to_string());
    cmd.arg("--repeat").arg(repeat.to_string());
    if allow_unmatched {
        cmd.arg("--allow-unmatched");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", python().display()));
    let _ = std::fs::remove_file(&path);
    let out = out?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output: {e}"))?;
    let get = |name: &str| -> Option<(f64, f64, f64)> {
        let r = &v[name];
        if let Some(e) = r["error"].as_str() {
            eprintln!("{e}");
            return None;
        }
        let list = |k: &str| {
            r[k].as_array()
                .map(|a| a.iter().filter_map(|x| x.as_f64()).collect::<Vec<_>>())
        };
        Some((
            median(&list("seconds")?),
            median(&list("cpu_seconds")?),
            r["total"].as_f64()?,
        ))
    };
    Ok(Peers {
        scipy: get("scipy"),
        lap: get("lap"),
    })
}

fn agree(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|k| args.get(k + 1))
    };
    let n: usize = value("--n").and_then(|s| s.parse().ok()).unwrap_or(2000);
    let repeat: usize = value("--repeat").and_then(|s| s.parse().ok()).unwrap_or(3);
    let all = [
        "uniform",
        "near-tie",
        "exact-ties",
        "rect-uniform",
        "rect-ties",
        "sparse-random",
        "sparse-typed",
    ];
    let families: Vec<String> = value("--families")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| all.iter().map(|s| s.to_string()).collect());
    println!("repeats {repeat}, medians; CPU = thread CPU seconds; x = ours / fastest peer (CPU)");
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}  totals",
        "family",
        "ours cpu",
        "ours wall",
        "scipy cpu",
        "scipy wall",
        "lap cpu",
        "lap wall",
        "classes",
        "x"
    );
    let mut ok = true;
    for fam in &families {
        let (label, w, sparse): (String, WeightMatrix, Option<SparseWeights>) = match fam.as_str() {
            "uniform" => (
                format!("uniform {n}x{n}"),
                uniform(n, n, 1000 + n as u64),
                None,
            ),
            "near-tie" => (format!("near-tie {n}x{n}"), ties(n, n, 7, 1e-6), None),
            "exact-ties" => (format!("exact-ties {n}x{n}"), ties(n, n, 7, 0.0), None),
            "rect-uniform" => (
                format!("rect-uniform {}x{}", n / 2, 4 * n),
                uniform(n / 2, 4 * n, 3),
                None,
            ),
            "rect-ties" => (
                format!("rect-ties {}x{}", n / 2, 4 * n),
                ties(n / 2, 4 * n, 9, 0.0),
                None,
            ),
            "sparse-random" => {
                let s = sparse(2 * n, 2 * n, 8, 5);
                (
                    format!("sparse-random {}x{} 8/job", 2 * n, 2 * n),
                    densify(&s),
                    Some(s),
                )
            }
            "sparse-typed" => (
                format!("sparse-typed {n}x{n}"),
                sparse_typed(n, n, 11),
                None,
            ),
            other => {
                eprintln!("unknown family {other}");
                std::process::exit(2);
            }
        };
        let cl = matrix_classes(&w);
        let classes = format!("{}x{}", cl.row_members.len(), cl.col_members.len());
        drop(cl);
        let (oc, ow, m) = match &sparse {
            Some(s) => {
                let (ow, oc, m) = timed(repeat, || max_weight_matching_sparse(s));
                (oc, ow, m)
            }
            None => {
                let (ow, oc, m) = timed(repeat, || max_weight_matching_auto(&w));
                (oc, ow, m)
            }
        };
        let has_forbidden = w.as_slice().contains(&FORBIDDEN);
        let peers = match run_peers(&w, repeat, has_forbidden) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{label}: peers unavailable: {e}");
                Peers {
                    scipy: None,
                    lap: None,
                }
            }
        };
        let mut note = String::new();
        for (name, p) in [("scipy", &peers.scipy), ("lap", &peers.lap)] {
            if let Some((_, _, t)) = p {
                if !agree(*t, m.total_weight()) {
                    ok = false;
                    note.push_str(&format!(
                        "{name} DIFFERS ({t} vs ours {}) ",
                        m.total_weight()
                    ));
                }
            }
        }
        if note.is_empty() {
            note = format!("equal ({:.6})", m.total_weight());
        }
        let fastest = [peers.scipy, peers.lap]
            .iter()
            .flatten()
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min);
        let f = |p: Option<(f64, f64, f64)>, k: usize| {
            p.map_or("-".to_string(), |p| {
                format!("{:.4}", if k == 0 { p.1 } else { p.0 })
            })
        };
        println!(
            "{:<28} {:>9.4} {:>9.4} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7.3}  {}",
            label,
            oc,
            ow,
            f(peers.scipy, 0),
            f(peers.scipy, 1),
            f(peers.lap, 0),
            f(peers.lap, 1),
            classes,
            oc / fastest,
            note
        );
    }
    if !ok {
        eprintln!("totals differ: see table");
        std::process::exit(1);
    }
}
