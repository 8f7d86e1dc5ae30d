// FLUX.2 [klein] (Black Forest Labs): the 4B and 9B DiTs, distilled (4
// steps, no CFG) and base (CFG against the empty prompt). Qwen3 (4B for
// klein 4B, 8B for klein 9B) reads the prompt under its chat template with
// thinking closed, padded to 512 tokens, and its hidden_states 9, 18 and 27
// side by side are the context; the DiT predicts the rectified-flow velocity
// on FLUX.2's autoencoder's normalised 128-channel latent (16x).
//
// FLUX.2 [dev]: the same DiT at 32B with a guidance embedding (guidance
// distilled: 50 steps, guidance 4, no CFG), Mistral Small 3.x (24B) reading
// the prompt under its chat template with BFL's system message, its
// hidden_states 10, 20 and 30 side by side, padded with zeros to 512 tokens.
//
// Klein's distilled and base share every weight name and shape; only the file name
// tells them apart, as BFL names them: a file or folder named "klein-base"
// (flux-2-klein-base-4b.safetensors, FLUX.2-klein-base-4B/) is base, any
// other is distilled.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& flux2_klein_family();
const Family& flux2_klein_base_family();
const Family& flux2_dev_family();

}  // namespace kiln::models
