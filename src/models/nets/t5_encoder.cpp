#include "models/nets/t5_encoder.h"

#include <algorithm>
#include <cmath>

#include "nn/layers.h"

namespace kiln::models {
namespace {

constexpr float kNormEps = 1e-6f;

// The tensors of one block, in every naming.
enum class Part { Q, K, V, O, RelativeBias, AttentionNorm, Gate, Up, Down, FeedForwardNorm };

std::string block_tensor(T5Config::Naming naming, int64_t block, Part part) {
    const std::string i = std::to_string(block);
    if (naming == T5Config::Naming::LlamaCpp) {
        const char* leaf = "";
        switch (part) {
            case Part::Q: leaf = "attn_q"; break;
            case Part::K: leaf = "attn_k"; break;
            case Part::V: leaf = "attn_v"; break;
            case Part::O: leaf = "attn_o"; break;
            case Part::RelativeBias: leaf = "attn_rel_b"; break;
            case Part::AttentionNorm: leaf = "attn_norm"; break;
            case Part::Gate: leaf = "ffn_gate"; break;
            case Part::Up: leaf = "ffn_up"; break;
            case Part::Down: leaf = "ffn_down"; break;
            case Part::FeedForwardNorm: leaf = "ffn_norm"; break;
        }
        return "enc.blk." + i + "." + leaf + ".weight";
    }
    if (naming == T5Config::Naming::Wan) {
        const char* leaf = "";
        switch (part) {
            case Part::Q: leaf = "attn.q"; break;
            case Part::K: leaf = "attn.k"; break;
            case Part::V: leaf = "attn.v"; break;
            case Part::O: leaf = "attn.o"; break;
            case Part::RelativeBias: leaf = "pos_embedding.embedding"; break;
            case Part::AttentionNorm: leaf = "norm1"; break;
            case Part::Gate: leaf = "ffn.gate.0"; break;
            case Part::Up: leaf = "ffn.fc1"; break;
            case Part::Down: leaf = "ffn.fc2"; break;
            case Part::FeedForwardNorm: leaf = "norm2"; break;
        }
        return "blocks." + i + "." + leaf + ".weight";
    }
    const std::string attn = "encoder.block." + i + ".layer.0.";
    const std::string ff = "encoder.block." + i + ".layer.1.";
    switch (part) {
        case Part::Q: return attn + "SelfAttention.q.weight";
        case Part::K: return attn + "SelfAttention.k.weight";
        case Part::V: return attn + "SelfAttention.v.weight";
        case Part::O: return attn + "SelfAttention.o.weight";
        case Part::RelativeBias: return attn + "SelfAttention.relative_attention_bias.weight";
        case Part::AttentionNorm: return attn + "layer_norm.weight";
        case Part::Gate: return ff + "DenseReluDense.wi_0.weight";
        case Part::Up: return ff + "DenseReluDense.wi_1.weight";
        case Part::Down: return ff + "DenseReluDense.wo.weight";
        case Part::FeedForwardNorm: return ff + "layer_norm.weight";
    }
    return "";
}

std::string final_norm_name(T5Config::Naming naming) {
    switch (naming) {
        case T5Config::Naming::LlamaCpp: return "enc.output_norm.weight";
        case T5Config::Naming::Wan: return "norm.weight";
        case T5Config::Naming::HuggingFace: break;
    }
    return "encoder.final_layer_norm.weight";
}

// Wan's embedding is named as OpenCLIP's; its block 0 position table tells them apart.
constexpr const char* kWanEmbedding = "token_embedding.weight";

// "0, 2 and 5"
std::string block_list(const std::vector<int64_t>& blocks) {
    std::string out;
    for (size_t i = 0; i < blocks.size(); ++i) {
        if (i > 0) out += i + 1 == blocks.size() ? " and " : ", ";
        out += std::to_string(blocks[i]);
    }
    return out;
}

// A product that may not round through f16 (the header's f16 overflow note).
ggml_tensor* product_f32(ggml_context* ctx, ggml_tensor* weight, ggml_tensor* x) {
    ggml_tensor* y = ggml_mul_mat(ctx, weight, x);
    ggml_prec_set_acc(y, GGML_PREC_F32);
    return y;
}

ggml_tensor* rms_norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* weight) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, kNormEps), weight);
}

