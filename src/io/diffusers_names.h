// Turns the tensors of a diffusers folder (named "unet/down_blocks.0...",
// "vae/encoder...", "text_encoder/text_model...") into kiln's internal ldm
// names, so a diffusers folder and a single-file checkpoint of the same model
// list the same tensors. The family (SD1, SD2, SDXL) and the UNet's block
// layout are read from the tensors themselves.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "io/name_map.h"
#include "io/tensor_info.h"

namespace kiln::io {

// QwenImage if transformer/ is Qwen-Image's DiT (its img_mod); Wan if it is
// Wan's (WanTransformer3DModel's condition_embedder);
// SDXL if there is a text_encoder_2; SD2 if the text encoder is 1024 wide;
// SD1 if 768 wide; for other widths, SD2 if the UNet's transformer
// projections are linear, SD1 if they are convolutions; nullopt for other
// pipelines (their names stay as they are).
std::optional<ModelFamily> detect_diffusers_family(const std::vector<TensorInfo>& tensors);
// Levels, resnets per level and attention levels from "<prefix>down_blocks.*"
// names ("unet/" in a diffusers folder; "" in a ControlNet's own file).
UnetLayout detect_unet_layout(const std::vector<TensorInfo>& tensors, std::string_view prefix = "unet/");

// Renames every "component/name" tensor that has a one-to-one ldm name, and
// gives VAE mid-attention weights their ldm 1x1-conv shape (the bytes are the
// same). Tensors whose ldm form needs their data combined or transposed
// (OpenCLIP's fused q/k/v, its text projection) keep their diffusers name
// under the component's ldm prefix; name_map.h says how to assemble them.
// Names nobody maps (extras) stay "component/name".
void rename_diffusers_tensors(ModelFamily family, std::vector<TensorInfo>& tensors);

// An autoencoder's file in diffusers' names (AutoencoderKL's and
// AutoencoderKLQwenImage's vae/diffusion_pytorch_model.safetensors): its
// encoder and decoder keep the ldm roots "encoder." and "decoder." but
// number diffusers' blocks (down_blocks, up_blocks, mid_block), which no
// original VAE names.
bool is_diffusers_vae(const std::vector<TensorInfo>& tensors);

// A ControlNet in diffusers' names (ControlNetModel, its folder or its
// diffusion_pytorch_model.safetensors): controlnet_cond_embedding.* is there.
bool is_diffusers_controlnet(const std::vector<TensorInfo>& tensors);
// Renames such a ControlNet's tensors to the original releases' ldm names
// under "control_model.", as diffusers' conversion script pairs them: the
// UNet encoder's names as for a UNet (down_blocks -> input_blocks, ...),
// controlnet_cond_embedding.{conv_in, blocks.k, conv_out} ->
// input_hint_block.{0, 2k + 2, 2n + 2} (n blocks), controlnet_down_blocks.k ->
// zero_convs.k.0, controlnet_mid_block -> middle_block_out.0. Names nobody
// maps stay.
void rename_diffusers_controlnet(std::vector<TensorInfo>& tensors);

}  // namespace kiln::io
