#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (tests/fuzz) in their own build dir and runs
# them. Not part of the normal build or CI.
#
#   scripts/fuzz.sh TARGET SECONDS    fuzz one target (safetensors, gguf, pickle, tokenizer,
#                                     t5_tokenizer, llm_tokenizer, prompt, a1111, args,
#                                     model_config, rpc_messages, server_request) for SECONDS
#   scripts/fuzz.sh all SECONDS       each target in turn, SECONDS each
#   scripts/fuzz.sh check             run the committed seeds and regressions once through each target
#
# Needs clang/clang++ with libFuzzer (KILN_FUZZ_CC / KILN_FUZZ_CXX override).
# Build dir: build-fuzz (KILN_FUZZ_BUILD_DIR overrides). Each run fuzzes a
# writable copy of the committed seeds, build-fuzz/corpus/TARGET (kept
# between runs; tests/fuzz/corpus/ is never written), and writes crash
# reproducers to build-fuzz/artifacts/TARGET/ and the full log to
# build-fuzz/logs/TARGET.log. Exit status: 0 when no target crashed.
#
# The targets run with a 1 MB stack (KILN_FUZZ_STACK_KB), an eighth of the
# usual 8 MB: recursion that would overflow the default stack only with inputs
# far over -max_len (a safetensors header may be 100 MB) then shows up within it.
#
# A crash: reproduce with  (ulimit -s 1024; build-fuzz/tests/fuzz/fuzz_TARGET CRASH_FILE)
#          minimise with   build-fuzz/tests/fuzz/fuzz_TARGET -minimize_crash=1 -runs=20000 CRASH_FILE
# then add the minimised file to tests/fuzz/regressions/TARGET/ with a note in
# tests/fuzz/regressions/README.md; `scripts/fuzz.sh check` replays them all.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KILN_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${KILN_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
max_len="${KILN_FUZZ_MAX_LEN:-65536}"
stack_kb="${KILN_FUZZ_STACK_KB:-1024}"
all_targets=(safetensors gguf pickle tokenizer t5_tokenizer llm_tokenizer prompt a1111 args model_config rpc_messages
    server_request)

usage() {
    echo "usage: $0 {safetensors|gguf|pickle|tokenizer|t5_tokenizer|llm_tokenizer|prompt|a1111|args|model_config|rpc_messages|server_request|all} SECONDS" >&2
    echo "       $0 check" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
mode="$1"
seconds=""
case "$mode" in
    check) [[ $# -eq 1 ]] || usage ;;
    safetensors | gguf | pickle | tokenizer | t5_tokenizer | llm_tokenizer | prompt | a1111 | args | model_config | \
        rpc_messages | server_request | all)
        [[ $# -eq 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || usage
        seconds="$2"
        ;;
    *) usage ;;
esac

available=()
for t in "${all_targets[@]}"; do
    [[ -f "$root/tests/fuzz/fuzz_$t.cpp" ]] && available+=("$t")
done
if [[ "$mode" == all || "$mode" == check ]]; then
    targets=("${available[@]}")
else
    [[ -f "$root/tests/fuzz/fuzz_$mode.cpp" ]] || { echo "fuzz.sh: no tests/fuzz/fuzz_$mode.cpp" >&2; exit 2; }
    targets=("$mode")
fi

# ---- configure + build ------------------------------------------------------
san_flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Re-run every time: cheap, and it picks up fuzz targets added since.
mkdir -p "$build"
CC="${KILN_FUZZ_CC:-clang}" CXX="${KILN_FUZZ_CXX:-clang++}" \
    cmake -S "$root" -B "$build" \
    -DKILN_FUZZ=ON -DKILN_BLAS=OFF -DKILN_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="$san_flags" -DCMAKE_CXX_FLAGS="$san_flags" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; echo "fuzz.sh: configure failed" >&2; exit 1; }

build_targets=()
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
echo "fuzz.sh: building ${build_targets[*]} in $build"
nice -n 10 cmake --build "$build" -j "$jobs" --target "${build_targets[@]}"

export GGML_NO_BACKTRACE=1
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# ---- check: seeds + regressions once -------------------------------------------
if [[ "$mode" == check ]]; then
    status=0
    for t in "${targets[@]}"; do
        files=()
        for dir in "$root/tests/fuzz/corpus/$t" "$root/tests/fuzz/regressions/$t"; do
            [[ -d "$dir" ]] || continue
            while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$dir" -type f ! -name '*.md' ! -name '*.txt' -print0 | sort -z)
        done
        if [[ ${#files[@]} -eq 0 ]]; then
            echo "check $t: no inputs"
            continue
        fi
        if (ulimit -s "$stack_kb" && exec "$build/tests/fuzz/fuzz_$t" "${files[@]}") >"$build/check_$t.log" 2>&1; then
            echo "check $t: ${#files[@]} inputs OK"
        else
            echo "check $t: FAILED (log: $build/check_$t.log)"
            tail -n 40 "$build/check_$t.log"
            status=1
        fi
    done
    exit $status
fi

# ---- fuzz -----------------------------------------------------------------------
mkdir -p "$build/logs"
summaries=()
status=0
for t in "${targets[@]}"; do
    corpus="$build/corpus/$t"
    artifacts="$build/artifacts/$t"
    log="$build/logs/$t.log"
    mkdir -p "$corpus" "$artifacts"
    # Writable copy of the committed seeds; existing files (earlier finds) stay.
    if [[ -d "$root/tests/fuzz/corpus/$t" ]]; then
        cp -n "$root/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
    fi
    args=(-max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1
        -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$artifacts/")
    [[ -f "$root/tests/fuzz/$t.dict" ]] && args+=(-dict="$root/tests/fuzz/$t.dict")

    before="$(ls -1 "$artifacts" | sort)"
    echo "fuzz.sh: fuzzing $t for ${seconds}s (log: $log)"
    rc=0
    start=$SECONDS
    (ulimit -s "$stack_kb" && exec nice -n 10 "$build/tests/fuzz/fuzz_$t" "${args[@]}" "$corpus") >"$log" 2>&1 || rc=$?
    elapsed=$((SECONDS - start))
    after="$(ls -1 "$artifacts" | sort)"
    new="$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed '/^$/d' || true)"

    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    edges="$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2 || true)"
    corpus_files="$(find "$corpus" -type f | wc -l)"
    corpus_kb="$(find "$corpus" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s / 1024 }')"
    if [[ -n "$new" ]]; then
        crash="CRASH: $(printf '%s\n' "$new" | sed "s|^|$artifacts/|" | paste -sd' ' -)"
        status=1
        grep -m 1 -E '^==[0-9]+==ERROR|runtime error|deadly signal' "$log" || true
    elif [[ $rc -ne 0 ]]; then
        crash="no artifact, but libFuzzer exited with $rc (see log)"
        status=1
    else
        crash="no crash"
    fi
    summaries+=("$t: ${execs:-?} execs in ${elapsed}s, coverage ${edges:-?} edges, corpus $corpus_files files (${corpus_kb} KB), $crash")
done

for s in "${summaries[@]}"; do echo "fuzz.sh: $s"; done
exit $status
