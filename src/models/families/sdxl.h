// Stable Diffusion XL (base 1.0, Turbo, Lightning, Hyper, SSD-1B, Vega,
// inpainting): CLIP ViT-L and OpenCLIP ViT-bigG penultimate hidden states
// side by side (2048 wide), bigG's pooled projection and the size
// micro-conditioning in the UNet's `y`, the KL autoencoder at scale 0.13025.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& sdxl_family();

}  // namespace kiln::models
