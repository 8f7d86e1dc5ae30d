// FLUX.2 [klein] (Black Forest Labs): the 4B and 9B DiTs, distilled (4
// steps, no CFG) and base (CFG against the empty prompt). Qwen3 (4B for
// klein 4B, 8B for klein 9B) reads the prompt under its chat template with
// thinking closed, padded to 512 tokens, and its hidden_states 9, 18 and 27
// side by side are the context; the DiT predicts the rectified-flow velocity
// on FLUX.2's autoencoder's normalised 128-channel latent (16x).
//
// Distilled and base share every weight name and shape; only the file name
// tells them apart, as BFL names them: a file or folder named "klein-base"
// (flux-2-klein-base-4b.safetensors, FLUX.2-klein-base-4B/) is base, any
// other is distilled.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& flux2_klein_family();
const Family& flux2_klein_base_family();

}  // namespace kiln::models
