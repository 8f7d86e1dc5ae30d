#include "models/nets/z_image_dit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "models/nets/block_stages.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/modulation.h"
#include "nn/patches.h"
#include "nn/rope.h"
#include "nn/shapes.h"

namespace kiln::models {
namespace {

constexpr float kFinalNormEps = 1e-6f;  // the final layer's LayerNorm
constexpr float kTimeScale = 1000.0f;   // t_scale: the embedder sees (1 - sigma) * 1000
constexpr int kMaxPeriod = 10000;

// One transformer block: a noise refiner, a context refiner (no adaLN) or a
// main layer.
struct Block {
    nn::Linear qkv;               // single-file names: q, k, v rows stacked; null weight when split
    nn::Linear to_q, to_k, to_v;  // diffusers names
    nn::Linear out;
    ggml_tensor* q_norm = nullptr;  // [head_dim]
    ggml_tensor* k_norm = nullptr;
    ggml_tensor* attention_norm1 = nullptr;  // [dim]
    ggml_tensor* attention_norm2 = nullptr;
    ggml_tensor* ffn_norm1 = nullptr;
    ggml_tensor* ffn_norm2 = nullptr;
    nn::Linear w1, w2, w3;
    nn::Linear ada;  // adaLN_modulation.0; null weight in a context refiner
};

// The file's name for a single-file name: itself, or the original's /
// diffusers' (attention.qkv is split, so it is handled by the caller).
class Naming {
  public:
    Naming(bool diffusers, int patch) : diffusers_(diffusers), embedder_suffix_(std::to_string(patch) + "-1.") {}
    // A full name or a layer's stem (without ".weight").
    std::string operator()(const std::string& name) const {
        if (!diffusers_) return name;
        std::string n = name + ".";  // every part ends in a dot
        if (n.rfind("x_embedder.", 0) == 0) n = "all_x_embedder." + embedder_suffix_ + n.substr(11);
        if (n.rfind("final_layer.", 0) == 0) n = "all_final_layer." + embedder_suffix_ + n.substr(12);
        for (auto [from, to] : {std::pair{".attention.out.", ".attention.to_out.0."},
                                std::pair{".attention.q_norm.", ".attention.norm_q."},
                                std::pair{".attention.k_norm.", ".attention.norm_k."}}) {
            const size_t at = n.find(from);
            if (at != std::string::npos) n.replace(at, std::string(from).size(), to);
        }
        return n.substr(0, n.size() - 1);
    }