// GELU with the tanh approximation (HF's "gelu_new"), 0.5 x (1 + tanh(c (x +
// 0.044715 x^3))), c = sqrt(2 / pi), from F32 ops: ggml_gelu on the CPU looks
// its values up in an f16 table (GGML_GELU_FP16), about 1e-3 off.
ggml_tensor* gelu_tanh(ggml_context* ctx, ggml_tensor* x) {
    const float c = 0.7978845608028654f;
    // c (x + 0.044715 x^3) = x (c + 0.044715 c x^2)
    ggml_tensor* inner = ggml_mul(ctx, x, ggml_scale_bias(ctx, ggml_sqr(ctx, x), 0.044715f * c, c));
    return ggml_mul(ctx, x, ggml_scale_bias(ctx, ggml_tanh(ctx, inner), 0.5f, 0.5f));
}

}  // namespace

struct T5Encoder::Block {
    ggml_tensor* attention_norm = nullptr;
    ggml_tensor *q = nullptr, *k = nullptr, *v = nullptr,
                *o = nullptr;  // q/k/v ne [d_model, inner], o [inner, d_model]
    ggml_tensor* ff_norm = nullptr;
    ggml_tensor *gate = nullptr, *up = nullptr, *down = nullptr;  // wi_0, wi_1, wo
    ggml_tensor* relative_bias = nullptr;  // umT5: this block's own table, F32 ne [heads, buckets]; T5: null
};

bool T5Encoder::looks_like_t5(const io::ModelFile& file, const std::string& prefix) {
    for (T5Config::Naming naming : {T5Config::Naming::HuggingFace, T5Config::Naming::LlamaCpp, T5Config::Naming::Wan}) {
        if (file.find(prefix + block_tensor(naming, 0, Part::RelativeBias))) return true;
    }
    return false;
}

