#include "models/nets/llm_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "nn/layers.h"

namespace kiln::models {
namespace {

using Naming = LlmConfig::Naming;

constexpr float kDefaultRopeTheta = 1e6f;       // Qwen2.5's and Qwen3's rope_theta
constexpr float kDefaultLlamaRopeTheta = 1e4f;  // HF LlamaConfig's default
constexpr float kDefaultNormEps = 1e-6f;        // Qwen3's rms_norm_eps
constexpr int64_t kDefaultHeadDim = 128;        // without QK norm or GGUF metadata to say it

// The tensors of one layer, in both namings.
enum class Part { Q, K, V, O, QNorm, KNorm, AttentionNorm, Gate, Up, Down, FeedForwardNorm };

// `kind`: "weight", or "bias" for the projections that have one.
// HF's causal-LM classes (Qwen3ForCausalLM) keep the decoder under "model.";
// the bare decoder (Qwen3Model, a diffusers folder's text_encoder/) does not.
std::string hf_stem(Naming naming) { return naming == Naming::HuggingFace ? "model." : ""; }

std::string layer_tensor(Naming naming, int64_t layer, Part part, const char* kind = "weight") {
    const char* leaf = "";
    if (naming == Naming::LlamaCpp) {
        switch (part) {
            case Part::Q: leaf = "attn_q"; break;
            case Part::K: leaf = "attn_k"; break;
            case Part::V: leaf = "attn_v"; break;
            case Part::O: leaf = "attn_output"; break;
            case Part::QNorm: leaf = "attn_q_norm"; break;
            case Part::KNorm: leaf = "attn_k_norm"; break;
            case Part::AttentionNorm: leaf = "attn_norm"; break;
            case Part::Gate: leaf = "ffn_gate"; break;
            case Part::Up: leaf = "ffn_up"; break;
            case Part::Down: leaf = "ffn_down"; break;
            case Part::FeedForwardNorm: leaf = "ffn_norm"; break;
        }
        return "blk." + std::to_string(layer) + "." + leaf + "." + kind;
    }
    switch (part) {
        case Part::Q: leaf = "self_attn.q_proj"; break;
        case Part::K: leaf = "self_attn.k_proj"; break;
        case Part::V: leaf = "self_attn.v_proj"; break;
        case Part::O: leaf = "self_attn.o_proj"; break;
        case Part::QNorm: leaf = "self_attn.q_norm"; break;
        case Part::KNorm: leaf = "self_attn.k_norm"; break;
        case Part::AttentionNorm: leaf = "input_layernorm"; break;
        case Part::Gate: leaf = "mlp.gate_proj"; break;
        case Part::Up: leaf = "mlp.up_proj"; break;
        case Part::Down: leaf = "mlp.down_proj"; break;
        case Part::FeedForwardNorm: leaf = "post_attention_layernorm"; break;
    }
    return hf_stem(naming) + "layers." + std::to_string(layer) + "." + leaf + "." + kind;
}

std::string embedding_name(Naming naming) {
    return naming == Naming::LlamaCpp ? "token_embd.weight" : hf_stem(naming) + "embed_tokens.weight";
}

std::string final_norm_name(Naming naming) {
    return naming == Naming::LlamaCpp ? "output_norm.weight" : hf_stem(naming) + "norm.weight";
}

// A product that may not round through f16 (the header's precision note).
ggml_tensor* product_f32(ggml_context* ctx, ggml_tensor* weight, ggml_tensor* x) {
    ggml_tensor* y = ggml_mul_mat(ctx, weight, x);
    ggml_prec_set_acc(y, GGML_PREC_F32);
    return y;
}

// A projection with its bias, when it has one.
ggml_tensor* project(ggml_context* ctx, ggml_tensor* weight, ggml_tensor* bias, ggml_tensor* x) {
    ggml_tensor* y = ggml_mul_mat(ctx, weight, x);
    return bias ? ggml_add(ctx, y, bias) : y;
}

// A metadata value that must be a finite number: nullopt when the key is
// absent, an error naming the key when it is there but no number.
Result<std::optional<double>> metadata_value(const io::ModelFile& file, const std::string& key,
                                             const std::string& where) {
    if (file.metadata().find(key) == file.metadata().end()) return std::optional<double>();
    const double value = file.metadata_number(key, std::numeric_limits<double>::quiet_NaN());
    if (!std::isfinite(value)) {
        return Error::bad_file(where + ": metadata " + key + " is '" + file.metadata_string(key, "") +
                               "', not a number");
    }
    return std::optional<double>(value);
}

// HF's mrope_section for Qwen2.5-VL (head_dim 128), as proportions of the
// head's rotation pairs where the file does not say.
constexpr std::array<int, 3> kQwenVlRopeSections = {16, 24, 24};

Status read_rope_sections(const io::ModelFile& file, const std::string& key, const std::string& where, LlmConfig& c) {
    const int pairs = static_cast<int>(c.head_dim / 2);
    auto it = file.metadata().find(key);
    if (it == file.metadata().end()) {
        const int whole = kQwenVlRopeSections[0] + kQwenVlRopeSections[1] + kQwenVlRopeSections[2];
        c.rope_sections[0] = pairs * kQwenVlRopeSections[0] / whole;
        c.rope_sections[1] = pairs * kQwenVlRopeSections[1] / whole;
        c.rope_sections[2] = pairs - c.rope_sections[0] - c.rope_sections[1];
        return Status::Ok();
    }
    // A GGUF array, or "16,24,24" as text in a safetensors header.
    std::vector<double> values;
    if (it->second.kind == io::MetaValue::Kind::Array) {
        for (const io::MetaValue& v : it->second.array) values.push_back(std::strtod(v.to_string().c_str(), nullptr));
    } else {
        std::string text = it->second.to_string();
        for (size_t at = 0; at <= text.size();) {
            const size_t comma = std::min(text.find(',', at), text.size());
            values.push_back(std::strtod(text.substr(at, comma - at).c_str(), nullptr));
            at = comma + 1;
        }
    }
    int sum = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        if (!(values[i] >= 0 && values[i] <= pairs) || values[i] != std::floor(values[i]) || (i >= 3 && values[i] != 0))
            sum = -1;
        if (i < 3 && sum >= 0) c.rope_sections[i] = static_cast<int>(values[i]), sum += c.rope_sections[i];
    }
    if (values.size() < 3 || sum != pairs) {
        return Error::bad_file(
            where + ": metadata " + key + " is '" + it->second.to_string() +
            "', not three sections (time, row, column) that add up to head_dim / 2 = " + std::to_string(pairs));
    }
    return Status::Ok();
}

}  // namespace

