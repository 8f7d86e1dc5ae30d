#!/usr/bin/env bash
# Provisions (scripts/setup.sh), configures and builds kiln into build/.
# Extra arguments go to CMake's configure step (e.g. -DKILN_CUDA=ON).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${KILN_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
