// The Flux.1 diffusion transformer (Black Forest Labs' flux/model.py: dev,
// schnell, Kontext; Fill and the Control models take extra latent channels)
// and Chroma's variant of it. Its shape is read from the weights (BFL's
// tensor names under a prefix: "" for flux1-dev.safetensors,
// "model.diffusion_model." in ComfyUI all-in-one files):
//   img_in.weight [hidden, in_channels], txt_in.weight [hidden, context_dim],
//   vector_in.in_layer.weight [hidden, vec_dim], guidance_in.* present or not,
//   double_blocks.N / single_blocks.N counted, head_dim from
//   double_blocks.0.img_attn.norm.query_norm.scale, mlp_hidden from
//   double_blocks.0.img_mlp.0.weight, out_channels from final_layer.linear;
//   Chroma: distilled_guidance_layer.* instead of time_in, vector_in,
//   guidance_in and every modulation layer.
// RoPE splits head_dim 128 into BFL's axes {16, 56, 56}; another head_dim
// needs the metadata key "kiln.flux.axes_dim" ("8,12,12": small test models).
//
// Token layout of one evaluation: the text tokens, the image's patches
// (row-major, 2x2 latent pixels each), then each Kontext reference latent's
// patches. Every token has three positions (index, row, col):
//   text                (0, 0, 0)
//   image               (0, row, col)
//   reference latent i  (1, row + h_off_i, col + w_off_i)
// The first reference sits at offset (0, 0): BFL's Kontext (index 1, no
// offset), which ComfyUI and stable-diffusion.cpp agree on. Each further
// reference (h_i by w_i patches) is placed beside the ones before it (which
// span H by W patches from the origin): to their right (w_off = W) when
// h_i + H > w_i + W, else below them (h_off = H). That is ComfyUI's default
// ("offset") rule, in patches; stable-diffusion.cpp applies the same rule
// with the offsets counted in latent pixels (twice as far). Kontext was
// trained with one reference, so neither is canonical beyond the first.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct FluxConfig {
    int64_t latent_channels = 16;  // in_channels / (patch*patch)
    int64_t in_channels = 64;      // img_in's input width
    int64_t out_channels = 64;     // final_layer.linear's output width
    int64_t hidden = 3072;
    int64_t heads = 24;  // hidden / head_dim; head_dim = sum(axes_dim) = 128
    int64_t mlp_hidden = 12288;
    int64_t context_dim = 4096;  // txt_in input (T5 width)
    int64_t vec_dim = 768;       // vector_in input (CLIP-L pooled); 0 for Chroma
    int double_blocks = 19;
    int single_blocks = 38;
    bool guidance_embed = true;  // guidance_in present (dev, Kontext), absent in schnell
    bool chroma = false;         // distilled_guidance_layer.* replaces the modulations
    std::vector<int> axes_dim = {16, 56, 56};
    float theta = 10000.0f;
    int patch = 2;
    // The file names the tensors as diffusers' FluxTransformer2DModel does
    // (x_embedder, transformer_blocks.N.attn.to_q, ...), not as BFL does.
    bool diffusers_names = false;
    bool qkv_bias = true;  // img_attn.qkv.bias present (every released Flux and Chroma)
    // Chroma's approximator (distilled_guidance_layer): 64 inputs (timestep,
    // guidance and modulation-index embeddings), hidden width, layers.N count.
    int64_t approximator_in = 64;
    int64_t approximator_hidden = 5120;
    int approximator_layers = 5;

    int64_t head_dim() const { return hidden / heads; }
    // Channels of the velocity build() returns (out_channels / patch^2:
    // latent_channels, except for Fill and Control models, whose inputs
    // carry extra channels).
    int64_t velocity_channels() const { return out_channels / (patch * patch); }
    // Flux.1-Fill: x carries the masked image's latent and the pixel mask
    // after the latent (LatentConcat::MaskedImageThenPixelMask).
    bool fill() const { return latent_channels > 2 * velocity_channels(); }
    // Chroma: modulation vectors the approximator makes, 3 per single block,
    // 12 per double block and 2 for the final layer (344 for 19 + 38 blocks).
    int64_t chroma_modulations() const { return 3 * single_blocks + 12 * double_blocks + 2; }
};

