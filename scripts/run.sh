#!/usr/bin/env bash
# The main job from a fresh clone: provision, build, and generate
# "a red circle on a white background" with the default model into output.png.
# Arguments replace the default job's flags (e.g. scripts/run.sh -p "a blue star").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${KILN_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/build.sh" --run  # the kiln binary alone; scripts/test.sh builds the rest
if (($#)); then
    exec "$BUILD_DIR/bin/kiln" "$@"
fi
exec "$BUILD_DIR/bin/kiln" -p "a red circle on a white background" -o output.png
