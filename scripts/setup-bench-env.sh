#!/usr/bin/env bash
# Installs the matching benchmarks' peers into the test venv (.venv, made by
# scripts/setup-test-env.sh): scipy (already there for the tests) and `lap` (LAPJV), which
# only the benchmarks use. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ ! -x .venv/bin/python ]]; then
    ./scripts/setup-test-env.sh
fi
if ! .venv/bin/python -c 'import lap, scipy' 2>/dev/null; then
    echo "setup-bench: installing lap into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check 'lap==0.5.13' 'scipy>=1.13'
fi
echo "setup-bench: ok (scipy $(.venv/bin/python -c 'import scipy; print(scipy.__version__)'), lap $(.venv/bin/python -c 'import lap; print(lap.__version__)'))"
