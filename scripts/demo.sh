#!/usr/bin/env bash
# The main job, on an emulated GPU host (no GPU needed):
#   1. host-demo: the online client alone, beside an unrestrained offline client, and beside an
#      offline client held to a static MPS share -- the problem and the blunt fix;
#   2. node-demo: the node runtime (sysmonitor + mps-manager + the shim in the offline client)
#      sharing the GPU live, through an online burst that forces an eviction; its timeline is
#      drawn into target/demo/node-demo.svg.
# Builds what it needs first. Arguments go to host-demo (see `target/debug/host-demo --help`),
# e.g. ./scripts/demo.sh --profile h100 --duration 10. DEMO_NODE=0 skips part 2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "demo: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
    exit 1
fi
node=0
if [[ "${DEMO_NODE:-1}" != 0 && -f sysmonitor/examples/node-demo.rs ]]; then
    node=1
fi
echo "demo: building the emulator, the workload programs and the node runtime (first run takes a few minutes)" >&2
cargo build -q -p emu-cuda -p emu-nvml -p emu-mps-control -p workloads
if [[ $node == 1 ]]; then
    cargo build -q -p sysmonitor -p mps-manager -p xcuda-shim
    cargo build -q -p sysmonitor --example node-demo
fi
target/debug/host-demo "$@"
if [[ $node == 1 ]]; then
    echo
    target/debug/examples/node-demo
fi