// The inputs of one evaluation (ggml ne order). Fill and Control models take
// their conditioning as extra latent channels of x (in_channels /
// patch^2 in all: Fill's 16 + 16 masked-image + 64 mask channels).
struct FluxInputs {
    ggml_tensor* x = nullptr;          // ne [W, H, latent_channels, B]; W, H multiples of patch
    std::vector<ggml_tensor*> refs;    // Kontext reference latents, each ne [w_i, h_i, velocity_channels(), B];
                                       // appended as extra image tokens after x's
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1] (the network multiplies by 1000 as
                                       // BFL's timestep_embedding does)
    // F32 ne [B] distilled guidance (dev: 3.5): required iff guidance_embed,
    // null otherwise, except Chroma: its approximator takes a guidance input
    // (null: 0, as Chroma is run).
    ggml_tensor* guidance = nullptr;
    ggml_tensor* context = nullptr;  // ne [context_dim, txt_tokens, B] (T5 hidden states)
    ggml_tensor* pooled = nullptr;   // ne [vec_dim, B] (CLIP-L pooled); null for Chroma
    // F32 ne flux_rope_shape(): from flux_rope_table(), for the text tokens,
    // x's grid and the refs' grids in order.
    ggml_tensor* rope = nullptr;
    // Optional F32 additive mask over the keys, ne flux_attention_mask_shape()
    // (0 attend, -inf ignore), from flux_attention_mask(): Chroma's T5
    // padding mask. The graph expands it once to ne [tokens, tokens, 1, B]
    // for every block's attention. Null: every token attends to every token.
    ggml_tensor* mask = nullptr;
    // BlockStage Rest and Cached (FluxBuildOptions::split): the stream after
    // the front blocks and the middle blocks' residual, ne [hidden, tokens, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
    // Chroma only (required there, null otherwise): F32 ne chroma_index_shape(),
    // from chroma_index_table(): the embeddings of the modulation indices,
    // computed on the host in double precision.
    ggml_tensor* chroma_index = nullptr;
};

struct FluxBuildOptions {
    bool flash_attention = false;  // ggml's fused kernel: K/V (and the mask) in F16, not bit-identical
    // Skip-layer guidance's pass (sd-cli's --skip-layers): blocks left out,
    // numbered double blocks first, then single blocks (double_blocks + j is
    // single block j). Numbers past the last block skip nothing.
    std::vector<int> skip_blocks;
    // The part of the evaluation to build (models/nets/block_stages.h); the
    // blocks are numbered as skip_blocks numbers them.
    BlockSplit split;
    // Where the graph computes: on the CPU the tanh GELU is composed of exact
    // ops (ggml's CPU GELU reads an F16 table); on a device it is ggml_gelu.
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
};

// A latent's size in patches (W / patch by H / patch).
struct FluxTokenGrid {
    int64_t w = 0, h = 0;
};

// Tokens of one evaluation: text, image, references.
int64_t flux_token_count(int64_t txt_tokens, FluxTokenGrid image, const std::vector<FluxTokenGrid>& refs);

// BFL's layer `bfl_stem` ("double_blocks.0.img_attn.qkv") in diffusers'
// FluxTransformer2DModel names: one name, or a fused projection's parts in
// row order (attn.to_q, attn.to_k, attn.to_v, then a single block's proj_mlp).
std::vector<std::string> flux_diffusers_names(const std::string& bfl_stem);

