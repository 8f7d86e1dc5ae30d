// Stable Diffusion 1.x (and its 9-channel inpainting UNet): OpenAI CLIP
// ViT-L/14 text encoder, a UNet with a 768-wide context, the KL autoencoder.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& sd1_family();

}  // namespace kiln::models
