// The Z-Image diffusion transformer (Tongyi-MAI's Z-Image-Turbo and Z-Image
// Base, 6B; the NextDiT / Lumina-Image-2.0 lineage), as Tongyi's
// src/zimage/transformer.py and diffusers' ZImageTransformer2DModel define it
// (PyTorch reference: training/reference/z_image.py). Its shape is read from
// the weights under a prefix, in either naming:
//   single file (ComfyUI, stable-diffusion.cpp: z_image_turbo_bf16.safetensors):
//     x_embedder, final_layer.{linear, adaLN_modulation.1},
//     <block>.attention.{qkv, out, q_norm, k_norm}
//   original / diffusers transformer/ folder (diffusers_names):
//     all_x_embedder.2-1, all_final_layer.2-1.*,
//     <block>.attention.{to_q, to_k, to_v, to_out.0, norm_q, norm_k}
// and in both t_embedder.mlp.{0,2}, cap_embedder.{0,1}, x_pad_token,
// cap_pad_token, <block>.{attention_norm1/2, ffn_norm1/2, feed_forward.w1/w2/w3,
// adaLN_modulation.0}, where <block> is noise_refiner.N (modulated, image
// tokens only), context_refiner.N (no modulation, caption tokens only) or
// layers.N (modulated, all tokens). dim from x_embedder, head_dim from the
// q_norm length, the FFN width from w1, the caption width from cap_embedder.1,
// layer counts counted. RoPE splits head_dim 128 into axes {32, 48, 48},
// theta 256; another head_dim needs the metadata key "kiln.z_image.axes_dim"
// ("8,12,12": small test models).
//
// Token layout of one batch item (SEQ_MULTI_OF = 32):
//   [0, Np)          image tokens, row-major 2x2 patches (channel fastest in a
//                    patch's features), then x_pad_token up to Np, the image
//                    token count rounded up to a multiple of 32
//   [Np, Np + Tp)    caption slots: the item's L caption tokens
//                    (cap_embedder(context)), then cap_pad_token up to L
//                    rounded up to 32 (attended, as real tokens are), then
//                    batch padding up to Tp = the context's token count
//                    rounded up to 32 (masked as keys; values never read)
// The noise refiners see [0, Np), the context refiners [Np, Np + Tp), the main
// layers everything. Positions (t, row, col): caption slot i (i + 1, 0, 0);
// image token (Lp + 1, row, col), Lp = L rounded up to 32; image pad tokens
// (0, 0, 0); batch padding: no rotation (zeros in the table, as diffusers'
// pad_sequence leaves it).
//
// Time: the network takes sigma in [0, 1] (as FluxInputs does), evaluates the
// model at t = 1 - sigma (t_embedder of t * 1000, as the diffusers pipeline's
// (1000 - sigma * 1000) / 1000 and ComfyUI's 1 - sigma do), and returns the
// model's output negated: the rectified-flow velocity v = noise - x0 of
// x_sigma = (1 - sigma) x0 + sigma noise, Flux's convention.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ggml.h"
#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

struct ZImageConfig {
    int64_t in_channels = 64;   // x_embedder's input width: patch^2 * latent channels
    int64_t out_channels = 64;  // final_layer.linear's output width (= in_channels)
    int64_t dim = 3840;
    int64_t heads = 30;
    int64_t head_dim = 128;  // = sum(axes_dim)
    int64_t ffn_hidden = 10240;
    int64_t cap_dim = 2560;     // caption width (Qwen3-4B's hidden states)
    int64_t t_freq_dim = 256;   // sinusoidal timestep embedding (t_embedder.mlp.0's input)
    int64_t t_mid = 1024;       // t_embedder.mlp.0's output
    int64_t t_embed_dim = 256;  // t_embedder's output, every adaLN's input: min(dim, 256)
    int noise_refiner_layers = 2;
    int context_refiner_layers = 2;
    int layers = 30;
    std::vector<int> axes_dim = {32, 48, 48};
    float theta = 256.0f;
    float norm_eps = 1e-5f;  // every RMSNorm (the final LayerNorm: 1e-6)
    int patch = 2;
    // The file uses the original / diffusers names (to_q, all_x_embedder.2-1, ...).
    bool diffusers_names = false;

    int64_t latent_channels() const { return in_channels / (patch * patch); }
};

// Image and caption token counts are padded to multiples of this.
constexpr int64_t kZImageSeqMultiple = 32;
// `tokens` rounded up to a multiple of kZImageSeqMultiple.
int64_t z_image_padded(int64_t tokens);

// The tokens of one evaluation, from which the host tables are made.
struct ZImageTokens {
    int64_t grid_w = 0, grid_h = 0;        // the latent in patches: W / patch, H / patch
    int64_t txt_tokens = 0;                // the context's token count
    std::vector<int64_t> caption_lengths;  // per batch item, its real caption tokens (1..txt_tokens)

    int64_t batch() const { return static_cast<int64_t>(caption_lengths.size()); }
    int64_t image_slots() const { return z_image_padded(grid_w * grid_h); }  // Np
    int64_t caption_slots() const { return z_image_padded(txt_tokens); }     // Tp
    int64_t slots() const { return image_slots() + caption_slots(); }
    // Whether some item's padded caption is shorter than caption_slots(), so
    // ZImageInputs::mask is required.
    bool needs_mask() const;
};

// Checks and describes an evaluation: a latent of W x H (multiples of the
// patch), a context of `txt_tokens` tokens, and each item's caption length
// (at least one item; each between 1 and txt_tokens). Error: InvalidRequest.
Result<ZImageTokens> z_image_tokens(const ZImageConfig& c, int64_t latent_w, int64_t latent_h, int64_t txt_tokens,
                                    std::vector<int64_t> caption_lengths);

