#include "models/nets/qwen_image_dit.h"

#include <algorithm>
#include <array>
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

constexpr float kNormEps = 1e-6f;      // the LayerNorms, txt_norm and the QK RMSNorms
constexpr int kTimeEmbedding = 256;    // Timesteps(num_channels=256)
constexpr int kPatch = 2;              // the pipelines' _pack_latents
constexpr int64_t kQwenHeadDim = 128;  // the head width axes_dims_rope (16, 56, 56) is for

// One stream of a block: the image's (to_q ... to_out.0, norm_q, img_mod,
// img_mlp) or the text's (add_q_proj ... to_add_out, norm_added_q, txt_mod,
// txt_mlp).
struct Stream {
    nn::Linear modulation;  // *_mod.1: 6 chunks, (shift, scale, gate) x (attention, MLP)
    nn::Linear q, k, v, out;
    ggml_tensor* q_norm = nullptr;
    ggml_tensor* k_norm = nullptr;
    nn::Linear mlp_in, mlp_out;  // *_mlp.net.0.proj, *_mlp.net.2
};

struct Block {
    Stream img, txt;
};

// What every block of one evaluation shares.
struct Shared {
    ggml_tensor* cos = nullptr;  // rope planes, ne [head_dim, 1, tokens, 1]
    ggml_tensor* sin = nullptr;
    nn::AttentionOptions attn;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    int64_t heads = 1;
    ggml_tensor* silu_t = nullptr;  // silu(temb): every modulation's input
    // zero_cond_t with references: silu(temb) of timestep 0, the references'
    // modulation in the image stream; null otherwise.
    ggml_tensor* silu_zero = nullptr;
    int64_t image_tokens = 0;  // the image's own tokens, before the references'
};

// A run of the image stream's tokens and the modulation it takes: the
// image's own (t), or with zero_cond_t the references' (t = 0). Layer norms
// are per token, so each run is normalised and modulated on its own.
struct Span {
    int64_t count = 0;
    nn::ShiftScaleGate mod[2];  // attention, MLP
};

// The stream's modulation of `silu` (shift, scale, gate for the attention,
// then for the MLP: _modulate's chunk(3) of each half).
std::array<nn::ShiftScaleGate, 2> modulation(ggml_context* ctx, const Stream& st, ggml_tensor* silu) {
    const nn::ModulationTable table = nn::ModulationTable::split(ctx, nn::linear(ctx, st.modulation, silu), 6);
    return {nn::shift_scale_gate(ctx, table, 0), nn::shift_scale_gate(ctx, table, 3)};
}

// f(tokens of the span, its modulation k) over each span, joined back.
template <class F>
ggml_tensor* over_spans(ggml_context* ctx, const std::vector<Span>& spans, ggml_tensor* x, int k, F f) {
    if (spans.size() == 1) return f(x, spans.front().mod[k], 0, x->ne[1]);
    ggml_tensor* out = nullptr;
    int64_t first = 0;
    for (const Span& span : spans) {
        ggml_tensor* part = f(nn::token_range(ctx, x, first, span.count), span.mod[k], first, span.count);
        out = out ? ggml_concat(ctx, out, part, 1) : part;
        first += span.count;
    }
    return out;
}

ggml_tensor* modulated(ggml_context* ctx, const std::vector<Span>& spans, ggml_tensor* x, int k) {
    return over_spans(ctx, spans, x, k, [&](ggml_tensor* part, const nn::ShiftScaleGate& m, int64_t, int64_t) {
        return nn::modulate_layer_norm(ctx, part, m, kNormEps);
    });
}

// x + gate * y, each span with its own gate.
ggml_tensor* gated(ggml_context* ctx, const std::vector<Span>& spans, ggml_tensor* x, ggml_tensor* y, int k) {
    return over_spans(ctx, spans, x, k,
                      [&](ggml_tensor* part, const nn::ShiftScaleGate& m, int64_t first, int64_t count) {
                          ggml_tensor* y_part = spans.size() == 1 ? y : nn::token_range(ctx, y, first, count);
                          return nn::gated_add(ctx, part, y_part, m.gate);
                      });
}

