#include "models/nets/flux2_dit.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "models/nets/bfl_names.h"
#include "models/nets/block_stages.h"
#include "nn/attention.h"
#include "nn/modulation.h"
#include "nn/patches.h"
#include "nn/rope.h"
#include "nn/shapes.h"

namespace kiln::models {
namespace {

constexpr float kNormEps = 1e-6f;  // BFL's LayerNorms and QK RMSNorms
constexpr int kTimeEmbedding = 256;
constexpr int64_t kRefTimeScale = 10;  // encode_image_refs: reference i at t = 10 + 10 i

struct Attention {
    FusedLinear qkv;  // q, k, v
    nn::Linear proj;
    ggml_tensor* q_scale = nullptr;
    ggml_tensor* k_scale = nullptr;
};

struct Stream {
    Attention attn;
    nn::Linear mlp_in, mlp_out;  // mlp.0 [2 mlp, hidden] (gate first), mlp.2
};

struct DoubleBlock {
    Stream img, txt;
};

struct SingleBlock {
    FusedLinear linear1;  // q, k, v, the SwiGLU's input: [3 hidden + 2 mlp, hidden]
    nn::Linear linear2;   // [hidden, hidden + mlp]
    ggml_tensor* q_scale = nullptr;
    ggml_tensor* k_scale = nullptr;
};

// What every block of one evaluation shares.
struct Shared {
    ggml_tensor* cos = nullptr;  // rope planes, ne [head_dim, 1, tokens, 1]
    ggml_tensor* sin = nullptr;
    nn::AttentionOptions attn;
    int64_t heads = 1;
    int64_t hidden = 0;
    int64_t mlp = 0;
};

struct Qkv {
    ggml_tensor *q, *k, *v;
};

// q, k and v of x through a fused projection whose first 3 parts are q, k,
// v in BFL's "B L (K H D)" layout (each its own product over its rows), q
// and k RMS-normed per head.
Qkv project_qkv(ggml_context* ctx, const Shared& s, const FusedLinear& fused, ggml_tensor* x, ggml_tensor* q_scale,
                ggml_tensor* k_scale) {
    auto part = [&](size_t i) { return nn::linear(ctx, fused.part(ctx, i), x); };
    return {nn::head_rms_norm(ctx, part(0), q_scale, s.heads, kNormEps),
            nn::head_rms_norm(ctx, part(1), k_scale, s.heads, kNormEps), part(2)};
}

ggml_tensor* attention(ggml_context* ctx, const Shared& s, const Qkv& a) {
    return nn::attention(ctx, nn::rope_pairs(ctx, a.q, s.cos, s.sin), nn::rope_pairs(ctx, a.k, s.cos, s.sin), a.v,
                         s.attn);
}

// A double block on the joint tokens ne [hidden, T + N, B] (text first).
ggml_tensor* double_block(ggml_context* ctx, const Shared& s, const DoubleBlock& b, ggml_tensor* joint, int64_t T,
                          const nn::ShiftScaleGate img_mod[2], const nn::ShiftScaleGate txt_mod[2]) {
    const int64_t N = joint->ne[1] - T;
    ggml_tensor* txt = nn::token_range(ctx, joint, 0, T);
    ggml_tensor* img = nn::token_range(ctx, joint, T, N);
    auto qkv = [&](const Stream& st, ggml_tensor* x, const nn::ShiftScaleGate& m) {
        return project_qkv(ctx, s, st.attn.qkv, nn::modulate_layer_norm(ctx, x, m, kNormEps), st.attn.q_scale,
                           st.attn.k_scale);
    };
    const Qkv t = qkv(b.txt, txt, txt_mod[0]), i = qkv(b.img, img, img_mod[0]);
    ggml_tensor* attn = attention(
        ctx, s, {ggml_concat(ctx, t.q, i.q, 2), ggml_concat(ctx, t.k, i.k, 2), ggml_concat(ctx, t.v, i.v, 1)});
    auto update = [&](const Stream& st, ggml_tensor* x, ggml_tensor* a, const nn::ShiftScaleGate m[2]) {
        x = nn::gated_add(ctx, x, nn::linear(ctx, st.attn.proj, a), m[0].gate);
        ggml_tensor* h = ggml_swiglu(ctx, nn::linear(ctx, st.mlp_in, nn::modulate_layer_norm(ctx, x, m[1], kNormEps)));
        return nn::gated_add(ctx, x, nn::linear(ctx, st.mlp_out, h), m[1].gate);
    };
    txt = update(b.txt, txt, nn::token_range(ctx, attn, 0, T), txt_mod);
    img = update(b.img, img, nn::token_range(ctx, attn, T, N), img_mod);
    return ggml_concat(ctx, txt, img, 1);
}

// A single block on x ne [hidden, L, B]: one projection to q, k, v and the
// SwiGLU's input, one back from the attention and the SwiGLU side by side.
ggml_tensor* single_block(ggml_context* ctx, const Shared& s, const SingleBlock& b, ggml_tensor* x,
                          const nn::ShiftScaleGate& m) {
    ggml_tensor* xm = nn::modulate_layer_norm(ctx, x, m, kNormEps);
    const Qkv qkv = project_qkv(ctx, s, b.linear1, xm, b.q_scale, b.k_scale);
    ggml_tensor* mlp_in = nn::linear(ctx, b.linear1.part(ctx, 3), xm);
    ggml_tensor* both = ggml_concat(ctx, attention(ctx, s, qkv), ggml_swiglu(ctx, mlp_in), 0);
    return nn::gated_add(ctx, x, nn::linear(ctx, b.linear2, both), m.gate);
}

// diffusers' Flux2Transformer2DModel, as its scripts/convert_flux2_to_diffusers.py
// renames BFL's: a double block's qkv split into to_q, to_k, to_v (add_*_proj
// for the text stream), a single block's linear1 kept whole
// (attn.to_qkv_mlp_proj), and norm_out.linear holding (scale, shift) where
// BFL's final adaLN_modulation holds (shift, scale).
const BflRenames& diffusers_renames() {
    static const BflRenames renames = [] {
        BflRenames r;
        r.global = {
            {"img_in", {"x_embedder"}},
            {"txt_in", {"context_embedder"}},
            {"time_in.in_layer", {"time_guidance_embed.timestep_embedder.linear_1"}},
            {"time_in.out_layer", {"time_guidance_embed.timestep_embedder.linear_2"}},
            {"guidance_in.in_layer", {"time_guidance_embed.guidance_embedder.linear_1"}},
            {"guidance_in.out_layer", {"time_guidance_embed.guidance_embedder.linear_2"}},
            {"double_stream_modulation_img.lin", {"double_stream_modulation_img.linear"}},
            {"double_stream_modulation_txt.lin", {"double_stream_modulation_txt.linear"}},
            {"single_stream_modulation.lin", {"single_stream_modulation.linear"}},
            {"final_layer.linear", {"proj_out"}},
            {"final_layer.adaLN_modulation.1", {"norm_out.linear"}},
        };
        const BflRenames::Table own = {
            {"img_mlp.0", {"ff.linear_in"}},
            {"img_mlp.2", {"ff.linear_out"}},
            {"txt_mlp.0", {"ff_context.linear_in"}},
            {"txt_mlp.2", {"ff_context.linear_out"}},
        };
        r.double_block = diffusers_joint_attention();
        r.double_block.insert(r.double_block.end(), own.begin(), own.end());
        r.single_block = {
            {"linear1", {"attn.to_qkv_mlp_proj"}},
            {"linear2", {"attn.to_out"}},
            {"norm.query_norm.scale", {"attn.norm_q.weight"}},
            {"norm.key_norm.scale", {"attn.norm_k.weight"}},
        };
        r.swapped_halves = {"final_layer.adaLN_modulation.1"};
        return r;
    }();
    return renames;
}

BflNaming naming(bool diffusers) { return BflNaming(diffusers ? &diffusers_renames() : nullptr); }

bool has_diffusers_names(const io::ModelFile& file, const std::string& prefix) {
    return file.find(prefix + naming(true)("double_stream_modulation_img.lin.weight")) != nullptr;
}

int64_t token_count(int64_t txt_tokens, Flux2Grid image, const std::vector<Flux2Grid>& refs) {
    int64_t n = txt_tokens + image.w * image.h;
    for (const Flux2Grid& r : refs) n += r.w * r.h;
    return n;
}

}  // namespace

std::vector<int64_t> flux2_rope_shape(const Flux2Config& c, int64_t txt_tokens, Flux2Grid image,
                                      const std::vector<Flux2Grid>& refs) {
    return {c.head_dim(), token_count(txt_tokens, image, refs), 2};
}

std::vector<float> flux2_rope_table(const Flux2Config& c, int64_t txt_tokens, Flux2Grid image,
                                    const std::vector<Flux2Grid>& refs, nn::Seams seams) {
    std::vector<int64_t> positions;  // (t, h, w, l) of every token
    std::vector<int64_t> periods;    // the same, across seams
    const size_t values = static_cast<size_t>(4 * token_count(txt_tokens, image, refs));
    positions.reserve(values);
    for (int64_t l = 0; l < txt_tokens; ++l) positions.insert(positions.end(), {0, 0, 0, l});
    periods.assign(positions.size(), 0);
    auto add_grid = [&](Flux2Grid g, int64_t t) {
        for (int64_t row = 0; row < g.h; ++row)
            for (int64_t col = 0; col < g.w; ++col) {
                positions.insert(positions.end(), {t, row, col, 0});
                periods.insert(periods.end(), {0, seams.y ? g.h : 0, seams.x ? g.w : 0, 0});
            }
    };
    add_grid(image, 0);
    for (size_t i = 0; i < refs.size(); ++i) add_grid(refs[i], kRefTimeScale + kRefTimeScale * static_cast<int64_t>(i));
    return nn::rope_axes_table(positions, c.axes_dim, c.theta, seams.any() ? periods : std::vector<int64_t>{});
}

struct Flux2Dit::Blocks {
    nn::Linear img_in, txt_in;
    nn::MlpEmbedder time_in, guidance_in;
    nn::Linear double_mod_img, double_mod_txt, single_mod;
    std::vector<DoubleBlock> doubles;
    std::vector<SingleBlock> singles;
    nn::Linear final_linear, final_mod;
    bool final_scale_first = false;  // diffusers' norm_out.linear: (scale, shift)
};

Flux2Dit::Flux2Dit() = default;
Flux2Dit::~Flux2Dit() = default;

bool Flux2Dit::looks_like_flux2(const io::ModelFile& file, const std::string& prefix) {
    const BflNaming names = naming(has_diffusers_names(file, prefix));
    return file.find(prefix + names("double_stream_modulation_img.lin.weight")) != nullptr &&
           file.find(prefix + names("single_stream_modulation.lin.weight")) != nullptr;
}

std::vector<std::string> Flux2Dit::lora_split_names(const std::string& stem) const { return naming(true).parts(stem); }

std::optional<DiffusionNetwork::LoraFusedLayer> Flux2Dit::lora_fused_layer(const std::string& stem) const {
    return config_.diffusers_names ? naming(true).bfl_of(stem) : std::nullopt;
}

bool Flux2Dit::lora_other_name_swaps_halves(const std::string& stem) const { return naming(true).swaps_halves(stem); }

Result<std::unique_ptr<Flux2Dit>> Flux2Dit::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    const std::string where = "FLUX.2 DiT under '" + prefix + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    if (!looks_like_flux2(file, prefix)) {
        return bad("no double_stream_modulation_img.lin / single_stream_modulation.lin (not a FLUX.2 DiT)");
    }
    std::unique_ptr<Flux2Dit> dit(new Flux2Dit());
    Flux2Config& c = dit->config_;
    c.diffusers_names = has_diffusers_names(file, prefix);
    const BflNaming names = naming(c.diffusers_names);
    // A BFL name's tensor in the file; errors name the file's own names.
    auto find = [&](const std::string& bfl) { return file.find(prefix + names(bfl)); };
    auto matrix = [&](const std::string& bfl) -> Result<std::vector<int64_t>> {
        const io::TensorInfo* t = find(bfl);
        if (!t) return bad("missing " + names(bfl));
        if (t->shape.size() != 2 || t->shape[0] <= 0 || t->shape[1] <= 0)
            return bad(names(bfl) + " has shape " + t->shape_string() + ", expected a matrix");
        return t->shape;
    };
    auto img_in = matrix("img_in.weight");
    if (!img_in.ok()) return img_in.error();
    c.hidden = (*img_in)[0];
    c.channels = (*img_in)[1];
    auto txt_in = matrix("txt_in.weight");
    if (!txt_in.ok()) return txt_in.error();
    if ((*txt_in)[0] != c.hidden)
        return bad(names("txt_in.weight") + " is " + find("txt_in.weight")->shape_string() + ", " +
                   names("img_in.weight") + "'s width is " + std::to_string(c.hidden));
    c.context_dim = (*txt_in)[1];
    const std::string q_norm = "double_blocks.0.img_attn.norm.query_norm.scale";
    const io::TensorInfo* q_scale = find(q_norm);
    if (!q_scale || q_scale->shape.size() != 1) return bad("missing " + names(q_norm));
    const int64_t head_dim = q_scale->shape[0];
    if (head_dim <= 0 || head_dim % 2 != 0 || c.hidden % head_dim != 0) {
        return bad("head width " + std::to_string(head_dim) + " does not divide the width " + std::to_string(c.hidden) +
                   " into heads of pairs");
    }
    c.heads = c.hidden / head_dim;
    auto mlp_out = matrix("double_blocks.0.img_mlp.2.weight");
    if (!mlp_out.ok()) return mlp_out.error();
    c.mlp_hidden = (*mlp_out)[1];
    c.double_blocks = 0;
    while (find("double_blocks." + std::to_string(c.double_blocks) + ".img_attn.qkv.weight")) ++c.double_blocks;
    c.single_blocks = 0;
    while (find("single_blocks." + std::to_string(c.single_blocks) + ".linear1.weight")) ++c.single_blocks;
    c.guidance_embed = find("guidance_in.in_layer.weight") != nullptr;
    if (file.metadata().count("kiln.flux2.axes_dim")) {
        auto axes = nn::parse_rope_axes("kiln.flux2.axes_dim", file.metadata_string("kiln.flux2.axes_dim", ""),
                                        "four even positive sizes like 32,32,32,32");
        if (!axes.ok()) return axes.error().in_context(where + ": ");
        c.axes_dim = *axes;
    } else if (head_dim != 128) {
        return bad("heads " + std::to_string(head_dim) +
                   " wide need RoPE axes (BFL's are for 128); set metadata kiln.flux2.axes_dim");
    }
    int64_t axes_sum = 0;
    for (int a : c.axes_dim) axes_sum += a;
    if (c.axes_dim.size() != 4 || axes_sum != head_dim) {
        return bad("RoPE axes must be four and sum to the head width " + std::to_string(head_dim));
    }
    auto theta = file.metadata_integer("kiln.flux2.theta", 1, 1000000);
    if (!theta.ok()) return theta.error().in_context(where + ": ");
    if (*theta) c.theta = static_cast<float>(**theta);
    dit->declare(weights);

    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "DiT";
    can.joint_attention = true;
    can.seams = true;
    can.in_channels = can.out_channels = c.channels;
    can.context_width = c.context_dim;
    can.size_stride = 1;
    can.guidance = c.guidance_embed;
    can.skip_layers = true;
    can.reference_images = true;
    can.cache_blocks = c.double_blocks + c.single_blocks;
    return dit;
}

