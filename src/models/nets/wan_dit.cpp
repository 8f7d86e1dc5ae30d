#include "models/nets/wan_dit.h"

#include <string>
#include <vector>

#include "models/nets/block_stages.h"
#include "nn/attention.h"
#include "nn/modulation.h"
#include "nn/patches.h"
#include "nn/rope.h"
#include "nn/shapes.h"

namespace kiln::models {
namespace {

constexpr float kEps = 1e-6f;           // WanModel's eps: every LayerNorm and the QK RMSNorms
constexpr float kImageEmbeddingEps = 1e-5f;  // MLPProj's nn.LayerNorm default
constexpr int64_t kHeadWidth = 128;     // dim / num_heads of every released Wan
constexpr float kRopeTheta = 10000.0f;  // rope_params' theta
constexpr const char* kHeadsKey = "kiln.wan.heads";
constexpr int64_t kWanFramesPerLatent = 4;  // Wan's VAEs compress 4 frames (the first alone) into a latent frame

// A self- or cross-attention (WanSelfAttention, WanT2VCrossAttention;
// WanI2VCrossAttention with k_img, v_img and norm_k_img).
struct Attention {
    nn::Linear q, k, v, o;
    ggml_tensor* norm_q = nullptr;  // [dim]: RMSNorm over the whole width, not per head
    ggml_tensor* norm_k = nullptr;
    nn::Linear k_img, v_img;
    ggml_tensor* norm_k_img = nullptr;
};

struct Block {
    ggml_tensor* modulation = nullptr;  // ne [dim, 6, 1]
    Attention self_attn, cross_attn;
    nn::Norm norm3;  // cross_attn_norm: a LayerNorm with affine
    nn::Linear ffn_in, ffn_out;
};

// What every block of one evaluation shares.
struct Shared {
    ggml_tensor* cos = nullptr;  // rope planes, ne [head_dim, 1, tokens, 1]
    ggml_tensor* sin = nullptr;
    nn::AttentionOptions attn;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    int64_t heads = 1;
    ggml_tensor* e0 = nullptr;       // time_projection's six vectors, ne [dim, 6, B]
    // clean_first_frame: e0 at timestep 0, for the first `first_tokens` tokens.
    ggml_tensor* e0_first = nullptr;
    int64_t first_tokens = 0;
    ggml_tensor* context = nullptr;  // text_embedding of the padded context, ne [dim, kWanTextLength, B]
    ggml_tensor* image_context = nullptr;  // img_emb of CLIP vision's rows, ne [dim, rows, B]; null: T2V
};

// x ne [width, L, B] through a projection and the RMSNorm over its whole width.
ggml_tensor* normed(ggml_context* ctx, const nn::Linear& proj, ggml_tensor* norm, ggml_tensor* x) {
    return nn::rms_norm(ctx, nn::linear(ctx, proj, x), norm, kEps);
}

ggml_tensor* self_attention(ggml_context* ctx, const Shared& s, const Attention& a, ggml_tensor* x) {
    // Normed over the width, then each head's adjacent pairs turned.
    auto rotated = [&](const nn::Linear& proj, ggml_tensor* norm) {
        ggml_tensor* y = normed(ctx, proj, norm, x);
        y = ggml_reshape_4d(ctx, y, y->ne[0] / s.heads, s.heads, y->ne[1], y->ne[2]);
        return nn::rope_pairs(ctx, y, s.cos, s.sin);
    };
    ggml_tensor* out =
        nn::attention(ctx, rotated(a.q, a.norm_q), rotated(a.k, a.norm_k), nn::linear(ctx, a.v, x), s.attn);
    return nn::linear(ctx, a.o, out);
}

ggml_tensor* cross_attention(ggml_context* ctx, const Shared& s, const Attention& a, ggml_tensor* x) {
    ggml_tensor* q = normed(ctx, a.q, a.norm_q, x);
    ggml_tensor* out =
        nn::attention(ctx, q, normed(ctx, a.k, a.norm_k, s.context), nn::linear(ctx, a.v, s.context), s.attn);
    if (s.image_context) {
        // The image rows in an attention of their own, added before o.
        out = ggml_add(ctx, out,
                       nn::attention(ctx, q, normed(ctx, a.k_img, a.norm_k_img, s.image_context),
                                     nn::linear(ctx, a.v_img, s.image_context), s.attn));
    }
    return nn::linear(ctx, a.o, out);
}

// A sub-block's (shift, scale, gate) for every token: the timestep's, and
// with a clean first frame the first `first_tokens` tokens' at timestep 0.
struct TokenModulation {
    nn::ShiftScaleGate rest, first;
    int64_t first_tokens = 0;
};

// f(part, its modulation) over x ne [dim, L, B]: whole, or the first frame's
// tokens and the rest apart, joined again along the tokens.
template <class F>
ggml_tensor* by_tokens(ggml_context* ctx, ggml_tensor* x, const TokenModulation& m, F f) {
    if (m.first_tokens == 0) return f(x, m.rest);
    const int64_t D = x->ne[0], L = x->ne[1], B = x->ne[2], first = m.first_tokens;
    if (first >= L) return f(x, m.first);
    ggml_tensor* head = ggml_cont(ctx, ggml_view_3d(ctx, x, D, first, B, x->nb[1], x->nb[2], 0));
    ggml_tensor* tail = ggml_cont(
        ctx, ggml_view_3d(ctx, x, D, L - first, B, x->nb[1], x->nb[2], static_cast<size_t>(first) * x->nb[1]));
    return ggml_concat(ctx, f(head, m.first), f(tail, m.rest), 1);
}

ggml_tensor* modulated_norm(ggml_context* ctx, ggml_tensor* x, const TokenModulation& m) {
    return by_tokens(ctx, x, m, [&](ggml_tensor* part, const nn::ShiftScaleGate& g) {
        return nn::modulate_layer_norm(ctx, part, g, kEps);
    });
}

// x + gate * y, each token's gate.
ggml_tensor* gated(ggml_context* ctx, ggml_tensor* x, ggml_tensor* y, const TokenModulation& m) {
    if (m.first_tokens == 0) return nn::gated_add(ctx, x, y, m.rest.gate);
    return ggml_add(ctx, x, by_tokens(ctx, y, m, [&](ggml_tensor* part, const nn::ShiftScaleGate& g) {
                        return ggml_mul(ctx, part, g.gate);
                    }));
}

// Sub-block k's (0: the self-attention's, 3: the FFN's) modulation of a block.
TokenModulation block_modulation(ggml_context* ctx, const Shared& s, const Block& b, int64_t k) {
    auto of = [&](ggml_tensor* e0) {
        return nn::shift_scale_gate(ctx, nn::ModulationTable::from_chunks(ctx, ggml_add(ctx, e0, b.modulation)), k);
    };
    TokenModulation m;
    m.rest = of(s.e0);
    if (s.e0_first) {
        m.first = of(s.e0_first);
        m.first_tokens = s.first_tokens;
    }
    return m;
}

// WanAttentionBlock.forward on the tokens ne [dim, L, B].
ggml_tensor* block(ggml_context* ctx, const Shared& s, const Block& b, ggml_tensor* x) {
    // modulation + e0, chunked: (shift, scale, gate) of the self-attention, then of the FFN.
    const TokenModulation attn_mod = block_modulation(ctx, s, b, 0);
    const TokenModulation ffn_mod = block_modulation(ctx, s, b, 3);
    x = gated(ctx, x, self_attention(ctx, s, b.self_attn, modulated_norm(ctx, x, attn_mod)), attn_mod);
    x = ggml_add(ctx, x, cross_attention(ctx, s, b.cross_attn, nn::layer_norm(ctx, b.norm3, x, kEps)));
    ggml_tensor* h = nn::linear(ctx, b.ffn_in, modulated_norm(ctx, x, ffn_mod));
    return gated(ctx, x, nn::linear(ctx, b.ffn_out, nn::gelu_tanh(ctx, s.target, h)), ffn_mod);
}

// ne [W, H, frames * C, B] (each item channel after channel, each channel
// frame after frame) -> ne [W, H, C, frames * B]: every frame an image.
ggml_tensor* frames_as_images(ggml_context* ctx, ggml_tensor* x, int64_t channels, int64_t frames) {
    const int64_t W = x->ne[0], H = x->ne[1], B = x->ne[3];
    if (frames == 1) return x;
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, W * H, frames, channels, B), 0, 2, 1, 3));
    return ggml_reshape_4d(ctx, x, W, H, channels, frames * B);
}

