#include "models/nets/qwen25_vl_vision.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "nn/attention.h"
#include "nn/layers.h"

namespace kiln::models {
namespace {

using Naming = QwenVisionConfig::Naming;

constexpr int64_t kHeadWidth = 80;  // Qwen2.5-VL's: 1280 / 16
constexpr float kRopeTheta = 10000.0f;

// The tensors of a block, in both namings.
enum class Part { Norm1, Norm2, Qkv, Q, K, V, Out, Gate, Up, Down };

// The layer's name without ".weight" / ".bias".
std::string block_layer(Naming naming, int64_t block, Part part) {
    const char* leaf = "";
    if (naming == Naming::LlamaCpp) {
        switch (part) {
            case Part::Norm1: leaf = "ln1"; break;
            case Part::Norm2: leaf = "ln2"; break;
            case Part::Qkv: leaf = "attn_qkv"; break;
            case Part::Q: leaf = "attn_q"; break;
            case Part::K: leaf = "attn_k"; break;
            case Part::V: leaf = "attn_v"; break;
            case Part::Out: leaf = "attn_out"; break;
            case Part::Gate: leaf = "ffn_gate"; break;
            case Part::Up: leaf = "ffn_up"; break;
            case Part::Down: leaf = "ffn_down"; break;
        }
        return "v.blk." + std::to_string(block) + "." + leaf;
    }
    switch (part) {
        case Part::Norm1: leaf = "norm1"; break;
        case Part::Norm2: leaf = "norm2"; break;
        case Part::Qkv:
        case Part::Q:
        case Part::K:
        case Part::V: leaf = "attn.qkv"; break;
        case Part::Out: leaf = "attn.proj"; break;
        case Part::Gate: leaf = "mlp.gate_proj"; break;
        case Part::Up: leaf = "mlp.up_proj"; break;
        case Part::Down: leaf = "mlp.down_proj"; break;
    }
    return "blocks." + std::to_string(block) + "." + leaf;
}

std::string block_tensor(Naming naming, int64_t block, Part part) {
    return block_layer(naming, block, part) + ".weight";
}

const char* patch_name(Naming naming) {
    return naming == Naming::LlamaCpp ? "v.patch_embd.weight" : "patch_embed.proj.weight";
}

// A metadata count where present: a whole number in [1, max], else an error
// naming the key; `fallback` when absent.
Result<int64_t> metadata_count(const io::ModelFile& file, const std::string& key, int64_t fallback, int64_t max,
                               const std::string& where) {
    if (file.metadata().find(key) == file.metadata().end()) return fallback;
    const double v = file.metadata_number(key, std::numeric_limits<double>::quiet_NaN());
    if (!(v >= 1 && v <= static_cast<double>(max)) || v != std::floor(v)) {
        return Error::bad_file(where + ": metadata " + key + " is '" + file.metadata_string(key, "") +
                               "', not a whole number in [1, " + std::to_string(max) + "]");
    }
    return static_cast<int64_t>(v);
}

}  // namespace

struct QwenVisionEncoder::Block {
    ggml_tensor *norm1 = nullptr, *norm2 = nullptr;
    nn::Linear q, k, v;  // llama.cpp: three tensors; HF: filled from qkv at build time
    nn::Linear qkv;      // HF's fused projection
    nn::Linear out, gate, up, down;
};

namespace {

// The windows by size: (patches, windows) of each size in the order sizes
// first appear, and the permutation that puts the windows of each size
// together (order: the window-order patch at each grouped place; place: its
// inverse).
struct WindowGroups {
    std::vector<std::pair<int64_t, int64_t>> sizes;
    std::vector<int32_t> order, place;
};

WindowGroups window_groups(const std::vector<int64_t>& window_units, int64_t patches_per_unit) {
    WindowGroups g;
    std::vector<int64_t> starts;
    int64_t n = 0;
    for (int64_t units : window_units) {
        starts.push_back(n);
        n += units * patches_per_unit;
    }
    for (size_t w = 0; w < window_units.size(); ++w) {
        const int64_t patches = window_units[w] * patches_per_unit;
        if (std::none_of(g.sizes.begin(), g.sizes.end(), [&](const auto& s) { return s.first == patches; }))
            g.sizes.emplace_back(patches, 0);
    }
    for (auto& [patches, count] : g.sizes) {
        for (size_t w = 0; w < window_units.size(); ++w) {
            if (window_units[w] * patches_per_unit != patches) continue;
            ++count;
            for (int64_t i = 0; i < patches; ++i) g.order.push_back(static_cast<int32_t>(starts[w] + i));
        }
    }
    g.place.assign(g.order.size(), 0);
    for (size_t i = 0; i < g.order.size(); ++i) g.place[static_cast<size_t>(g.order[i])] = static_cast<int32_t>(i);
    return g;
}

}  // namespace

QwenVisionWindows qwen_vision_windows(int64_t rows, int64_t cols, int64_t window_units) {
    QwenVisionWindows w;
    w.unit_place.assign(static_cast<size_t>(rows * cols), 0);
    for (int64_t wr = 0; wr < rows; wr += window_units) {
        for (int64_t wc = 0; wc < cols; wc += window_units) {
            const int64_t h = std::min(window_units, rows - wr), wd = std::min(window_units, cols - wc);
            for (int64_t r = wr; r < wr + h; ++r) {
                for (int64_t c = wc; c < wc + wd; ++c) {
                    w.unit_place[static_cast<size_t>(r * cols + c)] = static_cast<int32_t>(w.unit_order.size());
                    w.unit_order.push_back(static_cast<int32_t>(r * cols + c));
                }
            }
            w.window_units.push_back(h * wd);
        }
    }
    return w;
}

Result<std::unique_ptr<QwenVisionEncoder>> QwenVisionEncoder::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    const std::string where = "Qwen2.5-VL vision tower under '" + prefix + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    std::unique_ptr<QwenVisionEncoder> enc(new QwenVisionEncoder());
    QwenVisionConfig& c = enc->config_;

