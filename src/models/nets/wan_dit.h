// Wan's video diffusion transformer (Alibaba's Wan 2.1 and Wan 2.2:
// T2V-1.3B, T2V-14B, the A14B experts, TI2V-5B, Wan 2.1's I2V and FLF2V), as
// the original wan/modules/model.py defines WanModel with model_type 't2v',
// 'i2v' and 'flf2v' (PyTorch reference: training/reference/wan_dit.py). One stream of video
// tokens: the latent [C, F, H, W] of each batch item cut into 1 x 2 x 2
// patches by patch_embedding (a Conv3d, kernel = stride = patch: a linear map
// of each patch's (c, ph, pw) features), tokens in (frame, row, column)
// order. Each block modulates from the timestep (its modulation [1, 6, dim]
// plus time_projection's six vectors: shift, scale, gate of the
// self-attention, then of the FFN), runs a self-attention over the tokens
// with q and k RMS-normed over the whole width and turned by a 3-D RoPE, a
// cross-attention to the text (norm3, a LayerNorm with affine, then q from
// the tokens, k and v from the context, RMS-normed, no RoPE, no gate) and a
// GELU (tanh) FFN. The head modulates by head.modulation plus the time
// embedding itself (shift, scale) and gives each token's patch with features
// (ph, pw, c), channel fastest. Wan 2.2's blocks take a timestep per token;
// the one use of it, TI2V's image-to-video, gives the first latent frame's
// tokens 0 and the rest the job's (WanDitBuildOptions::clean_first_frame),
// so the modulations are made for both and each applied to its tokens.
//
// Time: the network takes sigma in [0, 1] (as the other flow DiTs do) and
// embeds t = 1000 sigma, Wan's timestep: time_embedding of [cos, sin] of
// t 10000^(-i / (freq_dim / 2)), then time_projection. The output is the
// model's own: the flow velocity (noise - x0).
//
// Text: the context is each item's prompt rows of umT5-XXL's hidden states
// (Wan's pipelines cut the T5 output to the prompt's length). The original
// pads every prompt to kWanTextLength = 512 rows with ZERO rows before
// text_embedding, and the cross-attention has no mask, so the padded rows
// (text_embedding of zeros, not zeros) are attended; the network does the
// same padding itself. An item's rows past its prompt must be zeros: then a
// batch of prompts of different lengths, padded with zeros to one length,
// gives each item the original's numbers. A context repeated to another's
// length would not (hence capabilities().joint_attention, which makes CFG
// passes of different lengths run apart).
//
// RoPE (rope_apply): head_dim d is d / 2 complex pairs of adjacent features;
// the first d - 4 (d // 6) features turn with the frame, the next 2 (d // 6)
// with the row, the last 2 (d // 6) with the column (44, 42, 42 for heads of
// 128), each axis's pair j by pos 10000^(-2j / its features); frame, row
// and column count from 0, and each is below 1024 (the original's table,
// rope_params(1024, ...)).
//
// Configuration from the original's tensor names (Wan-AI's files; ComfyUI's
// wan2.1_t2v_*.safetensors under "model.diffusion_model."): dim, in_dim and
// the patch from patch_embedding [dim, in_dim, 1, p, p], text_dim from
// text_embedding.0, freq_dim from time_embedding.0, ffn_dim from
// blocks.0.ffn.0, out_dim from head.head [p p out_dim, dim], the blocks
// counted. Heads: dim / 128 (every release's head width), or metadata
// "kiln.wan.heads" (small test models). in_dim larger than out_dim is a
// concatenated condition (Wan 2.2 I2V-A14B: 16 noise, 4 mask and 16 image
// channels), the caller's to fill.
//
// Image context (Wan 2.1 I2V and FLF2V: img_emb.* and cross_attn.k_img /
// v_img / norm_k_img): CLIP vision's hidden states of the first frame (FLF2V:
// of the first then the last frame, plus img_emb.emb_pos) go through img_emb
// (LayerNorm, Linear, GELU, Linear, LayerNorm) and sit before the text rows;
// each cross-attention attends to the text and, with k_img and v_img, to
// the image rows apart (no mask) and adds the two before its output
// projection (WanI2VCrossAttention).
//
// VACE (Wan 2.1 VACE 1.3B and 14B: vace_patch_embedding and vace_blocks.N,
// the original's wan/modules/vace_model.py VaceWanModel; PyTorch reference
// training/reference/wan_vace.py): a context of vace_in_dim (96) planes per
// latent frame (pipeline/vace_context.h builds it) is cut into patches as x
// is; VACE block n, a block of the main kind that starts with before_proj(c)
// + x (n = 0, x the embedded tokens before any block), gives after_proj(c),
// the hint added, times the job's strength, to the stream after main block
// n * (layers / vace blocks) (the original's vace_layers: every second of
// the 1.3B's 30 blocks, every fifth of the 14B's 40). The original runs the VACE blocks first and keeps every
// hint; here each runs right after its main block, which gives the same
// numbers and keeps one hint at a time, and a cut after a main block carries
// the VACE stream with it.
#pragma once

