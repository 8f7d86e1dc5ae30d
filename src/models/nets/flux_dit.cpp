#include "models/nets/flux_dit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <sstream>
#include <tuple>

#include "models/nets/bfl_names.h"
#include "models/nets/block_stages.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/modulation.h"
#include "nn/patches.h"
#include "nn/rope.h"
#include "nn/shapes.h"

namespace kiln::models {
namespace {

constexpr float kNormEps = 1e-6f;  // BFL's LayerNorms and RMSNorms
constexpr int kTimeEmbedding = 256;
// Chroma's approximator input: timestep and guidance embeddings of 16, index embedding of 32.
constexpr int kChromaTimeEmbedding = 16;
constexpr int kChromaIndexEmbedding = 32;

struct Attention {
    FusedLinear qkv;
    nn::Linear proj;
    ggml_tensor* q_scale = nullptr;  // norm.query_norm.scale [head_dim]
    ggml_tensor* k_scale = nullptr;  // norm.key_norm.scale [head_dim]
};

struct Stream {      // one stream of a double block
    nn::Linear mod;  // <stream>_mod.lin (not in Chroma)
    Attention attn;
    nn::Linear mlp_in, mlp_out;
};

struct DoubleBlock {
    Stream img, txt;
};

struct SingleBlock {
    FusedLinear linear1;
    nn::Linear linear2, mod;
    ggml_tensor* q_scale = nullptr;
    ggml_tensor* k_scale = nullptr;
};

// BFL's Modulation: lin(silu(vec)) in `k` chunks of hidden.
nn::ModulationTable modulation(ggml_context* ctx, const nn::Linear& lin, ggml_tensor* silu_vec, int64_t k) {
    return nn::ModulationTable::split(ctx, nn::linear(ctx, lin, silu_vec), k);  // of [k * hidden, B]
}

// What every block of one evaluation shares.
struct Shared {
    ggml_tensor* cos = nullptr;  // rope planes, ne [head_dim, 1, tokens, 1]
    ggml_tensor* sin = nullptr;
    nn::AttentionOptions attn;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    int64_t heads = 1;
};

// Attention over all tokens of q, k, v (each ne [hidden, L, B], q and k
// already head-normed as ne [head_dim, heads, L, B]).
ggml_tensor* joint_attention(ggml_context* ctx, const Shared& s, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v) {
    return nn::attention(ctx, nn::rope_pairs(ctx, q, s.cos, s.sin), nn::rope_pairs(ctx, k, s.cos, s.sin), v, s.attn);
}

struct StreamQkv {
    ggml_tensor *q, *k, *v;
};

StreamQkv stream_qkv(ggml_context* ctx, const Shared& s, const Attention& a, ggml_tensor* x) {
    return {nn::head_rms_norm(ctx, nn::linear(ctx, a.qkv.part(ctx, 0), x), a.q_scale, s.heads, kNormEps),
            nn::head_rms_norm(ctx, nn::linear(ctx, a.qkv.part(ctx, 1), x), a.k_scale, s.heads, kNormEps),
            nn::linear(ctx, a.qkv.part(ctx, 2), x)};
}

// One stream's update after the joint attention: gated projection and MLP.
ggml_tensor* stream_out(ggml_context* ctx, const Shared& s, const Stream& st, ggml_tensor* x, ggml_tensor* attn,
                        const nn::ShiftScaleGate& m1, const nn::ShiftScaleGate& m2) {
    x = nn::gated_add(ctx, x, nn::linear(ctx, st.attn.proj, attn), m1.gate);
    ggml_tensor* h =
        nn::gelu_tanh(ctx, s.target, nn::linear(ctx, st.mlp_in, nn::modulate_layer_norm(ctx, x, m2, kNormEps)));
    return nn::gated_add(ctx, x, nn::linear(ctx, st.mlp_out, h), m2.gate);
}

// A double block on the joint tokens ne [hidden, T + N, B] (text first);
// returns them updated in the same layout.
ggml_tensor* double_block(ggml_context* ctx, const Shared& s, const DoubleBlock& b, ggml_tensor* joint, int64_t T,
                          const nn::ShiftScaleGate img_mod[2], const nn::ShiftScaleGate txt_mod[2]) {
    const int64_t N = joint->ne[1] - T;
    ggml_tensor* txt = nn::token_range(ctx, joint, 0, T);
    ggml_tensor* img = nn::token_range(ctx, joint, T, N);
    const StreamQkv ti = stream_qkv(ctx, s, b.txt.attn, nn::modulate_layer_norm(ctx, txt, txt_mod[0], kNormEps));
    const StreamQkv ii = stream_qkv(ctx, s, b.img.attn, nn::modulate_layer_norm(ctx, img, img_mod[0], kNormEps));
    ggml_tensor* attn = joint_attention(ctx, s, ggml_concat(ctx, ti.q, ii.q, 2), ggml_concat(ctx, ti.k, ii.k, 2),
                                        ggml_concat(ctx, ti.v, ii.v, 1));
    img = stream_out(ctx, s, b.img, img, nn::token_range(ctx, attn, T, N), img_mod[0], img_mod[1]);
    txt = stream_out(ctx, s, b.txt, txt, nn::token_range(ctx, attn, 0, T), txt_mod[0], txt_mod[1]);
    return ggml_concat(ctx, txt, img, 1);
}

ggml_tensor* single_block(ggml_context* ctx, const Shared& s, const SingleBlock& b, ggml_tensor* x,
                          const nn::ShiftScaleGate& m) {
    ggml_tensor* xm = nn::modulate_layer_norm(ctx, x, m, kNormEps);
    ggml_tensor* q = nn::head_rms_norm(ctx, nn::linear(ctx, b.linear1.part(ctx, 0), xm), b.q_scale, s.heads, kNormEps);
    ggml_tensor* k = nn::head_rms_norm(ctx, nn::linear(ctx, b.linear1.part(ctx, 1), xm), b.k_scale, s.heads, kNormEps);
    ggml_tensor* v = nn::linear(ctx, b.linear1.part(ctx, 2), xm);
    ggml_tensor* h = nn::gelu_tanh(ctx, s.target, nn::linear(ctx, b.linear1.part(ctx, 3), xm));
    ggml_tensor* out = nn::linear(ctx, b.linear2, ggml_concat(ctx, joint_attention(ctx, s, q, k, v), h, 0));
    return nn::gated_add(ctx, x, out, m.gate);
}

// diffusers' FluxTransformer2DModel (a diffusers folder's transformer/), as
// its scripts/convert_flux_to_diffusers.py renames BFL's: the fused
// projections split (to_q, to_k, to_v, proj_mlp), and norm_out.linear holding
// (scale, shift) where BFL's adaLN_modulation holds (shift, scale).
const BflRenames& diffusers_renames() {
    static const BflRenames renames = [] {
        BflRenames r;
        r.global = {
            {"img_in", {"x_embedder"}},
            {"txt_in", {"context_embedder"}},
            {"time_in.in_layer", {"time_text_embed.timestep_embedder.linear_1"}},
            {"time_in.out_layer", {"time_text_embed.timestep_embedder.linear_2"}},
            {"vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"}},
            {"vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"}},
            {"guidance_in.in_layer", {"time_text_embed.guidance_embedder.linear_1"}},
            {"guidance_in.out_layer", {"time_text_embed.guidance_embedder.linear_2"}},
            {"final_layer.linear", {"proj_out"}},
            {"final_layer.adaLN_modulation.1", {"norm_out.linear"}},
        };
        const BflRenames::Table own = {
            {"img_mod.lin", {"norm1.linear"}},        {"txt_mod.lin", {"norm1_context.linear"}},
            {"img_mlp.0", {"ff.net.0.proj"}},         {"img_mlp.2", {"ff.net.2"}},
            {"txt_mlp.0", {"ff_context.net.0.proj"}}, {"txt_mlp.2", {"ff_context.net.2"}},
        };
        r.double_block = diffusers_joint_attention();
        r.double_block.insert(r.double_block.end(), own.begin(), own.end());
        r.single_block = {
            {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
            {"linear2", {"proj_out"}},
            {"modulation.lin", {"norm.linear"}},
            {"norm.query_norm.scale", {"attn.norm_q.weight"}},
            {"norm.key_norm.scale", {"attn.norm_k.weight"}},
        };
        r.swapped_halves = {"final_layer.adaLN_modulation.1"};
        return r;
    }();
    return renames;
}

BflNaming naming(bool diffusers) { return BflNaming(diffusers ? &diffusers_renames() : nullptr); }

// Grid positions of the references (see the header): (h_off, w_off) of each.
std::vector<std::pair<int64_t, int64_t>> reference_offsets(const std::vector<FluxTokenGrid>& refs) {
    std::vector<std::pair<int64_t, int64_t>> offsets;
    int64_t h_used = 0, w_used = 0;
    for (const FluxTokenGrid& g : refs) {
        int64_t h_off = 0, w_off = 0;
        if (g.h + h_used > g.w + w_used) {
            w_off = w_used;
        } else {
            h_off = h_used;
        }
        offsets.emplace_back(h_off, w_off);
        h_used = std::max(h_used, g.h + h_off);
        w_used = std::max(w_used, g.w + w_off);
    }
    return offsets;
}

}  // namespace