std::vector<int32_t> llm_multimodal_positions(int64_t length, const std::vector<TokenGrid>& grids) {
    std::vector<int32_t> pos(static_cast<size_t>(4 * length), 0);
    auto set = [&](int64_t token, int64_t t, int64_t r, int64_t c) {
        pos[static_cast<size_t>(token)] = static_cast<int32_t>(t);
        pos[static_cast<size_t>(length + token)] = static_cast<int32_t>(r);
        pos[static_cast<size_t>(2 * length + token)] = static_cast<int32_t>(c);
    };
    int64_t token = 0, next = 0;  // next: the position the next text token takes
    for (const TokenGrid& g : grids) {
        for (; token < g.first; ++token, ++next) set(token, next, next, next);
        for (int64_t r = 0; r < g.rows; ++r)
            for (int64_t c = 0; c < g.cols; ++c) set(token++, next, next + r, next + c);
        next += std::max(g.rows, g.cols);
    }
    for (; token < length; ++token, ++next) set(token, next, next, next);
    return pos;
}

std::string LlmConfig::arch_name() const {
    switch (arch) {
        case Arch::Qwen3: return "qwen3";
        case Arch::Qwen2: return "qwen2";
        case Arch::Llama: return "llama";
    }
    return "";
}

std::vector<float> llm_causal_mask(int64_t n) {
    std::vector<float> mask(static_cast<size_t>(n * n), 0.0f);
    for (int64_t q = 0; q < n; ++q)
        for (int64_t k = q + 1; k < n; ++k)
            mask[static_cast<size_t>(q * n + k)] = -std::numeric_limits<float>::infinity();
    return mask;
}

