#!/usr/bin/env python3
"""Times scipy.optimize.linear_sum_assignment on a matrix written by the Rust matching bench.

Usage: bench_scipy_lsa.py FILE ROWS COLS [--repeat N] [--allow-unmatched]

FILE holds ROWS*COLS little-endian float64 weights, row-major; -inf marks a forbidden pair.
The problem solved is maximum total weight. With --allow-unmatched every row may also stay
unmatched at weight 0 (a private zero column per row is appended), which is the
max-weight (not max-cardinality) problem cluster-matcher solves; without it scipy's own
rectangular assignment is solved (min(ROWS, COLS) pairs), which equals it when all weights
are positive and no pair is forbidden.

Only the solve is timed, not the load. Prints one JSON object:
{"seconds": [wall per repeat], "cpu_seconds": [thread CPU time per repeat],
 "total": best total weight, "pairs": matched real pairs}
"""
import json
import sys
import time

import numpy as np
from scipy.optimize import linear_sum_assignment


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
    if allow_unmatched:
        dummy = np.full((rows, rows), -np.inf)
        np.fill_diagonal(dummy, 0.0)
        w = np.hstack([w, dummy])
    times, cpu = [], []
    for _ in range(repeat):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        r, c = linear_sum_assignment(w, maximize=True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    real = c < cols
    total = float(w[r[real], c[real]].sum())
    print(json.dumps({"seconds": times, "cpu_seconds": cpu, "total": total, "pairs": int(real.sum())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
