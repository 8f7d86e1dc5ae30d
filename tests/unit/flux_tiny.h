// The tiny random Flux.1 of training/make_flux_pipeline_fixtures.py (BFL's
// parts: DiT, ae, CLIP-L, T5 with its unigram tokenizer in tokenizer_2/
// beside it), as the Flux tests pass it.
#pragma once

#include <string>

#include "golden.h"
#include "pipeline/model.h"

namespace kiln::test {

inline std::string flux_tiny_part(const std::string& name) { return golden_path("pipeline/flux_tiny/" + name); }

// The parts as a user passes them: --diffusion-model DIT, --vae, --clip_l,
// --t5xxl, CLIP's tokenizer by flag; T5's is found in tokenizer_2/ beside
// the T5 file.
inline pipeline::ModelPaths flux_tiny_parts(const std::string& dit = "flux_dit.safetensors") {
    pipeline::ModelPaths paths;
    paths.diffusion_model = flux_tiny_part(dit);
    paths.vae = flux_tiny_part("ae.safetensors");
    paths.clip_l = flux_tiny_part("clip_l.safetensors");
    paths.t5xxl = flux_tiny_part("t5xxl.safetensors");
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return paths;
}

}  // namespace kiln::test