// The inverse of frames_as_images.
ggml_tensor* images_as_frames(ggml_context* ctx, ggml_tensor* x, int64_t frames) {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], B = x->ne[3] / frames;
    if (frames == 1) return x;
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, W * H, C, frames, B), 0, 2, 1, 3));
    return ggml_reshape_4d(ctx, x, W, H, frames * C, B);
}

}  // namespace

std::vector<int> WanDitConfig::rope_axes() const {
    const int d = static_cast<int>(head_dim());
    return {d - 4 * (d / 6), 2 * (d / 6), 2 * (d / 6)};
}

std::vector<int64_t> wan_rope_shape(const WanDitConfig& c, WanGrid grid) { return {c.head_dim(), grid.tokens(), 2}; }

std::vector<float> wan_rope_table(const WanDitConfig& c, WanGrid grid, nn::Seams seams) {
    std::vector<int64_t> positions, periods;
    positions.reserve(static_cast<size_t>(3 * grid.tokens()));
    for (int64_t f = 0; f < grid.frames; ++f)
        for (int64_t r = 0; r < grid.h; ++r)
            for (int64_t col = 0; col < grid.w; ++col) {
                positions.insert(positions.end(), {f, r, col});
                if (seams.any()) periods.insert(periods.end(), {0, seams.y ? grid.h : 0, seams.x ? grid.w : 0});
            }
    return nn::rope_axes_table(positions, c.rope_axes(), kRopeTheta, periods);
}