ggml_tensor* mlp(ggml_context* ctx, const Shared& s, const Stream& st, ggml_tensor* x) {
    return nn::linear(ctx, st.mlp_out, nn::gelu_tanh(ctx, s.target, nn::linear(ctx, st.mlp_in, x)));
}

// A block on the joint tokens ne [hidden, T + N, B] (text first; the image
// stream's N tokens the image's and the references').
ggml_tensor* block(ggml_context* ctx, const Shared& s, const Block& b, ggml_tensor* joint, int64_t T) {
    const int64_t N = joint->ne[1] - T;
    ggml_tensor* txt = nn::token_range(ctx, joint, 0, T);
    ggml_tensor* img = nn::token_range(ctx, joint, T, N);
    const std::array<nn::ShiftScaleGate, 2> txt_mod = modulation(ctx, b.txt, s.silu_t);
    const std::array<nn::ShiftScaleGate, 2> img_mod = modulation(ctx, b.img, s.silu_t);
    const std::vector<Span> txt_spans = {{T, {txt_mod[0], txt_mod[1]}}};
    std::vector<Span> spans = {{N, {img_mod[0], img_mod[1]}}};
    if (s.silu_zero && s.image_tokens < N) {  // zero_cond_t: the references at t = 0
        const std::array<nn::ShiftScaleGate, 2> ref_mod = modulation(ctx, b.img, s.silu_zero);
        spans.front().count = s.image_tokens;
        spans.push_back({N - s.image_tokens, {ref_mod[0], ref_mod[1]}});
    }

    // Joint attention over cat(txt, img): q and k RMS-normed per head, then rotated.
    ggml_tensor* txt_m = modulated(ctx, txt_spans, txt, 0);
    ggml_tensor* img_m = modulated(ctx, spans, img, 0);
    auto normed = [&](const nn::Linear& proj, ggml_tensor* norm, ggml_tensor* x) {
        return nn::head_rms_norm(ctx, nn::linear(ctx, proj, x), norm, s.heads, kNormEps);  // ne [D, heads, L, B]
    };
    ggml_tensor* q = ggml_concat(ctx, normed(b.txt.q, b.txt.q_norm, txt_m), normed(b.img.q, b.img.q_norm, img_m), 2);
    ggml_tensor* k = ggml_concat(ctx, normed(b.txt.k, b.txt.k_norm, txt_m), normed(b.img.k, b.img.k_norm, img_m), 2);
    ggml_tensor* v = ggml_concat(ctx, nn::linear(ctx, b.txt.v, txt_m), nn::linear(ctx, b.img.v, img_m), 1);
    ggml_tensor* attn =
        nn::attention(ctx, nn::rope_pairs(ctx, q, s.cos, s.sin), nn::rope_pairs(ctx, k, s.cos, s.sin), v, s.attn);
    txt = gated(ctx, txt_spans, txt, nn::linear(ctx, b.txt.out, nn::token_range(ctx, attn, 0, T)), 0);
    img = gated(ctx, spans, img, nn::linear(ctx, b.img.out, nn::token_range(ctx, attn, T, N)), 0);

    img = gated(ctx, spans, img, mlp(ctx, s, b.img, modulated(ctx, spans, img, 1)), 1);
    txt = gated(ctx, txt_spans, txt, mlp(ctx, s, b.txt, modulated(ctx, txt_spans, txt, 1)), 1);
    return ggml_concat(ctx, txt, img, 1);
}

int64_t token_count(int64_t txt_tokens, QwenImageGrid image, const std::vector<QwenImageGrid>& refs) {
    int64_t n = txt_tokens + image.w * image.h;
    for (const QwenImageGrid& r : refs) n += r.w * r.h;
    return n;
}

}  // namespace

std::vector<int64_t> qwen_image_rope_shape(const QwenImageConfig& c, int64_t txt_tokens, QwenImageGrid image,
                                           const std::vector<QwenImageGrid>& refs) {
    return {c.head_dim(), token_count(txt_tokens, image, refs), 2};
}

