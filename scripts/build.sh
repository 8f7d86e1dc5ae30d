#!/usr/bin/env bash
# Provisions (scripts/setup.sh), configures and builds kiln into build/.
# `--run` first: only the `kiln` binary and what it needs (scripts/run.sh).
# Other arguments go to CMake's configure step (e.g. -DKILN_CUDA=ON).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${KILN_BUILD_DIR:-$ROOT/build}"

SETUP_ARGS=()
TARGET_ARGS=()
if [[ "${1:-}" == "--run" ]]; then
    shift
    SETUP_ARGS=(--run)
    TARGET_ARGS=(--target kiln)
    set -- -DKILN_BUILD_TESTS=OFF "$@"  # the test suite's packages are not installed
fi
"$ROOT/scripts/setup.sh" "${SETUP_ARGS[@]}"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGET_ARGS[@]}"