void Flux2Dit::declare(io::WeightDeclarer& w) {
    const Flux2Config& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int64_t H = c.hidden, M = c.mlp_hidden, D = c.head_dim();
    const BflNaming names = naming(c.diffusers_names);
    auto linear = [&](const std::string& stem, int64_t in, int64_t out) {
        return nn::declare_linear(w, names(stem), in, out, /*bias=*/false);
    };
    auto scale = [&](const std::string& name) { return w.require_f32(names(name), {D}); };
    b.img_in = linear("img_in", c.channels, H);
    b.txt_in = linear("txt_in", c.context_dim, H);
    b.time_in = {linear("time_in.in_layer", kTimeEmbedding, H), linear("time_in.out_layer", H, H)};
    if (c.guidance_embed) {
        b.guidance_in = {linear("guidance_in.in_layer", kTimeEmbedding, H), linear("guidance_in.out_layer", H, H)};
    }
    b.double_mod_img = linear("double_stream_modulation_img.lin", H, 6 * H);
    b.double_mod_txt = linear("double_stream_modulation_txt.lin", H, 6 * H);
    b.single_mod = linear("single_stream_modulation.lin", H, 3 * H);
    for (int i = 0; i < c.double_blocks; ++i) {
        const std::string p = "double_blocks." + std::to_string(i) + ".";
        DoubleBlock block;
        for (auto [st, name] : {std::pair<Stream*, const char*>{&block.img, "img"}, {&block.txt, "txt"}}) {
            const std::string q = p + name;
            st->attn.qkv = declare_fused(w, names, q + "_attn.qkv", H, {H, H, H}, /*bias=*/false);
            st->attn.proj = linear(q + "_attn.proj", H, H);
            st->attn.q_scale = scale(q + "_attn.norm.query_norm.scale");
            st->attn.k_scale = scale(q + "_attn.norm.key_norm.scale");
            st->mlp_in = linear(q + "_mlp.0", H, 2 * M);
            st->mlp_out = linear(q + "_mlp.2", M, H);
        }
        b.doubles.push_back(block);
    }
    for (int i = 0; i < c.single_blocks; ++i) {
        const std::string p = "single_blocks." + std::to_string(i) + ".";
        SingleBlock block;
        block.linear1 = declare_fused(w, names, p + "linear1", H, {H, H, H, 2 * M}, /*bias=*/false);
        block.linear2 = linear(p + "linear2", H + M, H);
        block.q_scale = scale(p + "norm.query_norm.scale");
        block.k_scale = scale(p + "norm.key_norm.scale");
        b.singles.push_back(block);
    }
    b.final_mod = linear("final_layer.adaLN_modulation.1", H, 2 * H);
    b.final_linear = linear("final_layer.linear", H, c.channels);
    b.final_scale_first = c.diffusers_names;
}