std::vector<std::string> flux_diffusers_names(const std::string& bfl_stem) { return naming(true).parts(bfl_stem); }

std::optional<DiffusionNetwork::LoraFusedLayer> FluxDit::lora_fused_layer(const std::string& stem) const {
    return config_.diffusers_names ? naming(true).bfl_of(stem) : std::nullopt;
}

bool FluxDit::lora_other_name_swaps_halves(const std::string& stem) const { return naming(true).swaps_halves(stem); }

int64_t flux_token_count(int64_t txt_tokens, FluxTokenGrid image, const std::vector<FluxTokenGrid>& refs) {
    int64_t n = txt_tokens + image.w * image.h;
    for (const FluxTokenGrid& g : refs) n += g.w * g.h;
    return n;
}

std::vector<int64_t> flux_rope_shape(const FluxConfig& c, int64_t txt_tokens, FluxTokenGrid image,
                                     const std::vector<FluxTokenGrid>& refs) {
    return {c.head_dim(), flux_token_count(txt_tokens, image, refs), 2};
}

std::vector<float> flux_rope_table(const FluxConfig& c, int64_t txt_tokens, FluxTokenGrid image,
                                   const std::vector<FluxTokenGrid>& refs, bool increase_ref_index, nn::Seams seams) {
    // Positions (index, row, col) of every token, and their periods.
    std::vector<std::array<int64_t, 3>> ids(static_cast<size_t>(txt_tokens), {0, 0, 0});
    std::vector<std::array<int64_t, 3>> periods(static_cast<size_t>(txt_tokens), {0, 0, 0});
    auto add_grid = [&](FluxTokenGrid g, int64_t index, int64_t h_off, int64_t w_off) {
        for (int64_t row = 0; row < g.h; ++row)
            for (int64_t col = 0; col < g.w; ++col) {
                ids.push_back({index, row + h_off, col + w_off});
                periods.push_back({0, seams.y ? g.h : 0, seams.x ? g.w : 0});
            }
    };
    add_grid(image, 0, 0, 0);
    const auto offsets = reference_offsets(refs);
    for (size_t i = 0; i < refs.size(); ++i) {
        if (increase_ref_index) {
            add_grid(refs[i], static_cast<int64_t>(i) + 1, 0, 0);
        } else {
            add_grid(refs[i], 1, offsets[i].first, offsets[i].second);
        }
    }

    std::vector<int64_t> positions, position_periods;
    positions.reserve(ids.size() * 3);
    for (const auto& id : ids) positions.insert(positions.end(), id.begin(), id.end());
    if (seams.any()) {
        for (const auto& p : periods) position_periods.insert(position_periods.end(), p.begin(), p.end());
    }
    return nn::rope_axes_table(positions, c.axes_dim, c.theta, position_periods);  // three axes (create() checks)
}

