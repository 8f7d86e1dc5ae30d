// Wan 2.1 and 2.2 text-to-video (Alibaba's Wan team): a DiT over the latent
// clip's frames (models/nets/wan_dit) conditioned on umT5-XXL's hidden
// states (models/nets/t5_encoder), on Wan 2.1's causal 3D VAE
// (models/nets/wan_vae: 16 normalised channels, 8x smaller along each side,
// 4x along time). A job makes 4k + 1 frames (--video-frames); one frame is
// an image.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& wan_family();

// Wan 2.1's VAE latent as the sampler sees it (the VAE normalises its
// channels itself), with ComfyUI's Wan21 preview projection; Qwen-Image
// uses the same VAE.
LatentFormat wan21_latent_format();
// Wan 2.2's VAE's (TI2V-5B's): 48 channels, its own statistics inside the VAE.
LatentFormat wan22_latent_format();

}  // namespace kiln::models