struct WanDit::Blocks {
    ggml_tensor* patch_kernel = nullptr;  // patch_embedding.weight, ne [p, p, 1, in_channels * dim]
    ggml_tensor* patch_bias = nullptr;
    nn::Linear text_in, text_out;  // text_embedding.0, .2
    nn::MlpEmbedder time;          // time_embedding.0, .2
    nn::Linear time_projection;    // time_projection.1
    std::vector<Block> blocks;
    nn::Linear head;
    ggml_tensor* head_modulation = nullptr;  // ne [dim, 2, 1]
    // img_emb (MLPProj): proj.0 LayerNorm, proj.1 Linear, GELU, proj.3 Linear, proj.4 LayerNorm.
    nn::Norm image_norm_in, image_norm_out;
    nn::Linear image_in, image_out;
    ggml_tensor* image_positions = nullptr;  // img_emb.emb_pos (FLF2V), ne [clip_dim, rows, 1]
    // VACE: vace_patch_embedding, vace_blocks.N, vace_blocks.0.before_proj and each one's after_proj.
    ggml_tensor* vace_patch_kernel = nullptr;  // ne [p, p, 1, vace_in_channels * dim]
    ggml_tensor* vace_patch_bias = nullptr;
    std::vector<Block> vace_blocks;
    nn::Linear vace_before;
    std::vector<nn::Linear> vace_after;
};

WanDit::WanDit() = default;
WanDit::~WanDit() = default;