std::vector<float> flux_attention_mask(const std::vector<float>& txt_valid, int64_t image_tokens, int64_t batch) {
    const int64_t txt = batch > 0 ? static_cast<int64_t>(txt_valid.size()) / batch : 0;
    std::vector<float> mask;
    mask.reserve(static_cast<size_t>(batch * (txt + image_tokens)));
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t i = 0; i < txt; ++i)
            mask.push_back(txt_valid[static_cast<size_t>(b * txt + i)] > 0 ? 0.0f : -INFINITY);
        mask.insert(mask.end(), static_cast<size_t>(image_tokens), 0.0f);
    }
    return mask;
}

std::vector<int64_t> flux_attention_mask_shape(int64_t txt_tokens, int64_t image_tokens, int64_t batch) {
    return {txt_tokens + image_tokens, batch};
}

std::vector<int64_t> chroma_index_shape(const FluxConfig& c) { return {kChromaIndexEmbedding, c.chroma_modulations()}; }

std::vector<float> chroma_index_table(const FluxConfig& c) {
    const int half = kChromaIndexEmbedding / 2;
    std::vector<float> table;
    table.reserve(static_cast<size_t>(kChromaIndexEmbedding * c.chroma_modulations()));
    for (int64_t i = 0; i < c.chroma_modulations(); ++i) {
        std::vector<float> row(kChromaIndexEmbedding);
        for (int j = 0; j < half; ++j) {
            const double arg = 1000.0 * static_cast<double>(i) * std::exp(-std::log(10000.0) * j / half);
            row[static_cast<size_t>(j)] = static_cast<float>(std::cos(arg));
            row[static_cast<size_t>(j + half)] = static_cast<float>(std::sin(arg));
        }
        table.insert(table.end(), row.begin(), row.end());
    }
    return table;
}

struct FluxDit::Blocks {
    nn::Linear img_in, txt_in;
    nn::MlpEmbedder time_in, vector_in, guidance_in;
    // Chroma's distilled_guidance_layer.
    nn::Linear approx_in, approx_out;
    std::vector<nn::MlpEmbedder> approx_layers;
    std::vector<ggml_tensor*> approx_norms;
    std::vector<DoubleBlock> doubles;
    std::vector<SingleBlock> singles;
    nn::Linear final_linear, final_mod;
    // diffusers' norm_out.linear: (scale, shift), BFL's reverse.
    bool final_scale_first = false;
};

FluxDit::FluxDit() = default;
FluxDit::~FluxDit() = default;

