// Qwen-Image (Alibaba's Qwen team): a 20B MMDiT (models/nets/qwen_image_dit)
// conditioned on Qwen2.5-VL-7B's last hidden state under Qwen-Image's
// describe-the-image system turn, on Wan 2.1's VAE applied to one frame
// (models/nets/wan_vae, a per-channel normalised 16-channel latent).
#pragma once

#include "models/family.h"

namespace kiln::models {

// Qwen-Image and the Edit releases 2509 and 2511 (diffusers'
// QwenImageEditPlusPipeline for edit jobs).
const Family& qwen_image_family();
// The first Edit release ("Qwen-Image-Edit"; diffusers' QwenImageEditPipeline):
// the same networks, one input image, its own edit prompt.
const Family& qwen_image_edit_first_family();

}  // namespace kiln::models
