#include "models/nets/mmdit.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "models/nets/block_stages.h"
#include "nn/attention.h"
#include "nn/modulation.h"
#include "nn/patches.h"
#include "nn/shapes.h"

namespace kiln::models {
namespace {

constexpr float kNormEps = 1e-6f;          // the LayerNorms and QK RMSNorms
constexpr int kTimeEmbedding = 256;        // TimestepEmbedder's frequency_embedding_size
constexpr int64_t kStabilityHeadDim = 64;  // "apply magic --> this defines a head_size of 64"

struct Attention {
    nn::Linear qkv, proj;  // proj absent in a pre-only stream
    std::vector<nn::Linear> split;  // diffusers' q, k, v in place of qkv
    ggml_tensor* ln_q = nullptr;
    ggml_tensor* ln_k = nullptr;
};

// One stream of a joint block (Stability's DismantledBlock).
struct Stream {
    nn::Linear modulation;  // adaLN_modulation.1: 2, 6 or (MMDiT-X) 9 chunks
    Attention attn;
    Attention attn2;      // MMDiT-X only
    nn::Linear fc1, fc2;  // absent in a pre-only stream
    bool pre_only = false;
    bool self_attention = false;
    bool scale_first = false;  // a pre-only stream in diffusers' names: (scale, shift)
};

struct JointBlock {
    Stream context, x;
};

struct Shared {
    nn::AttentionOptions attn;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    int64_t heads = 1;
    int64_t hidden = 0;
    ggml_tensor* silu_c = nullptr;  // silu(t_embedder + y_embedder): what every modulation reads
};

struct Qkv {
    ggml_tensor *q, *k, *v;  // ne [hidden, L, B]
};

// q, k, v of `x` through a fused projection (q, k, v the first, second and
// third `hidden` rows), q and k RMS-normed per head in SD3.5.
Qkv project_qkv(ggml_context* ctx, const Shared& s, const Attention& a, ggml_tensor* x) {
    auto part = [&](int64_t i) {
        return nn::linear(ctx, a.split.empty() ? nn::linear_rows(ctx, a.qkv, i * s.hidden, s.hidden) : a.split[i], x);
    };
    Qkv out{part(0), part(1), part(2)};
    if (a.ln_q) {
        auto norm = [&](ggml_tensor* t, ggml_tensor* w) {
            return ggml_reshape_3d(ctx, nn::head_rms_norm(ctx, t, w, s.heads, kNormEps), t->ne[0], t->ne[1], t->ne[2]);
        };
        out.q = norm(out.q, a.ln_q);
        out.k = norm(out.k, a.ln_k);
    }
    return out;
}

// What pre_attention leaves for post_attention: the stream's modulation
// vectors, and q, k, v of its attention (and of MMDiT-X's second one).
struct Modulated {
    nn::ModulationTable table;
    Qkv qkv{};
    Qkv qkv2{};  // MMDiT-X's second attention
};

Modulated pre_attention(ggml_context* ctx, const Shared& s, const Stream& st, ggml_tensor* x) {
    Modulated m;
    const int64_t chunks = st.self_attention ? 9 : st.pre_only ? 2 : 6;
    m.table = nn::ModulationTable::split(ctx, nn::linear(ctx, st.modulation, s.silu_c), chunks);
    ggml_tensor* normed = ggml_norm(ctx, x, kNormEps);
    auto modulated = [&](int64_t k) {
        const int64_t shift = st.scale_first ? k + 1 : k, scale = st.scale_first ? k : k + 1;
        return nn::modulate(ctx, normed, nn::one_plus(ctx, m.table.at(ctx, scale)), m.table.at(ctx, shift));
    };
    m.qkv = project_qkv(ctx, s, st.attn, modulated(0));
    if (st.self_attention) m.qkv2 = project_qkv(ctx, s, st.attn2, modulated(6));
    return m;
}

// x + gate * proj(attn) (+ MMDiT-X's second attention), then the MLP.
ggml_tensor* post_attention(ggml_context* ctx, const Shared& s, const Stream& st, const Modulated& m, ggml_tensor* x,
                            ggml_tensor* attn) {
    x = nn::gated_add(ctx, x, nn::linear(ctx, st.attn.proj, attn), m.table.at(ctx, 2));
    if (st.self_attention) {
        ggml_tensor* attn2 = nn::attention(ctx, m.qkv2.q, m.qkv2.k, m.qkv2.v, s.attn);
        x = nn::gated_add(ctx, x, nn::linear(ctx, st.attn2.proj, attn2), m.table.at(ctx, 8));
    }
    ggml_tensor* h =
        nn::modulate(ctx, ggml_norm(ctx, x, kNormEps), nn::one_plus(ctx, m.table.at(ctx, 4)), m.table.at(ctx, 3));
    h = nn::linear(ctx, st.fc2, nn::gelu_tanh(ctx, s.target, nn::linear(ctx, st.fc1, h)));
    return nn::gated_add(ctx, x, h, m.table.at(ctx, 5));
}

// A joint block on (context ne [hidden, T, B], x ne [hidden, N, B]); the
// context comes back null after a pre-only block.
void joint_block(ggml_context* ctx, const Shared& s, const JointBlock& b, ggml_tensor*& context, ggml_tensor*& x) {
    const int64_t T = context->ne[1];
    const Modulated c = pre_attention(ctx, s, b.context, context);
    const Modulated i = pre_attention(ctx, s, b.x, x);
    ggml_tensor* attn = nn::attention(ctx, ggml_concat(ctx, c.qkv.q, i.qkv.q, 1), ggml_concat(ctx, c.qkv.k, i.qkv.k, 1),
                                      ggml_concat(ctx, c.qkv.v, i.qkv.v, 1), s.attn);
    ggml_tensor* x_attn = nn::token_range(ctx, attn, T, x->ne[1]);
    context =
        b.context.pre_only ? nullptr : post_attention(ctx, s, b.context, c, context, nn::token_range(ctx, attn, 0, T));
    x = post_attention(ctx, s, b.x, i, x, x_attn);
}

// The leading blocks whose output is the whole state, text then image
// tokens: all but a last, pre-only one (the blocks a block-level cache splits).
int64_t full_state_blocks(const std::vector<JointBlock>& blocks) {
    const int64_t n = static_cast<int64_t>(blocks.size());
    return n > 0 && blocks.back().context.pre_only ? n - 1 : n;
}

// The tensors of Stability's MMDiT (sd3.5_large.safetensors; ComfyUI's
// model.diffusion_model.) or of diffusers' SD3Transformer2DModel (a diffusers
// folder's transformer/), as diffusers' scripts/convert_sd3_to_diffusers.py
// renames them: q, k and v split (to_q, to_k, to_v; add_q_proj ... for the
// context), and the final layer's and the last block's pre-only context
// modulation in (scale, shift) where Stability's is (shift, scale).
class Naming {
  public:
    explicit Naming(bool diffusers) : diffusers_(diffusers) {}
    bool diffusers() const { return diffusers_; }