struct LlmEncoder::Layer {
    ggml_tensor* attention_norm = nullptr;
    ggml_tensor *q = nullptr, *k = nullptr, *v = nullptr,
                *o = nullptr;  // q ne [width, heads * head_dim], k/v [width, kv_heads * head_dim], o the reverse of q
    ggml_tensor *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;  // with qkv_bias only
    ggml_tensor *q_norm = nullptr, *k_norm = nullptr;                     // ne [head_dim], with qk_norm only
    ggml_tensor* ff_norm = nullptr;
    ggml_tensor *gate = nullptr, *up = nullptr, *down = nullptr;
};

bool LlmEncoder::looks_like_llm(const io::ModelFile& file, const std::string& prefix) {
    for (Naming naming : {Naming::HuggingFace, Naming::HuggingFaceBase, Naming::LlamaCpp}) {
        if (file.find(prefix + layer_tensor(naming, 0, Part::Q))) return true;
    }
    return false;
}

Result<std::unique_ptr<LlmEncoder>> LlmEncoder::create(io::WeightDeclarer& weights, int unused_last_layers,
                                                       int first_layers, const LlmFileDefaults& defaults) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<LlmEncoder> enc(new LlmEncoder());
    LlmConfig& c = enc->config_;
    const std::string where = "LLM text encoder under '" + prefix + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    if (unused_last_layers < 0) {
        return Error::invalid_request(where + ": unused_last_layers " + std::to_string(unused_last_layers) +
                                      " is negative");
    }

    // The naming follows the token embedding's name.
    if (file.find(prefix + embedding_name(Naming::HuggingFace))) {
        c.naming = Naming::HuggingFace;
    } else if (file.find(prefix + embedding_name(Naming::HuggingFaceBase))) {
        c.naming = Naming::HuggingFaceBase;
    } else if (file.find(prefix + embedding_name(Naming::LlamaCpp))) {
        c.naming = Naming::LlamaCpp;
    } else {
        return Error::bad_file("no LLM text encoder under '" + prefix + "' (no token embedding: " +
                               embedding_name(Naming::HuggingFace) + " or " + embedding_name(Naming::LlamaCpp) + ")");
    }
    auto name = [&](int64_t layer, Part part) { return layer_tensor(c.naming, layer, part); };
    auto find = [&](int64_t layer, Part part) { return file.find(prefix + name(layer, part)); };

    // The architecture: llama.cpp's names come with GGUF's general.architecture
    // (absent only in files kiln wrote from renamed tensors); otherwise the
    // tensors tell: QK norm is Qwen3, q/k/v biases Qwen2, neither Llama.
    const std::string gguf_arch = file.metadata_string("general.architecture", "");
    if (c.naming == Naming::LlamaCpp && !gguf_arch.empty()) {
        if (gguf_arch == "qwen3") {
            c.arch = LlmConfig::Arch::Qwen3;
        } else if (gguf_arch == "qwen2" || gguf_arch == "qwen2vl") {
            c.arch = LlmConfig::Arch::Qwen2;
        } else if (gguf_arch == "llama") {
            c.arch = LlmConfig::Arch::Llama;
        } else {
            return bad("general.architecture is '" + gguf_arch +
                       "'; the LLM text encoder reads qwen3, qwen2, qwen2vl and llama");
        }
    } else if (find(0, Part::QNorm)) {
        c.arch = LlmConfig::Arch::Qwen3;
    } else if (file.find(prefix + layer_tensor(c.naming, 0, Part::Q, "bias"))) {
        c.arch = LlmConfig::Arch::Qwen2;
    } else {
        c.arch = LlmConfig::Arch::Llama;
    }
    c.qk_norm = c.arch == LlmConfig::Arch::Qwen3;
    c.qkv_bias = c.arch == LlmConfig::Arch::Qwen2;
    c.rope_neox = !(c.arch == LlmConfig::Arch::Llama && c.naming == Naming::LlamaCpp);
    // GGUF's keys are under its own architecture name (qwen2vl.*).
    const std::string meta = (c.naming == Naming::LlamaCpp && !gguf_arch.empty() ? gguf_arch : c.arch_name()) + ".";

    const std::string embedding = embedding_name(c.naming);
    const io::TensorInfo* tok = file.find(prefix + embedding);
    if (tok->shape.size() != 2 || tok->shape[0] <= 0 || tok->shape[1] <= 0) {
        return bad(embedding + " has shape " + tok->shape_string() + ", not [vocab, width]");
    }
    c.vocab = tok->shape[0];
    c.width = tok->shape[1];

    while (find(c.layers, Part::Q)) ++c.layers;
    if (c.layers == 0) return bad("no layers (" + name(0, Part::Q) + " is missing)");

    // head_dim: Qwen3's q_norm length; else the metadata, else 128.
    auto key_length = metadata_value(file, meta + "attention.key_length", where);
    if (!key_length.ok()) return key_length.error();
    const std::string head_dim_from = c.qk_norm ? name(0, Part::QNorm) : "the head width";
    if (c.qk_norm) {
        const io::TensorInfo* q_norm = find(0, Part::QNorm);
        if (!q_norm) return bad("no " + name(0, Part::QNorm) + " (Qwen3's QK norm)");
        if (q_norm->shape.size() != 1 || q_norm->shape[0] <= 0 || q_norm->shape[0] % 2 != 0) {
            return bad(name(0, Part::QNorm) + " has shape " + q_norm->shape_string() +
                       ", not [head_dim] with head_dim even (rope rotates pairs)");
        }
        c.head_dim = q_norm->shape[0];
        if (*key_length && **key_length != static_cast<double>(c.head_dim)) {
            return bad("metadata " + meta + "attention.key_length is " +
                       file.metadata_string(meta + "attention.key_length", "") + " but " + name(0, Part::QNorm) +
                       " has shape " + q_norm->shape_string());
        }
    } else {
        const double stated = key_length->value_or(static_cast<double>(kDefaultHeadDim));
        if (!(stated >= 2 && stated <= 4096) || stated != std::floor(stated) || std::fmod(stated, 2) != 0) {
            return bad("metadata " + meta + "attention.key_length is " +
                       file.metadata_string(meta + "attention.key_length", "") + ", not an even head width");
        }
        c.head_dim = static_cast<int64_t>(stated);
    }

    // heads and kv_heads from the projections' rows.
    auto heads_of = [&](Part part, int64_t* heads) -> Status {
        const io::TensorInfo* t = find(0, part);
        if (!t) return bad("no " + name(0, part));
        if (t->shape.size() != 2 || t->shape[0] % c.head_dim != 0 || t->shape[0] == 0 || t->shape[1] != c.width) {
            return bad(name(0, part) + " has shape " + t->shape_string() + ", not [heads * " +
                       std::to_string(c.head_dim) + ", " + std::to_string(c.width) + "] (head_dim from " +
                       head_dim_from + ", width from " + embedding + ")");
        }
        *heads = t->shape[0] / c.head_dim;
        return Status::Ok();
    };
    KILN_TRY(heads_of(Part::Q, &c.heads));
    KILN_TRY(heads_of(Part::K, &c.kv_heads));
    if (c.heads % c.kv_heads != 0) {
        return bad(std::to_string(c.heads) + " query heads (" + name(0, Part::Q) + ") are not a multiple of " +
                   std::to_string(c.kv_heads) + " K/V heads (" + name(0, Part::K) + ")");
    }
    const io::TensorInfo* gate = find(0, Part::Gate);
    if (!gate) return bad("no feed-forward gate " + name(0, Part::Gate));
    if (gate->shape.size() != 2 || gate->shape[0] <= 0) {
        return bad(name(0, Part::Gate) + " has shape " + gate->shape_string() + ", not [ffn, width]");
    }
    c.ffn = gate->shape[0];

    // GGUF's counts, where present, must agree with the tensors.
    for (const auto& [key, value, from] :
         {std::make_tuple(meta + "attention.head_count", c.heads, name(0, Part::Q)),
          std::make_tuple(meta + "attention.head_count_kv", c.kv_heads, name(0, Part::K)),
          std::make_tuple(meta + "block_count", c.layers, std::string("the layers found"))}) {
        auto stated = metadata_value(file, key, where);
        if (!stated.ok()) return stated.error();
        if (*stated && **stated != static_cast<double>(value)) {
            return bad("metadata " + key + " is " + file.metadata_string(key, "") + " but " + from + " gives " +
                       std::to_string(value));
        }
    }
    auto theta = metadata_value(file, meta + "rope.freq_base", where);
    if (!theta.ok()) return theta.error();
    c.rope_theta = *theta                             ? static_cast<float>(**theta)
                   : defaults.rope_theta > 0.0f       ? defaults.rope_theta
                   : c.arch == LlmConfig::Arch::Llama ? kDefaultLlamaRopeTheta
                                                      : kDefaultRopeTheta;
    if (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)) {
        return bad("metadata " + meta + "rope.freq_base is " + file.metadata_string(meta + "rope.freq_base", "") +
                   ", not a positive number");
    }
    auto eps = metadata_value(file, meta + "attention.layer_norm_rms_epsilon", where);
    if (!eps.ok()) return eps.error();
    c.norm_eps = *eps ? static_cast<float>(**eps) : defaults.norm_eps > 0.0f ? defaults.norm_eps : kDefaultNormEps;
    if (!(c.norm_eps > 0.0f) || !(c.norm_eps < 1.0f)) {
        return bad("metadata " + meta + "attention.layer_norm_rms_epsilon is " +
                   file.metadata_string(meta + "attention.layer_norm_rms_epsilon", "") + ", not in (0, 1)");
    }

    KILN_TRY(read_rope_sections(file, meta + "rope.dimension_sections", where, c));

    if (unused_last_layers >= c.layers) {
        return Error::invalid_request(where + ": unused_last_layers " + std::to_string(unused_last_layers) +
                                      " but the file has " + std::to_string(c.layers) + " layers");
    }
    if (first_layers < 0 || first_layers > c.layers) {
        return Error::invalid_request(where + ": the first " + std::to_string(first_layers) +
                                      " layers are read, but the file has " + std::to_string(c.layers));
    }
    enc->declare(weights, first_layers > 0 ? first_layers : c.layers - unused_last_layers);
    return enc;
}