    const io::TensorInfo* patch = nullptr;
    if ((patch = file.find(prefix + patch_name(Naming::HuggingFace)))) {
        c.naming = Naming::HuggingFace;
        // [width, 3, 2, p, p]: two temporal kernels of one Conv3d.
        if (patch->shape.size() != 5 || patch->shape[1] != 3 || patch->shape[2] != 2 || patch->shape[3] <= 0 ||
            patch->shape[3] != patch->shape[4] || patch->shape[0] <= 0) {
            return bad(std::string(patch_name(c.naming)) + " has shape " + patch->shape_string() +
                       ", not [width, 3, 2, patch, patch] (a Conv3d over two frames)");
        }
    } else if ((patch = file.find(prefix + patch_name(Naming::LlamaCpp)))) {
        c.naming = Naming::LlamaCpp;
        if (patch->shape.size() != 4 || patch->shape[1] != 3 || patch->shape[2] <= 0 ||
            patch->shape[2] != patch->shape[3] || patch->shape[0] <= 0) {
            return bad(std::string(patch_name(c.naming)) + " has shape " + patch->shape_string() +
                       ", not [width, 3, patch, patch]");
        }
        if (!file.find(prefix + "v.patch_embd.weight.1")) {
            return bad(
                "no v.patch_embd.weight.1 (the second temporal kernel of Qwen2.5-VL's patch embedding): "
                "not a Qwen2-VL / Qwen2.5-VL mmproj file");
        }
    } else {
        return Error::bad_file("no Qwen2.5-VL vision tower under '" + prefix + "' (no " +
                               patch_name(Naming::HuggingFace) + " or " + patch_name(Naming::LlamaCpp) + ")");
    }
    c.width = patch->shape[0];
    c.patch = patch->shape.back();
    // Qwen2-VL's and Qwen2.5-VL's patches are 14 pixels; far smaller ones
    // would make the full attention's scores (patches squared) unbounded.
    if (c.patch < 8 || c.patch > 64) {
        return bad(std::string(patch_name(c.naming)) + " has shape " + patch->shape_string() + ": patches of " +
                   std::to_string(c.patch) + " pixels, not 8 to 64 (Qwen2.5-VL's are 14)");
    }
    c.blocks = 0;
    while (file.find(prefix + block_tensor(c.naming, c.blocks, Part::Norm1))) ++c.blocks;
    if (c.blocks == 0) return bad("no blocks (" + block_tensor(c.naming, 0, Part::Norm1) + " is missing)");
    const std::string gate_name = block_tensor(c.naming, 0, Part::Gate);
    const io::TensorInfo* gate = file.find(prefix + gate_name);
    if (!gate || gate->shape.size() != 2 || gate->shape[1] != c.width || gate->shape[0] <= 0) {
        return bad(gate ? gate_name + " has shape " + gate->shape_string() + ", not [mlp, " + std::to_string(c.width) +
                              "]"
                        : "no " + gate_name + " (Qwen2.5-VL's gated MLP; Qwen2-VL's towers are not read)");
    }
    c.mlp = gate->shape[0];
    const std::string merger_in = c.naming == Naming::LlamaCpp ? "mm.0.weight" : "merger.mlp.0.weight";
    const std::string merger_out = c.naming == Naming::LlamaCpp ? "mm.2.weight" : "merger.mlp.2.weight";
    const io::TensorInfo* in = file.find(prefix + merger_in);
    const io::TensorInfo* out = file.find(prefix + merger_out);
    if (!in || !out) return bad("no patch merger (" + (in ? merger_out : merger_in) + " is missing)");
    const int64_t merged = in->shape.size() == 2 ? in->shape[1] : 0;
    c.merge = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(merged) / c.width)));
    if (merged <= 0 || c.merge < 1 || c.merge > 4 || c.merge * c.merge * c.width != merged) {
        return bad(merger_in + " has shape " + in->shape_string() + ", not [m, width x merge^2] with width " +
                   std::to_string(c.width) + " and merge 1 to 4");
    }
    if (out->shape.size() != 2 || out->shape[0] <= 0) {
        return bad(merger_out + " has shape " + out->shape_string() + ", not [out_width, " + std::to_string(merged) +
                   "]");
    }
    c.out_width = out->shape[0];

    // What the weights cannot say, from llama.cpp's keys (also read from a
    // safetensors header), else Qwen2.5-VL's values.
    auto heads = metadata_count(file, "clip.vision.attention.head_count", c.width / kHeadWidth, c.width, where);
    if (!heads.ok()) return heads.error();
    c.heads = *heads;
    if (c.heads < 1 || c.width % c.heads != 0 || (c.width / c.heads) % 4 != 0) {
        return bad(std::to_string(c.heads) + " heads (clip.vision.attention.head_count, else width / 80) do not " +
                   "split the width " + std::to_string(c.width) + " into heads of a multiple of 4 (2-D RoPE)");
    }
    auto every = metadata_count(file, "clip.vision.n_wa_pattern", 8, 1 << 20, where);
    if (!every.ok()) return every.error();
    c.full_every = *every;
    auto window = metadata_count(file, "clip.vision.window_size", 112, 1 << 20, where);
    if (!window.ok()) return window.error();
    c.window = *window;
    if (c.window % c.unit() != 0) {
        return bad("clip.vision.window_size " + std::to_string(c.window) + " is not a multiple of " +
                   std::to_string(c.unit()) + " pixels (patch x merge)");
    }
    const std::string eps_key = "clip.vision.attention.layer_norm_epsilon";
    if (file.metadata().count(eps_key)) {
        const double eps = file.metadata_number(eps_key, -1.0);
        if (!(eps > 0 && eps < 1)) return bad("metadata " + eps_key + " is not in (0, 1)");
        c.norm_eps = static_cast<float>(eps);
    }
    enc->declare(weights, c.naming == Naming::LlamaCpp);
    return enc;
}