  private:
    bool diffusers_;
    std::string embedder_suffix_;
};

// Shapes from the sizes build() sees.
std::vector<int64_t> rope_shape(const ZImageConfig& c, int64_t image_tokens, int64_t txt_tokens, int64_t batch) {
    return {c.head_dim, z_image_padded(image_tokens) + z_image_padded(txt_tokens), batch, 2};
}
std::vector<int64_t> cap_pad_shape(int64_t txt_tokens, int64_t batch) { return {z_image_padded(txt_tokens), batch}; }
std::vector<int64_t> mask_shape(int64_t image_tokens, int64_t txt_tokens, int64_t batch) {
    return {z_image_padded(image_tokens) + z_image_padded(txt_tokens), batch};
}

// What one run of blocks over the same tokens shares.
struct Span {
    ggml_tensor* cos = nullptr;  // rope planes, ne [head_dim, 1, L, B]
    ggml_tensor* sin = nullptr;
    nn::AttentionOptions attn;
};

// The four modulation vectors of a modulated block, each ne [dim, 1, B]:
// 1 + scale_msa, tanh(gate_msa), 1 + scale_mlp, tanh(gate_mlp).
struct Mod {
    ggml_tensor* scale1_msa = nullptr;
    ggml_tensor* gate_msa = nullptr;
    ggml_tensor* scale1_mlp = nullptr;
    ggml_tensor* gate_mlp = nullptr;
};

Mod modulation(ggml_context* ctx, const nn::Linear& ada, ggml_tensor* t_emb) {
    const nn::ModulationTable t = nn::ModulationTable::split(ctx, nn::linear(ctx, ada, t_emb), 4);  // of [4 dim, B]
    return {nn::one_plus(ctx, t.at(ctx, 0)), ggml_tanh(ctx, t.at(ctx, 1)), nn::one_plus(ctx, t.at(ctx, 2)),
            ggml_tanh(ctx, t.at(ctx, 3))};
}

struct Shared {
    int64_t heads = 1;
    float eps = 1e-5f;
};

ggml_tensor* attention(ggml_context* ctx, const Shared& s, const Span& span, const Block& b, ggml_tensor* x) {
    const int64_t dim = x->ne[0];
    auto project = [&](int i, const nn::Linear& split) {
        return nn::linear(ctx, b.qkv.weight ? nn::linear_rows(ctx, b.qkv, i * dim, dim) : split, x);
    };
    ggml_tensor* q = nn::head_rms_norm(ctx, project(0, b.to_q), b.q_norm, s.heads, s.eps);
    ggml_tensor* k = nn::head_rms_norm(ctx, project(1, b.to_k), b.k_norm, s.heads, s.eps);
    ggml_tensor* v = project(2, b.to_v);
    ggml_tensor* a = nn::attention(ctx, nn::rope_pairs(ctx, q, span.cos, span.sin),
                                   nn::rope_pairs(ctx, k, span.cos, span.sin), v, span.attn);
    return nn::linear(ctx, b.out, a);
}

// w2(silu(w1 x) * w3 x)
ggml_tensor* feed_forward(ggml_context* ctx, const Block& b, ggml_tensor* x) {
    return nn::linear(ctx, b.w2, ggml_mul(ctx, ggml_silu(ctx, nn::linear(ctx, b.w1, x)), nn::linear(ctx, b.w3, x)));
}

// One block on x ne [dim, L, B]; `mod` null for a context refiner.
ggml_tensor* block(ggml_context* ctx, const Shared& s, const Span& span, const Block& b, ggml_tensor* x,
                   const Mod* mod) {
    ggml_tensor* h = nn::rms_norm(ctx, x, b.attention_norm1, s.eps);
    if (mod) h = ggml_mul(ctx, h, mod->scale1_msa);
    ggml_tensor* a = nn::rms_norm(ctx, attention(ctx, s, span, b, h), b.attention_norm2, s.eps);
    x = ggml_add(ctx, x, mod ? ggml_mul(ctx, a, mod->gate_msa) : a);
    h = nn::rms_norm(ctx, x, b.ffn_norm1, s.eps);
    if (mod) h = ggml_mul(ctx, h, mod->scale1_mlp);
    ggml_tensor* f = nn::rms_norm(ctx, feed_forward(ctx, b, h), b.ffn_norm2, s.eps);
    return ggml_add(ctx, x, mod ? ggml_mul(ctx, f, mod->gate_mlp) : f);
}

// `count` copies of a pad token (ne [dim] or [dim, 1]) per batch entry: ne [dim, count, B].
ggml_tensor* pad_tokens(ggml_context* ctx, ggml_tensor* token, int64_t count, int64_t B) {
    return ggml_repeat_4d(ctx, token, token->ne[0], count, B, 1);
}

// An additive mask over the keys ne [Nk, B] (a contiguous view or tensor),
// expanded for every query: ne [Nk, Nk, 1, B].
ggml_tensor* expand_mask(ggml_context* ctx, ggml_tensor* keys) {
    const int64_t n = keys->ne[0], B = keys->ne[1];
    return ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, keys, n, 1, 1, B), n, n, 1, B);
}

}  // namespace

int64_t z_image_padded(int64_t tokens) {
    return (tokens + kZImageSeqMultiple - 1) / kZImageSeqMultiple * kZImageSeqMultiple;
}

bool ZImageTokens::needs_mask() const {
    for (int64_t l : caption_lengths) {
        if (z_image_padded(l) != caption_slots()) return true;
    }
    return false;
}

Result<ZImageTokens> z_image_tokens(const ZImageConfig& c, int64_t latent_w, int64_t latent_h, int64_t txt_tokens,
                                    std::vector<int64_t> caption_lengths) {
    auto fail = [](const std::string& message) { return Error::invalid_request("Z-Image: " + message); };
    if (latent_w < c.patch || latent_h < c.patch || latent_w % c.patch != 0 || latent_h % c.patch != 0) {
        return fail("latent size " + std::to_string(latent_w) + "x" + std::to_string(latent_h) +
                    " is not a positive multiple of " + std::to_string(c.patch));
    }
    if (caption_lengths.empty()) return fail("no caption lengths (one per batch item)");
    for (int64_t l : caption_lengths) {
        if (l < 1 || l > txt_tokens) {
            return fail("caption length " + std::to_string(l) + " is outside 1.." + std::to_string(txt_tokens) +
                        " (the context's tokens)");
        }
    }
    ZImageTokens t;
    t.grid_w = latent_w / c.patch;
    t.grid_h = latent_h / c.patch;
    t.txt_tokens = txt_tokens;
    t.caption_lengths = std::move(caption_lengths);
    return t;
}