Result<std::unique_ptr<WanDit>> WanDit::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string where = "Wan DiT under '" + weights.prefix() + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    if (!weights.has("patch_embedding.weight") || !weights.has("blocks.0.cross_attn.norm_k.weight"))
        return bad("no patch_embedding / blocks.0.cross_attn.norm_k (not a Wan DiT)");
    std::unique_ptr<WanDit> dit(new WanDit());
    WanDitConfig& c = dit->config_;
    auto shape = [&](const std::string& name, size_t dims) -> Result<std::vector<int64_t>> {
        const io::TensorInfo* t = weights.info(name);
        if (!t) return bad("missing " + name);
        bool positive = t->shape.size() == dims;
        for (int64_t d : t->shape) positive = positive && d > 0;
        if (!positive)
            return bad(name + " has shape " + t->shape_string() + ", expected " + std::to_string(dims) + " dimensions");
        return t->shape;
    };
    auto patch = shape("patch_embedding.weight", 5);
    if (!patch.ok()) return patch.error();
    c.dim = (*patch)[0];
    c.in_channels = (*patch)[1];
    if ((*patch)[2] != 1 || (*patch)[3] != (*patch)[4]) {
        return bad("patch_embedding.weight is " + weights.info("patch_embedding.weight")->shape_string() +
                   ": patches of 1 frame and p x p pixels are supported (every release's 1 x 2 x 2)");
    }
    c.patch = static_cast<int>((*patch)[3]);
    auto text = shape("text_embedding.0.weight", 2);
    if (!text.ok()) return text.error();
    c.text_dim = (*text)[1];
    auto time = shape("time_embedding.0.weight", 2);
    if (!time.ok()) return time.error();
    c.freq_dim = (*time)[1];
    if (c.freq_dim % 2 != 0)
        return bad("time_embedding.0.weight takes " + std::to_string(c.freq_dim) +
                   " sinusoidal features, expected an even count");
    auto ffn = shape("blocks.0.ffn.0.weight", 2);
    if (!ffn.ok()) return ffn.error();
    c.ffn_dim = (*ffn)[0];
    auto head = shape("head.head.weight", 2);
    if (!head.ok()) return head.error();
    const int64_t patch_area = static_cast<int64_t>(c.patch) * c.patch;
    if ((*head)[0] % patch_area != 0) {
        return bad("head.head.weight is " + weights.info("head.head.weight")->shape_string() +
                   ", expected a multiple of " + std::to_string(patch_area) + " outputs (channels per patch)");
    }
    c.out_channels = (*head)[0] / patch_area;
    // Image-to-video and first-last-frame take a mask of the VAE's 4 frames
    // per latent frame and the clip's latent after the noise (36 = 16 + 4 +
    // 16); the Fun models' control inputs (48 = 16 + 32) kiln has none for.
    const int64_t condition = 2 * c.out_channels + kWanFramesPerLatent;
    if (c.in_channels != c.out_channels && c.in_channels != condition) {
        return bad("patch_embedding takes " + std::to_string(c.in_channels) + " channels for head.head's " +
                   std::to_string(c.out_channels) + "; kiln runs Wan's text-to-video DiTs (" +
                   std::to_string(c.out_channels) + ") and its image-to-video and first-last-frame ones (" +
                   std::to_string(condition) + ")");
    }
    c.layers = 0;
    while (weights.has("blocks." + std::to_string(c.layers) + ".modulation")) ++c.layers;
    if (weights.has("img_emb.proj.0.weight") != weights.has("blocks.0.cross_attn.k_img.weight"))
        return bad("img_emb and blocks.N.cross_attn.k_img come together (Wan 2.1 I2V, FLF2V); it has one of them");
    if (weights.has("img_emb.proj.0.weight")) {
        auto clip = shape("img_emb.proj.0.weight", 1);
        if (!clip.ok()) return clip.error();
        c.clip_dim = (*clip)[0];
        if (weights.has("img_emb.emb_pos")) {
            auto positions = shape("img_emb.emb_pos", 3);
            if (!positions.ok()) return positions.error();
            if ((*positions)[0] != 1 || (*positions)[2] != c.clip_dim || (*positions)[1] % 2 != 0) {
                return bad("img_emb.emb_pos is " + weights.info("img_emb.emb_pos")->shape_string() +
                           ", expected [1, an even number of rows (two images'), " + std::to_string(c.clip_dim) + "]");
            }
            c.image_context_images = 2;
            c.image_context_rows = (*positions)[1];
        }
    }
    while (weights.has("vace_blocks." + std::to_string(c.vace_layers) + ".modulation")) ++c.vace_layers;
    if ((c.vace_layers > 0) != weights.has("vace_patch_embedding.weight"))
        return bad("vace_patch_embedding and vace_blocks.N come together (Wan VACE); it has one of them");
    if (c.vace_layers > 0) {
        auto vace_patch = shape("vace_patch_embedding.weight", 5);
        if (!vace_patch.ok()) return vace_patch.error();
        if ((*vace_patch)[0] != c.dim || (*vace_patch)[2] != 1 || (*vace_patch)[3] != c.patch ||
            (*vace_patch)[4] != c.patch) {
            return bad("vace_patch_embedding.weight is " + weights.info("vace_patch_embedding.weight")->shape_string() +
                       ", expected [" + std::to_string(c.dim) + ", planes, 1, " + std::to_string(c.patch) + ", " +
                       std::to_string(c.patch) + "] (patch_embedding's)");
        }
        c.vace_in_channels = (*vace_patch)[1];
        // The files do not say which blocks the VACE blocks follow; the
        // releases space them evenly from block 0 (sd-cli reads them so too).
        if (c.vace_layers > c.layers || c.layers % c.vace_layers != 0) {
            return bad(std::to_string(c.vace_layers) + " vace_blocks for " + std::to_string(c.layers) +
                       " blocks: VACE blocks follow every k-th block from block 0, so their count must divide the "
                       "blocks' (the 1.3B: 15 of 30, the 14B: 8 of 40)");
        }
        if (c.clip_dim > 0) return bad("VACE blocks on an image-to-video DiT (img_emb) are not a Wan release");
    }

    auto heads = file.metadata_integer(kHeadsKey, 1, c.dim);
    if (!heads.ok()) return bad(heads.error().message);
    if (*heads) {
        c.heads = **heads;
    } else if (c.dim % kHeadWidth == 0) {
        c.heads = c.dim / kHeadWidth;
    } else {
        return bad("width " + std::to_string(c.dim) + " is not a whole number of Wan's heads of 128; set metadata " +
                   kHeadsKey);
    }
    // rope_apply needs whole pairs, and at least one for the row and the column.
    if (c.dim % c.heads != 0 || c.head_dim() % 2 != 0 || c.head_dim() < 6) {
        return bad(std::to_string(c.heads) + " heads do not split the width " + std::to_string(c.dim) +
                   " into heads of an even width of at least 6");
    }
    dit->declare(weights);

    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "Wan DiT";
    can.video = true;
    can.in_channels = c.in_channels;
    can.out_channels = c.out_channels;
    if (c.in_channels != c.out_channels) can.concat = LatentConcat::FirstFrameCondition;
    can.context_width = c.text_dim;
    can.hidden_width = c.dim;
    can.size_stride = c.patch;
    can.max_latent_side = kWanRopePositions * c.patch;
    // Not a joint attention, but what the flag is for holds: the padding to
    // 512 rows is attended, so a context repeated to another's length would
    // change the prediction; passes of different lengths run apart.
    can.joint_attention = true;
    can.seams = true;
    // A VACE stream runs beside the blocks, which the block stages do not carry.
    can.cache_blocks = c.vace_layers > 0 ? 0 : c.layers;
    can.image_context_width = c.clip_dim;
    can.image_context_images = c.clip_dim > 0 ? c.image_context_images : 0;
    can.clean_first_frame = true;
    can.vace_channels = c.vace_in_channels;
    return dit;
}