std::vector<float> qwen_image_rope_table(const QwenImageConfig& c, int64_t txt_tokens, QwenImageGrid image,
                                         const std::vector<QwenImageGrid>& refs, nn::Seams seams) {
    std::vector<QwenImageGrid> grids = {image};
    grids.insert(grids.end(), refs.begin(), refs.end());
    // scale_rope: the text follows the largest half-extent of any image.
    int64_t text_start = 0;
    for (const QwenImageGrid& g : grids) text_start = std::max({text_start, g.h / 2, g.w / 2});
    std::vector<int64_t> positions;  // (frame, row, col) of every token
    positions.reserve(static_cast<size_t>(3 * token_count(txt_tokens, image, refs)));
    for (int64_t l = 0; l < txt_tokens; ++l)
        positions.insert(positions.end(), {text_start + l, text_start + l, text_start + l});
    std::vector<int64_t> periods(positions.size(), 0);  // the same, across seams
    // Each image centred, an odd side one more below zero than above
    // (_compute_video_freqs: neg_freqs[-(h - h // 2):], then pos_freqs[:h // 2]).
    for (size_t frame = 0; frame < grids.size(); ++frame) {
        const QwenImageGrid& g = grids[frame];
        for (int64_t row = 0; row < g.h; ++row)
            for (int64_t col = 0; col < g.w; ++col) {
                positions.insert(positions.end(),
                                 {static_cast<int64_t>(frame), row - (g.h - g.h / 2), col - (g.w - g.w / 2)});
                periods.insert(periods.end(), {0, seams.y ? g.h : 0, seams.x ? g.w : 0});
            }
    }
    return nn::rope_axes_table(positions, c.axes_dim, c.theta, seams.any() ? periods : std::vector<int64_t>{});
}

struct QwenImageDit::Blocks {
    nn::MlpEmbedder time;  // time_text_embed.timestep_embedder linear_1, linear_2
    ggml_tensor* txt_norm = nullptr;
    nn::Linear img_in, txt_in;
    std::vector<Block> blocks;
    nn::Linear final_mod, proj_out;  // norm_out.linear: (scale, shift)
};

QwenImageDit::QwenImageDit() = default;
QwenImageDit::~QwenImageDit() = default;