Result<std::unique_ptr<T5Encoder>> T5Encoder::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<T5Encoder> enc(new T5Encoder());
    T5Config& c = enc->config_;
    const std::string where = "T5 encoder under '" + prefix + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };

    // The naming follows the token embedding's name.
    std::string embedding;
    for (const char* name : {"shared.weight", "encoder.embed_tokens.weight", "token_embd.weight"}) {
        if (file.find(prefix + name)) {
            embedding = name;
            break;
        }
    }
    if (embedding.empty() && file.find(prefix + kWanEmbedding) &&
        file.find(prefix + block_tensor(T5Config::Naming::Wan, 0, Part::RelativeBias))) {
        embedding = kWanEmbedding;
    }
    if (embedding.empty()) {
        return Error::bad_file("no T5 encoder under '" + prefix +
                               "' (no token embedding: shared.weight, encoder.embed_tokens.weight or "
                               "token_embd.weight)");
    }
    c.naming = embedding == "token_embd.weight" ? T5Config::Naming::LlamaCpp
               : embedding == kWanEmbedding     ? T5Config::Naming::Wan
                                                : T5Config::Naming::HuggingFace;
    auto find = [&](int64_t block, Part part) { return file.find(prefix + block_tensor(c.naming, block, part)); };
    auto name = [&](int64_t block, Part part) { return block_tensor(c.naming, block, part); };

    const io::TensorInfo* tok = file.find(prefix + embedding);
    if (tok->shape.size() != 2) return bad(embedding + " is not a matrix (" + tok->shape_string() + ")");
    c.vocab = tok->shape[0];
    c.d_model = tok->shape[1];

    // v1.0 has one ReLU input projection where v1.1 has the gated pair.
    const bool hf = c.naming == T5Config::Naming::HuggingFace;
    if (hf && file.find(prefix + "encoder.block.0.layer.1.DenseReluDense.wi.weight")) {
        return bad(
            "encoder.block.0.layer.1.DenseReluDense.wi.weight is a T5 v1.0 (ReLU) feed-forward; only v1.1's "
            "gated-GELU one (wi_0, wi_1) is supported");
    }
    if (!hf && !find(0, Part::Gate) && find(0, Part::Up)) {
        return bad(name(0, Part::Up) + " without " + name(0, Part::Gate) +
                   " is a T5 v1.0 (ReLU) feed-forward; only v1.1's gated-GELU one is supported");
    }

    const io::TensorInfo* rel = find(0, Part::RelativeBias);
    if (!rel) return bad("no relative position table " + name(0, Part::RelativeBias));
    if (rel->shape.size() != 2) return bad(name(0, Part::RelativeBias) + " has shape " + rel->shape_string());
    c.buckets = rel->shape[0];
    c.heads = rel->shape[1];
    // Each direction needs a bucket of its own for distance 0 and a log range.
    if (c.buckets < 4 || c.heads <= 0) {
        return bad(name(0, Part::RelativeBias) + " has shape " + rel->shape_string() +
                   " (expected [buckets >= 4, heads])");
    }

    while (find(c.layers, Part::Q)) ++c.layers;
    if (c.layers == 0) return bad("no blocks (" + name(0, Part::Q) + " is missing)");
    // T5 shares block 0's table; umT5 gives every block its own. Anything
    // between is neither, most likely a file cut or renamed wrongly, and
    // guessing would compute a different network.
    std::vector<int64_t> with_table, without_table;
    for (int64_t i = 0; i < c.layers; ++i) (find(i, Part::RelativeBias) ? with_table : without_table).push_back(i);
    c.per_block_position_bias = without_table.empty() && c.layers > 1;
    if (with_table.size() > 1 && !without_table.empty()) {
        return bad("block " + std::to_string(without_table.front()) + " has no relative position table (" +
                   name(without_table.front(), Part::RelativeBias) + ") but blocks " + block_list(with_table) +
                   " have their own: umT5 has one in every block, T5 in block 0 alone");
    }
    const io::TensorInfo* q = find(0, Part::Q);
    if (q->shape.size() != 2 || q->shape[0] % c.heads != 0) {
        return bad(name(0, Part::Q) + " has shape " + q->shape_string() + ", not [heads * d_kv, d_model] for " +
                   std::to_string(c.heads) + " heads");
    }
    c.d_kv = q->shape[0] / c.heads;
    const io::TensorInfo* gate = find(0, Part::Gate);
    if (!gate) return bad("no feed-forward gate " + name(0, Part::Gate));
    if (gate->shape.size() != 2) return bad(name(0, Part::Gate) + " has shape " + gate->shape_string());
    c.d_ff = gate->shape[0];
    // A zero size would reach ggml as an empty weight.
    if (c.vocab <= 0 || c.d_model <= 0 || c.d_kv <= 0 || c.d_ff <= 0) {
        return bad("a zero size in its embedding, attention or feed-forward (vocab " + std::to_string(c.vocab) +
                   ", d_model " + std::to_string(c.d_model) + ", d_kv " + std::to_string(c.d_kv) + ", d_ff " +
                   std::to_string(c.d_ff) + ")");
    }
    // The log-spaced buckets start at buckets / 4 (half a direction's).
    if (c.max_distance <= c.buckets / 4) {
        return bad(std::to_string(c.buckets) + " buckets leave no log-spaced range below max_distance " +
                   std::to_string(c.max_distance));
    }

    enc->declare(weights, embedding);
    return enc;
}

