// SD3's and SD3.5's diffusion transformer, the MMDiT (Stability AI's
// mmditx.py): text and image tokens in separate streams with their own
// weights, joined in one attention per block. A p x p convolution makes the
// image's tokens (p = 2), a learned position embedding of
// pos_embed_max_size^2 positions is cropped around its centre to the
// image's grid and added once; the timestep and the pooled CLIP vector are
// summed into the vector every block's adaLN modulation reads. The last
// block's text stream ends in its attention ("pre only"). MMDiT-X (SD3.5
// Medium) adds to some blocks a second attention over the image tokens
// alone (x_block.attn2). SD3.5 RMS-normalises q and k per head (ln_q,
// ln_k); SD3 does not.
//
// Configuration from Stability's tensor names (sd3.5_large.safetensors;
// "model.diffusion_model." in the all-in-one and ComfyUI files):
// x_embedder.proj [hidden, channels, p, p], pos_embed [1, M^2, hidden],
// context_embedder [hidden, context], y_embedder.mlp.0 [hidden, pooled],
// joint_blocks.N counted, mlp.fc1 [mlp, hidden], ln_q [head width] (64, the
// width Stability fixes, without it), attn2 per block.
//
// Token layout of one evaluation: the text tokens, then the image's patches
// (row-major); no attention mask.
#pragma once

#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct MmditConfig {
    int64_t channels = 16;  // latent planes in and out
    int patch = 2;
    int64_t hidden = 1536;
    int64_t heads = 24;
    int64_t mlp_hidden = 6144;
    int64_t context_dim = 4096;
    int64_t pooled_dim = 2048;  // y_embedder's input: pooled CLIP-L then CLIP-G
    int64_t pos_embed_max_size = 192;
    int depth = 24;
    bool qk_norm = false;                // SD3.5's ln_q / ln_k
    std::vector<bool> x_self_attention;  // per block: MMDiT-X's attn2
    bool diffusers_names = false;        // diffusers' SD3Transformer2DModel (pos_embed.pos_embed)

    int64_t head_dim() const { return hidden / heads; }
};

// The inputs of one evaluation (ggml ne order).
struct MmditInputs {
    ggml_tensor* x = nullptr;          // ne [W, H, channels, B]: W, H multiples of patch
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1] (the network multiplies by 1000)
    ggml_tensor* y = nullptr;          // ne [pooled_dim, B]
    ggml_tensor* context = nullptr;    // ne [context_dim, T, B]
    ggml_tensor* positions = nullptr;  // I32 ne [patches]: mmdit_positions()
    // BlockStage Rest and Cached (MmditBuildOptions::split): the state after
    // the front blocks and the middle blocks' residual, ne [hidden, T + N, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
};

// The rows of the position embedding's M x M grid that a grid of w x h
// patches takes, row-major: the crop around the grid's centre (top (M - h)
// / 2, left (M - w) / 2), for MmditInputs::positions. Requires w, h <= M.
std::vector<int32_t> mmdit_positions(const MmditConfig& c, int64_t w, int64_t h);

struct MmditBuildOptions {
    bool flash_attention = false;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    std::vector<int> skip_blocks;  // skip-layer guidance's pass: joint blocks left out
    // The part of the evaluation to build (models/nets/block_stages.h). Its
    // blocks are the joint blocks that keep the text stream
    // (DiffusionCapabilities::cache_blocks of them); a last, pre-only block
    // runs after them, with the final layer, in every stage but Front.
    BlockSplit split;
};

class Mmdit final : public DiffusionNetwork {
  public:
    // Error (BadFile) if the tensors under the declarer's prefix are not an
    // MMDiT, naming the tensor.
    static Result<std::unique_ptr<Mmdit>> create(io::WeightDeclarer& weights);
    ~Mmdit() override;
    const MmditConfig& config() const { return config_; }

    // Returns the velocity ne [W, H, channels, B], with a cut marker
    // "joint_blocks.N" after each block: the text then the image tokens as
    // one tensor ne [hidden, T + N, B], the image tokens alone once the
    // text stream has ended. An error (nothing built) when the inputs do
    // not fit the network (the stream and residual options.split's stage
    // reads included). Other stages than Whole give what BlockStage says.
    Result<ggml_tensor*> build(ggml_context* ctx, const MmditInputs& in, const MmditBuildOptions& options) const;

    // DiffusionNetwork: the inputs above made from a job's shape.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;

  private:
    struct Blocks;
    Mmdit();
    void declare(io::WeightDeclarer& w);

    MmditConfig config_;
    std::vector<int64_t> pos_embed_shape_;  // as the file has it
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