Result<ggml_tensor*> Flux2Dit::build(ggml_context* ctx, const Flux2Inputs& in, const Flux2BuildOptions& options) const {
    const Flux2Config& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& what) -> Error { return Error{"FLUX.2 DiT inputs: " + what}; };
    if (!in.x || !in.timesteps || !in.context || !in.rope) return fail("x, timesteps, context and rope are required");
    const int64_t B = in.x->ne[3];
    auto check_latent = [&](const ggml_tensor* t, const std::string& what) -> Status {
        if (t->ne[2] != c.channels || t->ne[3] != B) {
            return fail(what + " is " + nn::ne_string(t) + ", expected [W, H, " + std::to_string(c.channels) + ", " +
                        std::to_string(B) + "]");
        }
        return Status::Ok();
    };
    KILN_TRY(check_latent(in.x, "x"));
    for (size_t i = 0; i < in.refs.size(); ++i) {
        if (!in.refs[i]) return fail("reference latent " + std::to_string(i) + " is null");
        KILN_TRY(check_latent(in.refs[i], "reference latent " + std::to_string(i)));
    }
    if (!nn::has_ne(in.timesteps, {B})) return fail("timesteps must be ne [" + std::to_string(B) + "]");
    if (in.context->ne[0] != c.context_dim || in.context->ne[2] != B || in.context->ne[3] != 1) {
        return fail("context is " + nn::ne_string(in.context) + ", expected [" + std::to_string(c.context_dim) +
                    ", tokens, " + std::to_string(B) + "]");
    }
    if (c.guidance_embed != (in.guidance != nullptr)) {
        return fail(c.guidance_embed ? "this network has guidance_in and needs guidance"
                                     : "this network has no guidance_in; guidance must be null");
    }
    if (in.guidance && !nn::has_ne(in.guidance, {B})) return fail("guidance must be ne [" + std::to_string(B) + "]");
    const int64_t T = in.context->ne[1];
    if (T < 1) return fail("context has no tokens");
    const Flux2Grid grid{in.x->ne[0], in.x->ne[1]};
    std::vector<Flux2Grid> ref_grids;
    for (ggml_tensor* r : in.refs) ref_grids.push_back({r->ne[0], r->ne[1]});
    const std::vector<int64_t> rope_ne = flux2_rope_shape(c, T, grid, ref_grids);
    if (in.rope->type != GGML_TYPE_F32 || !nn::has_ne(in.rope, rope_ne)) {
        return fail("rope is " + nn::ne_string(in.rope) + ", these tokens need F32 " + nn::ne_string(rope_ne) +
                    " (flux2_rope_table)");
    }
    const int64_t n_tokens = rope_ne[1];
    const std::string stage_problem =
        stage_inputs_problem(options.split, in.stream, in.residual, c.hidden, n_tokens, B);
    if (!stage_problem.empty()) return fail(stage_problem);

    Shared s;
    s.heads = c.heads;
    s.hidden = c.hidden;
    s.mlp = c.mlp_hidden;
    const int64_t hd = c.head_dim();
    s.cos = ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], 0);
    s.sin =
        ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], in.rope->nb[2]);
    s.attn.heads = static_cast<int>(c.heads);
    s.attn.flash = options.flash_attention;

    // The modulation every block of a kind shares, made once, where its
    // first block runs: each modulation layer's weights then belong to that
    // block's segment, not all to the first.
    ggml_tensor* vec = nn::mlp_embed(ctx, b.time_in, nn::bfl_time_embedding(ctx, in.timesteps, kTimeEmbedding));
    if (c.guidance_embed)
        vec = ggml_add(ctx, vec,
                       nn::mlp_embed(ctx, b.guidance_in, nn::bfl_time_embedding(ctx, in.guidance, kTimeEmbedding)));
    ggml_tensor* silu_vec = ggml_silu(ctx, vec);
    auto table = [&](const nn::Linear& lin, int64_t k) {
        return nn::ModulationTable::split(ctx, nn::linear(ctx, lin, silu_vec), k);
    };

    // Tokens: text, then the image's latent pixels and each reference's.
    ggml_tensor* x = nullptr;
    if (stage_embeds(options.split)) {
        auto tokens = [&](ggml_tensor* latent) {
            return nn::patchify(ctx, latent, 1, nn::PatchFeatures::ChannelSlowest);
        };
        ggml_tensor* img = tokens(in.x);
        for (ggml_tensor* r : in.refs) img = ggml_concat(ctx, img, tokens(r), 1);
        x = ggml_concat(ctx, nn::linear(ctx, b.txt_in, in.context), nn::linear(ctx, b.img_in, img), 1);
    }
    auto skipped = [&](int64_t block) {
        return std::find(options.skip_blocks.begin(), options.skip_blocks.end(), static_cast<int>(block)) !=
               options.skip_blocks.end();
    };
    const int64_t D = static_cast<int64_t>(b.doubles.size()), S = static_cast<int64_t>(b.singles.size());
    std::optional<std::array<nn::ShiftScaleGate, 4>> double_mods;  // img 1, img 2, txt 1, txt 2
    std::optional<nn::ShiftScaleGate> single_mod;
    auto block = [&](int64_t i, ggml_tensor* h) {
        if (skipped(i)) return h;
        if (i < D) {
            if (!double_mods) {
                const nn::ModulationTable img = table(b.double_mod_img, 6), txt = table(b.double_mod_txt, 6);
                double_mods = {nn::shift_scale_gate(ctx, img, 0), nn::shift_scale_gate(ctx, img, 3),
                               nn::shift_scale_gate(ctx, txt, 0), nn::shift_scale_gate(ctx, txt, 3)};
            }
            const nn::ShiftScaleGate img_mod[2] = {(*double_mods)[0], (*double_mods)[1]};
            const nn::ShiftScaleGate txt_mod[2] = {(*double_mods)[2], (*double_mods)[3]};
            return nn::mark_cut(double_block(ctx, s, b.doubles[static_cast<size_t>(i)], h, T, img_mod, txt_mod),
                                "double_blocks." + std::to_string(i));
        }
        const int64_t j = i - D;
        if (!single_mod) single_mod = nn::shift_scale_gate(ctx, table(b.single_mod, 3), 0);
        return nn::mark_cut(single_block(ctx, s, b.singles[static_cast<size_t>(j)], h, *single_mod),
                            "single_blocks." + std::to_string(j));
    };
    StageResults kept;
    x = run_block_stage(ctx, options.split, D + S, x, in.stream, in.residual, block, kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, x, nullptr, kept);
    // The image's tokens (text and references dropped) through the final layer.
    const nn::ModulationTable final_table = table(b.final_mod, 2);
    const nn::ShiftScaleGate final_mod = b.final_scale_first
                                             ? nn::scale_shift(ctx, final_table, 0)
                                             : nn::shift_scale_gate(ctx, final_table, 0, /*with_gate=*/false);
    ggml_tensor* out =
        nn::linear(ctx, b.final_linear,
                   nn::modulate_layer_norm(ctx, nn::token_range(ctx, x, T, grid.w * grid.h), final_mod, kNormEps));
    return block_stage_output(ctx, options.split, x,
                              nn::unpatchify(ctx, out, grid.w, grid.h, 1, nn::PatchFeatures::ChannelSlowest), kept);
}