void LlmEncoder::declare(io::WeightDeclarer& w, int64_t used_layers) {
    const LlmConfig& c = config_;
    const int64_t q_rows = c.heads * c.head_dim, kv_rows = c.kv_heads * c.head_dim;
    token_embedding_ = w.require(embedding_name(c.naming), {c.vocab, c.width});
    for (int64_t i = 0; i < used_layers; ++i) {
        auto l = std::make_shared<Layer>();
        auto req = [&](Part part, std::vector<int64_t> shape) {
            return w.require(layer_tensor(c.naming, i, part), shape);
        };
        l->attention_norm = req(Part::AttentionNorm, {c.width});
        l->q = req(Part::Q, {q_rows, c.width});
        l->k = req(Part::K, {kv_rows, c.width});
        l->v = req(Part::V, {kv_rows, c.width});
        l->o = req(Part::O, {c.width, q_rows});
        if (c.qkv_bias) {
            l->q_bias = w.require(layer_tensor(c.naming, i, Part::Q, "bias"), {q_rows});
            l->k_bias = w.require(layer_tensor(c.naming, i, Part::K, "bias"), {kv_rows});
            l->v_bias = w.require(layer_tensor(c.naming, i, Part::V, "bias"), {kv_rows});
        }
        if (c.qk_norm) {
            l->q_norm = req(Part::QNorm, {c.head_dim});
            l->k_norm = req(Part::KNorm, {c.head_dim});
        }
        l->ff_norm = req(Part::FeedForwardNorm, {c.width});
        l->gate = req(Part::Gate, {c.ffn, c.width});
        l->up = req(Part::Up, {c.ffn, c.width});
        l->down = req(Part::Down, {c.width, c.ffn});
        layers_.push_back(l);
    }
    if (used_layers == c.layers) final_norm_ = w.require(final_norm_name(c.naming), {c.width});
}