void T5Encoder::declare(io::WeightDeclarer& w, const std::string& embedding_name) {
    const T5Config& c = config_;
    const int64_t inner = c.heads * c.d_kv;
    token_embedding_ = w.require(embedding_name, {c.vocab, c.d_model});
    // F32: their rows are added to the scores.
    if (!c.per_block_position_bias) {
        relative_bias_ = w.require_f32(block_tensor(c.naming, 0, Part::RelativeBias), {c.buckets, c.heads});
    }
    for (int64_t i = 0; i < c.layers; ++i) {
        auto b = std::make_shared<Block>();
        auto req = [&](Part part, std::vector<int64_t> shape) {
            return w.require(block_tensor(c.naming, i, part), shape);
        };
        b->attention_norm = req(Part::AttentionNorm, {c.d_model});
        b->q = req(Part::Q, {inner, c.d_model});
        b->k = req(Part::K, {inner, c.d_model});
        b->v = req(Part::V, {inner, c.d_model});
        b->o = req(Part::O, {c.d_model, inner});
        b->ff_norm = req(Part::FeedForwardNorm, {c.d_model});
        b->gate = req(Part::Gate, {c.d_ff, c.d_model});
        b->up = req(Part::Up, {c.d_ff, c.d_model});
        b->down = req(Part::Down, {c.d_model, c.d_ff});
        if (c.per_block_position_bias) {
            b->relative_bias = w.require_f32(block_tensor(c.naming, i, Part::RelativeBias), {c.buckets, c.heads});
        }
        blocks_.push_back(b);
    }
    final_norm_ = w.require(final_norm_name(c.naming), {c.d_model});
}

int32_t T5Encoder::relative_bucket(int64_t key_minus_query, int64_t buckets, int64_t max_distance) {
    const int64_t half = buckets / 2;
    const int64_t max_exact = half / 2;
    const int64_t base = key_minus_query > 0 ? half : 0;
    const int64_t distance = key_minus_query < 0 ? -key_minus_query : key_minus_query;
    if (distance < max_exact) return static_cast<int32_t>(base + distance);
    // max_exact + floor(log(d / max_exact) / log(max_distance / max_exact) *
    // (half - max_exact)), in double with a margin, so that a value that is an
    // integer in exact arithmetic (at powers of two for T5's 32 buckets and
    // distance 128) is not truncated to the one below; HF's float32 gets those
    // exact too (training/make_t5_fixtures.py checks it). Other values lie far
    // from integers.
    const double scaled = std::log(static_cast<double>(distance) / static_cast<double>(max_exact)) /
                          std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                          static_cast<double>(half - max_exact);
    const int64_t large = max_exact + static_cast<int64_t>(std::floor(scaled + 1e-9));
    return static_cast<int32_t>(base + std::min(large, half - 1));
}

std::vector<int32_t> T5Encoder::relative_buckets(int64_t n) const {
    std::vector<int32_t> out(static_cast<size_t>(n * n));
    for (int64_t q = 0; q < n; ++q)
        for (int64_t k = 0; k < n; ++k)
            out[static_cast<size_t>(q * n + k)] = relative_bucket(k - q, config_.buckets, config_.max_distance);
    return out;
}

ggml_tensor* T5Encoder::attention_bias(ggml_context* ctx, ggml_tensor* table, const T5Options& options,
                                       ggml_tensor* key_mask, int64_t n, int64_t batch) const {
    const int64_t heads = config_.heads;
    // Rows of the table [heads, buckets] at each (key, query) bucket: [heads, n keys, n queries].
    ggml_tensor* rows = ggml_get_rows(ctx, table, ggml_reshape_1d(ctx, options.relative_buckets, n * n));
    rows = ggml_reshape_3d(ctx, rows, heads, n, n);
    ggml_tensor* bias = ggml_cont(ctx, ggml_permute(ctx, rows, 2, 0, 1, 3));  // [n keys, n queries, heads]
    if (!key_mask) return bias;
    return ggml_add(ctx, ggml_repeat_4d(ctx, bias, n, n, heads, batch), key_mask);  // [n, n, heads, batch]
}