Result<std::unique_ptr<FluxDit>> FluxDit::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<FluxDit> dit(new FluxDit());
    FluxConfig& c = dit->config_;
    c.diffusers_names = file.find(prefix + "x_embedder.weight") != nullptr;
    const BflNaming names = naming(c.diffusers_names);
    auto find = [&](const std::string& name) { return file.find(prefix + names(name)); };
    auto matrix = [&](const std::string& name) -> const io::TensorInfo* {
        const io::TensorInfo* t = find(name);
        return t && t->shape.size() == 2 ? t : nullptr;
    };
    const std::string where = "Flux DiT under '" + prefix + "'";
    const io::TensorInfo* img_in = matrix("img_in.weight");
    const io::TensorInfo* txt_in = matrix("txt_in.weight");
    const io::TensorInfo* final_linear = matrix("final_layer.linear.weight");
    const io::TensorInfo* query_norm = find("double_blocks.0.img_attn.norm.query_norm.scale");
    const io::TensorInfo* mlp_in = matrix("double_blocks.0.img_mlp.0.weight");
    if (!img_in || !txt_in || !final_linear || !query_norm || query_norm->shape.size() != 1 || !mlp_in) {
        return Error::bad_file("no Flux DiT under '" + prefix +
                               "' (img_in, txt_in, final_layer.linear or double_blocks.0 missing or malformed)");
    }
    c.hidden = img_in->shape[0];
    c.in_channels = img_in->shape[1];
    c.context_dim = txt_in->shape[1];
    c.out_channels = final_linear->shape[0];
    c.mlp_hidden = mlp_in->shape[0];
    const int64_t head_dim = query_norm->shape[0];
    // A zero size would reach ggml as an empty weight (or as zero heads).
    if (c.hidden <= 0 || c.in_channels <= 0 || c.context_dim <= 0 || c.out_channels <= 0 || c.mlp_hidden <= 0) {
        return Error::bad_file(where + ": a zero size in img_in, txt_in, final_layer or the MLP");
    }
    if (head_dim <= 0 || c.hidden % head_dim != 0) {
        return Error::bad_file(where + ": width " + std::to_string(c.hidden) + " does not split into heads of " +
                               std::to_string(head_dim));
    }
    c.heads = c.hidden / head_dim;
    const int64_t pp = static_cast<int64_t>(c.patch) * c.patch;
    if (c.in_channels % pp != 0 || c.out_channels % pp != 0) {
        return Error::bad_file(where + ": img_in / final_layer widths are not multiples of " + std::to_string(pp));
    }
    c.latent_channels = c.in_channels / pp;
    // Fill takes the masked image's latent and the pixel mask of each
    // latent pixel after the latent (16 + 16 + 8x8 planes, 384 features;
    // check_conditioning holds the mask's planes to the VAE's downscale);
    // the Canny and Depth models a control image's latent (16 + 16), which
    // kiln has no input for.
    const int64_t velocity = c.velocity_channels();
    if (c.latent_channels != velocity && !c.fill()) {
        return Error::bad_file(where + ": img_in takes " + std::to_string(c.in_channels) + " features for " +
                               std::to_string(velocity) + " latent channels; kiln runs Flux.1 (" +
                               std::to_string(velocity * pp) + ") and Flux.1-Fill (" +
                               std::to_string((2 * velocity + 64) * pp) + "), not the Canny or Depth models (" +
                               std::to_string(2 * velocity * pp) + ")");
    }
    c.chroma = find("distilled_guidance_layer.in_proj.weight") != nullptr;
    c.guidance_embed = !c.chroma && find("guidance_in.in_layer.weight") != nullptr;
    c.qkv_bias = find("double_blocks.0.img_attn.qkv.bias") != nullptr;
    if (c.chroma && c.diffusers_names) {
        return Error::bad_file(where + ": Chroma in diffusers' names is not supported; use its single file");
    }
    if (c.chroma) {
        c.vec_dim = 0;
        const io::TensorInfo* in_proj = matrix("distilled_guidance_layer.in_proj.weight");
        if (!in_proj) return Error::bad_file(where + ": distilled_guidance_layer.in_proj.weight is not a matrix");
        c.approximator_hidden = in_proj->shape[0];
        c.approximator_in = in_proj->shape[1];
        if (c.approximator_in != 2 * kChromaTimeEmbedding + kChromaIndexEmbedding) {
            return Error::bad_file(where + ": Chroma's approximator takes " + std::to_string(c.approximator_in) +
                                   " inputs, expected 64");
        }
        c.approximator_layers = 0;
        while (find("distilled_guidance_layer.layers." + std::to_string(c.approximator_layers) + ".in_layer.weight")) {
            ++c.approximator_layers;
        }
    } else {
        const io::TensorInfo* vector_in = matrix("vector_in.in_layer.weight");
        if (!vector_in)
            return Error::bad_file(where + ": vector_in.in_layer.weight missing (and no Chroma approximator)");
        c.vec_dim = vector_in->shape[1];
    }
    c.double_blocks = 0;
    while (find("double_blocks." + std::to_string(c.double_blocks) + ".img_attn.qkv.weight")) ++c.double_blocks;
    c.single_blocks = 0;
    while (find("single_blocks." + std::to_string(c.single_blocks) + ".linear1.weight")) ++c.single_blocks;

    if (file.metadata().count("kiln.flux.axes_dim")) {
        auto axes = nn::parse_rope_axes("kiln.flux.axes_dim", file.metadata_string("kiln.flux.axes_dim", ""),
                                        "even positive sizes like 16,56,56");
        if (!axes.ok()) return axes.error();
        c.axes_dim = std::move(axes).value();
    } else if (head_dim != 128) {
        return Error::bad_file(where + ": heads of " + std::to_string(head_dim) +
                               " need RoPE axes (BFL's are for 128); set metadata kiln.flux.axes_dim");
    }
    int64_t axes_sum = 0;
    for (int a : c.axes_dim) axes_sum += a;
    if (c.axes_dim.size() != 3 || axes_sum != head_dim) {
        return Error::bad_file(where + ": RoPE axes must be three and sum to the head width " +
                               std::to_string(head_dim));
    }

    KILN_TRY(dit->declare(weights));
    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "DiT";
    can.joint_attention = true;
    can.seams = true;
    can.in_channels = c.latent_channels;
    can.out_channels = c.velocity_channels();
    if (c.fill()) can.concat = LatentConcat::MaskedImageThenPixelMask;
    can.context_width = c.context_dim;
    can.vector_width = c.vec_dim;
    can.size_stride = c.patch;
    can.guidance = c.guidance_embed;
    can.skip_layers = true;
    can.text_mask = true;
    can.reference_images = !c.fill();  // Kontext's; Fill's image is its concat
    can.cache_blocks = c.double_blocks + c.single_blocks;
    return dit;
}

