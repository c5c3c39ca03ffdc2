#!/usr/bin/env bash
# What one 10 ms sample of sysmonitor touches in memory: distinct cache lines and pages per
# sample (between two of its clock_nanosleep calls), by mapping (its own code, the NVML
# library's code and data, stack, ledger, emulator state file, heap). After each 10 ms sleep
# these are cold (the VM's vCPU halts and other work runs), so this working set, more than the
# instruction count, is what a sample costs here. Counts, not times: deterministic, unlike
# `cargo bench -p sysmonitor --bench monitor`, so a change can be judged on a noisy machine.
# Needs valgrind (lackey) and python3. Usage: scripts/monitor-footprint.sh [SECONDS]
# (default 12 s of trace; valgrind slows the monitor down, a third of the samples are skipped
# as warm-up).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-12}
command -v valgrind >/dev/null || { echo "monitor-footprint: valgrind not found" >&2; exit 1; }
cargo build --release -q -p emu-cuda -p emu-nvml -p sysmonitor
cargo bench -q -p sysmonitor --bench monitor --no-run 2>/dev/null
bench=$(ls -t target/release/deps/monitor-* | grep -v '\.d$' | head -1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
MONITOR_BENCH_WRAP="timeout -s INT $((secs + 13)) valgrind --tool=lackey --trace-mem=yes --trace-syscalls=yes --log-file=$out/trace" \
    "$bench" --hold "$secs" >"$out/hold.log" 2>&1 || true
python3 - "$out/trace" <<'EOF'
import collections, re, statistics, sys
regions, cur, ticks, last_open = [], set(), [], None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("SYSCALL"):
        if "clock_nanosleep" in line:
            ticks.append(cur)
            cur = set()
            continue
        m = re.search(r"sys_openat \( \d+, 0x[0-9a-f]+\(([^)]*)\)", line)
        if m:
            last_open = m.group(1)
            continue
        m = re.search(r"sys_mmap \( 0x[0-9a-f]+, (\d+), (\d+), \d+, (\d+), \d+ \) --> \[pre-success\] Success\(0x([0-9a-f]+)\)", line)
        if m:
            start, length = int(m.group(4), 16), int(m.group(1))
            anon = int(m.group(3)) == 4294967295
            name = "anonymous" if anon else (last_open or "?").split("/")[-1]
            regions.append((start, start + length, name + (" code" if int(m.group(2)) & 4 else "")))
        continue
    kind = line[:2]
    if kind in ("I ", " L", " S", " M"):
        try:
            addr = int(line[3:].split(",")[0], 16)
        except ValueError:
            continue
        cur.add((addr >> 6, kind == "I "))
ticks = ticks[len(ticks) // 3:-3]
if not ticks:
    sys.exit("monitor-footprint: no samples traced (is valgrind working?)")
def region(a):
    for s, e, n in reversed(regions):
        if s <= a < e:
            return n
    if a >= 0x1ffe000000:
        return "stack"
    return "sysmonitor" if a < 0x400000 else "heap/other"
lines, pages = collections.Counter(), collections.Counter()
for t in ticks:
    seen = set()
    for l, code in t:
        k = region(l << 6) + (" code" if code and not region(l << 6).endswith("code") else "")
        lines[k] += 1
        seen.add((l >> 6, k))
    for _, k in seen:
        pages[k] += 1
n = len(ticks)
sizes = sorted(len(t) for t in ticks)
print(f"{n} samples traced: distinct cache lines per sample median {statistics.median(sizes):.0f}, "
      f"mean {sum(sizes) / n:.0f}; pages per sample {sum(pages.values()) / n:.1f}")
print(f"{'mapping':<32} {'lines':>7} {'pages':>7}")
for k, v in lines.most_common():
    print(f"{k:<32} {v / n:7.1f} {pages[k] / n:7.1f}")
EOF