void QwenVisionEncoder::declare(io::WeightDeclarer& w, bool two_kernels) {
    const QwenVisionConfig& c = config_;
    const int64_t p = c.patch;
    if (two_kernels) {
        patch_kernel_ = w.require("v.patch_embd.weight", {c.width, 3, p, p});
        patch_kernel1_ = w.require("v.patch_embd.weight.1", {c.width, 3, p, p});
    } else {
        patch_kernel_ = w.require("patch_embed.proj.weight", {c.width, 3, 2, p, p});
    }
    for (int64_t i = 0; i < c.blocks; ++i) {
        auto b = std::make_shared<Block>();
        auto linear = [&](Part part, int64_t in, int64_t out) {
            return nn::declare_linear(w, block_layer(c.naming, i, part), in, out);
        };
        b->norm1 = w.require_f32(block_tensor(c.naming, i, Part::Norm1), {c.width});
        b->norm2 = w.require_f32(block_tensor(c.naming, i, Part::Norm2), {c.width});
        if (c.naming == Naming::LlamaCpp) {
            b->q = linear(Part::Q, c.width, c.width);
            b->k = linear(Part::K, c.width, c.width);
            b->v = linear(Part::V, c.width, c.width);
        } else {
            b->qkv = linear(Part::Qkv, c.width, 3 * c.width);
        }
        b->out = linear(Part::Out, c.width, c.width);
        b->gate = linear(Part::Gate, c.width, c.mlp);
        b->up = linear(Part::Up, c.width, c.mlp);
        b->down = linear(Part::Down, c.mlp, c.width);
        blocks_.push_back(b);
    }
    const int64_t merged = c.width * c.merge * c.merge;
    const bool cpp = c.naming == Naming::LlamaCpp;
    merger_norm_ = w.require_f32(cpp ? "v.post_ln.weight" : "merger.ln_q.weight", {c.width});
    merger_in_ = nn::declare_linear(w, cpp ? "mm.0" : "merger.mlp.0", merged, merged);
    merger_out_ = nn::declare_linear(w, cpp ? "mm.2" : "merger.mlp.2", merged, c.out_width);
}