Status FluxDit::declare(io::WeightDeclarer& w) {
    const FluxConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int64_t h = c.hidden, hd = c.head_dim();
    const BflNaming names = naming(c.diffusers_names);
    auto linear = [&](const std::string& stem, int64_t in, int64_t out, bool bias = true) {
        return nn::declare_linear(w, names(stem), in, out, bias);
    };
    auto vector = [&](const std::string& name, int64_t n) { return w.require(names(name), {n}); };
    auto embedder = [&](const std::string& p, int64_t in, int64_t width) {
        return nn::MlpEmbedder{linear(p + ".in_layer", in, width), linear(p + ".out_layer", width, width)};
    };
    b.img_in = linear("img_in", c.in_channels, h);
    b.txt_in = linear("txt_in", c.context_dim, h);
    if (c.chroma) {
        const std::string p = "distilled_guidance_layer.";
        b.approx_in = nn::declare_linear(w, p + "in_proj", c.approximator_in, c.approximator_hidden);
        for (int i = 0; i < c.approximator_layers; ++i) {
            b.approx_layers.push_back(
                embedder(p + "layers." + std::to_string(i), c.approximator_hidden, c.approximator_hidden));
            b.approx_norms.push_back(w.require(p + "norms." + std::to_string(i) + ".scale", {c.approximator_hidden}));
        }
        b.approx_out = nn::declare_linear(w, p + "out_proj", c.approximator_hidden, h);
    } else {
        b.time_in = embedder("time_in", kTimeEmbedding, h);
        b.vector_in = embedder("vector_in", c.vec_dim, h);
        if (c.guidance_embed) b.guidance_in = embedder("guidance_in", kTimeEmbedding, h);
    }
    auto attention = [&](const std::string& p) {
        Attention a;
        a.qkv = declare_fused(w, names, p + ".qkv", h, {h, h, h}, c.qkv_bias);
        a.q_scale = vector(p + ".norm.query_norm.scale", hd);
        a.k_scale = vector(p + ".norm.key_norm.scale", hd);
        a.proj = linear(p + ".proj", h, h);
        return a;
    };
    for (int i = 0; i < c.double_blocks; ++i) {
        const std::string p = "double_blocks." + std::to_string(i) + ".";
        DoubleBlock block;
        for (auto [stream, name] : {std::pair{&block.img, "img"}, std::pair{&block.txt, "txt"}}) {
            const std::string s = p + name;
            if (!c.chroma) stream->mod = linear(s + "_mod.lin", h, 6 * h);
            stream->attn = attention(s + "_attn");
            stream->mlp_in = linear(s + "_mlp.0", h, c.mlp_hidden);
            stream->mlp_out = linear(s + "_mlp.2", c.mlp_hidden, h);
        }
        b.doubles.push_back(block);
    }
    for (int i = 0; i < c.single_blocks; ++i) {
        const std::string p = "single_blocks." + std::to_string(i) + ".";
        SingleBlock block;
        block.linear1 = declare_fused(w, names, p + "linear1", h, {h, h, h, c.mlp_hidden}, true);
        block.linear2 = linear(p + "linear2", h + c.mlp_hidden, h);
        block.q_scale = vector(p + "norm.query_norm.scale", hd);
        block.k_scale = vector(p + "norm.key_norm.scale", hd);
        if (!c.chroma) block.mod = linear(p + "modulation.lin", h, 3 * h);
        b.singles.push_back(block);
    }
    b.final_linear = linear("final_layer.linear", h, c.out_channels);
    if (!c.chroma) b.final_mod = linear("final_layer.adaLN_modulation.1", h, 2 * h);
    b.final_scale_first = c.diffusers_names;
    return Status::Ok();
}

