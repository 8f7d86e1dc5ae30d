// A decoder-only LLM used as a text encoder: the hidden states of its layers
// condition a diffusion network (Z-Image reads Qwen3-4B's second-to-last
// layer). Only the prompt pass: no KV cache, no LM head, no sampling.
//
// Architectures: Qwen3 (any size: 0.6B ... 32B, and Qwen3-4B as Z-Image uses
// it), Qwen2 (Qwen2.5 and Qwen2.5-VL's text model: q/k/v biases, no QK norm)
// and Llama (Llama and Mistral Small 3.x's text model: neither). The
// differences are switches in LlmConfig (qk_norm, qkv_bias, rope_neox). The
// architecture is GGUF's `general.architecture` (qwen3, qwen2, qwen2vl,
// llama), else read from the tensors: q_norm is Qwen3, a q_proj bias Qwen2,
// neither Llama.
//
// Sizes come from the weights: vocabulary and width from the token
// embedding, layers by counting them, head_dim from layer 0's q_norm length
// (checked against GGUF `<arch>.attention.key_length` when present; without
// QK norm that key, else 128: Qwen2.5-7B's, Llama 3's and Mistral Small's), heads
// and kv_heads from the q and k projections' rows / head_dim (so head_dim
// need not be width / heads: Qwen3-4B has 32 heads of 128 over a width of
// 2560), the feed-forward width from the gate projection. From metadata
// (GGUF, or the same keys in a safetensors header): rope theta
// `<arch>.rope.freq_base` (default 1e6, Qwen's; 1e4 for Llama, HF's default:
// a Mistral safetensors file needs the key, its theta is 1e9) and the RMSNorm epsilon
// `<arch>.attention.layer_norm_rms_epsilon` (default 1e-6). A GGUF's
// `<arch>.attention.head_count`, `head_count_kv` and `block_count`, when
// present, must agree with the tensors. HF's config.json beside the file is
// not read.
//
// Three tensor namings, detected from the file (all under `prefix`, which may
// be empty, ComfyUI's "text_encoders.qwen3_4b.transformer." or a diffusers
// folder's "text_encoder/"):
//   HF transformers' causal LM (Qwen3ForCausalLM): `model.embed_tokens.weight`,
//   `model.layers.N.self_attn.{q,k,v,o}_proj.weight`,
//   `model.layers.N.self_attn.{q,k}_norm.weight`,
//   `model.layers.N.mlp.{gate,up,down}_proj.weight`,
//   `model.layers.N.{input,post_attention}_layernorm.weight`, `model.norm.weight`;
//   HF's bare decoder (Qwen3Model, which diffusers' ZImagePipeline keeps in
//   text_encoder/): the same without "model.";
//   llama.cpp's GGUF names: `token_embd.weight`, `blk.N.attn_{q,k,v,output}.weight`,
//   `blk.N.attn_{q,k}_norm.weight`, `blk.N.attn_norm.weight`,
//   `blk.N.ffn_{gate,up,down}.weight`, `blk.N.ffn_norm.weight`, `output_norm.weight`.
// The LM head (`lm_head.weight`, `output.weight`) and a vision tower
// (`visual.*`) are never declared. llama.cpp's converter does not permute
// Qwen2/Qwen3's q and k rows and rotates them in the NeoX layout, as HF
// does; for llama it permutes each head's rows so that HF's pairs (i, i + d/2)
// are adjacent and rotates adjacent pairs: a llama GGUF takes rope's normal
// mode, the same numbers. A GGUF `general.architecture` kiln does not read is
// an error naming it.
//
// The computation (HF modeling_qwen3; training/reference/qwen3.py), per
// layer: h = RMSNorm(x); q, k, v projections (no biases), q with `heads` and
// k, v with `kv_heads` heads of head_dim; RMSNorm of each q and k head over
// head_dim (q_norm, k_norm) before the rotary embedding; rope in the NeoX
// layout (pairs i and i + head_dim / 2) over the whole head with base theta;
// scores q.k / sqrt(head_dim) plus the additive causal mask, softmax, each
// group of heads / kv_heads query heads sharing one K/V head (HF's
// repeat_kv: query head h reads K/V head h / (heads / kv_heads)); o
// projection; residual; h = RMSNorm(x); x + down(silu(gate h) * up h). A
// final RMSNorm (model.norm) on request.
//
// Precision: the residual stream is F32 throughout (Qwen models have a few
// very large activations in it), and the products whose outputs can be large
// (o, gate, up, down, the scores and the attention output) ask for F32
// precision (ggml_prec_set_acc), as in t5_encoder.h.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/nets/llm_file_defaults.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

