// Flux.1 (Black Forest Labs): dev (with the distilled-guidance embedding,
// also Kontext-dev, which takes reference images), Fill-dev (dev inpainting
// from a masked image) and schnell (without the guidance embedding).
// CLIP-L gives the pooled vector, T5-XXL the context, the DiT predicts the
// rectified-flow velocity on a 16-channel latent.
#pragma once

#include "models/family.h"

namespace kiln::models {

const Family& flux_dev_family();
const Family& flux_fill_family();
const Family& flux_schnell_family();

// What the Flux families share with Chroma: the T5, DiT and autoencoder
// modules (any prefix: BFL's files have none, ComfyUI's all-in-one files
// text_encoders.t5xxl.transformer., model.diffusion_model., vae.) and the
// latent format (16 channels, scale 0.3611, shift 0.1159).
ModuleSpec flux_t5_module();
ModuleSpec flux_dit_module();
ModuleSpec flux_vae_module();
LatentFormat flux_latent_format();
// Whether the files hold a Flux-type DiT (BFL's double_blocks.0 attention, or
// diffusers' single_transformer_blocks).
bool has_flux_dit(const FileSet& files);

}  // namespace kiln::models