Result<std::unique_ptr<QwenImageDit>> QwenImageDit::create(io::WeightDeclarer& weights, bool zero_cond_t) {
    const io::ModelFile& file = weights.file();
    const std::string where = "Qwen-Image DiT under '" + weights.prefix() + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    if (!weights.has("transformer_blocks.0.img_mod.1.weight") || !weights.has("txt_norm.weight"))
        return bad("no transformer_blocks.0.img_mod.1 / txt_norm (not a Qwen-Image DiT)");
    if (weights.has("time_text_embed.addition_t_embedding.weight"))
        return bad("time_text_embed.addition_t_embedding (Qwen-Image-Layered's extra condition) is not supported");
    std::unique_ptr<QwenImageDit> dit(new QwenImageDit());
    QwenImageConfig& c = dit->config_;
    // ComfyUI's Edit-2511 files carry an empty __index_timestep_zero__ to say so.
    c.zero_cond_t = zero_cond_t || weights.has("__index_timestep_zero__");
    auto shape = [&](const std::string& name, size_t dims) -> Result<std::vector<int64_t>> {
        const io::TensorInfo* t = weights.info(name);
        if (!t) return bad("missing " + name);
        bool positive = t->shape.size() == dims;
        for (int64_t d : t->shape) positive = positive && d > 0;
        if (!positive)
            return bad(name + " has shape " + t->shape_string() + ", expected " + std::to_string(dims) + " dimensions");
        return t->shape;
    };
    auto img_in = shape("img_in.weight", 2);
    if (!img_in.ok()) return img_in.error();
    c.hidden = (*img_in)[0];
    if ((*img_in)[1] % (kPatch * kPatch) != 0)
        return bad("img_in.weight is " + weights.info("img_in.weight")->shape_string() + ", expected " +
                   std::to_string(kPatch * kPatch) + " features per latent channel");
    c.patch = kPatch;
    c.channels = (*img_in)[1] / (kPatch * kPatch);
    auto txt_in = shape("txt_in.weight", 2);
    if (!txt_in.ok()) return txt_in.error();
    if ((*txt_in)[0] != c.hidden)
        return bad("txt_in.weight is " + weights.info("txt_in.weight")->shape_string() + ", img_in's width is " +
                   std::to_string(c.hidden));
    c.context_dim = (*txt_in)[1];
    auto norm_q = shape("transformer_blocks.0.attn.norm_q.weight", 1);
    if (!norm_q.ok()) return norm_q.error();
    const int64_t head_dim = (*norm_q)[0];
    if (head_dim % 2 != 0 || c.hidden % head_dim != 0)
        return bad("head width " + std::to_string(head_dim) + " does not divide the width " + std::to_string(c.hidden) +
                   " into heads of pairs");
    c.heads = c.hidden / head_dim;
    auto mlp_in = shape("transformer_blocks.0.img_mlp.net.0.proj.weight", 2);
    if (!mlp_in.ok()) return mlp_in.error();
    c.mlp_hidden = (*mlp_in)[0];
    auto proj_out = shape("proj_out.weight", 2);
    if (!proj_out.ok()) return proj_out.error();
    if ((*proj_out)[0] != kPatch * kPatch * c.channels)
        return bad("proj_out.weight is " + weights.info("proj_out.weight")->shape_string() + ", expected " +
                   std::to_string(kPatch * kPatch * c.channels) + " outputs (as img_in's inputs)");
    c.depth = 0;
    while (weights.has("transformer_blocks." + std::to_string(c.depth) + ".img_mod.1.weight")) ++c.depth;
    if (file.metadata().count("kiln.qwen_image.axes_dim")) {
        auto axes =
            nn::parse_rope_axes("kiln.qwen_image.axes_dim", file.metadata_string("kiln.qwen_image.axes_dim", ""),
                                "three even positive sizes like 16,56,56");
        if (!axes.ok()) return axes.error().in_context(where + ": ");
        c.axes_dim = *axes;
    } else if (head_dim != kQwenHeadDim) {
        return bad("heads " + std::to_string(head_dim) +
                   " wide need RoPE axes (Qwen-Image's are for 128); set metadata kiln.qwen_image.axes_dim");
    }
    int64_t axes_sum = 0;
    for (int a : c.axes_dim) axes_sum += a;
    if (c.axes_dim.size() != 3 || axes_sum != head_dim)
        return bad("RoPE axes must be three and sum to the head width " + std::to_string(head_dim));
    dit->declare(weights);

    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "DiT";
    can.joint_attention = true;
    can.seams = true;
    can.in_channels = can.out_channels = c.channels;
    can.context_width = c.context_dim;
    can.size_stride = c.patch;
    can.reference_images = true;
    can.cache_blocks = c.depth;
    return dit;
}

void QwenImageDit::declare(io::WeightDeclarer& w) {
    const QwenImageConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int64_t H = c.hidden, M = c.mlp_hidden, D = c.head_dim(), P = c.patch * c.patch * c.channels;
    b.time = {nn::declare_linear(w, "time_text_embed.timestep_embedder.linear_1", kTimeEmbedding, H),
              nn::declare_linear(w, "time_text_embed.timestep_embedder.linear_2", H, H)};
    // Multiplied in element-wise: held in F32 whatever --type says.
    b.txt_norm = w.require_f32("txt_norm.weight", {c.context_dim});
    b.img_in = nn::declare_linear(w, "img_in", P, H);
    b.txt_in = nn::declare_linear(w, "txt_in", c.context_dim, H);
    for (int i = 0; i < c.depth; ++i) {
        const std::string p = "transformer_blocks." + std::to_string(i) + ".";
        Block block;
        struct Names {
            Stream* st;
            const char *stream, *q, *k, *v, *out, *q_norm, *k_norm;
        };
        for (const Names& n : {Names{&block.img, "img", "to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k"},
                               Names{&block.txt, "txt", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                                     "norm_added_q", "norm_added_k"}}) {
            const std::string stream = n.stream;
            n.st->modulation = nn::declare_linear(w, p + stream + "_mod.1", H, 6 * H);
            n.st->q = nn::declare_linear(w, p + "attn." + n.q, H, H);
            n.st->k = nn::declare_linear(w, p + "attn." + n.k, H, H);
            n.st->v = nn::declare_linear(w, p + "attn." + n.v, H, H);
            n.st->out = nn::declare_linear(w, p + "attn." + n.out, H, H);
            n.st->q_norm = w.require_f32(p + "attn." + n.q_norm + ".weight", {D});
            n.st->k_norm = w.require_f32(p + "attn." + n.k_norm + ".weight", {D});
            n.st->mlp_in = nn::declare_linear(w, p + stream + "_mlp.net.0.proj", H, M);
            n.st->mlp_out = nn::declare_linear(w, p + stream + "_mlp.net.2", M, H);
        }
        b.blocks.push_back(block);
    }
    b.final_mod = nn::declare_linear(w, "norm_out.linear", H, 2 * H);
    b.proj_out = nn::declare_linear(w, "proj_out", H, P);
}