struct LlmConfig {
    // Qwen3 (QK norm), Qwen2 (Qwen2.5 and Qwen2.5-VL's text model: q/k/v
    // biases), Llama (Llama and Mistral: neither).
    enum class Arch { Qwen3, Qwen2, Llama };
    enum class Naming { HuggingFace, HuggingFaceBase, LlamaCpp };
    Arch arch = Arch::Qwen3;
    Naming naming = Naming::HuggingFace;
    int64_t vocab = 0;
    int64_t width = 0;   // hidden size
    int64_t layers = 0;  // in the file (LlmEncoder::declared_layers() may be fewer)
    int64_t heads = 0;
    int64_t kv_heads = 0;  // heads is a multiple of it (grouped-query attention)
    int64_t head_dim = 0;  // heads * head_dim need not be width
    int64_t ffn = 0;       // feed-forward width
    float rope_theta = 1e6f;
    float norm_eps = 1e-6f;
    bool qk_norm = true;    // RMSNorm of each q and k head before rope (Qwen3)
    bool qkv_bias = false;  // q, k and v projections with biases (Qwen2.5)
    // Rope on (i, i + head_dim / 2) pairs, as HF rotates; false: adjacent
    // pairs, for the q/k rows llama.cpp's converter permutes for llama.
    bool rope_neox = true;
    // Multimodal RoPE (Qwen2.5-VL): of each head's head_dim / 2 rotation
    // pairs, the first rope_sections[0] turn by the token's time position,
    // the next [1] by its row, the next [2] by its column (HF's mrope_section,
    // [16, 24, 24] for head_dim 128). From `<arch>.rope.dimension_sections`,
    // else those proportions of head_dim / 2. A text-only prompt, whose three
    // positions are equal, is the plain NeoX rope.
    std::array<int, 3> rope_sections{};

    // llama.cpp's name: "qwen3", "qwen2", "llama".
    std::string arch_name() const;
};

struct LlmOptions {
    // Run the first `layers` decoder layers (0: all declared ones); the
    // output is the last one's. At most LlmEncoder::declared_layers().
    int layers = 0;
    // Apply the final RMSNorm to the output; only when every layer of the
    // file runs (HF's last hidden state). Asserted.
    bool final_norm = false;
    // The outputs of these layers (0-based, each one that runs), joined
    // along the features in this order, instead of the last layer's (FLUX.2
    // klein stacks HF's hidden_states 9, 18 and 27: layers 8, 17, 26).
    std::vector<int> stacked_outputs;
    // Required. I32 ne [n]: the positions 0..n-1 (rope's), a host input; or
    // ne [4 n]: multimodal positions (time, row, column rows of n, then n
    // unused), rotated by config().rope_sections.
    ggml_tensor* positions = nullptr;
    // Optional. F32 ne [width, rows] and ne [n] I32 / F32 ne [1, n]: the
    // rows replace the token embeddings where `replace` is 1 (`rows_at`
    // says which row: a vision tower's output in place of image pads).
    ggml_tensor* extra_rows = nullptr;
    ggml_tensor* rows_at = nullptr;
    ggml_tensor* replace = nullptr;
    // Required. F32 ne [n keys, n queries] (or [n, n, 1, batch] for masks
    // that differ per prompt): added to the scaled scores of every head;
    // llm_causal_mask(n) for one unpadded prompt, a host input.
    ggml_tensor* mask = nullptr;
};