ggml_tensor* LlmEncoder::self_attention(ggml_context* ctx, const Layer& layer, ggml_tensor* h,
                                        const LlmOptions& options) const {
    const LlmConfig& c = config_;
    const int64_t n = h->ne[1], batch = h->ne[2];
    // [heads * head_dim, n, B] -> [head_dim, heads, n, B], QK-normed per
    // head, rotated (rope wants the positions in dim 2).
    auto heads_rotated = [&](ggml_tensor* t, int64_t heads, ggml_tensor* norm) {
        t = ggml_reshape_4d(ctx, t, c.head_dim, heads, n, batch);
        if (norm) t = ggml_mul(ctx, ggml_rms_norm(ctx, t, c.norm_eps), norm);
        if (options.positions->ne[0] == 4 * n) {
            int sections[GGML_MROPE_SECTIONS] = {c.rope_sections[0], c.rope_sections[1], c.rope_sections[2], 0};
            return ggml_rope_multi(ctx, t, options.positions, nullptr, static_cast<int>(c.head_dim), sections,
                                   GGML_ROPE_TYPE_MROPE, 0, c.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        }
        return ggml_rope_ext(ctx, t, options.positions, nullptr, static_cast<int>(c.head_dim),
                             c.rope_neox ? GGML_ROPE_TYPE_NEOX : 0, 0, c.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    };
    ggml_tensor* q = heads_rotated(project(ctx, layer.q, layer.q_bias, h), c.heads, layer.q_norm);
    ggml_tensor* k = heads_rotated(project(ctx, layer.k, layer.k_bias, h), c.kv_heads, layer.k_norm);
    // Contiguous [head_dim, n, heads, B], so the products reach BLAS (nn/attention.cpp).
    q = ggml_cont(ctx, ggml_permute(ctx, q, 0, 2, 1, 3));
    k = ggml_cont(ctx, ggml_permute(ctx, k, 0, 2, 1, 3));  // [head_dim, n, kv_heads, B]
    // v as [n keys, head_dim, kv_heads, B], so the second product contracts over the keys.
    ggml_tensor* v = ggml_reshape_4d(ctx, project(ctx, layer.v, layer.v_bias, h), c.head_dim, c.kv_heads, n, batch);
    v = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));
    // ggml_mul_mat broadcasts its first operand over dim 2: query head j
    // meets K/V head j / (heads / kv_heads), HF's repeat_kv.
    ggml_tensor* scores = ggml_mul_mat(ctx, k, q);  // [n keys, n queries, heads, B]
    ggml_prec_set_acc(scores, GGML_PREC_F32);
    scores = ggml_soft_max_ext(ctx, scores, options.mask, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), 0.0f);
    ggml_tensor* out = ggml_mul_mat(ctx, v, scores);  // [head_dim, n queries, heads, B]
    ggml_prec_set_acc(out, GGML_PREC_F32);
    out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));  // [head_dim, heads, n, B]
    return product_f32(ctx, layer.o, ggml_reshape_3d(ctx, out, c.head_dim * c.heads, n, batch));
}