Result<ggml_tensor*> QwenImageDit::build(ggml_context* ctx, const QwenImageInputs& in,
                                         const QwenImageBuildOptions& options) const {
    const QwenImageConfig& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& what) -> Error { return Error{"Qwen-Image DiT inputs: " + what}; };
    if (!in.x || !in.timesteps || !in.context || !in.rope) return fail("x, timesteps, context and rope are required");
    const int64_t B = in.x->ne[3], p = c.patch;
    auto check_latent = [&](const ggml_tensor* t, const std::string& what) -> Status {
        if (t->ne[2] != c.channels || t->ne[3] != B || t->ne[0] % p != 0 || t->ne[1] % p != 0) {
            return fail(what + " is " + nn::ne_string(t) + ", expected [W, H, " + std::to_string(c.channels) + ", " +
                        std::to_string(B) + "] with W and H multiples of " + std::to_string(p));
        }
        return Status::Ok();
    };
    KILN_TRY(check_latent(in.x, "x"));
    for (size_t i = 0; i < in.refs.size(); ++i) {
        if (!in.refs[i]) return fail("reference latent " + std::to_string(i) + " is null");
        KILN_TRY(check_latent(in.refs[i], "reference latent " + std::to_string(i)));
    }
    if (!nn::has_ne(in.timesteps, {B})) return fail("timesteps must be ne [" + std::to_string(B) + "]");
    if (in.context->ne[0] != c.context_dim || in.context->ne[1] < 1 || in.context->ne[2] != B ||
        in.context->ne[3] != 1) {
        return fail("context is " + nn::ne_string(in.context) + ", expected [" + std::to_string(c.context_dim) +
                    ", tokens, " + std::to_string(B) + "]");
    }
    const int64_t T = in.context->ne[1];
    const QwenImageGrid grid{in.x->ne[0] / p, in.x->ne[1] / p};
    std::vector<QwenImageGrid> ref_grids;
    for (ggml_tensor* r : in.refs) ref_grids.push_back({r->ne[0] / p, r->ne[1] / p});
    const std::vector<int64_t> rope_ne = qwen_image_rope_shape(c, T, grid, ref_grids);
    if (in.rope->type != GGML_TYPE_F32 || !nn::has_ne(in.rope, rope_ne)) {
        return fail("rope is " + nn::ne_string(in.rope) + ", these tokens need F32 " + nn::ne_string(rope_ne) +
                    " (qwen_image_rope_table)");
    }
    const int64_t n_tokens = rope_ne[1], N = grid.w * grid.h;
    const std::string stage_problem =
        stage_inputs_problem(options.split, in.stream, in.residual, c.hidden, n_tokens, B);
    if (!stage_problem.empty()) return fail(stage_problem);

    Shared s;
    s.heads = c.heads;
    s.target = options.target;
    s.image_tokens = N;
    const int64_t hd = c.head_dim();
    s.cos = ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], 0);
    s.sin =
        ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], in.rope->nb[2]);
    s.attn.heads = static_cast<int>(c.heads);
    s.attn.flash = options.flash_attention;
    // Timesteps(256, flip_sin_to_cos, shift 0, scale 1000): cat(cos, sin) of
    // 1000 t, as BFL's embedding.
    auto temb = [&](ggml_tensor* t) {
        return nn::mlp_embed(ctx, b.time, nn::bfl_time_embedding(ctx, t, kTimeEmbedding));
    };
    ggml_tensor* vec = temb(in.timesteps);
    s.silu_t = ggml_silu(ctx, vec);
    if (c.zero_cond_t && !in.refs.empty()) s.silu_zero = ggml_silu(ctx, temb(ggml_scale(ctx, in.timesteps, 0.0f)));

    // Tokens: text, then the image's patches and each reference's.
    ggml_tensor* x = nullptr;
    if (stage_embeds(options.split)) {
        auto patches = [&](ggml_tensor* latent) {
            return nn::patchify(ctx, latent, static_cast<int>(p), nn::PatchFeatures::ChannelSlowest);
        };
        ggml_tensor* img = patches(in.x);
        for (ggml_tensor* r : in.refs) img = ggml_concat(ctx, img, patches(r), 1);
        ggml_tensor* txt = nn::linear(ctx, b.txt_in, nn::rms_norm(ctx, in.context, b.txt_norm, kNormEps));
        x = ggml_concat(ctx, txt, nn::linear(ctx, b.img_in, img), 1);
    }
    auto run = [&](int64_t i, ggml_tensor* h) {
        return nn::mark_cut(block(ctx, s, b.blocks[static_cast<size_t>(i)], h, T),
                            "transformer_blocks." + std::to_string(i));
    };
    StageResults kept;
    x = run_block_stage(ctx, options.split, c.depth, x, in.stream, in.residual, run, kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, x, nullptr, kept);
    // The image's tokens (text and references dropped) through norm_out, an
    // AdaLayerNormContinuous whose chunks are (scale, shift), and proj_out.
    const nn::ModulationTable final_table = nn::ModulationTable::split(ctx, nn::linear(ctx, b.final_mod, s.silu_t), 2);
    nn::ShiftScaleGate final_mod;
    final_mod.scale1 = nn::one_plus(ctx, final_table.at(ctx, 0));
    final_mod.shift = final_table.at(ctx, 1);
    ggml_tensor* out =
        nn::linear(ctx, b.proj_out, nn::modulate_layer_norm(ctx, nn::token_range(ctx, x, T, N), final_mod, kNormEps));
    return block_stage_output(
        ctx, options.split, x,
        nn::unpatchify(ctx, out, grid.w, grid.h, static_cast<int>(p), nn::PatchFeatures::ChannelSlowest), kept);
}