ggml_tensor* T5Encoder::self_attention(ggml_context* ctx, const Block& block, ggml_tensor* h, ggml_tensor* bias) const {
    const int64_t d_kv = config_.d_kv, heads = config_.heads;
    const int64_t n = h->ne[1], batch = h->ne[2];
    // [inner, n, B] -> contiguous [d_kv, n, heads, B], so the products reach BLAS (nn/attention.cpp).
    auto split_heads = [&](ggml_tensor* t) {
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, t, d_kv, heads, n, batch), 0, 2, 1, 3));
    };
    ggml_tensor* q = split_heads(ggml_mul_mat(ctx, block.q, h));
    ggml_tensor* k = split_heads(ggml_mul_mat(ctx, block.k, h));
    // v as [n keys, d_kv, heads, B], so the second product contracts over the keys.
    ggml_tensor* v = ggml_cont(
        ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, ggml_mul_mat(ctx, block.v, h), d_kv, heads, n, batch), 1, 2, 0, 3));
    ggml_tensor* scores = ggml_mul_mat(ctx, k, q);  // [n keys, n queries, heads, B]
    ggml_prec_set_acc(scores, GGML_PREC_F32);
    // T5 does not scale the scores (its init does): scale 1.
    scores = ggml_soft_max_ext(ctx, scores, bias, 1.0f, 0.0f);
    ggml_tensor* out = ggml_mul_mat(ctx, v, scores);           // [d_kv, n queries, heads, B]
    out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));  // [d_kv, heads, n, B]
    return product_f32(ctx, block.o, ggml_reshape_3d(ctx, out, d_kv * heads, n, batch));
}

ggml_tensor* T5Encoder::encode(ggml_context* ctx, ggml_tensor* tokens, const T5Options& options) const {
    const T5Config& c = config_;
    const int64_t n = tokens->ne[0], batch = tokens->ne[1];
    GGML_ASSERT(options.relative_buckets && ggml_nelements(options.relative_buckets) == n * n &&
                "T5Options::relative_buckets must hold relative_buckets(n)");
    ggml_tensor* x = ggml_get_rows(ctx, token_embedding_, ggml_reshape_1d(ctx, tokens, n * batch));  // [d, n*B]
    x = ggml_reshape_3d(ctx, x, c.d_model, n, batch);
    // log(1) = 0 for real keys, log(0) = -inf for padding.
    ggml_tensor* key_mask =
        options.key_mask ? ggml_reshape_4d(ctx, ggml_log(ctx, options.key_mask), n, 1, 1, batch) : nullptr;
    // T5's one bias serves every block; umT5's are made block by block, in
    // the block's segment, so none has to outlive its block.
    ggml_tensor* shared_bias =
        relative_bias_ ? attention_bias(ctx, relative_bias_, options, key_mask, n, batch) : nullptr;
    for (int64_t i = 0; i < c.layers; ++i) {
        const Block& b = *blocks_[static_cast<size_t>(i)];
        ggml_tensor* bias =
            b.relative_bias ? attention_bias(ctx, b.relative_bias, options, key_mask, n, batch) : shared_bias;
        x = ggml_add(ctx, x, self_attention(ctx, b, rms_norm(ctx, x, b.attention_norm), bias));
        ggml_tensor* h = rms_norm(ctx, x, b.ff_norm);
        ggml_tensor* gated = ggml_mul(ctx, gelu_tanh(ctx, product_f32(ctx, b.gate, h)), product_f32(ctx, b.up, h));
        x = ggml_add(ctx, x, product_f32(ctx, b.down, gated));
        x = nn::mark_cut(x, "t5.blocks." + std::to_string(i));
    }
    return rms_norm(ctx, x, final_norm_);
}

TextEncoderTensors T5Encoder::build(nn::GraphInputs& s, const TextEncodeShape& shape) const {
    TextEncoderTensors g;
    g.tokens = s.input(GGML_TYPE_I32, {shape.length, shape.batch}, nullptr, "tokens");
    T5Options options;
    const std::vector<int32_t> buckets = relative_buckets(shape.length);
    options.relative_buckets = s.input(GGML_TYPE_I32, {shape.length, shape.length}, buckets.data(), "relative_buckets");
    if (shape.key_mask) {
        options.key_mask = s.input(GGML_TYPE_F32, {shape.length, shape.batch}, shape.key_mask, "key_mask");
    }
    g.out = encode(s.ctx(), g.tokens, options);
    return g;
}

}  // namespace kiln::models
