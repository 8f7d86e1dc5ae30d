// Stable Diffusion 2.x: OpenCLIP ViT-H/14 text encoder (penultimate layer,
// zero padding), a UNet with a 1024-wide context and linear projections, the
// KL autoencoder; eps (base) or v (768-v) prediction.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& sd2_family();

}  // namespace kiln::models