    // The file's name of Stability's tensor (or stem) `name`.
    std::string operator()(const std::string& name) const {
        if (!diffusers_) return name;
        for (const char* suffix : {".weight", ".bias"}) {
            const size_t n = std::char_traits<char>::length(suffix);
            if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0)
                return stem(name.substr(0, name.size() - n)) + suffix;
        }
        return stem(name);
    }
    // The file's stems of a fused q/k/v projection's parts.
    std::vector<std::string> qkv_parts(const std::string& block, const std::string& stream,
                                       const std::string& attn) const {
        if (!diffusers_) return {block + "." + stream + "." + attn + ".qkv"};
        const std::string b = "transformer_blocks." + block.substr(block.find('.') + 1) + "." + attn + ".";
        if (stream == "context_block") return {b + "add_q_proj", b + "add_k_proj", b + "add_v_proj"};
        return {b + "to_q", b + "to_k", b + "to_v"};
    }

  private:
    static std::string stem(const std::string& s) {
        static const std::pair<const char*, const char*> kGlobal[] = {
            {"pos_embed", "pos_embed.pos_embed"},
            {"x_embedder.proj", "pos_embed.proj"},
            {"t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"},
            {"t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"},
            {"y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"},
            {"y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2"},
            {"final_layer.adaLN_modulation.1", "norm_out.linear"},
            {"final_layer.linear", "proj_out"},
        };
        for (const auto& [stability, diffusers] : kGlobal)
            if (s == stability) return diffusers;
        // joint_blocks.N.<stream>.<rest>
        static const std::pair<const char*, const char*> kX[] = {
            {"adaLN_modulation.1", "norm1.linear"}, {"attn.proj", "attn.to_out.0"},   {"attn.ln_q", "attn.norm_q"},
            {"attn.ln_k", "attn.norm_k"},           {"attn2.proj", "attn2.to_out.0"}, {"attn2.ln_q", "attn2.norm_q"},
            {"attn2.ln_k", "attn2.norm_k"},         {"mlp.fc1", "ff.net.0.proj"},     {"mlp.fc2", "ff.net.2"},
        };
        static const std::pair<const char*, const char*> kContext[] = {
            {"adaLN_modulation.1", "norm1_context.linear"},
            {"attn.proj", "attn.to_add_out"},
            {"attn.ln_q", "attn.norm_added_q"},
            {"attn.ln_k", "attn.norm_added_k"},
            {"mlp.fc1", "ff_context.net.0.proj"},
            {"mlp.fc2", "ff_context.net.2"},
        };
        const std::string head = "joint_blocks.";
        if (s.compare(0, head.size(), head) != 0) return s;
        const size_t dot = s.find('.', head.size());
        if (dot == std::string::npos) return s;
        const std::string block = s.substr(head.size(), dot - head.size());
        const std::string rest = s.substr(dot + 1);
        auto renamed = [&](const std::string& stream, const auto& table) -> std::optional<std::string> {
            if (rest.compare(0, stream.size(), stream) != 0) return std::nullopt;
            const std::string leaf = rest.substr(stream.size());
            for (const auto& [stability, diffusers] : table)
                if (leaf == stability) return "transformer_blocks." + block + "." + diffusers;
            return std::nullopt;
        };
        if (auto x = renamed("x_block.", kX)) return *x;
        if (auto context = renamed("context_block.", kContext)) return *context;
        return s;
    }

