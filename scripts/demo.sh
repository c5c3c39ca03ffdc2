#!/usr/bin/env bash
# The main job, on an emulated GPU host (no GPU needed):
#   1. host-demo: the online client alone, beside an unrestrained offline client, and beside an
#      offline client held to a static MPS share -- the problem and the blunt fix;
#   2. node-demo: the node runtime (sysmonitor + mps-manager + the shim in the offline client)
#      sharing the GPU live, through an online burst that forces an eviction; its timeline is
#      drawn into target/demo/node-demo.svg.
# Builds what it needs first. Arguments go to host-demo, those after `--` to node-demo, e.g.
#   ./scripts/demo.sh --profile h100 --duration 10 -- --plot /tmp/node.svg
# DEMO_NODE=0 skips part 2. --help prints both programs' options and runs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
host_args=()
node_args=()
help=0
seen_dashdash=0
for a in "$@"; do
    if [[ $seen_dashdash == 1 ]]; then
        node_args+=("$a")
    elif [[ $a == -- ]]; then
        seen_dashdash=1
    else
        [[ $a == -h || $a == --help ]] && help=1
        host_args+=("$a")
    fi
done
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
if [[ $help == 1 ]]; then
    echo "usage: ./scripts/demo.sh [HOST-DEMO OPTIONS] [-- NODE-DEMO OPTIONS]   (DEMO_NODE=0: host-demo only)"
    echo
    target/debug/host-demo --help
    if [[ $node == 1 ]]; then
        echo
        target/debug/examples/node-demo --help
    fi
    exit 0
fi
target/debug/host-demo ${host_args[@]+"${host_args[@]}"}
if [[ $node == 1 ]]; then
    echo
    target/debug/examples/node-demo ${node_args[@]+"${node_args[@]}"}
fi