std::vector<int64_t> z_image_rope_shape(const ZImageConfig& c, const ZImageTokens& t) {
    return rope_shape(c, t.grid_w * t.grid_h, t.txt_tokens, t.batch());
}

std::vector<float> z_image_rope_table(const ZImageConfig& c, const ZImageTokens& t, nn::Seams seams) {
    const int64_t D = c.head_dim, S = t.slots(), B = t.batch();
    const int64_t Np = t.image_slots(), n_image = t.grid_w * t.grid_h;
    std::vector<float> table(static_cast<size_t>(2 * D * S * B), 0.0f);
    // Per axis, the frequencies of its pairs.
    std::vector<std::pair<size_t, double>> pairs;  // (axis, omega)
    for (size_t axis = 0; axis < c.axes_dim.size(); ++axis) {
        const int dim = c.axes_dim[axis];
        for (int j = 0; j < dim / 2; ++j)
            pairs.emplace_back(axis, std::pow(static_cast<double>(c.theta), -2.0 * j / dim));
    }
    // Across seams the image's rows and columns repeat (nn::periodic_frequency).
    const std::array<int64_t, 3> image_periods = {0, seams.y ? t.grid_h : 0, seams.x ? t.grid_w : 0};
    auto fill = [&](int64_t b, int64_t slot, const std::array<int64_t, 3>& pos, bool image = false) {
        float* cos_row = table.data() + (b * S + slot) * D;
        float* sin_row = cos_row + D * S * B;
        for (size_t j = 0; j < pairs.size() && static_cast<int64_t>(2 * j + 1) < D; ++j) {
            const size_t axis = pairs[j].first;
            const double omega = image ? nn::periodic_frequency(pairs[j].second, image_periods[axis]) : pairs[j].second;
            // The original rounds the angle to float32 (precompute_freqs_cis' .float()).
            const float angle = static_cast<float>(static_cast<double>(pos[axis]) * omega);
            const float cs = static_cast<float>(std::cos(static_cast<double>(angle)));
            const float sn = static_cast<float>(std::sin(static_cast<double>(angle)));
            cos_row[2 * j] = cs;
            cos_row[2 * j + 1] = cs;
            sin_row[2 * j] = -sn;
            sin_row[2 * j + 1] = sn;
        }
    };
    for (int64_t b = 0; b < B; ++b) {
        const int64_t lp = z_image_padded(t.caption_lengths[static_cast<size_t>(b)]);
        for (int64_t i = 0; i < Np; ++i) {
            if (i < n_image) {
                fill(b, i, {lp + 1, i / t.grid_w, i % t.grid_w}, /*image=*/true);
            } else {
                fill(b, i, {0, 0, 0});
            }
        }
        for (int64_t i = 0; i < lp; ++i) fill(b, Np + i, {i + 1, 0, 0});
        // Batch padding (slots lp..Tp) stays zero.
    }
    return table;
}

std::vector<int64_t> z_image_caption_pad_shape(const ZImageTokens& t) { return cap_pad_shape(t.txt_tokens, t.batch()); }

std::vector<float> z_image_caption_pad(const ZImageTokens& t) {
    const int64_t Tp = t.caption_slots();
    std::vector<float> pad;
    pad.reserve(static_cast<size_t>(Tp * t.batch()));
    for (int64_t l : t.caption_lengths) {
        for (int64_t i = 0; i < Tp; ++i) pad.push_back(i < l ? 0.0f : 1.0f);
    }
    return pad;
}

std::vector<int64_t> z_image_attention_mask_shape(const ZImageTokens& t) {
    return mask_shape(t.grid_w * t.grid_h, t.txt_tokens, t.batch());
}