void WanDit::declare(io::WeightDeclarer& w) {
    const WanDitConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int64_t D = c.dim, p = c.patch;
    b.patch_kernel = w.require("patch_embedding.weight", {D, c.in_channels, 1, p, p});
    b.patch_bias = w.require("patch_embedding.bias", {D});
    b.text_in = nn::declare_linear(w, "text_embedding.0", c.text_dim, D);
    b.text_out = nn::declare_linear(w, "text_embedding.2", D, D);
    b.time = {nn::declare_linear(w, "time_embedding.0", c.freq_dim, D),
              nn::declare_linear(w, "time_embedding.2", D, D)};
    b.time_projection = nn::declare_linear(w, "time_projection.1", D, 6 * D);
    auto attention = [&](const std::string& stem, bool image) {
        Attention a;
        a.q = nn::declare_linear(w, stem + ".q", D, D);
        a.k = nn::declare_linear(w, stem + ".k", D, D);
        a.v = nn::declare_linear(w, stem + ".v", D, D);
        a.o = nn::declare_linear(w, stem + ".o", D, D);
        // Multiplied in element-wise: held in F32 whatever --type says.
        a.norm_q = w.require_f32(stem + ".norm_q.weight", {D});
        a.norm_k = w.require_f32(stem + ".norm_k.weight", {D});
        if (image) {
            a.k_img = nn::declare_linear(w, stem + ".k_img", D, D);
            a.v_img = nn::declare_linear(w, stem + ".v_img", D, D);
            a.norm_k_img = w.require_f32(stem + ".norm_k_img.weight", {D});
        }
        return a;
    };
    auto declare_block = [&](const std::string& stem) {
        Block block;
        // The original adds it to e0 in float32.
        block.modulation = w.require_f32(stem + "modulation", {1, 6, D});
        block.self_attn = attention(stem + "self_attn", false);
        block.cross_attn = attention(stem + "cross_attn", c.clip_dim > 0);
        block.norm3 = {w.require_f32(stem + "norm3.weight", {D}), w.require_f32(stem + "norm3.bias", {D})};
        block.ffn_in = nn::declare_linear(w, stem + "ffn.0", D, c.ffn_dim);
        block.ffn_out = nn::declare_linear(w, stem + "ffn.2", c.ffn_dim, D);
        return block;
    };
    for (int i = 0; i < c.layers; ++i) b.blocks.push_back(declare_block("blocks." + std::to_string(i) + "."));
    if (c.vace_layers > 0) {
        b.vace_patch_kernel = w.require("vace_patch_embedding.weight", {D, c.vace_in_channels, 1, p, p});
        b.vace_patch_bias = w.require("vace_patch_embedding.bias", {D});
        for (int n = 0; n < c.vace_layers; ++n) {
            const std::string stem = "vace_blocks." + std::to_string(n) + ".";
            b.vace_blocks.push_back(declare_block(stem));
            b.vace_after.push_back(nn::declare_linear(w, stem + "after_proj", D, D));
        }
        b.vace_before = nn::declare_linear(w, "vace_blocks.0.before_proj", D, D);
    }
    b.head = nn::declare_linear(w, "head.head", D, p * p * c.out_channels);
    b.head_modulation = w.require_f32("head.modulation", {1, 2, D});
    if (c.clip_dim > 0) {
        b.image_norm_in = nn::declare_norm(w, "img_emb.proj.0", c.clip_dim);
        b.image_in = nn::declare_linear(w, "img_emb.proj.1", c.clip_dim, c.clip_dim);
        b.image_out = nn::declare_linear(w, "img_emb.proj.3", c.clip_dim, D);
        b.image_norm_out = nn::declare_norm(w, "img_emb.proj.4", D);
        if (c.image_context_rows > 0)
            b.image_positions = w.require_f32("img_emb.emb_pos", {1, c.image_context_rows, c.clip_dim});
    }
}

