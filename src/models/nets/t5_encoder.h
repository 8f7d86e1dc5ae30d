// T5 v1.1 text encoder (Flux's and SD3's T5-XXL; any size of v1.1: small,
// base, large, XL, XXL) and umT5 (Wan's umT5-XXL): T5 v1.1 with a relative
// position table in every block instead of block 0's alone. Sizes come from
// the weights: vocabulary and width from the token embedding, heads and
// relative-position buckets from block 0's relative position table
// [buckets, heads], head width from the query projection, feed-forward width
// from the gate, block count by counting blocks. Which variant a file holds
// follows from its tables: block 0's alone is T5 (one table shared by every
// block), one in every block is umT5 (each block adds its own; label()
// "umT5"), any other set is an error naming the first block out of line.
// Only the gated-GELU feed-forward of v1.1 is supported; a v1.0 file (ReLU,
// one `wi`) is an error naming the tensor that shows it.
//
// Three tensor namings, detected from the file (all under `prefix`, which may
// be empty):
//   HF transformers (t5xxl_fp16.safetensors, umt5_xxl_fp16.safetensors,
//   ComfyUI's all-in-one files under "text_encoders.t5xxl.transformer."):
//   `shared.weight` or `encoder.embed_tokens.weight`, `encoder.block.N.layer.0.
//   SelfAttention.{q,k,v,o}.weight`, `...SelfAttention.relative_attention_bias.weight`
//   (block 0's; umT5: every block's), `encoder.block.N.layer.0.layer_norm.weight`,
//   `encoder.block.N.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight`,
//   `encoder.block.N.layer.1.layer_norm.weight`, `encoder.final_layer_norm.weight`;
//   llama.cpp's GGUF names (the community's T5 and umT5 GGUF files, city96's
//   umt5-xxl-encoder-*.gguf): `token_embd.weight`, `enc.blk.N.attn_{q,k,v,o}.weight`,
//   `enc.blk.N.attn_rel_b.weight` (block 0's; umT5: every block's),
//   `enc.blk.N.attn_norm.weight`, `enc.blk.N.ffn_gate.weight` (wi_0), `ffn_up`
//   (wi_1), `ffn_down` (wo), `enc.blk.N.ffn_norm.weight`, `enc.output_norm.weight`;
//   Wan's original module tree (models_t5_umt5-xxl-enc-bf16.pth, umT5 only):
//   `token_embedding.weight`, `blocks.N.attn.{q,k,v,o}.weight`,
//   `blocks.N.pos_embedding.embedding.weight`, `blocks.N.norm1.weight`,
//   `blocks.N.ffn.gate.0.weight` (wi_0), `ffn.fc1` (wi_1), `ffn.fc2` (wo),
//   `blocks.N.norm2.weight`, `norm.weight`. Its embedding's name is also
//   OpenCLIP's, so this naming is taken only with block 0's position table
//   beside it.
//
// The computation (T5 paper, HF modeling_t5 and modeling_umt5, Wan's
// wan/modules/t5.py): per block, pre-norm RMSNorm (no mean subtraction, eps
// 1e-6, a scale and no bias), self-attention whose scores are q.k WITHOUT
// 1/sqrt(d_kv) scaling plus the relative position bias (the block's table,
// T5: block 0's, at the bidirectional bucket of key - query) plus the key
// mask, then the feed-forward wo(gelu_tanh(wi_0 x) * wi_1 x); residual adds;
// no biases anywhere; a final RMSNorm.
//
// f16 overflow: T5-XXL's activations (the feed-forward's above all) exceed
// f16's range. The residual stream is F32 throughout, and the products whose
// inputs or outputs can be large (wi_0, wi_1, wo, the attention scores and
// the attention output o) ask for F32 precision (ggml_prec_set_acc(GGML_PREC_F32),
// the pinned ggml's name for ggml_mul_mat_set_prec), so a backend that would
// compute a product in f16 (CUDA's cuBLAS path, which also rounds the
// activations to f16) computes it in F32. The CPU computes in F32 anyway.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

struct T5Config {
    enum class Naming { HuggingFace, LlamaCpp, Wan };
    Naming naming = Naming::HuggingFace;
    // umT5: every block has its own relative position table; T5: block 0's
    // serves all.
    bool per_block_position_bias = false;
    int64_t vocab = 0;
    int64_t d_model = 0;
    int64_t d_kv = 0;  // width of one head; heads * d_kv need not be d_model
    int64_t heads = 0;
    int64_t d_ff = 0;
    int64_t layers = 0;
    int64_t buckets = 32;        // relative-position buckets, both directions together
    int64_t max_distance = 128;  // distances from here on share each direction's last bucket (not in the weights)
};