std::vector<float> z_image_attention_mask(const ZImageTokens& t) {
    const int64_t Np = t.image_slots(), Tp = t.caption_slots();
    std::vector<float> mask;
    mask.reserve(static_cast<size_t>((Np + Tp) * t.batch()));
    for (int64_t l : t.caption_lengths) {
        mask.insert(mask.end(), static_cast<size_t>(Np), 0.0f);
        const int64_t lp = z_image_padded(l);
        for (int64_t i = 0; i < Tp; ++i) mask.push_back(i < lp ? 0.0f : -INFINITY);
    }
    return mask;
}

struct ZImageDit::Blocks {
    nn::Linear x_embedder, t_in, t_out, cap_in, final_linear, final_mod;
    ggml_tensor* cap_norm = nullptr;
    ggml_tensor* x_pad_token = nullptr;
    ggml_tensor* cap_pad_token = nullptr;
    std::vector<Block> noise_refiner, context_refiner, layers;
};

ZImageDit::ZImageDit() = default;
ZImageDit::~ZImageDit() = default;

bool ZImageDit::looks_like_z_image(const io::ModelFile& file, const std::string& prefix) {
    auto has = [&](const std::string& name) { return file.find(prefix + name) != nullptr; };
    return (has("x_embedder.weight") || has("all_x_embedder.2-1.weight")) && has("cap_embedder.1.weight") &&
           has("x_pad_token") && has("cap_pad_token") && has("layers.0.adaLN_modulation.0.weight");
}

Result<std::unique_ptr<ZImageDit>> ZImageDit::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<ZImageDit> dit(new ZImageDit());
    ZImageConfig& c = dit->config_;
    c.diffusers_names = file.find(prefix + "all_x_embedder.2-1.weight") != nullptr;
    const Naming names(c.diffusers_names, c.patch);
    auto find = [&](const std::string& name) { return file.find(prefix + names(name)); };
    auto shaped = [&](const std::string& name, size_t dims) -> const io::TensorInfo* {
        const io::TensorInfo* t = find(name);
        return t && t->shape.size() == dims ? t : nullptr;
    };
    const std::string where = "Z-Image DiT under '" + prefix + "'";
    const io::TensorInfo* x_embedder = shaped("x_embedder.weight", 2);
    const io::TensorInfo* cap_embedder = shaped("cap_embedder.1.weight", 2);
    const io::TensorInfo* t_in = shaped("t_embedder.mlp.0.weight", 2);
    const io::TensorInfo* t_out = shaped("t_embedder.mlp.2.weight", 2);
    const io::TensorInfo* final_linear = shaped("final_layer.linear.weight", 2);
    const io::TensorInfo* q_norm = shaped("layers.0.attention.q_norm.weight", 1);
    const io::TensorInfo* w1 = shaped("layers.0.feed_forward.w1.weight", 2);
    if (!x_embedder || !cap_embedder || !t_in || !t_out || !final_linear || !q_norm || !w1 || !find("x_pad_token") ||
        !find("cap_pad_token")) {
        return Error::bad_file("no Z-Image DiT under '" + prefix +
                               "' (x_embedder, cap_embedder, t_embedder, pad tokens, layers.0 or final_layer "
                               "missing or malformed)");
    }
    c.dim = x_embedder->shape[0];
    c.in_channels = x_embedder->shape[1];
    c.out_channels = final_linear->shape[0];
    c.cap_dim = cap_embedder->shape[1];
    c.t_mid = t_in->shape[0];
    c.t_freq_dim = t_in->shape[1];
    c.t_embed_dim = t_out->shape[0];
    c.ffn_hidden = w1->shape[0];
    c.head_dim = q_norm->shape[0];
    // A zero size would reach ggml as an empty weight (or as zero heads).
    if (c.dim <= 0 || c.in_channels <= 0 || c.out_channels <= 0 || c.cap_dim <= 0 || c.t_mid <= 0 ||
        c.t_freq_dim <= 0 || c.t_embed_dim <= 0 || c.ffn_hidden <= 0) {
        return Error::bad_file(where + ": a zero size in its embedders, final layer or feed-forward");
    }
    if (c.head_dim <= 0 || c.dim % c.head_dim != 0) {
        return Error::bad_file(where + ": width " + std::to_string(c.dim) + " does not split into heads of " +
                               std::to_string(c.head_dim));
    }
    c.heads = c.dim / c.head_dim;
    const int64_t pp = static_cast<int64_t>(c.patch) * c.patch;
    if (c.in_channels % pp != 0 || c.out_channels != c.in_channels) {
        return Error::bad_file(where + ": x_embedder takes " + std::to_string(c.in_channels) +
                               " and final_layer.linear gives " + std::to_string(c.out_channels) +
                               ", expected equal multiples of " + std::to_string(pp));
    }
    if (c.t_freq_dim % 2 != 0 || t_out->shape[1] != c.t_mid) {
        return Error::bad_file(where + ": t_embedder's layers do not chain (" + std::to_string(c.t_freq_dim) + " -> " +
                               std::to_string(c.t_mid) + ", " + std::to_string(t_out->shape[1]) + " -> " +
                               std::to_string(c.t_embed_dim) + ")");
    }
    auto count = [&](const std::string& stem) {
        int n = 0;
        while (find(stem + "." + std::to_string(n) + ".attention_norm1.weight")) ++n;
        return n;
    };
    c.noise_refiner_layers = count("noise_refiner");
    c.context_refiner_layers = count("context_refiner");
    c.layers = count("layers");

    if (file.metadata().count("kiln.z_image.axes_dim")) {
        auto axes = nn::parse_rope_axes("kiln.z_image.axes_dim", file.metadata_string("kiln.z_image.axes_dim", ""),
                                        "three even positive sizes like 32,48,48");
        if (!axes.ok()) return axes.error();
        c.axes_dim = std::move(axes).value();
    } else if (c.head_dim != 128) {
        return Error::bad_file(where + ": heads of " + std::to_string(c.head_dim) +
                               " need RoPE axes (Z-Image's are for 128); set metadata kiln.z_image.axes_dim");
    }
    int64_t axes_sum = 0;
    for (int a : c.axes_dim) axes_sum += a;
    if (c.axes_dim.size() != 3 || axes_sum != c.head_dim) {
        return Error::bad_file(where + ": RoPE axes must be three and sum to the head width " +
                               std::to_string(c.head_dim));
    }

    KILN_TRY(dit->declare(weights));
    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "DiT";
    can.joint_attention = true;
    can.seams = true;
    can.in_channels = can.out_channels = c.latent_channels();
    can.context_width = c.cap_dim;
    can.size_stride = c.patch;
    can.cache_blocks = c.layers;
    return dit;
}