ggml_tensor* LlmEncoder::encode(ggml_context* ctx, ggml_tensor* tokens, const LlmOptions& options) const {
    const LlmConfig& c = config_;
    const int64_t n = tokens->ne[0], batch = tokens->ne[1];
    const int64_t run = options.layers > 0 ? options.layers : declared_layers();
    GGML_ASSERT(run <= declared_layers() && "LlmOptions::layers exceeds the declared layers");
    GGML_ASSERT(options.positions && options.positions->type == GGML_TYPE_I32 &&
                (ggml_nelements(options.positions) == n ||
                 (ggml_nelements(options.positions) == 4 * n && batch == 1 && c.rope_neox)) &&
                "LlmOptions::positions must hold n (or 4 n multimodal) I32 positions");
    GGML_ASSERT((!options.extra_rows ||
                 (options.rows_at && options.replace && batch == 1 && options.extra_rows->ne[0] == c.width)) &&
                "LlmOptions::extra_rows needs rows_at and replace, one sequence, rows of the width");
    GGML_ASSERT(options.mask && options.mask->ne[0] == n && options.mask->ne[1] == n && options.mask->ne[2] == 1 &&
                (options.mask->ne[3] == 1 || options.mask->ne[3] == batch) &&
                "LlmOptions::mask must be [n, n] or [n, n, 1, batch]");
    GGML_ASSERT((!options.final_norm || (final_norm_ && run == c.layers)) &&
                "LlmOptions::final_norm needs every layer of the file");
    auto rms_norm = [&](ggml_tensor* x, ggml_tensor* weight) {
        return ggml_mul(ctx, ggml_rms_norm(ctx, x, c.norm_eps), weight);
    };
    for (int k : options.stacked_outputs) {
        GGML_ASSERT(k >= 0 && k < run && "LlmOptions::stacked_outputs names a layer that does not run");
    }
    ggml_tensor* x = ggml_get_rows(ctx, token_embedding_, ggml_reshape_1d(ctx, tokens, n * batch));  // [w, n*B]
    if (options.extra_rows) {
        // Exactly the rows where replace is 1 and the embeddings elsewhere
        // (a product with 1 or 0 and a sum with 0 change no value).
        ggml_tensor* rows = ggml_get_rows(ctx, options.extra_rows, options.rows_at);
        ggml_tensor* keep = ggml_scale_bias(ctx, options.replace, -1.0f, 1.0f);
        x = ggml_add(ctx, ggml_mul(ctx, x, keep), ggml_mul(ctx, rows, options.replace));
    }
    x = ggml_reshape_3d(ctx, x, c.width, n, batch);
    std::vector<ggml_tensor*> outputs(static_cast<size_t>(run), nullptr);
    for (int64_t i = 0; i < run; ++i) {
        const Layer& l = *layers_[static_cast<size_t>(i)];
        x = ggml_add(ctx, x, self_attention(ctx, l, rms_norm(x, l.attention_norm), options));
        ggml_tensor* h = rms_norm(x, l.ff_norm);
        ggml_tensor* gated = ggml_mul(ctx, ggml_silu(ctx, product_f32(ctx, l.gate, h)), product_f32(ctx, l.up, h));
        x = ggml_add(ctx, x, product_f32(ctx, l.down, gated));
        x = nn::mark_cut(x, "llm.layers." + std::to_string(i));
        outputs[static_cast<size_t>(i)] = x;
    }
    if (!options.stacked_outputs.empty()) {
        ggml_tensor* stacked = nullptr;
        for (int k : options.stacked_outputs) {
            ggml_tensor* layer = outputs[static_cast<size_t>(k)];
            // HF's last hidden state (hidden_states[layers]) is final-normed.
            if (k == c.layers - 1 && final_norm_) layer = rms_norm(layer, final_norm_);
            stacked = stacked ? ggml_concat(ctx, stacked, layer, 0) : layer;
        }
        return stacked;
    }
    return options.final_norm ? rms_norm(x, final_norm_) : x;
}