// The RoPE table of every token, in the layout above, for FluxInputs::rope:
// ne [head_dim, tokens, 2], F32. Plane 0 holds each pair's cosine twice
// (cos a_j, cos a_j); plane 1 the signed sines (-sin a_j, sin a_j), so that
// rope(x) = x * plane0 + swap_pairs(x) * plane1. The angle of pair j of axis
// a is pos_a * theta^(-2j / axes_dim[a]), axis 0's pairs first; computed in
// double precision. The same for every batch entry.
// References: index 1 each, laid out side by side (offsets, sd-cli's and
// ComfyUI's default); with increase_ref_index (sd-cli's
// --increase-ref-index), index 1, 2, ... in order, each at row and column 0.
// Across `seams` each grid's rows (and columns) repeat with its own height
// (and width): nn::rope_axes_table's periods.
std::vector<float> flux_rope_table(const FluxConfig& c, int64_t txt_tokens, FluxTokenGrid image,
                                   const std::vector<FluxTokenGrid>& refs, bool increase_ref_index = false,
                                   nn::Seams seams = {});
std::vector<int64_t> flux_rope_shape(const FluxConfig& c, int64_t txt_tokens, FluxTokenGrid image,
                                     const std::vector<FluxTokenGrid>& refs);

// Chroma's mask: `txt_valid` holds batch * txt_tokens flags (batch entry
// after batch entry; 1 a real token, 0 padding). Returns batch * (txt_tokens
// + image_tokens) additive values, ne [txt_tokens + image_tokens, batch]:
// 0 for real text tokens and every image token (references included), -inf
// for padding. Which padding tokens count as real (Chroma keeps one) is the
// caller's choice.
std::vector<float> flux_attention_mask(const std::vector<float>& txt_valid, int64_t image_tokens, int64_t batch = 1);
std::vector<int64_t> flux_attention_mask_shape(int64_t txt_tokens, int64_t image_tokens, int64_t batch = 1);

// Chroma: timestep_embedding(index * 1000, 32) of every modulation index
// 0..chroma_modulations()-1, ne [32, chroma_modulations()], F32 (computed in
// double; the float32 of ComfyUI and stable-diffusion.cpp differs by up to
// ~0.02 at Chroma's largest indices).
std::vector<float> chroma_index_table(const FluxConfig& c);
std::vector<int64_t> chroma_index_shape(const FluxConfig& c);

class FluxDit final : public DiffusionNetwork {
  public:
    // Error if the tensors under `prefix` are not a Flux or Chroma DiT.
    static Result<std::unique_ptr<FluxDit>> create(io::WeightDeclarer& weights);
    ~FluxDit();
    const FluxConfig& config() const { return config_; }

    // Returns the velocity ne [W, H, velocity_channels(), B] (unpatchified,
    // reference tokens dropped), with cut markers "double_blocks.N" (the
    // streams after double block N as one tensor: text then image tokens,
    // ne [hidden, tokens, B]) and "single_blocks.N". An error (nothing
    // built) when the inputs do not fit: x's or a reference's channels, W/H
    // not multiples of patch, the context width, guidance missing or given
    // to a network without guidance_in, pooled missing or given to Chroma,
    // batch sizes, the rope, mask or chroma_index shape.
    Result<ggml_tensor*> build(ggml_context* ctx, const FluxInputs& in, const FluxBuildOptions& options) const;

    // DiffusionNetwork: the inputs above made from a job's shape (the RoPE
    // table, Chroma's index embeddings), and Chroma's text mask.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;
    std::vector<float> text_mask_values(const std::vector<float>& text_valid,
                                        const DiffusionShape& shape) const override;
    std::vector<std::string> lora_split_names(const std::string& stem) const override {
        return flux_diffusers_names(stem);
    }
    // In diffusers' names: BFL's layer each weight is (a part of), for
    // kohya's and ComfyUI's LoRAs.
    std::optional<LoraFusedLayer> lora_fused_layer(const std::string& stem) const override;
    bool lora_other_name_swaps_halves(const std::string& stem) const override;

  private:
    struct Blocks;
    FluxDit();
    Status declare(io::WeightDeclarer& w);

    FluxConfig config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