    bool diffusers_;
};

}  // namespace

std::vector<int32_t> mmdit_positions(const MmditConfig& c, int64_t w, int64_t h) {
    const int64_t M = c.pos_embed_max_size, top = (M - h) / 2, left = (M - w) / 2;
    std::vector<int32_t> rows;
    rows.reserve(static_cast<size_t>(w * h));
    for (int64_t r = 0; r < h; ++r)
        for (int64_t col = 0; col < w; ++col) rows.push_back(static_cast<int32_t>((top + r) * M + left + col));
    return rows;
}

struct Mmdit::Blocks {
    ggml_tensor* patch_weight = nullptr;  // x_embedder.proj, ne [p, p, channels, hidden]
    ggml_tensor* patch_bias = nullptr;
    ggml_tensor* pos_embed = nullptr;  // ne [hidden, M * M, 1], in the file's type
    nn::MlpEmbedder t_embedder, y_embedder;
    nn::Linear context_embedder;
    std::vector<JointBlock> blocks;
    nn::Linear final_mod, final_linear;
};

Mmdit::Mmdit() = default;
Mmdit::~Mmdit() = default;

Result<std::unique_ptr<Mmdit>> Mmdit::create(io::WeightDeclarer& weights) {
    const std::string where = "MMDiT under '" + weights.prefix() + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    auto shape_of = [&](const std::string& name, size_t dims) -> Result<std::vector<int64_t>> {
        const io::TensorInfo* t = weights.info(name);
        if (!t) return bad("missing " + name);
        if (t->shape.size() != dims || std::any_of(t->shape.begin(), t->shape.end(), [](int64_t d) { return d <= 0; }))
            return bad(name + " has shape " + t->shape_string() + ", expected " + std::to_string(dims) + " sizes");
        return t->shape;
    };
    std::unique_ptr<Mmdit> dit(new Mmdit());
    MmditConfig& c = dit->config_;
    c.diffusers_names = weights.has("pos_embed.pos_embed");
    const Naming n(c.diffusers_names);
    auto patch = shape_of(n("x_embedder.proj.weight"), 4);
    if (!patch.ok()) return patch.error();
    c.hidden = (*patch)[0];
    c.channels = (*patch)[1];
    if ((*patch)[2] != (*patch)[3] || (*patch)[2] > 8)
        return bad(n("x_embedder.proj.weight") + " is " + weights.info(n("x_embedder.proj.weight"))->shape_string() +
                   ", expected a square patch");
    c.patch = static_cast<int>((*patch)[2]);
    // [1, M*M, hidden]; a GGUF drops the leading 1.
    const io::TensorInfo* pos = weights.info(n("pos_embed"));
    if (!pos) return bad("missing " + n("pos_embed"));
    dit->pos_embed_shape_ = pos->shape;
    const size_t dims = pos->shape.size();
    if (dims == 2 || dims == 3) {
        c.pos_embed_max_size = static_cast<int64_t>(
            std::llround(std::sqrt(static_cast<double>(std::max<int64_t>(0, pos->shape[dims - 2])))));
    }
    if ((dims != 2 && dims != 3) || (dims == 3 && pos->shape[0] != 1) || pos->shape[dims - 1] != c.hidden ||
        c.pos_embed_max_size < 1 || c.pos_embed_max_size * c.pos_embed_max_size != pos->shape[dims - 2])
        return bad(n("pos_embed") + " is " + pos->shape_string() + ", expected [1, M*M, " + std::to_string(c.hidden) +
                   "]");
    auto context = shape_of(n("context_embedder.weight"), 2);
    if (!context.ok()) return context.error();
    c.context_dim = (*context)[1];
    auto pooled = shape_of(n("y_embedder.mlp.0.weight"), 2);
    if (!pooled.ok()) return pooled.error();
    c.pooled_dim = (*pooled)[1];
    auto fc1 = shape_of(n("joint_blocks.0.x_block.mlp.fc1.weight"), 2);
    if (!fc1.ok()) return fc1.error();
    c.mlp_hidden = (*fc1)[0];
    c.depth = 0;
    auto has_attention = [&](int i, const char* attn) {
        return weights.has(n.qkv_parts("joint_blocks." + std::to_string(i), "x_block", attn).front() + ".weight");
    };
    while (has_attention(c.depth, "attn")) ++c.depth;
    if (c.depth < 1) return bad(c.diffusers_names ? "no transformer_blocks" : "no joint_blocks");
    for (int i = 0; i < c.depth; ++i) c.x_self_attention.push_back(has_attention(i, "attn2"));
    const io::TensorInfo* ln_q = weights.info(n("joint_blocks.0.x_block.attn.ln_q.weight"));
    c.qk_norm = ln_q != nullptr;
    const int64_t head_dim = ln_q && ln_q->shape.size() == 1 ? ln_q->shape[0] : kStabilityHeadDim;
    if (head_dim <= 0 || c.hidden % head_dim != 0)
        return bad("the width " + std::to_string(c.hidden) + " is not a whole number of " + std::to_string(head_dim) +
                   "-wide heads");
    c.heads = c.hidden / head_dim;
    dit->declare(weights);

    DiffusionCapabilities& can = dit->capabilities_;
    can.label = "DiT";
    can.joint_attention = true;
    can.in_channels = can.out_channels = c.channels;
    can.context_width = c.context_dim;
    can.vector_width = c.pooled_dim;
    can.size_stride = c.patch;
    can.max_latent_side = c.pos_embed_max_size * c.patch;
    can.skip_layers = true;
    can.cache_blocks = full_state_blocks(dit->blocks_->blocks);
    return dit;
}