TextEncoderTensors LlmEncoder::build(nn::GraphInputs& s, const TextEncodeShape& shape) const {
    TextEncoderTensors g;
    const int64_t length = shape.length;
    g.tokens = s.input(GGML_TYPE_I32, {length, shape.batch}, nullptr, "tokens");
    std::vector<int32_t> positions(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    if (!shape.image_grids.empty()) positions = llm_multimodal_positions(length, shape.image_grids);
    std::vector<float> mask = llm_causal_mask(length);
    if (shape.key_mask) {
        // Padding after the prompt: no query attends to it (HF's attention_mask).
        for (int64_t q = 0; q < length; ++q) {
            for (int64_t k = 0; k < length; ++k) {
                if (shape.key_mask[k] == 0.0f) mask[static_cast<size_t>(q * length + k)] = -INFINITY;
            }
        }
    }
    LlmOptions options;
    options.positions = s.input(GGML_TYPE_I32, {static_cast<int64_t>(positions.size())}, positions.data(), "positions");
    if (!shape.image_grids.empty()) {
        // The image tokens take the extra rows in order, grid after grid.
        std::vector<int32_t> rows_at(static_cast<size_t>(length), 0);
        std::vector<float> replace(static_cast<size_t>(length), 0.0f);
        int32_t row = 0;
        for (const TokenGrid& g : shape.image_grids) {
            for (int64_t t = g.first; t < g.first + g.rows * g.cols; ++t, ++row) {
                rows_at[static_cast<size_t>(t)] = row;
                replace[static_cast<size_t>(t)] = 1.0f;
            }
        }
        GGML_ASSERT(row == shape.extra_rows && "TextEncodeShape: the image grids' tokens are the extra rows");
        options.extra_rows = s.input(GGML_TYPE_F32, {config_.width, row}, shape.extra_embeddings, "image_rows");
        options.rows_at = s.input(GGML_TYPE_I32, {length}, rows_at.data(), "image_rows_at");
        options.replace = s.input(GGML_TYPE_F32, {1, length}, replace.data(), "image_rows_mask");
    }
    options.mask = s.input(GGML_TYPE_F32, {length, length}, mask.data(), "causal_mask");
    options.final_norm = shape.final_norm && declared_layers() == config_.layers;
    // HF's hidden_states[k] is the output of layer k - 1.
    for (int k : shape.hidden_states) options.stacked_outputs.push_back(k - 1);
    g.out = encode(s.ctx(), g.tokens, options);
    return g;
}

}  // namespace kiln::models
