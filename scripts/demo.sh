#!/usr/bin/env bash
# The main job: builds the emulator and the workload programs, then runs host-demo on an
# emulated GPU host (online client alone, then beside an unrestrained offline client) and
# prints the latency table. Extra arguments go to host-demo (see --help), e.g.
#   ./scripts/demo.sh --profile h100 --duration 10
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "demo: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
    exit 1
fi
echo "demo: building the emulator and the workload programs (first run takes a few minutes)" >&2
cargo build -q -p emu-cuda -p emu-nvml -p emu-mps-control -p workloads
exec target/debug/host-demo "$@"