std::vector<float> QwenVisionEncoder::patch_rows(const float* image, int64_t width, int64_t height) const {
    const QwenVisionConfig& c = config_;
    const int64_t p = c.patch, m = c.merge;
    const int64_t cols = width / c.unit(), rows = height / c.unit();
    const QwenVisionWindows windows = qwen_vision_windows(rows, cols, c.window / c.unit());
    const int64_t row_values = 3 * p * p;
    std::vector<float> out;
    out.reserve(static_cast<size_t>(rows * cols * m * m * row_values));
    for (int32_t unit : windows.unit_order) {
        const int64_t ur = unit / cols, uc = unit % cols;
        for (int64_t pr = 0; pr < m; ++pr) {
            for (int64_t pc = 0; pc < m; ++pc) {
                const int64_t y0 = (ur * m + pr) * p, x0 = (uc * m + pc) * p;
                for (int64_t ch = 0; ch < 3; ++ch) {
                    for (int64_t y = 0; y < p; ++y) {
                        const float* src = image + (ch * height + y0 + y) * width + x0;
                        for (int64_t x = 0; x < p; ++x) {
                            out.push_back((src[x] - kQwenVisionMean[static_cast<size_t>(ch)]) /
                                          kQwenVisionStd[static_cast<size_t>(ch)]);
                        }
                    }
                }
            }
        }
    }
    return out;
}

