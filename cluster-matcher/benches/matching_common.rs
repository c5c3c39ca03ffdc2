//! Seeded test matrices and the scipy runner, shared by the matching bench and tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use cluster_matcher::matching::{SparseWeights, WeightMatrix, FORBIDDEN};

/// splitmix64: small, seedable, good enough for test matrices.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (same seed, same sequence).
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// Next pseudo-random 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `0..n` (modulo bias is negligible for small `n`); `n` must be non-zero.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Uniform weights in [0, 1), every pair allowed.
pub fn uniform(rows: usize, cols: usize, seed: u64) -> WeightMatrix {
    let mut g = Rng::new(seed);
    let data = (0..rows * cols).map(|_| g.f64()).collect();
    WeightMatrix::new(rows, cols, data).unwrap()
}

/// MuxFlow-like weights: the normalized throughput of an offline job next to an online
/// GPU. GPUs have one of three types (speed factors) and an online load; jobs have one of
/// 26 types with a per-GPU-type speed and a sensitivity to the online load. Weights are
/// products of few factors plus 1% noise, so many pairs are near ties.
pub fn structured(rows: usize, cols: usize, seed: u64) -> WeightMatrix {
    let mut g = Rng::new(seed);
    let gpu_speed = [0.45, 0.75, 1.0];
    let job_speed: Vec<[f64; 3]> = (0..26)
        .map(|_| {
            let base = 0.3 + 0.7 * g.f64();
            [base * (0.4 + 0.3 * g.f64()), base * (0.7 + 0.2 * g.f64()), base]
        })
        .collect();
    let job_sens: Vec<f64> = (0..26).map(|_| 0.5 + 1.5 * g.f64()).collect();
    let gpus: Vec<(usize, f64)> = (0..rows).map(|_| (g.below(3), 0.1 + 0.8 * g.f64())).collect();
    let jobs: Vec<usize> = (0..cols).map(|_| g.below(26)).collect();
    let mut data = Vec::with_capacity(rows * cols);
    for &(t, load) in &gpus {
        for &k in &jobs {
            let w = gpu_speed[t] * job_speed[k][t] * (1.0 - load).powf(job_sens[k]);
            data.push((w * (1.0 + 0.01 * (g.f64() - 0.5))).max(0.0));
        }
    }
    WeightMatrix::new(rows, cols, data).unwrap()
}

/// Each job (column) allowed on `degree` random GPUs (rows), uniform weights.
pub fn sparse(rows: usize, cols: usize, degree: usize, seed: u64) -> SparseWeights {
    let mut g = Rng::new(seed);
    let mut edges = Vec::with_capacity(cols * degree);
    let mut picked = Vec::with_capacity(degree);
    for c in 0..cols {
        picked.clear();
        while picked.len() < degree.min(rows) {
            let r = g.below(rows);
            if !picked.contains(&r) {
                picked.push(r);
                edges.push((r, c, g.f64()));
            }
        }
    }
    SparseWeights::from_edges(rows, cols, edges).unwrap()
}

/// The dense form of a sparse matrix (unlisted pairs forbidden).
pub fn densify(s: &SparseWeights) -> WeightMatrix {
    let mut data = vec![FORBIDDEN; s.rows() * s.cols()];
    for r in 0..s.rows() {
        let (cs, ws) = s.row(r);
        for (&c, &w) in cs.iter().zip(ws) {
            data[r * s.cols() + c as usize] = w;
        }
    }
    WeightMatrix::new(s.rows(), s.cols(), data).unwrap()
}

/// Repository root (the workspace holding this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The Python interpreter with scipy: `XSHARE_PYTHON`, else `<repo>/.venv/bin/python`.
pub fn python() -> PathBuf {
    std::env::var_os("XSHARE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

/// What scipy reported for one matrix.
#[derive(Debug)]
pub struct ScipyRun {
    /// Wall time of each repeat, seconds.
    pub seconds: Vec<f64>,
    /// Thread CPU time of each repeat, seconds.
    pub cpu_seconds: Vec<f64>,
    /// Total weight of scipy's matching.
    pub total: f64,
    /// Rows scipy matched to a real column (matches to the padding columns not counted).
    pub pairs: usize,
}

/// Writes `w` to a temporary file and runs `scripts/bench_scipy_lsa.py` on it.
pub fn run_scipy(w: &WeightMatrix, repeat: usize, allow_unmatched: bool) -> Result<ScipyRun, String> {
    let path = std::env::temp_dir().join(format!(
        "xshare-lsa-{}-{}x{}-{}.f64",
        std::process::id(),
        w.rows(),
        w.cols(),
        Rng::new(w.as_slice().len() as u64 ^ repeat as u64).next_u64() % 100_000
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut buf = Vec::with_capacity(w.as_slice().len() * 8);
        for x in w.as_slice() {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        f.write_all(&buf).map_err(|e| format!("{}: {e}", path.display()))?;
        drop(f);
        let script = repo_root().join("scripts/bench_scipy_lsa.py");
        let mut cmd = Command::new(python());
        cmd.arg(&script)
            .arg(&path)
            .arg(w.rows().to_string())
            .arg(w.cols().to_string())
            .arg("--repeat")
            .arg(repeat.to_string());
        if allow_unmatched {
            cmd.arg("--allow-unmatched");
        }
        let out = cmd.output().map_err(|e| format!("{}: {e}", python().display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("scipy output not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))?;
        Ok(ScipyRun {
            seconds: v["seconds"].as_array().ok_or("no seconds")?.iter().filter_map(|x| x.as_f64()).collect(),
            cpu_seconds: v["cpu_seconds"].as_array().ok_or("no cpu_seconds")?.iter().filter_map(|x| x.as_f64()).collect(),
            total: v["total"].as_f64().ok_or("no total")?,
            pairs: v["pairs"].as_u64().ok_or("no pairs")? as usize,
        })
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (nanoseconds on
/// Linux); `None` elsewhere. Under load it is steadier than wall time.
pub fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? / 1e9)
}

/// Median of a non-empty list.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
