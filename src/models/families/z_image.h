// Z-Image (Tongyi-MAI): Turbo, the 8-step distilled model, and Base, the
// undistilled one it was distilled from. Qwen3-4B's hidden states (the
// second-to-last layer, under Qwen's chat template) are the context, the
// single-stream DiT predicts the rectified-flow velocity on Flux's
// 16-channel latent, and Flux's autoencoder decodes it.
//
// The two share every weight name and shape; only the file name tells them
// apart, as Kontext's does Flux-dev's: a file whose name says "turbo" is
// Turbo, any other Z-Image DiT is Base.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& z_image_turbo_family();
const Family& z_image_base_family();

}  // namespace kiln::models
