#!/usr/bin/env bash
# The whole test suite from a fresh clone: provision, build, run every test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${KILN_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/build.sh" -DKILN_BUILD_TESTS=ON
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
