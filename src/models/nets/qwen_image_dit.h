// Qwen-Image's diffusion transformer (diffusers' QwenImageTransformer2DModel;
// Qwen-Image, and the Qwen-Image-Edit models that read reference images): an
// MMDiT of 60 dual-stream blocks, width 3072 in 24 heads of 128. The text
// stream is Qwen2.5-VL's 3584-wide hidden states through an RMSNorm
// (txt_norm) and txt_in; the image stream is the 16-channel latent in 2 x 2
// patches (64 features each, channel slowest) through img_in. Each block
// modulates both streams from the timestep alone (img_mod / txt_mod: shift,
// scale, gate for the attention, then for the MLP), runs one attention over
// the text and image tokens with per-head RMSNorm on q and k and RoPE, and a
// GELU (tanh) MLP per stream. The final layer (norm_out, an
// AdaLayerNormContinuous: scale, then shift) and proj_out read the image's
// tokens.
//
// Configuration from diffusers' tensor names (a transformer/ folder, no
// prefix; "model.diffusion_model." in ComfyUI's files): img_in [hidden, 64],
// txt_in [hidden, context], transformer_blocks.0.attn.norm_q [head width],
// transformer_blocks.0.img_mlp.net.0.proj [mlp, hidden], proj_out
// [4 x 16, hidden], the blocks counted. RoPE axes (16, 56, 56) over (frame,
// row, column), theta 10000, for heads of 128; another head width needs
// metadata "kiln.qwen_image.axes_dim". Qwen-Image-Edit-2511's zero_cond_t
// (the references' tokens modulated at t = 0) changes no weight: ComfyUI's
// 2511 files carry an empty __index_timestep_zero__ tensor to say so, and
// for other files the caller asks for it at create (sd-cli's
// --qwen-image-zero-cond-t).
//
// Token layout of one evaluation: the text tokens, the image's patches
// (row-major), then each reference latent's. Positions (frame, row, col), as
// diffusers' QwenEmbedRope with scale_rope:
//   image row r of h, column c of w   (0, r - (h - h/2), c - (w - w/2))
//   reference i, likewise             (i + 1, ...)
//   text token l                      (s + l, s + l, s + l), s the largest
//                                     max(h/2, w/2) over all the images
// (integer halves); no attention mask.
#pragma once

#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct QwenImageConfig {
    int64_t channels = 16;  // latent planes in and out
    int patch = 2;
    int64_t hidden = 3072;
    int64_t heads = 24;
    int64_t mlp_hidden = 12288;
    int64_t context_dim = 3584;
    int depth = 60;
    std::vector<int> axes_dim = {16, 56, 56};
    float theta = 10000.0f;
    // Qwen-Image-Edit-2511: the reference tokens' modulation is the one of
    // timestep 0, the image's the one of t.
    bool zero_cond_t = false;

    int64_t head_dim() const { return hidden / heads; }
};

// A latent's patches across (w) and down (h).
struct QwenImageGrid {
    int64_t w = 0, h = 0;
};

// The inputs of one evaluation (ggml ne order).
struct QwenImageInputs {
    ggml_tensor* x = nullptr;          // ne [W, H, channels, B]: W, H multiples of patch
    std::vector<ggml_tensor*> refs;    // reference latents ne [w_i, h_i, channels, B], tokens after x's
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1] (the network multiplies by 1000)
    ggml_tensor* context = nullptr;    // ne [context_dim, T, B]
    ggml_tensor* rope = nullptr;       // F32 ne qwen_image_rope_shape(): qwen_image_rope_table()
    // BlockStage Rest and Cached (QwenImageBuildOptions::split): the stream
    // after the front blocks and the middle blocks' residual, ne [hidden,
    // tokens, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
};

struct QwenImageBuildOptions {
    bool flash_attention = false;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    // The part of the evaluation to build (models/nets/block_stages.h).
    BlockSplit split;
};

// The RoPE table of every token in the layout above, for
// QwenImageInputs::rope: ne [head_dim, tokens, 2] (nn::rope_axes_table).
// Across `seams` each image's rows (and columns) repeat with its own height
// (and width).
std::vector<float> qwen_image_rope_table(const QwenImageConfig& c, int64_t txt_tokens, QwenImageGrid image,
                                         const std::vector<QwenImageGrid>& refs, nn::Seams seams = {});
std::vector<int64_t> qwen_image_rope_shape(const QwenImageConfig& c, int64_t txt_tokens, QwenImageGrid image,
                                           const std::vector<QwenImageGrid>& refs);

class QwenImageDit final : public DiffusionNetwork {
  public:
    // Error (BadFile) if the tensors under the declarer's prefix are not a
    // Qwen-Image DiT, naming the tensor. `zero_cond_t`: Edit-2511's
    // modulation of the reference tokens (QwenImageConfig::zero_cond_t),
    // also set by the file's __index_timestep_zero__.
    static Result<std::unique_ptr<QwenImageDit>> create(io::WeightDeclarer& weights, bool zero_cond_t = false);
    ~QwenImageDit() override;
    const QwenImageConfig& config() const { return config_; }

    // Returns the velocity ne [W, H, channels, B] (reference tokens
    // dropped), with a cut marker "transformer_blocks.N" after each block:
    // the text, image and reference tokens as one tensor ne [hidden, tokens,
    // B]. An error (nothing built) when the inputs do not fit the network
    // (the stream and residual options.split's stage reads included). Other
    // stages than Whole give what BlockStage says.
    Result<ggml_tensor*> build(ggml_context* ctx, const QwenImageInputs& in,
                               const QwenImageBuildOptions& options) const;

    // DiffusionNetwork: the inputs above made from a job's shape.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;

  private:
    struct Blocks;
    QwenImageDit();
    void declare(io::WeightDeclarer& w);

    QwenImageConfig config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