Status ZImageDit::declare(io::WeightDeclarer& w) {
    const ZImageConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const Naming names(c.diffusers_names, c.patch);
    auto linear = [&](const std::string& stem, int64_t in, int64_t out, bool bias = true) {
        return nn::declare_linear(w, names(stem), in, out, bias);
    };
    auto vector = [&](const std::string& name, int64_t n) { return w.require(names(name), {n}); };
    // Pad tokens are [1, dim] in the released files; [dim] is accepted too.
    b.x_embedder = linear("x_embedder", c.in_channels, c.dim);
    b.t_in = linear("t_embedder.mlp.0", c.t_freq_dim, c.t_mid);
    b.t_out = linear("t_embedder.mlp.2", c.t_mid, c.t_embed_dim);
    b.cap_norm = vector("cap_embedder.0.weight", c.cap_dim);
    b.cap_in = linear("cap_embedder.1", c.cap_dim, c.dim);
    // [1, dim] in the release, [dim] in ComfyUI-GGUF's files: shapes match
    // modulo leading 1s.
    b.x_pad_token = w.require_f32("x_pad_token", {c.dim});
    b.cap_pad_token = w.require_f32("cap_pad_token", {c.dim});
    auto declare_block = [&](const std::string& stem, bool modulated) {
        Block k;
        const std::string p = stem + ".";
        if (c.diffusers_names) {
            k.to_q = linear(p + "attention.to_q", c.dim, c.dim, false);
            k.to_k = linear(p + "attention.to_k", c.dim, c.dim, false);
            k.to_v = linear(p + "attention.to_v", c.dim, c.dim, false);
        } else {
            k.qkv = linear(p + "attention.qkv", c.dim, 3 * c.dim, false);
        }
        k.out = linear(p + "attention.out", c.dim, c.dim, false);
        k.q_norm = vector(p + "attention.q_norm.weight", c.head_dim);
        k.k_norm = vector(p + "attention.k_norm.weight", c.head_dim);
        k.attention_norm1 = vector(p + "attention_norm1.weight", c.dim);
        k.attention_norm2 = vector(p + "attention_norm2.weight", c.dim);
        k.ffn_norm1 = vector(p + "ffn_norm1.weight", c.dim);
        k.ffn_norm2 = vector(p + "ffn_norm2.weight", c.dim);
        k.w1 = linear(p + "feed_forward.w1", c.dim, c.ffn_hidden, false);
        k.w2 = linear(p + "feed_forward.w2", c.ffn_hidden, c.dim, false);
        k.w3 = linear(p + "feed_forward.w3", c.dim, c.ffn_hidden, false);
        if (modulated) k.ada = linear(p + "adaLN_modulation.0", c.t_embed_dim, 4 * c.dim);
        return k;
    };
    for (int i = 0; i < c.noise_refiner_layers; ++i)
        b.noise_refiner.push_back(declare_block("noise_refiner." + std::to_string(i), true));
    for (int i = 0; i < c.context_refiner_layers; ++i)
        b.context_refiner.push_back(declare_block("context_refiner." + std::to_string(i), false));
    for (int i = 0; i < c.layers; ++i) b.layers.push_back(declare_block("layers." + std::to_string(i), true));
    b.final_linear = linear("final_layer.linear", c.dim, c.out_channels);
    b.final_mod = linear("final_layer.adaLN_modulation.1", c.t_embed_dim, c.dim);
    return Status::Ok();
}