Result<ggml_tensor*> WanDit::build(ggml_context* ctx, const WanDitInputs& in, const WanDitBuildOptions& options) const {
    const WanDitConfig& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& what) -> Error { return Error{"Wan DiT inputs: " + what}; };
    if (!in.x || !in.timesteps || !in.context || !in.rope) return fail("x, timesteps, context and rope are required");
    const int64_t B = in.x->ne[3], p = c.patch, C = c.in_channels;
    if (in.x->ne[2] % C != 0 || in.x->ne[0] % p != 0 || in.x->ne[1] % p != 0) {
        return fail("x is " + nn::ne_string(in.x) + ", expected [W, H, frames x " + std::to_string(C) + ", B] with W" +
                    " and H multiples of " + std::to_string(p));
    }
    const WanGrid grid{in.x->ne[2] / C, in.x->ne[1] / p, in.x->ne[0] / p};
    if (grid.frames > kWanRopePositions || grid.h > kWanRopePositions || grid.w > kWanRopePositions) {
        return fail("x is " + nn::ne_string(in.x) + ": Wan's RoPE covers " + std::to_string(kWanRopePositions) +
                    " frames and patches along each side");
    }
    if (!nn::has_ne(in.timesteps, {B}) || in.timesteps->type != GGML_TYPE_F32)
        return fail("timesteps must be F32 ne [" + std::to_string(B) + "]");
    const int64_t T = in.context->ne[1];
    if (in.context->ne[0] != c.text_dim || T < 1 || T > kWanTextLength || in.context->ne[2] != B ||
        in.context->ne[3] != 1) {
        return fail("context is " + nn::ne_string(in.context) + ", expected [" + std::to_string(c.text_dim) +
                    ", tokens, " + std::to_string(B) + "] with 1 to " + std::to_string(kWanTextLength) + " tokens");
    }
    const std::vector<int64_t> rope_ne = wan_rope_shape(c, grid);
    if (in.rope->type != GGML_TYPE_F32 || !nn::has_ne(in.rope, rope_ne)) {
        return fail("rope is " + nn::ne_string(in.rope) + ", these tokens need F32 " + nn::ne_string(rope_ne) +
                    " (wan_rope_table)");
    }
    if (c.clip_dim > 0) {
        const ggml_tensor* img = in.image_context;
        const bool rows_ok =
            img && img->ne[1] >= 1 && (c.image_context_rows == 0 || img->ne[1] == c.image_context_rows);
        if (!rows_ok || img->ne[0] != c.clip_dim || img->ne[2] != B || img->ne[3] != 1) {
            return fail("image_context is " + (img ? nn::ne_string(img) : std::string("missing")) + ", expected [" +
                        std::to_string(c.clip_dim) + ", " +
                        (c.image_context_rows ? std::to_string(c.image_context_rows) : std::string("rows")) + ", " +
                        std::to_string(B) + "] (CLIP vision's rows of the first frame" +
                        (c.image_context_images == 2 ? " and the last" : "") + ")");
        }
    } else if (in.image_context) {
        return fail("image_context given to a DiT without img_emb (a text-to-video model)");
    }
    if (c.vace_layers > 0) {
        const ggml_tensor* v = in.vace_context;
        if (!v || v->ne[0] != in.x->ne[0] || v->ne[1] != in.x->ne[1] || v->ne[2] != grid.frames * c.vace_in_channels ||
            v->ne[3] != B) {
            return fail("vace_context is " + (v ? nn::ne_string(v) : std::string("missing")) + ", expected [" +
                        std::to_string(in.x->ne[0]) + ", " + std::to_string(in.x->ne[1]) + ", " +
                        std::to_string(grid.frames) + " frames x " + std::to_string(c.vace_in_channels) + ", " +
                        std::to_string(B) + "] (VACE's context, x's layout)");
        }
        if (options.split.stage != BlockStage::Whole) return fail("a VACE DiT builds whole evaluations only");
    } else if (in.vace_context) {
        return fail("vace_context given to a DiT without vace_blocks");
    }
    const int64_t N = grid.tokens();
    const std::string stage_problem = stage_inputs_problem(options.split, in.stream, in.residual, c.dim, N, B);
    if (!stage_problem.empty()) return fail(stage_problem);

    Shared s;
    s.heads = c.heads;
    s.target = options.target;
    const int64_t hd = c.head_dim();
    s.cos = ggml_view_4d(ctx, in.rope, hd, 1, N, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], 0);
    s.sin = ggml_view_4d(ctx, in.rope, hd, 1, N, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], in.rope->nb[2]);
    s.attn.heads = static_cast<int>(c.heads);
    s.attn.flash = options.flash_attention;
    // A clip's tokens are many (14040 at 832x480x33: 9.5 GB of scores per
    // self-attention whole): on the CPU they go a block of queries at a time.
    if (options.target == nn::ComputeTarget::Cpu) s.attn.scores_block_bytes = nn::kCpuScoresBlockBytes;

    // e = time_embedding(sinusoidal_embedding_1d(freq_dim, 1000 sigma)): the
    // same [cos, sin] of t 10000^(-i / half) as BFL's embedding.
    auto embed = [&](ggml_tensor* t) {
        return nn::mlp_embed(ctx, b.time, nn::bfl_time_embedding(ctx, t, static_cast<int>(c.freq_dim)));
    };
    auto project = [&](ggml_tensor* emb) {
        return ggml_reshape_3d(ctx, nn::linear(ctx, b.time_projection, ggml_silu(ctx, emb)), c.dim, 6, B);
    };
    ggml_tensor* e = embed(in.timesteps);
    s.e0 = project(e);
    ggml_tensor* e_first = nullptr;
    if (options.clean_first_frame) {
        e_first = embed(ggml_scale(ctx, in.timesteps, 0.0f));
        s.e0_first = project(e_first);
        s.first_tokens = grid.h * grid.w;
    }

    // The context padded with zero rows to 512 before text_embedding, as the
    // original pads it: every stage's blocks read it.
    ggml_tensor* context = ggml_pad(ctx, in.context, 0, static_cast<int>(kWanTextLength - T), 0, 0);
    s.context = nn::linear(ctx, b.text_out, nn::gelu_tanh(ctx, options.target, nn::linear(ctx, b.text_in, context)));
    if (c.clip_dim > 0) {
        // img_emb (MLPProj): emb_pos added to the two images' rows first (FLF2V).
        ggml_tensor* img = in.image_context;
        if (b.image_positions) img = ggml_add(ctx, img, b.image_positions);
        img = nn::linear(ctx, b.image_in, nn::layer_norm(ctx, b.image_norm_in, img, kImageEmbeddingEps));
        img = nn::linear(ctx, b.image_out, ggml_gelu_erf(ctx, img));
        s.image_context = nn::layer_norm(ctx, b.image_norm_out, img, kImageEmbeddingEps);
    }

    // Tokens: the Conv3d with a 1 x p x p kernel is a linear map of each
    // frame's p x p patches, features (c, ph, pw) as its kernel reads them.
    auto embed_patches = [&](ggml_tensor* planes, int64_t channels, ggml_tensor* kernel, ggml_tensor* bias) {
        ggml_tensor* patches =
            nn::patchify(ctx, frames_as_images(ctx, planes, channels, grid.frames), static_cast<int>(p),
                         nn::PatchFeatures::ChannelSlowest);  // [C p p, h w, frames B]
        ggml_tensor* y =
            ggml_add(ctx, ggml_mul_mat(ctx, ggml_reshape_2d(ctx, kernel, channels * p * p, c.dim), patches), bias);
        return ggml_reshape_3d(ctx, y, c.dim, N, B);  // (frame, row, column) order
    };
    ggml_tensor* x = nullptr;
    if (stage_embeds(options.split)) x = embed_patches(in.x, C, b.patch_kernel, b.patch_bias);
    // VACE: block n's stream, and the main block it follows every `vace_every`.
    ggml_tensor* vace = nullptr;
    const int vace_every = c.vace_layers > 0 ? c.layers / c.vace_layers : 0;
    if (c.vace_layers > 0) {
        vace = nn::linear(ctx, b.vace_before,
                          embed_patches(in.vace_context, c.vace_in_channels, b.vace_patch_kernel, b.vace_patch_bias));
        vace = ggml_add(ctx, vace, x);
    }
    auto run = [&](int64_t i, ggml_tensor* h) {
        h = block(ctx, s, b.blocks[static_cast<size_t>(i)], h);
        if (vace && i % vace_every == 0 && i / vace_every < c.vace_layers) {
            const size_t n = static_cast<size_t>(i / vace_every);
            vace = block(ctx, s, b.vace_blocks[n], vace);
            h = ggml_add(ctx, h, ggml_scale(ctx, nn::linear(ctx, b.vace_after[n], vace), options.vace_strength));
        }
        return nn::mark_cut(h, "blocks." + std::to_string(i));
    };
    StageResults kept;
    x = run_block_stage(ctx, options.split, c.layers, x, in.stream, in.residual, run, kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, x, nullptr, kept);

    // Head: head.modulation + e (no SiLU), chunked (shift, scale).
    auto head_mod = [&](ggml_tensor* emb) {
        ggml_tensor* e3 = ggml_reshape_3d(ctx, emb, c.dim, 1, B);
        auto vector = [&](int64_t k) {
            return ggml_add(ctx, e3, ggml_view_1d(ctx, b.head_modulation, c.dim, k * b.head_modulation->nb[1]));
        };
        nn::ShiftScaleGate m;
        m.shift = vector(0);
        m.scale1 = nn::one_plus(ctx, vector(1));
        return m;
    };
    TokenModulation final_mod;
    final_mod.rest = head_mod(e);
    if (e_first) {
        final_mod.first = head_mod(e_first);
        final_mod.first_tokens = s.first_tokens;
    }
    ggml_tensor* out = nn::linear(ctx, b.head, modulated_norm(ctx, x, final_mod));
    // unpatchify: each token's features (pt, ph, pw, c), channel fastest.
    out = ggml_reshape_3d(ctx, out, out->ne[0], grid.h * grid.w, grid.frames * B);
    out = nn::unpatchify(ctx, out, grid.w, grid.h, static_cast<int>(p), nn::PatchFeatures::ChannelFastest);
    return block_stage_output(ctx, options.split, x, images_as_frames(ctx, out, grid.frames), kept);
}

