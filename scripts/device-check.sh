#!/usr/bin/env bash
# The memory system on a real GPU, in one prepared run for the device machine
# (16 cores, one NVIDIA card): builds kiln with KILN_CUDA=ON into build-cuda/,
# lists the devices, runs the memory tests of tests/unit/memory_test.cpp with
# --max-vram budgets on CUDA0 instead of the RPC device, and prints a budget
# sweep of the default model (time and managed peak per budget). Everything
# it prints goes to $OUT/device-check.log too when $OUT is set.
#
#   scripts/device-check.sh            # about 5 minutes of build on 16 cores, then 1-2 minutes of tests
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG="${OUT:-/tmp}/device-check.log"
exec > >(tee "$LOG") 2>&1
export PATH="/usr/local/cuda/bin:$PATH"

echo "== build (KILN_CUDA=ON, sm_${KILN_CUDA_ARCH:-90})"
KILN_BUILD_DIR="$ROOT/build-cuda" "$ROOT/scripts/build.sh" -DKILN_CUDA=ON -DKILN_CUDA_ARCH="${KILN_CUDA_ARCH:-90}"
KILN="$ROOT/build-cuda/bin/kiln"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
"$KILN" --list-devices

echo "== memory tests on CUDA0"
KILN_TEST_DEVICE=CUDA0 "$ROOT/build-cuda/tests/kiln_unit_tests" --gtest_filter='Memory.*'

echo "== budget sweep: default model, UNet and text encoder on CUDA0 with weights in RAM"
PLACE=(--backend diffusion=cuda0,te=cuda0,vae=cpu --params-backend diffusion=cpu,te=cpu)
for budget in 0 4M 3M 2.5M 2.2M; do
    start=$(date +%s.%N)
    "$KILN" "${PLACE[@]}" --max-vram "cuda0=$budget" -p "a red circle on a white background" \
        -o "${OUT:-/tmp}/sweep_$budget.png" -v 2>&1 | grep -E "UNet plans|memory: CUDA0|error" || true
    echo "budget $budget: $(echo "$(date +%s.%N) - $start" | bc) s"
done
for budget in 4M 3M 2.5M 2.2M; do
    cmp "${OUT:-/tmp}/sweep_0.png" "${OUT:-/tmp}/sweep_$budget.png" && echo "budget $budget: same image"
done