Result<ggml_tensor*> ZImageDit::build(ggml_context* ctx, const ZImageInputs& in,
                                      const ZImageBuildOptions& options) const {
    const ZImageConfig& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& message) { return Error::invalid_request("Z-Image: " + message); };
    if (!in.x || !in.timesteps || !in.context || !in.rope || !in.cap_pad) {
        return fail("x, timesteps, context, rope and cap_pad are required");
    }
    const int64_t B = in.x->ne[3];
    if (in.x->ne[2] != c.latent_channels()) {
        return fail("x has " + std::to_string(in.x->ne[2]) + " channels, the network takes " +
                    std::to_string(c.latent_channels()));
    }
    if (in.x->ne[0] % c.patch != 0 || in.x->ne[1] % c.patch != 0) {
        return fail("x size " + std::to_string(in.x->ne[0]) + "x" + std::to_string(in.x->ne[1]) +
                    " is not a multiple of " + std::to_string(c.patch));
    }
    if (!nn::has_ne(in.timesteps, {B}) || in.timesteps->type != GGML_TYPE_F32) {
        return fail("timesteps must be F32 ne [" + std::to_string(B) + "]");
    }
    if (in.context->ne[0] != c.cap_dim) {
        return fail("context is " + std::to_string(in.context->ne[0]) + " wide, the network takes " +
                    std::to_string(c.cap_dim));
    }
    if (in.context->ne[1] < 1 || in.context->ne[2] != B || in.context->ne[3] != 1) {
        return fail("context must be ne [" + std::to_string(c.cap_dim) + ", tokens, " + std::to_string(B) + "]");
    }
    const int64_t T = in.context->ne[1];
    const int64_t gw = in.x->ne[0] / c.patch, gh = in.x->ne[1] / c.patch;
    const int64_t N = gw * gh, Np = z_image_padded(N), Tp = z_image_padded(T);
    auto check_table = [&](const ggml_tensor* t, const std::vector<int64_t>& ne, const std::string& name,
                           const std::string& maker) -> Status {
        if (t->type != GGML_TYPE_F32 || !nn::has_ne(t, ne)) {
            return fail(name + " is " + nn::ne_string(t) + ", these tokens need F32 " + nn::ne_string(ne) + " (" +
                        maker + ")");
        }
        return Status::Ok();
    };
    KILN_TRY(check_table(in.rope, rope_shape(c, N, T, B), "rope", "z_image_rope_table"));
    KILN_TRY(check_table(in.cap_pad, cap_pad_shape(T, B), "cap_pad", "z_image_caption_pad"));
    if (in.mask) KILN_TRY(check_table(in.mask, mask_shape(N, T, B), "mask", "z_image_attention_mask"));
    const std::string stage_problem = stage_inputs_problem(options.split, in.stream, in.residual, c.dim, Np + Tp, B);
    if (!stage_problem.empty()) return fail(stage_problem);

    Shared s;
    s.heads = c.heads;
    s.eps = c.norm_eps;
    // The rope planes of slots [first, first + n), each ne [head_dim, 1, n, B].
    auto span = [&](int64_t first, int64_t n, ggml_tensor* mask) {
        Span sp;
        auto plane = [&](int k) {
            return ggml_view_4d(ctx, in.rope, c.head_dim, 1, n, B, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2],
                                k * in.rope->nb[3] + first * in.rope->nb[1]);
        };
        sp.cos = plane(0);
        sp.sin = plane(1);
        sp.attn.heads = static_cast<int>(c.heads);
        sp.attn.flash = options.flash_attention;
        sp.attn.mask = mask;
        return sp;
    };

    // t_emb = t_embedder(emb((1 - sigma) * 1000)), ne [t_embed_dim, B].
    ggml_tensor* t = ggml_scale_bias(ctx, in.timesteps, -kTimeScale, kTimeScale);
    ggml_tensor* t_freq = ggml_timestep_embedding(ctx, t, static_cast<int>(c.t_freq_dim), kMaxPeriod);
    ggml_tensor* t_emb = nn::linear(ctx, b.t_out, ggml_silu(ctx, nn::linear(ctx, b.t_in, t_freq)));

    // The embeddings (Whole and Front only): the image slots through the
    // noise refiners, the caption slots through the context refiners.
    ggml_tensor* x = nullptr;
    if (stage_embeds(options.split)) {
        // Image slots: embedded patches, then x_pad_token.
        ggml_tensor* img = nn::linear(
            ctx, b.x_embedder, nn::patchify(ctx, in.x, c.patch, nn::PatchFeatures::ChannelFastest));  // [dim, N, B]
        if (Np > N) img = ggml_concat(ctx, img, pad_tokens(ctx, b.x_pad_token, Np - N, B), 1);
        const Span img_span = span(0, Np, nullptr);
        for (size_t i = 0; i < b.noise_refiner.size(); ++i) {
            const Mod mod = modulation(ctx, b.noise_refiner[i].ada, t_emb);
            img = nn::mark_cut(block(ctx, s, img_span, b.noise_refiner[i], img, &mod),
                               "noise_refiner." + std::to_string(i));
        }

        // Caption slots: cap_embedder(context), cap_pad_token where cap_pad says.
        ggml_tensor* cap =
            nn::linear(ctx, b.cap_in, nn::rms_norm(ctx, in.context, b.cap_norm, c.norm_eps));  // [dim, T, B]
        if (Tp > T) cap = ggml_concat(ctx, cap, pad_tokens(ctx, b.cap_pad_token, Tp - T, B), 1);
        ggml_tensor* pad = ggml_reshape_3d(ctx, in.cap_pad, 1, Tp, B);
        cap = ggml_add(ctx, ggml_mul(ctx, cap, ggml_scale_bias(ctx, pad, -1.0f, 1.0f)),
                       ggml_mul(ctx, pad_tokens(ctx, b.cap_pad_token, Tp, B), pad));
        ggml_tensor* cap_mask = nullptr;
        if (in.mask) {
            ggml_tensor* cap_keys = ggml_view_2d(ctx, in.mask, Tp, B, in.mask->nb[1], Np * in.mask->nb[0]);
            cap_mask = expand_mask(ctx, ggml_cont(ctx, cap_keys));
        }
        const Span cap_span = span(Np, Tp, cap_mask);
        for (size_t i = 0; i < b.context_refiner.size(); ++i) {
            cap = nn::mark_cut(block(ctx, s, cap_span, b.context_refiner[i], cap, nullptr),
                               "context_refiner." + std::to_string(i));
        }
        x = ggml_concat(ctx, img, cap, 1);  // [dim, Np + Tp, B]
    }

    // Main layers over every slot, image first: the blocks of the stage.
    ggml_tensor* mask = in.mask ? expand_mask(ctx, in.mask) : nullptr;
    const Span all_span = span(0, Np + Tp, mask);
    auto layer = [&](int64_t i, ggml_tensor* h) {
        const Block& l = b.layers[static_cast<size_t>(i)];
        const Mod mod = modulation(ctx, l.ada, t_emb);
        return nn::mark_cut(block(ctx, s, all_span, l, h, &mod), "layers." + std::to_string(i));
    };
    StageResults kept;
    x = run_block_stage(ctx, options.split, static_cast<int64_t>(b.layers.size()), x, in.stream, in.residual, layer,
                        kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, x, nullptr, kept);

    // Final layer on the image's tokens: LayerNorm * (1 + scale), linear; negated.
    ggml_tensor* scale = nn::linear(ctx, b.final_mod, ggml_silu(ctx, t_emb));  // [dim, B]
    scale = ggml_scale_bias(ctx, ggml_reshape_3d(ctx, scale, c.dim, 1, B), 1.0f, 1.0f);
    ggml_tensor* out = ggml_mul(ctx, ggml_norm(ctx, nn::token_range(ctx, x, 0, N), kFinalNormEps), scale);
    out = nn::linear(ctx, b.final_linear, out);  // [C p p, N, B]
    return block_stage_output(
        ctx, options.split, x,
        ggml_scale(ctx, nn::unpatchify(ctx, out, gw, gh, c.patch, nn::PatchFeatures::ChannelFastest), -1.0f), kept);
}