Result<ggml_tensor*> FluxDit::build(ggml_context* ctx, const FluxInputs& in, const FluxBuildOptions& options) const {
    const FluxConfig& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& message) { return Error::invalid_request("Flux: " + message); };
    if (!in.x || !in.timesteps || !in.context || !in.rope) return fail("x, timesteps, context and rope are required");
    const int64_t B = in.x->ne[3];
    auto check_latent = [&](const ggml_tensor* t, const std::string& name, int64_t channels) -> Status {
        if (t->ne[2] != channels) {
            return fail(name + " has " + std::to_string(t->ne[2]) + " channels, the network takes " +
                        std::to_string(channels));
        }
        if (t->ne[0] % c.patch != 0 || t->ne[1] % c.patch != 0) {
            return fail(name + " size " + std::to_string(t->ne[0]) + "x" + std::to_string(t->ne[1]) +
                        " is not a multiple of " + std::to_string(c.patch));
        }
        if (t->ne[3] != B)
            return fail(name + " has batch " + std::to_string(t->ne[3]) + ", x has " + std::to_string(B));
        return Status::Ok();
    };
    KILN_TRY(check_latent(in.x, "x", c.latent_channels));
    for (size_t i = 0; i < in.refs.size(); ++i) {
        if (!in.refs[i]) return fail("reference latent " + std::to_string(i) + " is null");
        KILN_TRY(check_latent(in.refs[i], "reference latent " + std::to_string(i), c.velocity_channels()));
    }
    if (!nn::has_ne(in.timesteps, {B})) return fail("timesteps must be ne [" + std::to_string(B) + "]");
    if (in.context->ne[0] != c.context_dim) {
        return fail("context is " + std::to_string(in.context->ne[0]) + " wide, the network takes " +
                    std::to_string(c.context_dim));
    }
    if (in.context->ne[2] != B || in.context->ne[3] != 1) {
        return fail("context must be ne [" + std::to_string(c.context_dim) + ", tokens, " + std::to_string(B) + "]");
    }
    if (c.guidance_embed && !in.guidance) {
        return fail("this network has guidance_in and needs guidance (ne [" + std::to_string(B) + "])");
    }
    if (!c.guidance_embed && !c.chroma && in.guidance) {
        return fail("this network has no guidance_in (schnell); guidance must be null");
    }
    if (in.guidance && !nn::has_ne(in.guidance, {B})) return fail("guidance must be ne [" + std::to_string(B) + "]");
    if (c.vec_dim > 0) {
        if (!in.pooled) return fail("this network needs pooled (ne [" + std::to_string(c.vec_dim) + ", batch])");
        if (!nn::has_ne(in.pooled, {c.vec_dim, B})) {
            return fail("pooled must be ne [" + std::to_string(c.vec_dim) + ", " + std::to_string(B) + "]");
        }
    } else if (in.pooled) {
        return fail("this network (Chroma) has no vector_in; pooled must be null");
    }
    const int64_t T = in.context->ne[1];
    if (T < 1) return fail("context has no tokens");
    const FluxTokenGrid grid{in.x->ne[0] / c.patch, in.x->ne[1] / c.patch};
    std::vector<FluxTokenGrid> ref_grids;
    for (ggml_tensor* r : in.refs) ref_grids.push_back({r->ne[0] / c.patch, r->ne[1] / c.patch});
    const std::vector<int64_t> rope_ne = flux_rope_shape(c, T, grid, ref_grids);
    if (in.rope->type != GGML_TYPE_F32 || !nn::has_ne(in.rope, rope_ne)) {
        return fail("rope is " + nn::ne_string(in.rope) + ", these tokens need F32 " + nn::ne_string(rope_ne) +
                    " (flux_rope_table)");
    }
    const int64_t n_tokens = rope_ne[1];
    const std::string stage_problem =
        stage_inputs_problem(options.split, in.stream, in.residual, c.hidden, n_tokens, B);
    if (!stage_problem.empty()) return fail(stage_problem);
    if (in.mask) {
        const std::vector<int64_t> mask_ne = flux_attention_mask_shape(T, n_tokens - T, B);
        if (in.mask->type != GGML_TYPE_F32 || !nn::has_ne(in.mask, mask_ne)) {
            return fail("mask is " + nn::ne_string(in.mask) + ", expected F32 " + nn::ne_string(mask_ne));
        }
    }
    if (c.chroma && (!in.chroma_index || !nn::has_ne(in.chroma_index, chroma_index_shape(c)))) {
        return fail("Chroma needs chroma_index, F32 " + nn::ne_string(chroma_index_shape(c)) + " (chroma_index_table)");
    }
    if (!c.chroma && in.chroma_index) return fail("chroma_index is for Chroma only; must be null");

    // Every block's shared inputs: the rope planes and the expanded mask.
    Shared s;
    s.heads = c.heads;
    s.target = options.target;
    const int64_t hd = c.head_dim();
    s.cos = ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], 0);
    s.sin =
        ggml_view_4d(ctx, in.rope, hd, 1, n_tokens, 1, in.rope->nb[1], in.rope->nb[1], in.rope->nb[2], in.rope->nb[2]);
    s.attn.heads = static_cast<int>(c.heads);
    s.attn.flash = options.flash_attention;
    if (in.mask) {
        s.attn.mask = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, in.mask, n_tokens, 1, 1, B), n_tokens, n_tokens, 1, B);
    }

    // The modulation vectors of every block.
    std::vector<std::array<nn::ShiftScaleGate, 4>> double_mods;  // img 1, img 2, txt 1, txt 2
    std::vector<nn::ShiftScaleGate> single_mods;
    nn::ShiftScaleGate final_mod;
    if (c.chroma) {
        ggml_tensor* guidance = in.guidance ? in.guidance : ggml_scale(ctx, in.timesteps, 0.0f);
        ggml_tensor* tg = ggml_concat(ctx, nn::bfl_time_embedding(ctx, in.timesteps, kChromaTimeEmbedding),
                                      nn::bfl_time_embedding(ctx, guidance, kChromaTimeEmbedding), 0);  // [32, B]
        const int64_t M = c.chroma_modulations();
        ggml_tensor* input =
            ggml_concat(ctx, ggml_repeat_4d(ctx, ggml_reshape_3d(ctx, tg, tg->ne[0], 1, B), tg->ne[0], M, B, 1),
                        ggml_repeat_4d(ctx, ggml_reshape_3d(ctx, in.chroma_index, kChromaIndexEmbedding, M, 1),
                                       kChromaIndexEmbedding, M, B, 1),
                        0);  // [64, M, B]
        ggml_tensor* a = nn::linear(ctx, b.approx_in, input);
        for (size_t i = 0; i < b.approx_layers.size(); ++i) {
            ggml_tensor* n = nn::rms_norm(ctx, a, b.approx_norms[i], kNormEps);
            a = ggml_add(ctx, a, nn::mlp_embed(ctx, b.approx_layers[i], n));
        }
        const nn::ModulationTable t =
            nn::ModulationTable::from_chunks(ctx, nn::linear(ctx, b.approx_out, a));  // [hidden, B, M]
        const int64_t S = c.single_blocks, D = c.double_blocks;
        for (int64_t i = 0; i < D; ++i) {
            const int64_t img = 3 * S + 6 * i, txt = 3 * S + 6 * D + 6 * i;
            double_mods.push_back({nn::shift_scale_gate(ctx, t, img), nn::shift_scale_gate(ctx, t, img + 3),
                                   nn::shift_scale_gate(ctx, t, txt), nn::shift_scale_gate(ctx, t, txt + 3)});
        }
        for (int64_t i = 0; i < S; ++i) single_mods.push_back(nn::shift_scale_gate(ctx, t, 3 * i));
        final_mod = nn::shift_scale_gate(ctx, t, M - 2, /*with_gate=*/false);
    } else {
        ggml_tensor* vec = nn::mlp_embed(ctx, b.time_in, nn::bfl_time_embedding(ctx, in.timesteps, kTimeEmbedding));
        if (c.guidance_embed)
            vec = ggml_add(ctx, vec,
                           nn::mlp_embed(ctx, b.guidance_in, nn::bfl_time_embedding(ctx, in.guidance, kTimeEmbedding)));
        vec = ggml_add(ctx, vec, nn::mlp_embed(ctx, b.vector_in, ggml_reshape_2d(ctx, in.pooled, c.vec_dim, B)));
        ggml_tensor* silu_vec = ggml_silu(ctx, vec);
        for (const DoubleBlock& block : b.doubles) {
            const nn::ModulationTable img = modulation(ctx, block.img.mod, silu_vec, 6);
            const nn::ModulationTable txt = modulation(ctx, block.txt.mod, silu_vec, 6);
            double_mods.push_back({nn::shift_scale_gate(ctx, img, 0), nn::shift_scale_gate(ctx, img, 3),
                                   nn::shift_scale_gate(ctx, txt, 0), nn::shift_scale_gate(ctx, txt, 3)});
        }
        for (const SingleBlock& block : b.singles)
            single_mods.push_back(nn::shift_scale_gate(ctx, modulation(ctx, block.mod, silu_vec, 3), 0));
        const nn::ModulationTable final_table = modulation(ctx, b.final_mod, silu_vec, 2);
        final_mod = b.final_scale_first ? nn::scale_shift(ctx, final_table, 0)
                                        : nn::shift_scale_gate(ctx, final_table, 0, /*with_gate=*/false);
    }

    // Tokens: text, then the image's patches and each reference's.
    ggml_tensor* x = nullptr;
    if (stage_embeds(options.split)) {
        ggml_tensor* img = nn::patchify(ctx, in.x, c.patch, nn::PatchFeatures::ChannelSlowest);
        for (ggml_tensor* r : in.refs)
            img = ggml_concat(ctx, img, nn::patchify(ctx, r, c.patch, nn::PatchFeatures::ChannelSlowest), 1);
        img = nn::linear(ctx, b.img_in, img);
        ggml_tensor* txt = nn::linear(ctx, b.txt_in, in.context);
        x = ggml_concat(ctx, txt, img, 1);  // [hidden, tokens, B]
    }
    auto skipped = [&](int64_t block) {
        return std::find(options.skip_blocks.begin(), options.skip_blocks.end(), static_cast<int>(block)) !=
               options.skip_blocks.end();
    };
    const int64_t D = static_cast<int64_t>(b.doubles.size()), S = static_cast<int64_t>(b.singles.size());
    StageResults kept;
    auto block = [&](int64_t i, ggml_tensor* h) {
        if (skipped(i)) return h;
        if (i < D) {
            const auto& m = double_mods[static_cast<size_t>(i)];
            const nn::ShiftScaleGate img_mod[2] = {m[0], m[1]}, txt_mod[2] = {m[2], m[3]};
            return nn::mark_cut(double_block(ctx, s, b.doubles[static_cast<size_t>(i)], h, T, img_mod, txt_mod),
                                "double_blocks." + std::to_string(i));
        }
        const size_t j = static_cast<size_t>(i - D);
        return nn::mark_cut(single_block(ctx, s, b.singles[j], h, single_mods[j]),
                            "single_blocks." + std::to_string(j));
    };
    x = run_block_stage(ctx, options.split, D + S, x, in.stream, in.residual, block, kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, x, nullptr, kept);
    // The image's tokens (text and references dropped) through the final layer.
    ggml_tensor* out =
        nn::linear(ctx, b.final_linear,
                   nn::modulate_layer_norm(ctx, nn::token_range(ctx, x, T, grid.w * grid.h), final_mod, kNormEps));
    return block_stage_output(ctx, options.split, x,
                              nn::unpatchify(ctx, out, grid.w, grid.h, c.patch, nn::PatchFeatures::ChannelSlowest),
                              kept);
}