Status QwenImageDit::check_conditioning(const ConditioningShape& shape) const {
    const QwenImageConfig& c = config_;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.context && e.width != c.context_dim) {
            return Error::bad_file("the " + e.module + " text encoder (" + e.label + ") gives " +
                                   std::to_string(e.width) + " features per token but the " + shape.family_label +
                                   " DiT's txt_in takes " + std::to_string(c.context_dim) +
                                   " (Qwen-Image reads Qwen2.5-VL-7B's hidden states: pass the one made for it)");
        }
    }
    if (shape.latent_channels != c.channels) {
        return Error::bad_file("the VAE gives " + std::to_string(shape.latent_channels) + "-channel latents but the " +
                               shape.family_label + " DiT takes " + std::to_string(c.channels) +
                               " (pass Qwen-Image's 16-channel VAE)");
    }
    return Status::Ok();
}

Result<DiffusionTensors> QwenImageDit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const QwenImageConfig& c = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    QwenImageInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c.channels, b}, nullptr, "x");
    for (size_t i = 0; i < shape.refs.size(); ++i) {
        g.refs.push_back(s.input(GGML_TYPE_F32, {shape.refs[i].w, shape.refs[i].h, c.channels, b}, nullptr,
                                 ("ref" + std::to_string(i)).c_str()));
    }
    in.refs = g.refs;
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {c.context_dim, shape.tokens, b}, nullptr, "context");
    // Whole patches (else build() says what is wrong).
    const QwenImageGrid image{shape.latent_w / c.patch, shape.latent_h / c.patch};
    std::vector<QwenImageGrid> refs;
    for (const LatentSize& r : shape.refs) refs.push_back({r.w / c.patch, r.h / c.patch});
    const std::vector<float> rope = qwen_image_rope_table(c, shape.tokens, image, refs, shape.target.seams);
    in.rope = s.input(GGML_TYPE_F32, qwen_image_rope_shape(c, shape.tokens, image, refs), rope.data(), "rope");
    QwenImageBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = shape.target;
    options.split = shape.split;
    make_stage_inputs(s, shape.split, c.hidden, token_count(shape.tokens, image, refs), b, g);
    in.stream = g.stream;
    in.residual = g.residual;
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = *out;
    return g;
}

}  // namespace kiln::models