VisionEncoderTensors QwenVisionEncoder::build(nn::GraphInputs& s, const VisionEncodeShape& shape) const {
    const QwenVisionConfig& c = config_;
    ggml_context* ctx = s.ctx();
    const int64_t p = c.patch, m = c.merge;
    const int64_t cols = shape.width / c.unit(), rows = shape.height / c.unit();
    const int64_t units = rows * cols, n = units * m * m;
    const int64_t head_dim = c.width / c.heads;
    const QwenVisionWindows windows = qwen_vision_windows(rows, cols, c.window / c.unit());

    const std::vector<float> patches = patch_rows(shape.image, shape.width, shape.height);
    ggml_tensor* x = s.input(GGML_TYPE_F32, {3 * p * p, n}, patches.data(), "patches");

    // The Conv3d over two equal frames is the product with each temporal
    // kernel, summed; a kernel as ne [3 * p * p, width] reads (channel, row,
    // column) as the patch rows do.
    auto kernel = [&](ggml_tensor* k, int64_t t) {
        if (patch_kernel1_) return ggml_reshape_2d(ctx, k, 3 * p * p, c.width);
        ggml_tensor* slice =
            ggml_view_4d(ctx, k, p, p, 3, c.width, k->nb[1], k->nb[3], k->nb[3] * 3, static_cast<size_t>(t) * k->nb[2]);
        return ggml_reshape_2d(ctx, ggml_cont(ctx, slice), 3 * p * p, c.width);
    };
    x = ggml_add(ctx, ggml_mul_mat(ctx, kernel(patch_kernel_, 0), x),
                 ggml_mul_mat(ctx, kernel(patch_kernel1_ ? patch_kernel1_ : patch_kernel_, 1), x));

    // RoPE positions (row, column) of each patch in the window order, as
    // ggml's vision rope reads them: all rows, then all columns, then two unused.
    std::vector<int32_t> positions(static_cast<size_t>(4 * n), 0);
    int64_t at = 0;
    for (int32_t unit : windows.unit_order) {
        for (int64_t pr = 0; pr < m; ++pr) {
            for (int64_t pc = 0; pc < m; ++pc, ++at) {
                positions[static_cast<size_t>(at)] = static_cast<int32_t>((unit / cols) * m + pr);
                positions[static_cast<size_t>(n + at)] = static_cast<int32_t>((unit % cols) * m + pc);
            }
        }
    }
    ggml_tensor* pos = s.input(GGML_TYPE_I32, {4 * n}, positions.data(), "vision_positions");

    // Window attention: each window's patches are consecutive in the window
    // order, and the windows of one size (whole ones, and the narrower ones
    // at the right and bottom edges) attend as one batch of their own, so
    // no scores are made between windows (the whole attention's patches
    // squared: 1.8 GiB at the first Edit release's vision area of about
    // 1024x1024 pixels). The patches go into the groups' order and back by
    // two row gathers, unless there is one group, which is the window order
    // itself.
    const WindowGroups groups = window_groups(windows.window_units, m * m);
    ggml_tensor* into_groups = nullptr;
    ggml_tensor* out_of_groups = nullptr;
    if (groups.sizes.size() > 1) {
        into_groups = s.input(GGML_TYPE_I32, {n}, groups.order.data(), "window_group_order");
        out_of_groups = s.input(GGML_TYPE_I32, {n}, groups.place.data(), "window_group_place");
    }
    auto window_attention = [&](ggml_tensor* q, ggml_tensor* k, ggml_tensor* v, nn::AttentionOptions attn) {
        if (into_groups) {
            q = ggml_get_rows(ctx, q, into_groups);
            k = ggml_get_rows(ctx, k, into_groups);
            v = ggml_get_rows(ctx, v, into_groups);
        }
        ggml_tensor* out = nullptr;
        int64_t first = 0;
        for (const auto& [patches, count] : groups.sizes) {
            auto batch = [&](ggml_tensor* t) {
                ggml_tensor* rows =
                    ggml_view_2d(ctx, t, t->ne[0], patches * count, t->nb[1], static_cast<size_t>(first) * t->nb[1]);
                return ggml_reshape_3d(ctx, rows, t->ne[0], patches, count);
            };
            ggml_tensor* a = nn::attention(ctx, batch(q), batch(k), batch(v), attn);
            a = ggml_reshape_2d(ctx, a, c.width, patches * count);
            out = out ? ggml_concat(ctx, out, a, 1) : a;
            first += patches * count;
        }
        return into_groups ? ggml_get_rows(ctx, out, out_of_groups) : out;
    };

    int sections[GGML_MROPE_SECTIONS] = {static_cast<int>(head_dim / 4), static_cast<int>(head_dim / 4),
                                         static_cast<int>(head_dim / 4), static_cast<int>(head_dim / 4)};
    auto rotated = [&](ggml_tensor* t) {
        t = ggml_reshape_3d(ctx, t, head_dim, c.heads, n);
        t = ggml_rope_multi(ctx, t, pos, nullptr, static_cast<int>(head_dim / 2), sections, GGML_ROPE_TYPE_VISION, 0,
                            kRopeTheta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        return ggml_reshape_2d(ctx, t, c.width, n);
    };
    auto rms = [&](ggml_tensor* t, ggml_tensor* weight) { return nn::rms_norm(ctx, t, weight, c.norm_eps); };
    for (int64_t i = 0; i < c.blocks; ++i) {
        const Block& b = *blocks_[static_cast<size_t>(i)];
        ggml_tensor* h = rms(x, b.norm1);
        nn::Linear q = b.q, k = b.k, v = b.v;
        if (b.qkv.weight) {
            q = nn::linear_rows(ctx, b.qkv, 0, c.width);
            k = nn::linear_rows(ctx, b.qkv, c.width, c.width);
            v = nn::linear_rows(ctx, b.qkv, 2 * c.width, c.width);
        }
        nn::AttentionOptions attn;
        attn.heads = static_cast<int>(c.heads);
        attn.flash = shape.flash_attention;
        // The full attention's scores a block of queries at a time on the CPU.
        if (shape.target == nn::ComputeTarget::Cpu) attn.scores_block_bytes = nn::kCpuScoresBlockBytes;
        ggml_tensor* rq = rotated(nn::linear(ctx, q, h));
        ggml_tensor* rk = rotated(nn::linear(ctx, k, h));
        ggml_tensor* rv = nn::linear(ctx, v, h);
        ggml_tensor* a =
            c.full_attention(i) ? nn::attention(ctx, rq, rk, rv, attn) : window_attention(rq, rk, rv, attn);
        x = ggml_add(ctx, x, nn::linear(ctx, b.out, a));
        h = rms(x, b.norm2);
        ggml_tensor* gated = ggml_mul(ctx, ggml_silu(ctx, nn::linear(ctx, b.gate, h)), nn::linear(ctx, b.up, h));
        x = ggml_add(ctx, x, nn::linear(ctx, b.down, gated));
        x = nn::mark_cut(x, "visual.blocks." + std::to_string(i));
    }
    // Each unit's m x m patches are consecutive rows: one row of m * m * width.
    x = ggml_reshape_2d(ctx, rms(x, merger_norm_), c.width * m * m, units);
    x = nn::linear(ctx, merger_out_, ggml_gelu_erf(ctx, nn::linear(ctx, merger_in_, x)));
    // Back from the window order to the merged grid's row-major order.
    ggml_tensor* place = s.input(GGML_TYPE_I32, {units}, windows.unit_place.data(), "unit_place");
    VisionEncoderTensors t;
    t.out = ggml_get_rows(ctx, x, place);
    return t;
}

}  // namespace kiln::models
