#!/usr/bin/env bash
# Provisions everything kiln needs to build and test on a fresh Debian machine:
#   1. the Debian packages the build and tests use (installed only if missing);
#   2. the pinned ggml (scripts/ggml.lock) into third_party/ggml, unless
#      KILN_GGML_DIR points at an existing ggml checkout.
# Idempotent: a second run checks, finds everything present and says so.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=ggml.lock
source "$ROOT/scripts/ggml.lock"

PACKAGES=(
    build-essential cmake pkg-config git
    libopenblas-openmp-dev   # ggml's BLAS backend (KILN_BLAS), on OpenMP like ggml (cmake/openblas.cmake)
    nlohmann-json3-dev       # JSON headers (safetensors, model_index.json)
    libpng-dev libjpeg62-turbo-dev libwebp-dev zlib1g-dev  # image files (src/image)
    libgtest-dev libgmock-dev googletest
    clang libclang-rt-14-dev # libFuzzer targets in tests/fuzz
)
# npm fetches the package that carries ggml's history; a machine may already
# have Node.js from elsewhere, whose npm Debian's package would conflict with.
if ! command -v npm >/dev/null; then PACKAGES+=(npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "setup: Debian packages present"
fi

if [[ -n "${KILN_GGML_DIR:-}" ]]; then
    if [[ ! -f "$KILN_GGML_DIR/CMakeLists.txt" || ! -f "$KILN_GGML_DIR/include/ggml.h" ]]; then
        echo "setup: error: KILN_GGML_DIR=$KILN_GGML_DIR is not a ggml checkout (no CMakeLists.txt and include/ggml.h)" >&2
        exit 1
    fi
    echo "setup: using ggml from KILN_GGML_DIR=$KILN_GGML_DIR"
    exit 0
fi

DEST="$ROOT/third_party/ggml"
STAMP="$DEST/.kiln-ggml-commit"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KILN_GGML_COMMIT" ]]; then
    echo "setup: ggml ${KILN_GGML_COMMIT:0:12} present in third_party/ggml"
    exit 0
fi

echo "setup: provisioning ggml ${KILN_GGML_COMMIT:0:12} from $KILN_GGML_NPM_PACKAGE"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$KILN_GGML_NPM_PACKAGE" >/dev/null)
tar -xzf "$WORK"/node-llama-cpp-*.tgz -C "$WORK" package/llama/gitRelease.bundle
git clone -q --no-checkout "$WORK/package/llama/gitRelease.bundle" "$WORK/llama.cpp"
git -C "$WORK/llama.cpp" -c advice.detachedHead=false checkout -q "$KILN_GGML_COMMIT" -- ggml
rm -rf "$DEST.tmp"
mkdir -p "$(dirname "$DEST")"
cp -a "$WORK/llama.cpp/ggml" "$DEST.tmp"
echo "$KILN_GGML_COMMIT" >"$DEST.tmp/.kiln-ggml-commit"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "setup: ggml ready in third_party/ggml"