void Mmdit::declare(io::WeightDeclarer& w) {
    const MmditConfig& c = config_;
    const Naming n(c.diffusers_names);
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int64_t H = c.hidden, D = c.head_dim();
    // Small and read as a matrix or added whole: held in F32 whatever --type says.
    b.patch_weight = w.require_f32(n("x_embedder.proj.weight"), {H, c.channels, c.patch, c.patch});
    b.patch_bias = w.require_f32(n("x_embedder.proj.bias"), {H});
    // Read by rows (ggml_get_rows widens them): SD3.5 Large's 192 x 192
    // table would be 358 MB as F32.
    b.pos_embed = w.require(n("pos_embed"), pos_embed_shape_);
    b.t_embedder = {nn::declare_linear(w, n("t_embedder.mlp.0"), kTimeEmbedding, H),
                    nn::declare_linear(w, n("t_embedder.mlp.2"), H, H)};
    b.y_embedder = {nn::declare_linear(w, n("y_embedder.mlp.0"), c.pooled_dim, H),
                    nn::declare_linear(w, n("y_embedder.mlp.2"), H, H)};
    b.context_embedder = nn::declare_linear(w, n("context_embedder"), c.context_dim, H);
    auto attention = [&](const std::string& block, const std::string& stream, const std::string& attn, bool pre_only) {
        const std::string p = block + "." + stream + "." + attn;
        Attention a;
        const std::vector<std::string> parts = n.qkv_parts(block, stream, attn);
        if (parts.size() == 1) {
            a.qkv = nn::declare_linear(w, parts.front(), H, 3 * H);
        } else {
            for (const std::string& part : parts) a.split.push_back(nn::declare_linear(w, part, H, H));
        }
        if (!pre_only) a.proj = nn::declare_linear(w, n(p + ".proj"), H, H);
        if (c.qk_norm) {
            a.ln_q = w.require_f32(n(p + ".ln_q.weight"), {D});
            a.ln_k = w.require_f32(n(p + ".ln_k.weight"), {D});
        }
        return a;
    };
    for (int i = 0; i < c.depth; ++i) {
        JointBlock block;
        for (auto [st, name] :
             {std::pair<Stream*, const char*>{&block.context, "context_block"}, {&block.x, "x_block"}}) {
            const std::string block_name = "joint_blocks." + std::to_string(i);
            const std::string p = block_name + "." + name + ".";
            st->pre_only = st == &block.context && i == c.depth - 1;
            st->scale_first = st->pre_only && c.diffusers_names;
            st->self_attention = st == &block.x && c.x_self_attention[static_cast<size_t>(i)];
            const int64_t chunks = st->self_attention ? 9 : st->pre_only ? 2 : 6;
            st->modulation = nn::declare_linear(w, n(p + "adaLN_modulation.1"), H, chunks * H);
            st->attn = attention(block_name, name, "attn", st->pre_only);
            if (st->self_attention) st->attn2 = attention(block_name, name, "attn2", false);
            if (!st->pre_only) {
                st->fc1 = nn::declare_linear(w, n(p + "mlp.fc1"), H, c.mlp_hidden);
                st->fc2 = nn::declare_linear(w, n(p + "mlp.fc2"), c.mlp_hidden, H);
            }
        }
        b.blocks.push_back(block);
    }
    b.final_mod = nn::declare_linear(w, n("final_layer.adaLN_modulation.1"), H, 2 * H);
    b.final_linear = nn::declare_linear(w, n("final_layer.linear"), H, c.patch * c.patch * c.channels);
}

