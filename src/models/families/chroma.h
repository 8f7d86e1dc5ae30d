// Chroma (Lodestone Rock): Flux.1-schnell's DiT with its per-block
// modulation replaced by one distilled guidance network
// (distilled_guidance_layer.*), conditioned on T5-XXL alone, trained for
// real classifier-free guidance with a negative prompt.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& chroma_family();

}  // namespace kiln::models
