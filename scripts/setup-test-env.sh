#!/usr/bin/env bash
# Installs what the tests need beside the Rust toolchain, idempotently:
#   .venv/            Python with NVIDIA's cuda-bindings, numba-cuda, numpy, scipy
#   .cuda-headers/    cuda.h, cudaTypedefs.h (nvidia-cuda-runtime-cu12) and nvml.h
#                     (nvidia-nvml-dev-cu12), unpacked from NVIDIA's wheels; never committed.
#   .cuda-headers-13/ cuda.h, cudaTypedefs.h of CUDA 13.0 (driver 580), from the
#                     nvidia-cuda-runtime wheel (CUDA 13 dropped the -cu12 style suffix and
#                     ships them under nvidia/cu13/include/); never committed.
#   .cuda-tools/ptxas NVIDIA's PTX assembler (nvidia-cuda-nvcc-cu12), which checks that the
#                     workloads' PTX kernel is valid for real GPUs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

PY="${PYTHON:-python3}"
CUDA_WHEEL_VERSION=12.9.79
NVCC_WHEEL_VERSION=12.9.86
CUDA13_WHEEL_VERSION=13.0.96

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
if [[ ! -f .cuda-headers-13/cuda.h || ! -f .cuda-headers-13/cudaTypedefs.h ]]; then
    echo "setup: fetching NVIDIA CUDA 13 headers (${CUDA13_WHEEL_VERSION}) into .cuda-headers-13"
    tmp13="$(mktemp -d)"
    .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps -d "$tmp13" \
        "nvidia-cuda-runtime==${CUDA13_WHEEL_VERSION}"
    mkdir -p .cuda-headers-13
    .venv/bin/python - "$tmp13"/*.whl <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for h in ("cuda.h", "cudaTypedefs.h"):
        with open(".cuda-headers-13/" + h, "wb") as f:
            f.write(z.read("nvidia/cu13/include/" + h))
PYEOF
    rm -rf "$tmp13"
fi
if [[ ! -x .cuda-tools/ptxas ]]; then
    echo "setup: fetching NVIDIA's ptxas (${NVCC_WHEEL_VERSION}) into .cuda-tools"
    tmp2="$(mktemp -d)"
    .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps -d "$tmp2" \
        "nvidia-cuda-nvcc-cu12==${NVCC_WHEEL_VERSION}"
    mkdir -p .cuda-tools
    .venv/bin/python - "$tmp2"/*.whl <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    with open(".cuda-tools/ptxas", "wb") as f:
        f.write(z.read("nvidia/cuda_nvcc/bin/ptxas"))
PYEOF
    chmod +x .cuda-tools/ptxas
    rm -rf "$tmp2"
fi
echo "setup: ok (python: .venv/bin/python, headers: .cuda-headers and .cuda-headers-13, ptxas: .cuda-tools/ptxas)"
