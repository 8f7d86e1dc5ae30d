// Qwen2.5-VL's vision tower (HF transformers' Qwen2_5_VisionTransformerPretrainedModel;
// training/reference/qwen25_vl.py): the image encoder Qwen-Image-Edit puts in its
// prompt. An image of H x W pixels (multiples of 28) is cut into 14x14 patches,
// each seen twice along time (a still image is a clip of two equal frames, as
// HF's processor makes it, so the Conv3d patch embedding is the sum of its two
// temporal kernels); 32 pre-norm blocks of width 1280 (16 heads of 80) attend
// within windows of 112x112 pixels, except every 8th block (7, 15, 23, 31:
// HF's fullatt_block_indexes), which attends over the whole image; a 2-D RoPE
// rotates each head's first half by the patch's row and its second half by its
// column; the merger RMS-normalises each patch, joins each 2x2 block of patches
// (5120 features) and projects it through an MLP with GELU to the LLM's width
// (3584). One output row per 28x28 pixels, in row-major order of the merged
// grid: the rows that replace the prompt's <|image_pad|> tokens.
//
// Per block: h = RMSNorm(x); qkv (biases), q and k rotated (NeoX pairs (i, i +
// 40) over the head, pair j < 20 at row * 10000^(-j/20), pair j >= 20 at
// column * 10000^(-(j-20)/20)); attention within the window (a block-diagonal
// mask over the patches reordered window by window, as HF reorders them by
// get_window_index) or whole; proj (bias); residual; x + down(silu(gate h') *
// up h') with biases. Windows are 4x4 merged units (window_size / patch /
// merge) counted from the top left, partial at the right and bottom edges.
//
// Two tensor namings, detected from the file:
//   HF's (Qwen2.5-VL checkpoints, ComfyUI's qwen_2.5_vl_7b.safetensors; the
//   caller's prefix ends in "visual."): patch_embed.proj.weight [1280, 3, 2,
//   14, 14], blocks.N.{norm1,norm2}.weight, blocks.N.attn.qkv.{weight,bias},
//   blocks.N.attn.proj.{weight,bias}, blocks.N.mlp.{gate,up,down}_proj.{weight,bias},
//   merger.ln_q.weight, merger.mlp.{0,2}.{weight,bias};
//   llama.cpp's mmproj GGUF (sd-cli's --llm_vision): v.patch_embd.weight and
//   v.patch_embd.weight.1 (the two temporal kernels), v.blk.N.attn_{q,k,v,out}.{weight,bias},
//   v.blk.N.{ln1,ln2}.weight, v.blk.N.ffn_{gate,up,down}.{weight,bias},
//   v.post_ln.weight (ln_q), mm.{0,2}.{weight,bias}.
// Sizes from the weights (width, MLP width, blocks, output width, patch and
// merge size); from llama.cpp's metadata keys where present, in a GGUF or a
// safetensors header: clip.vision.attention.head_count (else width / 80,
// Qwen2.5-VL's head width), clip.vision.n_wa_pattern (else 8),
// clip.vision.window_size (else 112), clip.vision.attention.layer_norm_epsilon
// (else 1e-6).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

struct QwenVisionConfig {
    enum class Naming { HuggingFace, LlamaCpp };
    Naming naming = Naming::HuggingFace;
    int64_t width = 1280;
    int64_t heads = 16;
    int64_t blocks = 32;
    int64_t mlp = 3420;
    int64_t out_width = 3584;  // the LLM's
    int64_t patch = 14;
    int64_t merge = 2;       // patches per merged token along each side
    int64_t window = 112;    // pixels along each side of an attention window
    int64_t full_every = 8;  // block i attends over the whole image when (i + 1) % full_every == 0
    float norm_eps = 1e-6f;

    // Pixels per output token along each side (28): image sides must be multiples of it.
    int64_t unit() const { return patch * merge; }
    bool full_attention(int64_t block) const { return (block + 1) % full_every == 0; }
};

// OpenAI CLIP's normalisation, which Qwen2.5-VL's processor applies.
constexpr std::array<float, 3> kQwenVisionMean = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr std::array<float, 3> kQwenVisionStd = {0.26862954f, 0.26130258f, 0.27577711f};

// The order in which the tower sees an image's patches: window after window
// (each window's merged units in row-major order, each unit's 2x2 patches in
// row-major order), as HF's get_window_index reorders them. For a grid of
// `rows` x `cols` merged units.
struct QwenVisionWindows {
    std::vector<int32_t> unit_order;    // the merged unit (row * cols + col) at each place
    std::vector<int32_t> unit_place;    // the inverse: the place of each unit
    std::vector<int64_t> window_units;  // units per window, in order
};
QwenVisionWindows qwen_vision_windows(int64_t rows, int64_t cols, int64_t window_units);

class QwenVisionEncoder final : public VisionEncoderNetwork {
  public:
    static Result<std::unique_ptr<QwenVisionEncoder>> create(io::WeightDeclarer& weights);

    const QwenVisionConfig& config() const { return config_; }
    int64_t out_width() const override { return config_.out_width; }
    int64_t size_unit() const override { return config_.unit(); }
    int64_t tokens(int64_t width, int64_t height) const override {
        return (width / config_.unit()) * (height / config_.unit());
    }
    VisionEncoderTensors build(nn::GraphInputs& inputs, const VisionEncodeShape& shape) const override;

    // The patch rows of an image ne [W, H, 3] with values in [0, 1]:
    // normalised, one row of 3 * patch * patch values (channel, row, column)
    // per patch, in the tower's window order. W and H multiples of unit().
    std::vector<float> patch_rows(const float* image, int64_t width, int64_t height) const;

  private:
    struct Block;
    QwenVisionEncoder() = default;
    void declare(io::WeightDeclarer& w, bool two_kernels);

    QwenVisionConfig config_;
    ggml_tensor* patch_kernel_ = nullptr;   // HF: ne [p, p, 2, 3 * width]; llama.cpp: the first, ne [p, p, 3, width]
    ggml_tensor* patch_kernel1_ = nullptr;  // llama.cpp: the second temporal kernel
    std::vector<std::shared_ptr<Block>> blocks_;
    ggml_tensor* merger_norm_ = nullptr;
    nn::Linear merger_in_, merger_out_;
};

}  // namespace kiln::models