// The RoPE table for ZImageInputs::rope: ne [head_dim, slots, batch, 2], F32.
// Plane 0 holds each pair's cosine twice (cos a_j, cos a_j), plane 1 the
// signed sines (-sin a_j, sin a_j), so that rope(x) = x * plane0 +
// swap_pairs(x) * plane1. The angle of pair j of axis a is
// pos_a * theta^(-2j / axes_dim[a]), axis 0's pairs first, rounded to float32
// as the original's table is, then its cosine and sine taken in double.
// Batch padding slots are zeros in both planes.
// Across `seams` the image's rows (and columns) repeat with the grid's
// height (and width): nn::periodic_frequency.
std::vector<float> z_image_rope_table(const ZImageConfig& c, const ZImageTokens& t, nn::Seams seams = {});
std::vector<int64_t> z_image_rope_shape(const ZImageConfig& c, const ZImageTokens& t);

// ZImageInputs::cap_pad: ne [caption_slots, batch], F32: 1 for a caption slot
// that holds cap_pad_token (slot >= the item's caption length), 0 for one that
// holds the embedded context.
std::vector<float> z_image_caption_pad(const ZImageTokens& t);
std::vector<int64_t> z_image_caption_pad_shape(const ZImageTokens& t);

// ZImageInputs::mask: an additive mask over the keys, ne [slots, batch], F32:
// 0 for image slots and for the item's padded caption, -inf for its batch
// padding. The graph expands it for every attention.
std::vector<float> z_image_attention_mask(const ZImageTokens& t);
std::vector<int64_t> z_image_attention_mask_shape(const ZImageTokens& t);

// The inputs of one evaluation (ggml ne order).
struct ZImageInputs {
    ggml_tensor* x = nullptr;          // ne [W, H, latent_channels, B]; W, H multiples of patch
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]: sigma in [0, 1]
    // ne [cap_dim, txt_tokens, B]: the LLM's hidden states; txt_tokens is at
    // least the longest caption of the batch (normally equal), each item
    // anything (zeros) beyond its length (cap_pad replaces those slots).
    ggml_tensor* context = nullptr;
    ggml_tensor* rope = nullptr;     // F32 ne z_image_rope_shape(): z_image_rope_table()
    ggml_tensor* cap_pad = nullptr;  // F32 ne z_image_caption_pad_shape(): z_image_caption_pad()
    // F32 ne z_image_attention_mask_shape(): z_image_attention_mask().
    // Required when ZImageTokens::needs_mask() (captions of the batch that pad
    // to different lengths); may be null otherwise.
    ggml_tensor* mask = nullptr;
    // BlockStage Rest and Cached (ZImageBuildOptions::split): the stream after
    // the front layers and the middle layers' residual, ne [dim, Np + Tp, B].
    ggml_tensor* stream = nullptr;
    ggml_tensor* residual = nullptr;
};

struct ZImageBuildOptions {
    bool flash_attention = false;  // ggml's fused kernel: K/V (and the mask) in F16, not bit-identical
    // The part of the evaluation to build (models/nets/block_stages.h): the
    // blocks are the main layers; the refiners are part of the embeddings,
    // run only by the stages that embed (Whole, Front).
    BlockSplit split;
};

class ZImageDit final : public DiffusionNetwork {
  public:
    // Whether the tensors under `prefix` look like a Z-Image DiT (x_embedder
    // in either naming, cap_embedder, both pad tokens, a modulated layers.0);
    // Lumina-Image-2.0, whose NextDiT has no pad tokens, does not.
    static bool looks_like_z_image(const io::ModelFile& file, const std::string& prefix);
    // Error (BadFile) if the tensors under `prefix` are not a Z-Image DiT.
    static Result<std::unique_ptr<ZImageDit>> create(io::WeightDeclarer& weights);
    ~ZImageDit();
    const ZImageConfig& config() const { return config_; }

    // Returns the velocity ne [W, H, latent_channels, B], with cut markers
    // "noise_refiner.N" (the image slots, ne [dim, Np, B]),
    // "context_refiner.N" (the caption slots, ne [dim, Tp, B]) and "layers.N"
    // (all slots, image first, ne [dim, Np + Tp, B]). An error
    // (InvalidRequest; nothing built) when the inputs do not fit: x's
    // channels, W/H not multiples of the patch, the context's width or batch,
    // the timesteps', rope's, cap_pad's or mask's shape, or the stream's or
    // residual's that options.split's stage reads. Other stages than Whole
    // give what BlockStage says instead of the velocity.
    Result<ggml_tensor*> build(ggml_context* ctx, const ZImageInputs& in, const ZImageBuildOptions& options) const;

    // DiffusionNetwork: every batch item's caption has shape.tokens tokens
    // (the conditioner's passes of different lengths run apart), so the RoPE
    // table and the caption's padding are constants of the shape.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;
    // Z-Image's single file fuses q/k/v and names the output "out"; Tongyi's
    // and diffusers' names (and the LoRAs trained on them) split them.
    std::vector<std::string> lora_split_names(const std::string& stem) const override;
    // In diffusers' names, the other way: the single file's layer each
    // weight is (a part of), for LoRAs in that file's names.
    std::optional<LoraFusedLayer> lora_fused_layer(const std::string& stem) const override;

  private:
    struct Blocks;
    ZImageDit();
    Status declare(io::WeightDeclarer& w);

    ZImageConfig config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
