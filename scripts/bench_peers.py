#!/usr/bin/env python3
"""Times scipy's linear_sum_assignment and lap's lapjv on a matrix written by the Rust
`peers` bench (cargo bench -p cluster-matcher --bench peers).

Usage: bench_peers.py FILE ROWS COLS [--repeat N] [--allow-unmatched]

FILE holds ROWS*COLS little-endian float64 weights, row-major; -inf marks a forbidden pair.
The problem is maximum total weight. With --allow-unmatched any row may stay unmatched at
weight 0 (needed when pairs are forbidden): scipy gets a private zero column per row
appended, lap gets cost_limit=0 (its own unmatched option). Without it both solve the
rectangular assignment (min(ROWS, COLS) pairs), which equals the maximum weight when all
weights are >= 0 and nothing is forbidden.

Only the solve is timed (lap: building its cost matrix -w included, as the caller must).
Prints one JSON object: {"scipy": RUN, "lap": RUN} with RUN = {"seconds": [...],
"cpu_seconds": [...], "total": best total, "pairs": matched real pairs}, or
{"error": "..."} for a solver that is missing.
"""
import json
import sys
import time

import numpy as np


def run_scipy(w, repeat, allow_unmatched):
    from scipy.optimize import linear_sum_assignment

    rows, cols = w.shape
    m = w
    if allow_unmatched:
        dummy = np.full((rows, rows), -np.inf)
        np.fill_diagonal(dummy, 0.0)
        m = np.hstack([w, dummy])
    times, cpu = [], []
    for _ in range(repeat):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        r, c = linear_sum_assignment(m, maximize=True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    real = c < cols
    total = float(m[r[real], c[real]].sum())
    return {"seconds": times, "cpu_seconds": cpu, "total": total, "pairs": int(real.sum())}


def run_lap(w, repeat, allow_unmatched):
    import lap

    rows, cols = w.shape
    forbidden = ~np.isfinite(w)
    big = 1e6 * (1.0 + float(np.abs(w[~forbidden]).max(initial=0.0)))
    times, cpu = [], []
    for _ in range(repeat):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        cost = np.where(forbidden, big, -w)
        if allow_unmatched:
            _, x, _ = lap.lapjv(cost, extend_cost=True, cost_limit=0.0)
        else:
            _, x, _ = lap.lapjv(cost, extend_cost=rows != cols)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    total, pairs = 0.0, 0
    for r in range(rows):
        c = x[r]
        if 0 <= c < cols and not forbidden[r, c] and w[r, c] > 0:
            total += float(w[r, c])
            pairs += 1
    return {"seconds": times, "cpu_seconds": cpu, "total": total, "pairs": pairs}


def main(argv):
    if len(argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    path, rows, cols = argv[1], int(argv[2]), int(argv[3])
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    allow_unmatched = "--allow-unmatched" in argv
    w = np.fromfile(path, dtype="<f8")
    if w.size != rows * cols:
        sys.stderr.write(f"{path}: {w.size} weights, expected {rows}x{cols}\n")
        return 2
    w = w.reshape(rows, cols)
    out = {}
    for name, fn in (("scipy", run_scipy), ("lap", run_lap)):
        try:
            out[name] = fn(w, repeat, allow_unmatched)
        except ImportError as e:
            out[name] = {"error": f"{name} not installed ({e}); run scripts/setup-bench-env.sh"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
