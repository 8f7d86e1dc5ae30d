// Tensor-name normalisation between the two naming conventions of Stable
// Diffusion weights.
//
// kiln names tensors the way the original single-file checkpoints do (ldm /
// CompVis / Stability: "model.diffusion_model.input_blocks.1.0.in_layers.0.weight").
// Diffusers folders name the same tensors per component (unet/, vae/,
// text_encoder/, text_encoder_2/) with diffusers / HF transformers names
// ("down_blocks.0.resnets.0.norm1.weight"). This file converts names in both
// directions for SD1.x, SD2.x and SDXL, and for Qwen-Image's VAE (Wan 2.1's:
// diffusers' AutoencoderKLQwenImage vs the original module tree). It maps names only; where the data
// must change too (OpenCLIP's fused q/k/v, its transposed text projection) the
// result says how, and the loader does it.
//
// The rules are data: per-component tables of {ldm, diffusers} name patterns,
// the UNet's generated from a UnetLayout the way diffusers' conversion scripts
// generate theirs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::io {

// QwenImage: Qwen-Image's folders (diffusers' QwenImagePipeline and its
// edit pipelines), of which only vae/ is renamed: AutoencoderKLQwenImage is
// Wan 2.1's VAE in diffusers' names, mapped to the original module tree's
// (models/nets/wan_vae.h) under "first_stage_model.". Its transformer/ and
// text_encoder/ keep their names, which kiln's networks read.
// Wan: Wan 2.1's folders (diffusers' WanPipeline, WanImageToVideoPipeline,
// WanVACEPipeline): transformer/ (WanTransformer3DModel) takes the original
// DiT's names under "model.diffusion_model." (ComfyUI's single files), vae/
// Wan 2.1's VAE names as Qwen-Image's; text_encoder/ (UMT5EncoderModel) and
// image_encoder/ (CLIPVisionModelWithProjection) keep their HF names, which
// kiln's networks read.
enum class ModelFamily { SD1, SD2, SDXL, QwenImage, Wan };

// A diffusers pipeline folder's parts. TextEncoder2 exists in SDXL only,
// Transformer (a DiT's transformer/) in Wan's tables only.
enum class ModelComponent { Unet, Vae, TextEncoder, TextEncoder2, Transformer };

// The diffusers subfolder of a component: "unet", "vae", "text_encoder", "text_encoder_2".
std::string_view diffusers_folder(ModelComponent component);

// The prefix the family's single-file checkpoints put before the component's
// tensors ("model.diffusion_model.", "first_stage_model.", "cond_stage_model.transformer.", ...);
// empty if the family has no such component.
std::string_view ldm_prefix(ModelFamily family, ModelComponent component);

// The block structure of a UNet, which decides its ldm block numbering:
// input_blocks.0 is conv_in, then each level has `layers_per_block` resnets
// (each followed by a transformer if the level has attention) and, except the
// last level, a downsampler; output_blocks mirror that with one more layer per level.
struct UnetLayout {
    int levels = 4;            // channel levels = diffusers down_blocks
    int layers_per_block = 2;  // resnets per down block (up blocks have one more)
    // Bit i set: level i has transformer blocks. Level 0 is the full-resolution one.
    unsigned attention_levels = 0b0111;

    bool has_attention(int level) const { return level >= 0 && level < 32 && ((attention_levels >> level) & 1u) != 0; }
    // SD1/SD2: 4 levels, attention on the first three. SDXL: 3 levels, attention on the last two.
    static UnetLayout for_family(ModelFamily family);
};

// How one tensor under the target name is made from tensors under the queried convention.
struct NameMapping {
    enum class Op {
        Same,       // the target is sources[0], renamed
        Concat3,    // the target is cat(sources[0..2]) along dim 0 (ldm in_proj = cat(q, k, v))
        Slice3,     // the target is third number `part` of sources[0] along dim 0 (q, k or v of in_proj)
        Transpose,  // the target is sources[0] transposed (2-D; OpenCLIP text_projection vs HF Linear)
    };

    std::string name;  // target name in the other convention (ldm names with their component prefix)
    Op op = Op::Same;
    // Concat3: which of the three sources the queried name is. Slice3: which third to take.
    int part = 0;
    // Full names in the queried convention; always includes the queried name.
    std::vector<std::string> sources;
};

// An ldm name's counterparts: usually one tensor, three for a fused OpenCLIP
// in_proj (one Slice3 mapping per q, k, v).
struct DiffusersNames {
    ModelComponent component = ModelComponent::Unet;
    std::vector<NameMapping> tensors;
};

// The conversion tables for one family, with the UNet table built for a given
// layout. Building costs a few hundred small strings; the free functions below
// keep one per family. Unknown names give nullopt; the caller decides whether
// that is an error (checkpoints carry extras such as model_ema.*, logit_scale).
class NameMap {
  public:
    explicit NameMap(ModelFamily family);
    // `vae_levels`: the AutoencoderKL's channel levels, which decide its
    // decoder's numbering (diffusers counts up_blocks from the lowest
    // resolution, ldm's decoder.up from the highest). SD's and Flux's have 4.
    NameMap(ModelFamily family, const UnetLayout& unet, int vae_levels = 4);
    ~NameMap();
    NameMap(NameMap&&) noexcept;
    NameMap& operator=(NameMap&&) noexcept;

    // A diffusers name of `component` (as in that subfolder's files) -> the ldm name.
    std::optional<NameMapping> diffusers_to_ldm(ModelComponent component, std::string_view name) const;
    // A full ldm name (with its component prefix) -> the component and its diffusers name(s).
    std::optional<DiffusersNames> ldm_to_diffusers(std::string_view ldm_name) const;

  private:
    struct Tables;
    std::unique_ptr<Tables> tables_;
};

// Same as NameMap(family).diffusers_to_ldm / ldm_to_diffusers, with the family's default UNet layout.
std::optional<NameMapping> diffusers_to_ldm(ModelFamily family, ModelComponent component, std::string_view name);
std::optional<DiffusersNames> ldm_to_diffusers(ModelFamily family, std::string_view ldm_name);

// True for the VAE mid-block attention q/k/v/proj_out weights
// ("[first_stage_model.]{encoder,decoder}.mid.attn_1.{q,k,v,proj_out}.weight"): ldm stores them
// as 1x1 conv weights [C, C, 1, 1], diffusers as linear weights [C, C], so the loader reshapes.
bool vae_attention_needs_reshape(std::string_view ldm_name);

}  // namespace kiln::io