Status ZImageDit::check_conditioning(const ConditioningShape& shape) const {
    const ZImageConfig& zc = config_;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.width != zc.cap_dim) {
            return Error::bad_file("the " + e.module + " text encoder (" + e.label + ") is " + std::to_string(e.width) +
                                   " wide but the " + shape.family_label + " DiT's caption embedder takes " +
                                   std::to_string(zc.cap_dim) + " (Z-Image reads Qwen3-4B: pass it with --llm)");
        }
    }
    if (shape.latent_channels != zc.latent_channels()) {
        return Error::bad_file("the VAE has " + std::to_string(shape.latent_channels) + " latent channels but the " +
                               shape.family_label + " DiT takes " + std::to_string(zc.latent_channels()) +
                               " (an SD VAE with Z-Image? pass Flux's ae)");
    }
    return Status::Ok();
}

Result<DiffusionTensors> ZImageDit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const ZImageConfig& zc = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    ZImageInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, zc.latent_channels(), b}, nullptr, "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {zc.cap_dim, shape.tokens, b}, nullptr, "context");
    auto tokens = z_image_tokens(zc, shape.latent_w, shape.latent_h, shape.tokens,
                                 std::vector<int64_t>(static_cast<size_t>(b), shape.tokens));
    if (!tokens.ok()) return Error{"DiT graph: " + tokens.error().message};
    const std::vector<float> rope = z_image_rope_table(zc, *tokens, shape.target.seams);
    in.rope = s.input(GGML_TYPE_F32, z_image_rope_shape(zc, *tokens), rope.data(), "rope");
    const std::vector<float> pad = z_image_caption_pad(*tokens);
    in.cap_pad = s.input(GGML_TYPE_F32, z_image_caption_pad_shape(*tokens), pad.data(), "cap_pad");
    ZImageBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.split = shape.split;
    make_stage_inputs(s, shape.split, zc.dim, tokens->slots(), b, g);
    in.stream = g.stream;
    in.residual = g.residual;
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = *out;
    return g;
}

std::vector<std::string> ZImageDit::lora_split_names(const std::string& stem) const {
    auto ends_with = [&](const std::string& suffix) {
        return stem.size() >= suffix.size() && stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".attention.qkv")) {
        const std::string base = stem.substr(0, stem.size() - 3);
        return {base + "to_q", base + "to_k", base + "to_v"};
    }
    if (ends_with(".attention.out")) return {stem.substr(0, stem.size() - 3) + "to_out.0"};
    return {stem};
}

std::optional<DiffusionNetwork::LoraFusedLayer> ZImageDit::lora_fused_layer(const std::string& stem) const {
    if (!config_.diffusers_names) return std::nullopt;
    const std::string attention = ".attention.";
    const size_t at = stem.rfind(attention);
    if (at == std::string::npos) return std::nullopt;
    const std::string base = stem.substr(0, at + attention.size()), leaf = stem.substr(at + attention.size());
    const char* parts[] = {"to_q", "to_k", "to_v"};
    for (int i = 0; i < 3; ++i) {
        if (leaf == parts[i]) return LoraFusedLayer{base + "qkv", i, 3};
    }
    if (leaf == "to_out.0") return LoraFusedLayer{base + "out", 0, 1};
    return std::nullopt;
}

}  // namespace kiln::models