Status FluxDit::check_conditioning(const ConditioningShape& shape) const {
    const FluxConfig& fc = config_;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.context && e.width != fc.context_dim) {
            return Error::bad_file("the " + e.module + " text encoder is " + std::to_string(e.width) +
                                   " wide but the DiT's txt_in takes " + std::to_string(fc.context_dim));
        }
        if (e.pooled && e.pooled_width > 0 && e.width != fc.vec_dim) {
            return Error::bad_file("the " + e.module + " pooled output is " + std::to_string(e.width) +
                                   " wide but the DiT's vector_in takes " + std::to_string(fc.vec_dim));
        }
    }
    if (shape.latent_channels != fc.velocity_channels()) {
        return Error::bad_file("the VAE has " + std::to_string(shape.latent_channels) + " latent channels but the " +
                               shape.family_label + " DiT takes " + std::to_string(fc.velocity_channels()) +
                               " (an SD VAE with a Flux model? pass Flux's ae)");
    }
    const int64_t mask_planes = fc.latent_channels - 2 * fc.velocity_channels();
    if (fc.fill() && mask_planes != shape.vae_downscale * shape.vae_downscale) {
        return Error::bad_file("the " + shape.family_label + " DiT takes " + std::to_string(mask_planes) +
                               " mask planes per latent pixel, but the VAE downscales " +
                               std::to_string(shape.vae_downscale) + "x (" +
                               std::to_string(shape.vae_downscale * shape.vae_downscale) + " pixels)");
    }
    return Status::Ok();
}

