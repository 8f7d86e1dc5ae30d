// What SD1.x, SD2.x and SDXL share: the probes that find a UNet and a KL
// autoencoder, and the context width a UNet's cross-attention reads.
#pragma once

#include <cstdint>

#include "models/family.h"

namespace kiln::models {

ModuleSpec unet_module();
ModuleSpec vae_module();
// SD1/SD2's one text encoder, in a checkpoint or its own --clip_l file.
ModuleSpec single_clip_module(const std::string& name);
// SD1/SD2 detection: 2 when the UNet's context is `width` wide; 1 when it is
// not but the text encoder sits under `encoder_prefix` (small test models
// of other widths); else 0.
int detect_sd_checkpoint(const FileSet& files, int64_t width, const std::string& encoder_prefix);
// SD1.x's and SD2.x's latent format (ComfyUI's SD15): scale 0.18215 and its
// preview projection.
LatentFormat sd15_latent_format();
// The width of the context the UNet's first cross-attention takes (768 SD1,
// 1024 SD2, 2048 SDXL), or 0 when the files hold no such UNet.
int64_t unet_context_width(const FileSet& files);

}  // namespace kiln::models