// Multimodal RoPE positions for a prompt of `length` tokens with image
// grids in it (HF Qwen2.5-VL's get_rope_index for images): 4 rows of
// `length` (time, row, column, then zeros). A text token's three positions
// are its running index; an image's tokens all take as time the position
// the next text token would have, and add their row and column to it; the
// text after an image goes on from its largest position plus one.
std::vector<int32_t> llm_multimodal_positions(int64_t length, const std::vector<TokenGrid>& grids);

// n * n values, element [q * n + k] (ggml ne [n keys, n queries]): 0 for
// k <= q, -inf for keys after the query.
std::vector<float> llm_causal_mask(int64_t n);

class LlmEncoder final : public TextEncoderNetwork {
  public:
    // Whether `prefix` holds a decoder this class reads, in either naming:
    // layer 0's q projection (`model.layers.0.self_attn.q_proj.weight`,
    // `layers.0.self_attn.q_proj.weight` or `blk.0.attn_q.weight`). Says
    // nothing about whether the rest is complete (create() does).
    static bool looks_like_llm(const io::ModelFile& file, const std::string& prefix);

    // Reads the configuration from the tensors and metadata under `prefix`
    // and declares the weights. `unused_last_layers` > 0 leaves that many
    // layers at the end undeclared, and the final norm with them (a caller
    // that reads an inner layer never loads the rest).
    // Errors (BadFile unless said): no LLM there (naming the tensors looked
    // for), an unsupported GGUF architecture,
    // sizes that do not divide (naming the tensor), metadata that disagrees
    // with the tensors or is not a usable number (naming the key);
    // InvalidRequest: unused_last_layers negative or not fewer than the file has. A
    // wrong shape or a missing tensor further on is reported by
    // loading the weights, naming the tensor.
    // `first_layers` > 0 declares only that many layers from the start
    // (InvalidRequest when the file has fewer). `defaults` replace the
    // architecture's rope theta and epsilon where the file's metadata has
    // none (a family that knows its model: FLUX.2-dev's Mistral, whose HF
    // safetensors carry no metadata, has theta 1e9 and epsilon 1e-5).
    static Result<std::unique_ptr<LlmEncoder>> create(io::WeightDeclarer& weights, int unused_last_layers = 0,
                                                      int first_layers = 0, const LlmFileDefaults& defaults = {});

    const LlmConfig& config() const { return config_; }
    // The layers declared (and runnable): config().layers less create()'s unused_last_layers.
    int64_t declared_layers() const { return static_cast<int64_t>(layers_.size()); }

    // tokens: I32 ne [n, batch]. Returns F32 ne [width, n, batch]: the output
    // of layer options.layers - 1, final-normed on request. Cut markers
    // "llm.layers.<i>" after every layer. Missing or wrongly sized positions
    // or mask, too many layers, or a final norm that was not declared are a
    // caller's bug (asserted). Compute memory: the scores are n * n * heads *
    // batch floats per layer.
    ggml_tensor* encode(ggml_context* ctx, ggml_tensor* tokens, const LlmOptions& options) const;

    // TextEncoderNetwork: positions 0..n-1 and the causal mask, every
    // sequence of a batch of the same length (the conditioner encodes one
    // prompt at a time); the final norm only when every layer runs.
    int64_t width() const override { return config_.width; }
    int64_t vocab() const override { return config_.vocab; }
    std::string label() const override { return config_.arch_name(); }
    TextEncoderTensors build(nn::GraphInputs& inputs, const TextEncodeShape& shape) const override;

  private:
    struct Layer;
    LlmEncoder() = default;
    void declare(io::WeightDeclarer& w, int64_t used_layers);
    ggml_tensor* self_attention(ggml_context* ctx, const Layer& layer, ggml_tensor* h, const LlmOptions& options) const;

    LlmConfig config_;
    ggml_tensor* token_embedding_ = nullptr;  // ne [width, vocab]
    std::vector<std::shared_ptr<Layer>> layers_;
    ggml_tensor* final_norm_ = nullptr;  // null unless every layer is declared
};

}  // namespace kiln::models
