// The FLUX.2 diffusion transformer (Black Forest Labs' flux2 model.py:
// [klein] 4B and 9B, distilled and base; [dev] with its guidance
// embedding). Compared with Flux.1 (models/nets/flux_dit.h): the modulation
// is computed once per evaluation and shared by every block of a kind
// (double_stream_modulation_img/txt, single_stream_modulation), no linear
// layer has a bias, the MLPs are SwiGLU, there is no pooled-vector input,
// RoPE runs over four axes (t, h, w, l; 32 features each, theta 2000), and
// the DiT sees the autoencoder's 128-channel normalised latent one token per
// latent pixel (patch 1). Its shape is read from BFL's tensor names
// (flux-2-klein-4b.safetensors, no prefix; "model.diffusion_model." in
// ComfyUI files): img_in [hidden, 128], txt_in [hidden, context],
// double_blocks.0.img_attn.norm.query_norm.scale [head_dim],
// double_blocks.0.img_mlp.2 [hidden, mlp], the blocks counted. Another
// head width needs metadata "kiln.flux2.axes_dim" (and "kiln.flux2.theta").
// diffusers' Flux2Transformer2DModel names (a diffusers folder's
// transformer/) are read too (models/nets/bfl_names.h).
//
// Token layout of one evaluation: the text tokens, the image's latent pixels
// (row-major), then each reference latent's. Positions (t, h, w, l):
//   text token l        (0, 0, 0, l)
//   image (row, col)    (0, row, col, 0)
//   reference i         (10 + 10 i, row, col, 0)
// BFL's prc_txt, prc_img and encode_image_refs; no attention mask.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct Flux2Config {
    int64_t channels = 128;  // img_in's input and final_layer's output: the latent's channels
    int64_t hidden = 3072;
    int64_t heads = 24;
    int64_t mlp_hidden = 9216;  // SwiGLU's width (mlp.0 makes twice this)
    int64_t context_dim = 7680;
    int double_blocks = 5;
    int single_blocks = 20;
    bool guidance_embed = false;  // guidance_in present ([dev])
    bool diffusers_names = false;  // Flux2Transformer2DModel's names
    std::vector<int> axes_dim = {32, 32, 32, 32};
    float theta = 2000.0f;

    int64_t head_dim() const { return hidden / heads; }
};

// The inputs of one evaluation (ggml ne order).
struct Flux2Inputs {
    ggml_tensor* x = nullptr;          // ne [W, H, channels, B]: the latent
    std::vector<ggml_tensor*> refs;    // reference latents ne [w_i, h_i, channels, B], tokens after x's
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1] (the network multiplies by 1000)
    ggml_tensor* guidance = nullptr;   // F32 ne [B]: required iff guidance_embed, null otherwise
    ggml_tensor* context = nullptr;    // ne [context_dim, T, B]
    ggml_tensor* rope = nullptr;       // F32 ne flux2_rope_shape(): flux2_rope_table()
    // BlockStage Rest and Cached (Flux2BuildOptions::split): the stream after
    // the front blocks and the middle blocks' residual, ne [hidden, tokens, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
};

struct Flux2BuildOptions {
    bool flash_attention = false;  // ggml's fused kernel: K/V in F16, not bit-identical
    // Skip-layer guidance's pass: blocks left out, double blocks first, then
    // single blocks (double_blocks + j is single block j).
    std::vector<int> skip_blocks;
    // The part of the evaluation to build (models/nets/block_stages.h); the
    // blocks are numbered as skip_blocks numbers them.
    BlockSplit split;
};

// The latent grid (W by H pixels) of an evaluation and of each reference.
struct Flux2Grid {
    int64_t w = 0, h = 0;
};

// The RoPE table of every token in the layout above, for Flux2Inputs::rope:
// ne [head_dim, tokens, 2] (nn::rope_axes_table). Across `seams` each
// grid's rows (and columns) repeat with its own height (and width).
std::vector<float> flux2_rope_table(const Flux2Config& c, int64_t txt_tokens, Flux2Grid image,
                                    const std::vector<Flux2Grid>& refs, nn::Seams seams = {});
std::vector<int64_t> flux2_rope_shape(const Flux2Config& c, int64_t txt_tokens, Flux2Grid image,
                                      const std::vector<Flux2Grid>& refs);

class Flux2Dit final : public DiffusionNetwork {
  public:
    // Whether the tensors under `prefix` are a FLUX.2 DiT (its shared
    // modulation layers, in BFL's or diffusers' names), not a Flux.1 one.
    static bool looks_like_flux2(const io::ModelFile& file, const std::string& prefix);
    // Error (BadFile) if the tensors under the declarer's prefix are not a
    // FLUX.2 DiT, naming the tensor.
    static Result<std::unique_ptr<Flux2Dit>> create(io::WeightDeclarer& weights);
    ~Flux2Dit() override;
    const Flux2Config& config() const { return config_; }

    // Returns the velocity ne [W, H, channels, B] (reference tokens dropped),
    // with cut markers "double_blocks.N" (text then image tokens as one
    // tensor, ne [hidden, tokens, B]) and "single_blocks.N". An error
    // (nothing built) when the inputs do not fit the network (the stream and
    // residual options.split's stage reads included). Other stages than
    // Whole give what BlockStage says.
    Result<ggml_tensor*> build(ggml_context* ctx, const Flux2Inputs& in, const Flux2BuildOptions& options) const;

    // DiffusionNetwork: the inputs above made from a job's shape.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;
    // LoRA: BFL's stems in diffusers' names (PEFT and diffusers-trained
    // LoRAs), a double block's qkv as its to_q, to_k, to_v.
    std::vector<std::string> lora_split_names(const std::string& stem) const override;
    // In diffusers' names: BFL's layer each weight is (a part of).
    std::optional<LoraFusedLayer> lora_fused_layer(const std::string& stem) const override;
    bool lora_other_name_swaps_halves(const std::string& stem) const override;

  private:
    struct Blocks;
    Flux2Dit();
    void declare(io::WeightDeclarer& w);

    Flux2Config config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
