#!/bin/bash
# CPU of the monitor's NVML calls alone (sysmonitor's monitor bench in its helper mode,
# MONITOR_BENCH_NVML_MS=10: NvmlSource::sample + the XID poll every 10 ms on an emulated H100),
# two builds side by side over the same windows, beside a process that only wakes up every
# 10 ms (the floor). Each build runs its own bench binary over its own fake NVML, so builds
# with different emulator layouts compare too (the monitor bench's --compare cannot).
#
# usage: nvml-cpu-side-by-side.sh THIS/target/release OTHER/target/release [SECS [WINDOWS]]
# (each needs `cargo build --release -p emu-nvml` and `cargo bench -p sysmonitor --bench
# monitor --no-run` done there).
set -euo pipefail
A=$(realpath "$1"); B=$(realpath "$2"); SECS=${3:-10}; W=${4:-5}
D=$(mktemp -d /tmp/nvml-sbs.XXXXXX)
trap 'kill $P1 $P2 $P3 2>/dev/null; rm -rf "$D"' EXIT
bench() { ls -t "$1"/deps/monitor-* | grep -v '\.d$' | head -1; }
start() { # name target-dir
  mkdir -p "$D/$1/lib"
  ln -s "$2/libnvidia_ml.so" "$D/$1/lib/libnvidia-ml.so.1"
  MONITOR_BENCH_NVML_MS=10 GPUEMU_STATE="$D/$1/gpu.state" GPUEMU_PROFILE=h100 \
    LD_LIBRARY_PATH="$D/$1/lib" "$(bench "$2")" > "$D/$1/out.txt" 2>&1 &
}
start a "$A"; P1=$!
start b "$B"; P2=$!
MONITOR_BENCH_FLOOR_MS=10 "$(bench "$A")" > /dev/null 2>&1 & P3=$!
sleep 1
ns() { awk '{print $1}' "/proc/$1/schedstat"; }
echo "this: $A   other: $B   ($W windows of $SECS s)"
for w in $(seq 1 "$W"); do
  a=$(ns $P1); b=$(ns $P2); c=$(ns $P3); t0=$(date +%s%N)
  sleep "$SECS"
  a2=$(ns $P1); b2=$(ns $P2); c2=$(ns $P3); t1=$(date +%s%N)
  awk -v a="$a" -v a2="$a2" -v b="$b" -v b2="$b2" -v c="$c" -v c2="$c2" -v t=$((t1 - t0)) \
      -v l="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN {
    printf "window: this %.3f %%  other %.3f %%  floor %.3f %%  (over the floor: this %.1f us, other %.1f us a 10 ms sample; load %s)\n",
      (a2-a)/t*100, (b2-b)/t*100, (c2-c)/t*100, ((a2-a)-(c2-c))/(t/1e7)/1000, ((b2-b)-(c2-c))/(t/1e7)/1000, l }'
done