Status Flux2Dit::check_conditioning(const ConditioningShape& shape) const {
    const Flux2Config& c = config_;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.context && e.width != c.context_dim) {
            return Error::bad_file(
                "the " + e.module + " text encoder (" + e.label + ") gives " + std::to_string(e.width) +
                " features per token but the " + shape.family_label + " DiT's txt_in takes " +
                std::to_string(c.context_dim) +
                " (klein 4B reads Qwen3-4B, klein 9B Qwen3-8B: pass the one that matches with --llm)");
        }
    }
    if (shape.latent_channels != c.channels) {
        return Error::bad_file("the autoencoder gives " + std::to_string(shape.latent_channels) +
                               "-channel latents but the " + shape.family_label + " DiT takes " +
                               std::to_string(c.channels) + " (a FLUX.1 ae with a FLUX.2 model? pass FLUX.2's)");
    }
    return Status::Ok();
}

Result<DiffusionTensors> Flux2Dit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const Flux2Config& c = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    Flux2Inputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c.channels, b}, nullptr, "x");
    for (size_t i = 0; i < shape.refs.size(); ++i) {
        g.refs.push_back(s.input(GGML_TYPE_F32, {shape.refs[i].w, shape.refs[i].h, c.channels, b}, nullptr,
                                 ("ref" + std::to_string(i)).c_str()));
    }
    in.refs = g.refs;
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    if (c.guidance_embed) in.guidance = g.guidance = s.input(GGML_TYPE_F32, {b}, nullptr, "guidance");
    in.context = g.context = s.input(GGML_TYPE_F32, {c.context_dim, shape.tokens, b}, nullptr, "context");
    const Flux2Grid image{shape.latent_w, shape.latent_h};
    std::vector<Flux2Grid> refs;
    for (const LatentSize& r : shape.refs) refs.push_back({r.w, r.h});
    const std::vector<float> rope = flux2_rope_table(c, shape.tokens, image, refs, shape.target.seams);
    in.rope = s.input(GGML_TYPE_F32, flux2_rope_shape(c, shape.tokens, image, refs), rope.data(), "rope");
    Flux2BuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.skip_blocks = shape.skip_blocks;
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
