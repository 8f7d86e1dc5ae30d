#!/usr/bin/env bash
# KILN_VULKAN against the glslc this machine has (Debian 12's, from
# scripts/setup.sh): one that cannot compile GL_KHR_cooperative_matrix stops
# the configure before ggml is reached, naming the glslc and its version; a
# KILN_GLSLC that is not a file is named. Exit 77 (skipped) when there is no
# glslc, or when it is new enough that there is nothing to refuse.
#
#   tests/build/vulkan_option_test.sh SOURCE_DIR
set -u
src="$1"
glslc="$(command -v glslc)" || { echo "skipped: no glslc on PATH"; exit 77; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

printf '#version 450\n#extension GL_KHR_cooperative_matrix : require\nvoid main() {}\n' > "$dir/probe.comp"
if "$glslc" --target-env=vulkan1.3 -fshader-stage=compute "$dir/probe.comp" -o "$dir/probe.spv" 2>/dev/null; then
    echo "skipped: $glslc knows GL_KHR_cooperative_matrix; nothing to refuse"
    exit 77
fi

fail() { echo "FAIL: $1"; echo "$out"; exit 1; }

out="$(cmake -S "$src" -B "$dir/old" -DKILN_VULKAN=ON 2>&1)" && fail "the configure succeeded"
version="$("$glslc" --version | head -n 1)"
grep -qF "KILN_VULKAN: $glslc ($version) cannot compile" <<<"$out" || fail "the error does not name $glslc ($version)"
grep -q "GL_KHR_cooperative_matrix" <<<"$out" || fail "the error does not name the extension"
[[ ! -e "$dir/old/ggml" ]] || fail "ggml was configured before the check"

out="$(cmake -S "$src" -B "$dir/none" -DKILN_VULKAN=ON -DKILN_GLSLC=/no/such/glslc 2>&1)" && fail "configured with no glslc"
grep -qF "KILN_GLSLC=/no/such/glslc is not a file" <<<"$out" || fail "the missing glslc is not named"
echo "ok: KILN_VULKAN stops at configure with $version"
