#!/usr/bin/env bash
# Installs what the tests need beside the Rust toolchain, idempotently:
#   .venv/            Python with NVIDIA's cuda-bindings, numba-cuda, numpy, scipy
#   .cuda-headers/    cuda.h, cudaTypedefs.h (nvidia-cuda-runtime-cu12) and nvml.h
#                     (nvidia-nvml-dev-cu12), unpacked from NVIDIA's wheels; never committed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

PY="${PYTHON:-python3}"
CUDA_WHEEL_VERSION=12.9.79

if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import cuda.bindings, numba.cuda, numpy, scipy' 2>/dev/null; then
    echo "setup: installing Python test clients into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check \
        'cuda-bindings==12.9.4' 'numba-cuda==0.20.1' 'numba==0.62.1' 'cuda-core<0.4' 'numpy>=1.26' 'scipy>=1.13'
fi

if [[ ! -f .cuda-headers/cuda.h || ! -f .cuda-headers/nvml.h ]]; then
    echo "setup: fetching NVIDIA headers (${CUDA_WHEEL_VERSION}) into .cuda-headers"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
        "nvidia-cuda-runtime-cu12==${CUDA_WHEEL_VERSION}" "nvidia-nvml-dev-cu12==${CUDA_WHEEL_VERSION}"
    mkdir -p .cuda-headers
    for whl in "$tmp"/*.whl; do
        .venv/bin/python - "$whl" <<'PYEOF'
import sys, zipfile, os
wanted = {"cuda.h", "cudaTypedefs.h", "nvml.h"}
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        base = os.path.basename(n)
        if base in wanted:
            with open(os.path.join(".cuda-headers", base), "wb") as f:
                f.write(z.read(n))
PYEOF
    done
fi
echo "setup: ok (python: .venv/bin/python, headers: .cuda-headers)"