Status WanDit::check_conditioning(const ConditioningShape& shape) const {
    const WanDitConfig& c = config_;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.context && e.width != c.text_dim) {
            return Error::bad_file("the " + e.module + " text encoder (" + e.label + ") gives " +
                                   std::to_string(e.width) + " features per token but the " + shape.family_label +
                                   " DiT's text_embedding takes " + std::to_string(c.text_dim) +
                                   " (Wan reads umT5-XXL's hidden states: pass the one made for it)");
        }
    }
    if (shape.latent_channels != c.out_channels) {
        return Error::bad_file("the VAE gives " + std::to_string(shape.latent_channels) + "-channel latents but the " +
                               shape.family_label + " DiT predicts " + std::to_string(c.out_channels) +
                               " (Wan 2.1 and the A14B models take Wan 2.1's 16-channel VAE, TI2V-5B Wan 2.2's "
                               "48-channel one)");
    }
    if (capabilities_.concat == LatentConcat::FirstFrameCondition &&
        shape.vae_temporal_downscale != kWanFramesPerLatent) {
        return Error::bad_file("the " + shape.family_label + " DiT takes a mask of " +
                               std::to_string(kWanFramesPerLatent) + " frames per latent frame, but the VAE " +
                               (shape.vae_temporal_downscale > 0
                                    ? "compresses " + std::to_string(shape.vae_temporal_downscale) + " frames into one"
                                    : "encodes single images"));
    }
    return Status::Ok();
}