#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

// WanModel's text_len: every context is padded with zero rows to this many.
constexpr int64_t kWanTextLength = 512;
// Positions the original's RoPE table covers along each axis.
constexpr int64_t kWanRopePositions = 1024;

struct WanDitConfig {
    int64_t in_channels = 16;  // patch_embedding's input planes (more than out_channels: a concatenated condition)
    int64_t out_channels = 16;
    int patch = 2;  // spatial; the temporal patch is 1 in every release
    int64_t dim = 1536;
    int64_t heads = 12;
    int64_t ffn_dim = 8960;
    int64_t text_dim = 4096;
    int64_t freq_dim = 256;
    int layers = 30;
    // Width of the image context's rows (CLIP vision's, 1280); 0: no image context.
    int64_t clip_dim = 0;
    // Images whose rows the image context holds: 2 for FLF2V (emb_pos covers
    // both), else 1.
    int image_context_images = 1;
    // FLF2V: rows of img_emb.emb_pos, which the image context must have; 0: any.
    int64_t image_context_rows = 0;
    // VACE: its blocks (0: none) and its context's planes per latent frame.
    int vace_layers = 0;
    int64_t vace_in_channels = 0;

    int64_t head_dim() const { return dim / heads; }
    // Features of a head that turn with the frame, the row and the column.
    std::vector<int> rope_axes() const;
};

// A latent's patches: frames, rows (h) and columns (w).
struct WanGrid {
    int64_t frames = 1, h = 0, w = 0;
    int64_t tokens() const { return frames * h * w; }
};

// The RoPE table of the grid's tokens in (frame, row, column) order, for
// WanDitInputs::rope: ne [head_dim, tokens, 2] (nn::rope_axes_table).
// Across `seams` the rows (and columns) repeat with the grid's height (and
// width); frames never wrap.
std::vector<float> wan_rope_table(const WanDitConfig& c, WanGrid grid, nn::Seams seams = {});
std::vector<int64_t> wan_rope_shape(const WanDitConfig& c, WanGrid grid);

// The inputs of one evaluation (ggml ne order).
struct WanDitInputs {
    // ne [W, H, frames * in_channels, B]: each item the original's [C, F, H,
    // W], channel after channel, each channel frame after frame. W and H
    // multiples of the patch; frames = ne[2] / in_channels.
    ggml_tensor* x = nullptr;
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1] (the network multiplies by 1000)
    // ne [text_dim, tokens, B], 1 <= tokens <= kWanTextLength: each item's
    // prompt rows, then zeros.
    ggml_tensor* context = nullptr;
    ggml_tensor* rope = nullptr;  // F32 ne wan_rope_shape(): wan_rope_table()
    // clip_dim > 0: ne [clip_dim, rows, B], CLIP vision's rows of the image
    // (FLF2V: the first frame's, then the last's).
    ggml_tensor* image_context = nullptr;
    // vace_layers > 0: ne [W, H, frames * vace_in_channels, B], x's layout.
    ggml_tensor* vace_context = nullptr;
    // BlockStage Rest and Cached (WanDitBuildOptions::split): the stream
    // after the front blocks and the middle blocks' residual, ne [dim,
    // tokens, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
};

struct WanDitBuildOptions {
    bool flash_attention = false;  // ggml's fused kernel: K/V in F16, not bit-identical
    // The first latent frame's tokens modulated as at timestep 0, the rest
    // at `timesteps` (Wan 2.2's per-token t, as TI2V-5B's image-to-video
    // sets it: the first frame is the given image's latent).
    bool clean_first_frame = false;
    float vace_strength = 1.0f;  // the hints' factor (sd-cli's --vace-strength)
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    // The part of the evaluation to build (models/nets/block_stages.h).
    BlockSplit split;
};

class WanDit final : public DiffusionNetwork {
  public:
    // Error (BadFile) if the tensors under the declarer's prefix are not a
    // Wan DiT, naming what is wrong.
    static Result<std::unique_ptr<WanDit>> create(io::WeightDeclarer& weights);
    ~WanDit() override;
    const WanDitConfig& config() const { return config_; }

    // Returns the prediction ne [W, H, frames * out_channels, B] (x's
    // layout), with a cut marker "blocks.N" after each block: the tokens ne
    // [dim, tokens, B]. An error (nothing built) when the inputs do not fit
    // the network (the stream and residual options.split's stage reads
    // included). Other stages than Whole give what BlockStage says.
    Result<ggml_tensor*> build(ggml_context* ctx, const WanDitInputs& in, const WanDitBuildOptions& options) const;

    // DiffusionNetwork: the inputs above made from a job's shape
    // (shape.frames latent frames).
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;

  private:
    struct Blocks;
    WanDit();
    void declare(io::WeightDeclarer& w);

    WanDitConfig config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
