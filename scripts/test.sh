#!/usr/bin/env bash
# Runs every test: installs the test environment (Python clients, NVIDIA headers), builds the
# whole workspace (the emulator's libraries and binaries are needed by the end-to-end tests),
# then runs all tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup-test-env.sh
cargo build --workspace --all-targets
cargo test --workspace