Result<ggml_tensor*> Mmdit::build(ggml_context* ctx, const MmditInputs& in, const MmditBuildOptions& options) const {
    const MmditConfig& c = config_;
    const Blocks& b = *blocks_;
    auto fail = [](const std::string& what) -> Error { return Error{"MMDiT inputs: " + what}; };
    if (!in.x || !in.timesteps || !in.y || !in.context) return fail("x, timesteps, y and context are required");
    const int64_t B = in.x->ne[3], p = c.patch;
    if (in.x->ne[2] != c.channels || in.x->ne[0] % p != 0 || in.x->ne[1] % p != 0)
        return fail("x is " + nn::ne_string(in.x) + ", expected [W, H, " + std::to_string(c.channels) +
                    ", B] with W and H multiples of " + std::to_string(p));
    const int64_t w = in.x->ne[0] / p, h = in.x->ne[1] / p, M = c.pos_embed_max_size;
    if (w > M || h > M)
        return fail("x is " + nn::ne_string(in.x) + ": the position embedding covers at most " + std::to_string(M * p) +
                    " latent pixels a side");
    if (!nn::has_ne(in.timesteps, {B})) return fail("timesteps must be ne [" + std::to_string(B) + "]");
    if (!in.positions || in.positions->type != GGML_TYPE_I32 || !nn::has_ne(in.positions, {w * h}))
        return fail("positions must be I32 ne [" + std::to_string(w * h) + "] (mmdit_positions)");
    if (!nn::has_ne(in.y, {c.pooled_dim, B}))
        return fail("y is " + nn::ne_string(in.y) + ", expected [" + std::to_string(c.pooled_dim) + ", " +
                    std::to_string(B) + "]");
    if (in.context->ne[0] != c.context_dim || in.context->ne[1] < 1 || in.context->ne[2] != B || in.context->ne[3] != 1)
        return fail("context is " + nn::ne_string(in.context) + ", expected [" + std::to_string(c.context_dim) +
                    ", tokens, " + std::to_string(B) + "]");

    const int64_t T = in.context->ne[1], N = w * h;
    const std::string stage_problem = stage_inputs_problem(options.split, in.stream, in.residual, c.hidden, T + N, B);
    if (!stage_problem.empty()) return fail(stage_problem);

    Shared s;
    s.heads = c.heads;
    s.hidden = c.hidden;
    s.target = options.target;
    s.attn.heads = static_cast<int>(c.heads);
    s.attn.flash = options.flash_attention;
    ggml_tensor* vec =
        ggml_add(ctx, nn::mlp_embed(ctx, b.t_embedder, nn::bfl_time_embedding(ctx, in.timesteps, kTimeEmbedding)),
                 nn::mlp_embed(ctx, b.y_embedder, in.y));
    s.silu_c = ggml_silu(ctx, vec);

    // The residual stream a cut carries: text and image tokens while the
    // text stream runs, the image tokens alone after.
    ggml_tensor* state = nullptr;
    if (stage_embeds(options.split)) {
        // The patches through the convolution (as a product over each patch's
        // channel-slowest features), plus the position embedding's rows of the
        // crop around the centre of its M x M grid.
        nn::Linear embed{ggml_reshape_2d(ctx, b.patch_weight, p * p * c.channels, c.hidden), b.patch_bias};
        ggml_tensor* x =
            nn::linear(ctx, embed, nn::patchify(ctx, in.x, static_cast<int>(p), nn::PatchFeatures::ChannelSlowest));
        x = ggml_add(ctx, x, ggml_get_rows(ctx, ggml_reshape_2d(ctx, b.pos_embed, c.hidden, M * M), in.positions));
        ggml_tensor* context = nn::linear(ctx, b.context_embedder, in.context);
        state = ggml_concat(ctx, context, x, 1);
    }
    bool text_runs = true;
    auto joint = [&](int64_t i, ggml_tensor* st) {
        if (std::find(options.skip_blocks.begin(), options.skip_blocks.end(), static_cast<int>(i)) !=
            options.skip_blocks.end())
            return st;
        ggml_tensor* txt = nn::token_range(ctx, st, 0, T);
        ggml_tensor* img = nn::token_range(ctx, st, T, N);
        joint_block(ctx, s, b.blocks[static_cast<size_t>(i)], txt, img);
        text_runs = txt != nullptr;  // only a pre-only block ends the text stream
        return nn::mark_cut(text_runs ? ggml_concat(ctx, txt, img, 1) : img, "joint_blocks." + std::to_string(i));
    };
    // The blocks that keep the whole state are the stage's; a pre-only last
    // block follows them, as part of the final layer.
    const int64_t full = full_state_blocks(b.blocks);
    StageResults kept;
    state = run_block_stage(ctx, options.split, full, state, in.stream, in.residual, joint, kept);
    if (options.split.stage == BlockStage::Front) return block_stage_output(ctx, options.split, state, nullptr, kept);
    ggml_tensor* last = state;
    for (int64_t i = full; i < static_cast<int64_t>(b.blocks.size()); ++i) last = joint(i, last);
    ggml_tensor* img = text_runs ? nn::token_range(ctx, last, T, N) : last;
    const nn::ModulationTable final_table = nn::ModulationTable::split(ctx, nn::linear(ctx, b.final_mod, s.silu_c), 2);
    nn::ShiftScaleGate final_mod = nn::shift_scale_gate(ctx, final_table, 0, /*with_gate=*/false);
    if (c.diffusers_names) {  // norm_out.linear: (scale, shift)
        final_mod.shift = final_table.at(ctx, 1);
        final_mod.scale1 = nn::one_plus(ctx, final_table.at(ctx, 0));
    }
    ggml_tensor* out = nn::linear(ctx, b.final_linear, nn::modulate_layer_norm(ctx, img, final_mod, kNormEps));
    return block_stage_output(ctx, options.split, state,
                              nn::unpatchify(ctx, out, w, h, static_cast<int>(p), nn::PatchFeatures::ChannelFastest),
                              kept);
}