namespace {

// The latent grids of an evaluation, in patches.
FluxTokenGrid image_grid(const FluxConfig& fc, const DiffusionShape& shape) {
    return {shape.latent_w / fc.patch, shape.latent_h / fc.patch};
}
std::vector<FluxTokenGrid> reference_grids(const FluxConfig& fc, const DiffusionShape& shape) {
    std::vector<FluxTokenGrid> grids;
    for (const LatentSize& r : shape.refs) grids.push_back({r.w / fc.patch, r.h / fc.patch});
    return grids;
}
int64_t image_tokens(const FluxConfig& fc, const DiffusionShape& shape) {
    const FluxTokenGrid image = image_grid(fc, shape);
    int64_t tokens = image.w * image.h;
    for (const FluxTokenGrid& r : reference_grids(fc, shape)) tokens += r.w * r.h;
    return tokens;
}

}  // namespace

Result<DiffusionTensors> FluxDit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const FluxConfig& fc = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    const int64_t c = fc.latent_channels;
    FluxInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c, b}, nullptr, "x");
    for (size_t i = 0; i < shape.refs.size(); ++i) {
        g.refs.push_back(s.input(GGML_TYPE_F32, {shape.refs[i].w, shape.refs[i].h, fc.velocity_channels(), b}, nullptr,
                                 ("ref" + std::to_string(i)).c_str()));
    }
    in.refs = g.refs;
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    if (fc.guidance_embed) in.guidance = g.guidance = s.input(GGML_TYPE_F32, {b}, nullptr, "guidance");
    in.context = g.context = s.input(GGML_TYPE_F32, {fc.context_dim, shape.tokens, b}, nullptr, "context");
    if (fc.vec_dim > 0) in.pooled = g.y = s.input(GGML_TYPE_F32, {fc.vec_dim, b}, nullptr, "pooled");
    const FluxTokenGrid image = image_grid(fc, shape);
    const std::vector<FluxTokenGrid> ref_grids = reference_grids(fc, shape);
    const std::vector<float> rope =
        flux_rope_table(fc, shape.tokens, image, ref_grids, shape.increase_ref_index, shape.target.seams);
    in.rope = s.input(GGML_TYPE_F32, flux_rope_shape(fc, shape.tokens, image, ref_grids), rope.data(), "rope");
    if (shape.mask) {
        const std::vector<float> open(static_cast<size_t>(shape.tokens * b), 1.0f);
        const std::vector<float> mask = text_mask_values(open, shape);
        in.mask = g.mask = s.input(GGML_TYPE_F32, flux_attention_mask_shape(shape.tokens, image_tokens(fc, shape), b),
                                   mask.data(), "mask");
    }
    if (fc.chroma) {
        const std::vector<float> index = chroma_index_table(fc);
        in.chroma_index = s.input(GGML_TYPE_F32, chroma_index_shape(fc), index.data(), "chroma_index");
    }
    FluxBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = shape.target;
    options.skip_blocks = shape.skip_blocks;
    options.split = shape.split;
    make_stage_inputs(s, shape.split, fc.hidden, shape.tokens + image_tokens(fc, shape), b, g);
    in.stream = g.stream;
    in.residual = g.residual;
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = *out;
    return g;
}

std::vector<float> FluxDit::text_mask_values(const std::vector<float>& text_valid, const DiffusionShape& shape) const {
    return flux_attention_mask(text_valid, image_tokens(config_, shape), shape.batch);
}

}  // namespace kiln::models