struct T5Options {
    // F32 ne [tokens, batch]: 1 for real tokens, 0 for padding; padded keys
    // get -inf in every attention (HF's attention_mask). Every prompt needs at
    // least one real token (a row of -inf is NaN). Null: every key is attended
    // to (Flux's reference runs T5 so, padding included).
    ggml_tensor* key_mask = nullptr;
    // Required. I32 ne [n, n] holding relative_buckets(n) for n = tokens->ne[0]:
    // the buckets depend only on the token count and are computed on the host
    // (in exact arithmetic, which HF's float32 matches for T5's 32 buckets and
    // distance 128), so the caller makes this input with its other graph inputs.
    ggml_tensor* relative_buckets = nullptr;
};

class T5Encoder final : public TextEncoderNetwork {
  public:
    // Whether `prefix` holds a T5 or umT5 encoder in any naming: checks for
    // block 0's relative position table, `encoder.block.0.layer.0.SelfAttention.
    // relative_attention_bias.weight` (HF), `enc.blk.0.attn_rel_b.weight`
    // (llama.cpp) or `blocks.0.pos_embedding.embedding.weight` (Wan), which no
    // other network kiln reads has. Says nothing about whether the rest is
    // complete (create() does).
    static bool looks_like_t5(const io::ModelFile& file, const std::string& prefix);

    // Reads the configuration from the tensors under `prefix` and declares
    // the weights. Errors: no T5 there (naming the tensors looked for), a v1.0
    // (ungated) feed-forward, position tables in some blocks but not all
    // (naming the block), inconsistent sizes; a wrong shape further on is
    // reported by weights().load(), naming the tensor.
    static Result<std::unique_ptr<T5Encoder>> create(io::WeightDeclarer& weights);

    const T5Config& config() const { return config_; }

    // The bucket of a relative position (key index - query index) in a
    // bidirectional table of `buckets` (HF's _relative_position_bucket with
    // bidirectional=True): half of the buckets for keys after the query;
    // in each half, distances below half / 2 have their own bucket, larger
    // ones log-spaced buckets up to max_distance, then the half's last.
    static int32_t relative_bucket(int64_t key_minus_query, int64_t buckets, int64_t max_distance);
    // For T5Options::relative_buckets: n * n buckets, element [q * n + k]
    // the bucket of k - q (ggml ne [n keys, n queries]).
    std::vector<int32_t> relative_buckets(int64_t n) const;

    // tokens: I32 ne [n, batch]. Returns F32 ne [d_model, n, batch] after the
    // final RMSNorm. Cut markers "t5.blocks.<i>" after every block. A missing
    // or wrongly sized options.relative_buckets is a caller's bug (asserted).
    // Compute memory: the scores are n * n * heads * batch floats per block.
    ggml_tensor* encode(ggml_context* ctx, ggml_tensor* tokens, const T5Options& options) const;

    // TextEncoderNetwork.
    int64_t width() const override { return config_.d_model; }
    int64_t vocab() const override { return config_.vocab; }
    std::string label() const override { return config_.per_block_position_bias ? "umT5" : "T5"; }
    TextEncoderTensors build(nn::GraphInputs& inputs, const TextEncodeShape& shape) const override;

  private:
    struct Block;
    T5Encoder() = default;
    void declare(io::WeightDeclarer& w, const std::string& embedding_name);
    // [n keys, n queries, heads, batch or 1]: the position bias of `table`
    // plus the key mask (log of options.key_mask, ne [n, 1, 1, batch]; null:
    // none), added to a block's scores.
    ggml_tensor* attention_bias(ggml_context* ctx, ggml_tensor* table, const T5Options& options, ggml_tensor* key_mask,
                                int64_t n, int64_t batch) const;
    ggml_tensor* self_attention(ggml_context* ctx, const Block& block, ggml_tensor* h, ggml_tensor* bias) const;

    T5Config config_;
    ggml_tensor* token_embedding_ = nullptr;  // ne [d_model, vocab]
    ggml_tensor* relative_bias_ = nullptr;    // T5: block 0's table, F32 ne [heads, buckets]; umT5: null
    std::vector<std::shared_ptr<Block>> blocks_;
    ggml_tensor* final_norm_ = nullptr;
};

}  // namespace kiln::models