Status Mmdit::check_conditioning(const ConditioningShape& shape) const {
    const MmditConfig& c = config_;
    // Stability's join: the CLIPs side by side, padded to the context width,
    // then T5 (exactly that wide) along the tokens.
    std::vector<int64_t> group_width;
    int64_t pooled = 0;
    for (const EncoderOutput& e : shape.encoders) {
        if (e.pooled) pooled += e.pooled_width;
        if (!e.context) continue;
        if (group_width.size() <= static_cast<size_t>(e.token_group)) group_width.resize(e.token_group + 1, 0);
        group_width[static_cast<size_t>(e.token_group)] += e.width;
    }
    for (const EncoderOutput& e : shape.encoders) {
        if (!e.context) continue;
        const int64_t width = group_width[static_cast<size_t>(e.token_group)];
        const bool padded = e.token_group == 0;
        if (width > c.context_dim || (!padded && width != c.context_dim)) {
            return Error::bad_file("the " + e.module + " text encoder (" + e.label + ") gives " +
                                   std::to_string(e.width) + " features per token but the " + shape.family_label +
                                   " DiT's context_embedder takes " + std::to_string(c.context_dim) +
                                   " (SD3 reads CLIP-L, CLIP-G and T5-XXL: pass the files made for it)");
        }
    }
    if (pooled != c.pooled_dim) {
        return Error::bad_file("the pooled CLIP vectors are " + std::to_string(pooled) + " wide but the " +
                               shape.family_label + " DiT's y_embedder takes " + std::to_string(c.pooled_dim) +
                               " (CLIP-L's 768 and CLIG-G's 1280: pass --clip_l and --clip_g made for SD3)");
    }
    if (shape.latent_channels != c.channels) {
        return Error::bad_file("the VAE gives " + std::to_string(shape.latent_channels) + "-channel latents but the " +
                               shape.family_label + " DiT takes " + std::to_string(c.channels) +
                               " (pass SD3's 16-channel VAE)");
    }
    return Status::Ok();
}

Result<DiffusionTensors> Mmdit::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const MmditConfig& c = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    MmditInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c.channels, b}, nullptr, "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    in.y = g.y = s.input(GGML_TYPE_F32, {c.pooled_dim, b}, nullptr, "y");
    in.context = g.context = s.input(GGML_TYPE_F32, {c.context_dim, shape.tokens, b}, nullptr, "context");
    const int64_t w = shape.latent_w / c.patch, h = shape.latent_h / c.patch;
    if (w <= c.pos_embed_max_size && h <= c.pos_embed_max_size) {  // else build() says what is wrong
        const std::vector<int32_t> rows = mmdit_positions(c, w, h);
        in.positions = s.input(GGML_TYPE_I32, {w * h}, rows.data(), "positions");
    }
    MmditBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = shape.target;
    options.skip_blocks = shape.skip_blocks;
    options.split = shape.split;
    make_stage_inputs(s, shape.split, c.hidden, shape.tokens + w * h, b, g);
    in.stream = g.stream;
    in.residual = g.residual;
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = *out;
    return g;
}

}  // namespace kiln::models
