// Stable Diffusion 3 and 3.5 (Stability AI): an MMDiT (models/nets/mmdit)
// conditioned on three text encoders, as Stability's sd3_infer.py does it:
// CLIP-L's and CLIP-G's penultimate hidden states side by side (768 +
// 1280), padded with zeros to T5-XXL's 4096 and followed along the tokens
// by T5's 77; the pooled vector is CLIP-L's pooled output then CLIP-G's
// projected one. T5 is optional (SD3 files ship without it): 77 zero rows
// stand in for it, as the reference used before it required T5. The
// latent is SD3's 16-channel VAE's (scale 1.5305, shift 0.0609); flow
// matching with the time shift 3.
//
// The variants are told apart by the DiT's weights: MMDiT-X's attn2 is
// SD3.5 Medium, no QK norm is SD3 Medium, otherwise SD3.5 Large; Large and
// Large Turbo share every weight, and a file or folder named "turbo" is
// Turbo, as Stability names it (sd3.5_large_turbo.safetensors).
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& sd35_large_family();
const Family& sd35_large_turbo_family();
const Family& sd35_medium_family();
const Family& sd3_medium_family();

}  // namespace kiln::models