Result<DiffusionTensors> WanDit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const WanDitConfig& c = config_;
    if (shape.frames < 1) return Error{"DiT graph: " + std::to_string(shape.frames) + " latent frames"};
    DiffusionTensors g;
    const int64_t b = shape.batch;
    WanDitInputs in;
    in.x = g.x =
        s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, shape.frames * c.in_channels, b}, nullptr, "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {c.text_dim, shape.tokens, b}, nullptr, "context");
    // Whole patches (else build() says what is wrong).
    const WanGrid grid{shape.frames, shape.latent_h / c.patch, shape.latent_w / c.patch};
    const std::vector<float> rope = wan_rope_table(c, grid, shape.target.seams);
    in.rope = s.input(GGML_TYPE_F32, wan_rope_shape(c, grid), rope.data(), "rope");
    if (c.clip_dim > 0) {
        in.image_context = g.image_context =
            s.input(GGML_TYPE_F32, {c.clip_dim, shape.image_context_rows, b}, nullptr, "image_context");
    }
    if (c.vace_layers > 0) {
        in.vace_context = g.vace_context =
            s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, shape.frames * c.vace_in_channels, b}, nullptr,
                    "vace_context");
    }
    WanDitBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = shape.target;
    options.split = shape.split;
    options.clean_first_frame = shape.clean_first_frame;
    options.vace_strength = shape.vace_strength;
    make_stage_inputs(s, shape.split, c.dim, grid.tokens(), b, g);
    in.stream = g.stream;
    in.residual = g.residual;
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = *out;
    return g;
}

}  // namespace kiln::models
