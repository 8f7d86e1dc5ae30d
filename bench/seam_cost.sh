#!/bin/bash
# The network seam's cost: alternates kiln-bench of a build of the tree before the seam
# (804337c^: `git worktree add $KILN_PRESEAM 804337c^`, third_party/ggml copied in, then
# `cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF && cmake --build build --target kiln-bench`)
# and of this tree, on the same files, in one sitting; prints each job's median step.
# The files: bench/write_spec_model.py of tests/fixtures/flux_medium.spec to /tmp/flux_medium.safetensors
# and of z_image_medium.spec to /tmp/z_image_turbo_medium.safetensors (the name makes it Turbo).
set -u
PRE=${KILN_PRESEAM:-/work/wt-preseam}
HEAD="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLUX="-m /tmp/flux_medium.safetensors --tokenizer clip_l=tests/fixtures/tiny_tokenizer,t5xxl=tests/golden/pipeline/flux_tiny/tokenizer_2 -W 256 -H 256 --steps 3 --runs 1 -t 2 --no-limit"
ZIMG="-m /tmp/z_image_turbo_medium.safetensors --tokenizer llm=tests/golden/pipeline/z_image_tiny/tokenizer -W 256 -H 256 --steps 3 --runs 1 -t 2 --no-limit"
SD1="-m models/kiln-tiny.gguf -W 256 -H 256 --steps 8 --runs 1 -t 2 --no-limit"
for round in 1 2; do
  for model in SD1 FLUX ZIMG; do
    for build in pre head; do
      if [ $build = pre ]; then root=$PRE; else root=$HEAD; fi
      args=${!model}
      (cd $root && build/bin/kiln-bench $args --json /tmp/seam_${model}_${build}.json > /tmp/seam_last.log 2>&1)
      med=$(/usr/bin/python3 -c "import json;d=json.load(open('/tmp/seam_${model}_${build}.json'));print(round(d['median']['step_median_s']*1000,1))" 2>/dev/null)
      echo "round $round $model $build step_median_ms=$med"
    done
  done
done
