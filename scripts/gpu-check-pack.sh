#!/usr/bin/env bash
# Packs the GPU check kit's binaries for a GPU host that has no cargo (a lent device machine):
# builds them here in release and writes stripped copies (release builds carry debug info,
# about 90 MB together; stripped, under 10 MB) with a PROFILE file saying what they are.
# Usage: scripts/gpu-check-pack.sh [--from DIR] [OUT]
#   OUT     where the copies go (default .gc/bin, ignored by git: carry ".gc" to the device)
#   --from  take the binaries from DIR instead of building (a release target directory)
# Then, on the GPU host: scripts/gpu-check.sh --real --bin-dir OUT (see README, "GPU check kit
# on a lent GPU").
set -euo pipefail
top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
from="" out="$top/.gc/bin" built=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --from) from="${2:?--from needs a directory}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu-check-pack: unknown argument $1" >&2; exit 2 ;;
        *) out="$1"; shift ;;
    esac
done
bins=(libxcuda.so sysmonitor mps-manager online offline)
if [[ -z $from ]]; then
    echo "gpu-check-pack: cargo build --release (shim, monitor, manager, workloads)" >&2
    (cd "$top" && cargo build -q --release -p xcuda-shim -p sysmonitor -p mps-manager -p workloads)
    from="${CARGO_TARGET_DIR:-$top/target}/release" built=1
fi
for b in "${bins[@]}"; do
    [[ -f "$from/$b" ]] || { echo "gpu-check-pack: $from/$b is missing" >&2; exit 2; }
done
# The device machine is x86-64: binaries built for another machine would not run there.
if command -v file >/dev/null 2>&1 && ! file -L "$from/sysmonitor" | grep -q 'x86-64'; then
    echo "gpu-check-pack: $from/sysmonitor is not an x86-64 binary: $(file -L "$from/sysmonitor")" >&2
    exit 2
fi
mkdir -p "$out"
for b in "${bins[@]}"; do
    rm -f "$out/$b"
    strip --strip-debug -o "$out/$b" "$from/$b"
    # Shimmed processes run as uid 65534 on a root host: readable and executable by all.
    chmod 755 "$out/$b"
done
{
    echo "release"
    if [[ -n $built ]]; then
        echo "built from $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$top" diff --quiet HEAD 2>/dev/null || echo ' with changes') on $(date -u +%Y-%m-%dT%H:%MZ)"
    else
        echo "copied from $from on $(date -u +%Y-%m-%dT%H:%MZ) (not built by this script: their source is not known here)"
    fi
} >"$out/PROFILE"
chmod 644 "$out/PROFILE"
chmod 755 "$out"
total=$(du -sm "$out" | cut -f1)
echo "gpu-check-pack: $out: ${bins[*]} (stripped), $total MiB" >&2
if (( total > 48 )); then
    echo "gpu-check-pack: over 48 MiB: the device tool carries 64 MiB at most with the working tree" >&2
    exit 1
fi
