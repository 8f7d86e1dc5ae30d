#include "models/nets/wan_vae.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "nn/attention.h"
#include "nn/concat_rows_cpu.h"
#include "nn/conv_cpu.h"
#include "nn/im2col_cpu.h"

namespace kiln::models {
namespace {

using ChannelValues = std::vector<float>;
// WanVAE's latent statistics (Wan 2.1's wan/modules/vae.py).
const ChannelValues kWan21Mean = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f,  -0.1517f, 1.5508f,
                                  0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f,  -0.2921f};
const ChannelValues kWan21Std = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                 3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
// Wan2_2_VAE's (Wan 2.2's wan/modules/vae2_2.py).
const ChannelValues kWan22Mean = {-0.2289f, -0.0052f, -0.1323f, -0.2339f, -0.2799f, 0.0174f,  0.1838f,  0.1557f,
                                  -0.1382f, 0.0542f,  0.2813f,  0.0891f,  0.1570f,  -0.0098f, 0.0375f,  -0.1825f,
                                  -0.2246f, -0.1207f, -0.0698f, 0.5109f,  0.2665f,  -0.2108f, -0.2158f, 0.2502f,
                                  -0.2055f, -0.0322f, 0.1109f,  0.1567f,  -0.0729f, 0.0899f,  -0.2799f, -0.1230f,
                                  -0.0313f, -0.1649f, 0.0117f,  0.0723f,  -0.2839f, -0.2083f, -0.0520f, 0.3748f,
                                  0.0152f,  0.1957f,  0.1433f,  -0.2944f, 0.3573f,  -0.0548f, -0.1681f, -0.0667f};
const ChannelValues kWan22Std = {
    0.4765f, 1.0364f, 0.4514f, 1.1677f, 0.5313f, 0.4990f, 0.4818f, 0.5013f, 0.8158f, 1.0344f, 0.5894f, 1.0901f,
    0.6885f, 0.6165f, 0.8454f, 0.4978f, 0.5759f, 0.3523f, 0.7135f, 0.6804f, 0.5833f, 1.4146f, 0.8986f, 0.5659f,
    0.7069f, 0.5338f, 0.4889f, 0.4917f, 0.4069f, 0.4999f, 0.6866f, 0.4093f, 0.5709f, 0.6065f, 0.6415f, 0.4944f,
    0.5726f, 1.2042f, 0.5458f, 1.6887f, 0.3971f, 1.0600f, 0.3943f, 0.5537f, 0.5444f, 0.4089f, 0.7468f, 0.7744f};
const ChannelValues& latent_mean(bool wan22) { return wan22 ? kWan22Mean : kWan21Mean; }
const ChannelValues& latent_std(bool wan22) { return wan22 ? kWan22Std : kWan21Std; }
// RMS_norm is F.normalize (x / max(|x|, 1e-12)) times sqrt(C): an RMS norm
// whose epsilon only keeps a zero vector finite.
constexpr float kRmsEps = 1e-12f;
// A temporal kernel of 3 sees its frame and the two before it (the
// original's CACHE_T = 2 frames of history).
constexpr int kTemporalKernel = 3;
constexpr int64_t kHistoryFrames = kTemporalKernel - 1;
// The original's Decoder3d halves the input of levels 1 to 3 only (after an
// upsampler's convolution to half the channels): no Wan VAE has more levels.
constexpr size_t kMaxLevels = 4;
// At most this many bands to a banded convolution, as nn/layers.cpp's: the
// graph's node count stays within a constant factor of the unbanded one's.
constexpr int64_t kMaxBands = 64;

// A CausalConv3d: ne [kw, kh, kt, in * out] (PyTorch's [out, in, kt, kh, kw]).
struct CausalConv {
    ggml_tensor* weight = nullptr;
    ggml_tensor* bias = nullptr;
    int64_t in = 0, out = 0;
    int kt = 1;
    int padding = 0;  // spatial; the temporal padding is causal
};

struct RmsNorm {
    ggml_tensor* gamma = nullptr;  // C values, in whichever shape the file holds them
    int64_t channels = 0;
};

struct Residual {
    RmsNorm norm1, norm2;
    CausalConv conv1, conv2;
    std::optional<CausalConv> shortcut;
};

struct Attention {
    RmsNorm norm;
    nn::Conv2d to_qkv, proj;
};

struct Middle {
    Residual first, last;
    Attention attention;
};

struct Resample {
    nn::Conv2d conv;
    std::optional<CausalConv> time_conv;
};

// Wan 2.2's level shortcut, added to a level's output from its input:
// AvgDown3D in the encoder (each output channel the average of `group`
// consecutive values of the input's channels by time offset, row offset,
// column offset), DupUp3D in the decoder (its inverse, each value
// duplicated), over `time` frames and `space` x `space` pixels.
struct LevelShortcut {
    bool up = false;
    int64_t in = 0, out = 0;
    int time = 1, space = 1;
};

// One module of encoder.downsamples or decoder.upsamples (Wan 2.2: of their
// levels' downsamples / upsamples).
struct Layer {
    std::optional<Residual> residual;
    std::optional<Resample> resample;
    std::string cut;  // the level ends here: a cut marker of this name
    bool starts_level = false;
    std::optional<LevelShortcut> shortcut;  // Wan 2.2: added after this layer, the level's last
};

// How ne[3] of a graph's activations reads, and the causal history a clip
// decode carries from one chunk to the next: for each temporal convolution,
// in the order the graph meets them, the two input frames before the chunk.
struct Time {
    bool clip = false;                                      // ne[3] is a clip's time; else a batch of one-frame clips
    bool starts_clip = true;                                // the first frame is the clip's
    const std::vector<ggml_tensor*>* history_in = nullptr;  // null or empty: zeros
    std::vector<ggml_tensor*> history_out;
    size_t next = 0;
    bool fits = true;
    // On the CPU, the patches a banded convolution unfolds at once, and how
    // large an input must be before its RMS norm is made a band at a time
    // (norm_silu_conv) and an upsample is folded into its convolution's
    // unfold (nn::conv2d_of_upsample_2x). Not about time: the one setting
    // the builders below share besides it.
    int64_t max_patch_bytes = WanVae::kMaxPatchBytes;

    // The history of the next temporal convolution, whose input is x: null for zeros.
    ggml_tensor* past(const ggml_tensor* x) {
        const size_t slot = next++;
        if (!history_in || history_in->empty()) return nullptr;
        if (slot >= history_in->size()) {
            fits = false;
            return nullptr;
        }
        ggml_tensor* h = (*history_in)[slot];
        if (h->type != x->type || h->ne[0] != x->ne[0] || h->ne[1] != x->ne[1] || h->ne[2] != x->ne[2] ||
            h->ne[3] != kHistoryFrames) {
            fits = false;
            return nullptr;
        }
        return h;
    }
    void keep(ggml_tensor* h) { history_out.push_back(h); }
    bool all_used() const { return !history_in || history_in->empty() || next == history_in->size(); }
};

CausalConv declare_causal(io::WeightDeclarer& w, const std::string& name, int64_t in, int64_t out, int kt, int k,
                          int padding) {
    CausalConv c;
    c.weight = w.require(name + ".weight", {out, in, kt, k, k});
    c.bias = w.require(name + ".bias", {out});
    c.in = in;
    c.out = out;
    c.kt = kt;
    c.padding = padding;
    return c;
}

// `images`: the attention block's norm, whose gamma is [C, 1, 1] where the
// others' is [C, 1, 1, 1]. A file that squeezed them to [C] is taken too.
RmsNorm declare_rms(io::WeightDeclarer& w, const std::string& name, int64_t channels, bool images) {
    const io::TensorInfo* t = w.info(name);
    std::vector<int64_t> shape = {channels, 1, 1};
    if (t && t->shape.size() == 1) {
        shape = {channels};
    } else if (!images) {
        shape.push_back(1);
    }
    return {w.require_f32(name, shape), channels};
}

Residual declare_residual(io::WeightDeclarer& w, const std::string& p, int64_t in, int64_t out) {
    Residual r;
    r.norm1 = declare_rms(w, p + "residual.0.gamma", in, false);
    r.conv1 = declare_causal(w, p + "residual.2", in, out, kTemporalKernel, 3, 1);
    r.norm2 = declare_rms(w, p + "residual.3.gamma", out, false);
    r.conv2 = declare_causal(w, p + "residual.6", out, out, kTemporalKernel, 3, 1);
    if (in != out) r.shortcut = declare_causal(w, p + "shortcut", in, out, 1, 1, 0);
    return r;
}

Middle declare_middle(io::WeightDeclarer& w, const std::string& p, int64_t ch) {
    Middle m;
    m.first = declare_residual(w, p + "middle.0.", ch, ch);
    m.attention.norm = declare_rms(w, p + "middle.1.norm.gamma", ch, true);
    m.attention.to_qkv = nn::declare_conv2d(w, p + "middle.1.to_qkv", ch, 3 * ch, 1);
    m.attention.proj = nn::declare_conv2d(w, p + "middle.1.proj", ch, ch, 1);
    m.last = declare_residual(w, p + "middle.2.", ch, ch);
    return m;
}

// ---- graph pieces ------------------------------------------------------------

// Frames [first, first + count) of x (ne[3]), a contiguous view.
ggml_tensor* frame_range(ggml_context* ctx, ggml_tensor* x, int64_t first, int64_t count) {
    return ggml_view_4d(ctx, x, x->ne[0], x->ne[1], x->ne[2], count, x->nb[1], x->nb[2], x->nb[3],
                        static_cast<size_t>(first) * x->nb[3]);
}

// Channels [first, first + count) of ne [W, H, C, N], contiguous.
ggml_tensor* channel_range(ggml_context* ctx, ggml_tensor* x, int64_t first, int64_t count) {
    return ggml_cont(ctx, ggml_view_4d(ctx, x, x->ne[0], x->ne[1], count, x->ne[3], x->nb[1], x->nb[2], x->nb[3],
                                       static_cast<size_t>(first) * x->nb[2]));
}

// The latent's values as ne [1, 1, C, 1], to broadcast over a latent. Built
// from one-value aranges ([v, v + 0.5) holds v alone): constants of the code,
// not of the weights, with no input for the caller to fill.
ggml_tensor* channel_constants(ggml_context* ctx, const ChannelValues& values) {
    ggml_tensor* v = nullptr;
    for (float value : values) {
        ggml_tensor* one = ggml_arange(ctx, value, value + 0.5f, 1.0f);
        v = v ? ggml_concat(ctx, v, one, 0) : one;
    }
    return ggml_reshape_4d(ctx, v, 1, 1, static_cast<int64_t>(values.size()), 1);
}

// Temporal slice k of a CausalConv3d as a 2-D convolution (its weight made
// contiguous: the slice's rows are kt apart), with the bias or without.
nn::Conv2d kernel_slice(ggml_context* ctx, const CausalConv& c, int k, bool with_bias) {
    ggml_tensor* w = c.weight;
    const int64_t kw = w->ne[0], kh = w->ne[1];
    ggml_tensor* slice = c.kt == 1 ? ggml_reshape_4d(ctx, w, kw, kh, c.in, c.out)
                                   : ggml_cont(ctx, ggml_view_4d(ctx, w, kw, kh, c.in, c.out, w->nb[1], w->nb[3],
                                                                 w->nb[3] * c.in, static_cast<size_t>(k) * w->nb[2]));
    nn::Conv2d conv;
    conv.weight = slice;
    conv.bias = with_bias ? c.bias : nullptr;
    conv.stride = 1;
    conv.padding = c.padding;
    return conv;
}

ggml_tensor* conv_in_bands(ggml_context* ctx, const nn::Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                           ggml_tensor* added_to, const std::function<ggml_tensor*(ggml_tensor*)>& prepare);

// A CausalConv3d on x ne [W, H, C, T]. One-frame clips see only the last
// temporal slice (the frames before are zeros). A clip's frames see the
// history (or zeros) then themselves: the sum of each slice's 2-D
// convolution over the frames it reads; slices reading only the zeros before
// a clip's start are left out. Its last two input frames become the history.
ggml_tensor* causal_conv(ggml_context* ctx, nn::ComputeTarget target, const CausalConv& c, ggml_tensor* x, Time& time) {
    const int last = c.kt - 1;
    if (c.kt == 1 || !time.clip) return nn::conv2d(ctx, target, kernel_slice(ctx, c, last, true), x);
    const int64_t T = x->ne[3];
    ggml_tensor* past = time.past(x);
    ggml_tensor* padded = past ? ggml_concat(ctx, past, x, 3) : ggml_pad_ext(ctx, x, 0, 0, 0, 0, 0, 0, last, 0);
    // On the CPU a large clip's slices go a band of rows at a time, each
    // added into the sum in place: their unfolds of every frame at once are
    // what a clip's decode would otherwise hold (GiBs at 832x480).
    const bool odd_same = c.weight->ne[0] == c.weight->ne[1] && c.weight->ne[0] == 2 * c.padding + 1;
    // (Not across seams: the bands read the rows beyond the image as zeros.)
    const bool bands = target == nn::ComputeTarget::Cpu && !target.seams.any() && odd_same &&
                       padded->type == GGML_TYPE_F32 &&
                       ggml_nelements(x) * static_cast<int64_t>(sizeof(float)) > time.max_patch_bytes;
    ggml_tensor* out = nullptr;
    for (int k = last; k >= 0; --k) {
        if (!past && k + T <= last) continue;
        const nn::Conv2d slice = kernel_slice(ctx, c, k, k == last);
        ggml_tensor* frames = frame_range(ctx, padded, k, T);
        if (bands) {
            out = conv_in_bands(ctx, slice, frames, time.max_patch_bytes, out,
                                [&](ggml_tensor* rows) { return ggml_cont(ctx, rows); });
            continue;
        }
        ggml_tensor* y = nn::conv2d(ctx, target, slice, frames);
        out = out ? ggml_add(ctx, out, y) : y;
    }
    time.keep(ggml_cont(ctx, frame_range(ctx, padded, T, kHistoryFrames)));
    return out;
}

// RMS_norm over the channels of ne [W, H, C, N], then SiLU when `silu`; the
// channels made ne[0] for ggml's norm, then put back.
ggml_tensor* rms_norm_channels(ggml_context* ctx, const RmsNorm& n, ggml_tensor* x, bool silu) {
    ggml_tensor* h = ggml_cont(ctx, ggml_permute(ctx, x, 1, 2, 0, 3));  // [C, W, H, N]
    h = ggml_mul(ctx, ggml_rms_norm(ctx, h, kRmsEps), ggml_reshape_1d(ctx, n.gamma, n.channels));
    if (silu) h = ggml_silu(ctx, h);
    return ggml_cont(ctx, ggml_permute(ctx, h, 2, 0, 1, 3));
}

// conv(prepare(x)) on the CPU a band of output rows at a time, for a 3x3 (or
// any odd square) convolution with stride 1 and "same" padding, where
// prepare is per pixel (silu(rms_norm(x)): norm_silu_conv_in_bands; or a
// copy of the rows). The
// norm is per pixel, so each band normalises only its input rows (the band
// and `padding` rows either side, as the unfold reads them): the normalised
// image, as large as x (384 MiB at the top level of a 1024x1024 decode), is
// never made whole, and neither are its transposes. The same numbers as the
// whole graph: each pixel's norm, the patches and each output row's product
// are computed as they are there. `added_to`: null, or a tensor of the
// output's shape (a residual block's shortcut or input; never x, whose rows
// later bands still read) that each band is added into in place, so the
// sum is not a tensor of its own; its values are then gone.
ggml_tensor* conv_in_bands(ggml_context* ctx, const nn::Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                           ggml_tensor* added_to, const std::function<ggml_tensor*(ggml_tensor*)>& prepare) {
    ggml_tensor* w = layer.weight;
    const int64_t W = x->ne[0], H = x->ne[1], N = x->ne[3];
    const int p = layer.padding;
    const int64_t K = w->ne[0] * w->ne[1] * w->ne[2];
    ggml_tensor* kernel = nn::kernel_matrix_for_cpu(ctx, w);
    const int64_t row_bytes = std::max<int64_t>(1, K * W * N * static_cast<int64_t>(sizeof(float)));
    const int64_t band_rows = std::clamp<int64_t>(max_patch_bytes / row_bytes, (H + kMaxBands - 1) / kMaxBands, H);
    std::vector<ggml_tensor*> bands;
    for (int64_t first = 0; first < H; first += band_rows) {
        const int64_t rows = std::min(band_rows, H - first);
        // Input rows [top, bottom): the unfold's own zero padding stands for
        // the rows beyond the image's edges, as it does for the whole image.
        const int64_t top = std::max<int64_t>(0, first - p), bottom = std::min(H, first + rows + p);
        ggml_tensor* in = ggml_view_4d(ctx, x, W, bottom - top, x->ne[2], N, x->nb[1], x->nb[2], x->nb[3],
                                       static_cast<size_t>(top) * x->nb[1]);
        ggml_tensor* patches = nn::im2col_f32_cpu(ctx, w, prepare(in), 1, p, first - top, rows);
        ggml_tensor* band = nn::pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, patches, K, W * rows * N), kernel,
                                                            W, rows, N, layer.bias);
        if (added_to) {
            // added_to + band (the same bits as ggml_add(band, added_to)).
            added_to = ggml_acc_inplace(ctx, added_to, band, added_to->nb[1], added_to->nb[2], added_to->nb[3],
                                        static_cast<size_t>(first) * added_to->nb[1]);
        } else {
            bands.push_back(band);
        }
    }
    return added_to ? added_to : nn::concat_rows_cpu(ctx, bands);
}

ggml_tensor* norm_silu_conv_in_bands(ggml_context* ctx, const RmsNorm& n, const nn::Conv2d& layer, ggml_tensor* x,
                                     int64_t max_patch_bytes, ggml_tensor* added_to) {
    return conv_in_bands(ctx, layer, x, max_patch_bytes, added_to,
                         [&](ggml_tensor* rows) { return rms_norm_channels(ctx, n, rows, true); });
}

// A CausalConv3d of silu(rms_norm(x)), plus `added_to` when not null: in
// bands (norm_silu_conv_in_bands) where x is large, on the CPU, for one-frame
// clips (a clip's frames are each temporal slice's convolution, summed);
// otherwise the ops in full.
ggml_tensor* norm_silu_conv(ggml_context* ctx, nn::ComputeTarget target, const RmsNorm& n, const CausalConv& c,
                            ggml_tensor* x, Time& time, ggml_tensor* added_to) {
    const bool odd_same = c.weight->ne[0] == c.weight->ne[1] && c.weight->ne[0] == 2 * c.padding + 1;
    const auto f32_contiguous = [](const ggml_tensor* t) { return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t); };
    const bool fold = target == nn::ComputeTarget::Cpu && !target.seams.any() && (c.kt == 1 || !time.clip) &&
                      odd_same && f32_contiguous(x) &&
                      (!added_to || f32_contiguous(added_to)) &&
                      ggml_nelements(x) * static_cast<int64_t>(sizeof(float)) > time.max_patch_bytes;
    if (target == nn::ComputeTarget::Device && (c.kt == 1 || !time.clip) && x->type == GGML_TYPE_F32) {
        // On a device, ggml's own ops a band at a time (nn/layers.h): each
        // band normalises only the input rows its unfold reads, so neither
        // the normalised image nor its transposes are made whole; the same
        // numbers, the norm being per pixel.
        return nn::conv2d_on_device_in_row_bands(
            ctx, kernel_slice(ctx, c, c.kt - 1, true), x->ne[0], x->ne[1], x->ne[3],
            [&](int64_t top, int64_t bottom) {
                ggml_tensor* rows = top == 0 && bottom == x->ne[1]
                                        ? x
                                        : ggml_view_4d(ctx, x, x->ne[0], bottom - top, x->ne[2], x->ne[3], x->nb[1],
                                                       x->nb[2], x->nb[3], static_cast<size_t>(top) * x->nb[1]);
                return rms_norm_channels(ctx, n, rows, true);
            },
            time.max_patch_bytes, added_to, target.seams);
    }
    if (!fold) {
        ggml_tensor* y = causal_conv(ctx, target, c, rms_norm_channels(ctx, n, x, true), time);
        return added_to ? ggml_add(ctx, y, added_to) : y;
    }
    return norm_silu_conv_in_bands(ctx, n, kernel_slice(ctx, c, c.kt - 1, true), x, time.max_patch_bytes, added_to);
}

// `keep_input`: x is read again after the block (Wan 2.2's level shortcut),
// so the sum is not made in place in it.
ggml_tensor* residual(ggml_context* ctx, nn::ComputeTarget target, const Residual& r, ggml_tensor* x, Time& time,
                      bool keep_input = false) {
    ggml_tensor* shortcut = r.shortcut   ? causal_conv(ctx, target, *r.shortcut, x, time)
                            : keep_input ? ggml_cont(ctx, x)
                                         : x;
    ggml_tensor* h = norm_silu_conv(ctx, target, r.norm1, r.conv1, x, time, nullptr);
    return norm_silu_conv(ctx, target, r.norm2, r.conv2, h, time, shortcut);
}

// Single-head self-attention over each frame's pixels. On the CPU the scores
// go a block of queries at a time (nn/attention.h): a 1024x1024 image's
// 128x128 latent is 16384 tokens, whose scores are 1 GiB whole.
ggml_tensor* attention(ggml_context* ctx, nn::ComputeTarget target, const Attention& a, ggml_tensor* x) {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], N = x->ne[3];
    ggml_tensor* h = ggml_cont(ctx, ggml_permute(ctx, x, 1, 2, 0, 3));  // [C, W, H, N]: tokens
    h = ggml_mul(ctx, ggml_rms_norm(ctx, h, kRmsEps), ggml_reshape_1d(ctx, a.norm.gamma, C));
    h = ggml_reshape_3d(ctx, h, C, W * H, N);
    const nn::Linear qkv = nn::conv1x1_as_linear(ctx, a.to_qkv);  // q, k, v: output channels in thirds
    nn::AttentionOptions options{1, false, false};
    if (target == nn::ComputeTarget::Cpu) options.scores_block_bytes = nn::kCpuScoresBlockBytes;
    ggml_tensor* out = nn::attention(ctx, nn::linear(ctx, nn::linear_rows(ctx, qkv, 0, C), h),
                                     nn::linear(ctx, nn::linear_rows(ctx, qkv, C, C), h),
                                     nn::linear(ctx, nn::linear_rows(ctx, qkv, 2 * C, C), h), options);
    out = nn::linear(ctx, nn::conv1x1_as_linear(ctx, a.proj), out);
    out = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, out, C, W, H, N), 2, 0, 1, 3));
    return ggml_add(ctx, x, out);
}

ggml_tensor* middle(ggml_context* ctx, nn::ComputeTarget target, const Middle& m, ggml_tensor* x, Time& time) {
    x = residual(ctx, target, m.first, x, time);
    x = attention(ctx, target, m.attention, x);
    return residual(ctx, target, m.last, x, time);
}

// The decoder's Resample: with a time_conv, each frame becomes two (its
// output channels [0, C) then [C, 2C), which ne [W, H, 2C, T] already holds
// as ne [W, H, C, 2T] in that order), except a clip's first frame, which
// passes alone ("Rep"); then nearest 2x and a 3x3 convolution to C / 2.
ggml_tensor* upsample(ggml_context* ctx, nn::ComputeTarget target, const Resample& r, ggml_tensor* x, Time& time) {
    if (r.time_conv && time.clip) {
        const int64_t T = x->ne[3];
        const int64_t skipped = time.starts_clip ? 1 : 0;
        ggml_tensor* doubled = nullptr;
        if (T > skipped) {
            ggml_tensor* t = causal_conv(ctx, target, *r.time_conv, skipped ? frame_range(ctx, x, 1, T - 1) : x, time);
            doubled = ggml_reshape_4d(ctx, t, t->ne[0], t->ne[1], t->ne[2] / 2, 2 * t->ne[3]);
        } else {
            // The clip's first frame alone: the history the original's "Rep"
            // stands for, two frames of zeros.
            time.past(x);
            ggml_tensor* frame = frame_range(ctx, x, 0, 1);
            time.keep(ggml_fill(ctx, ggml_concat(ctx, frame, frame, 3), 0.0f));
        }
        if (!skipped) {
            x = doubled;
        } else if (doubled) {
            x = ggml_concat(ctx, frame_range(ctx, x, 0, 1), doubled, 3);
        }
    }
    return nn::conv2d_of_upsample_2x(ctx, target, r.conv, x, time.max_patch_bytes);
}

// The encoder's Resample: padded right and bottom by one, a stride-2 3x3
// convolution; with a time_conv, a clip of 1 + 2k frames becomes 1 + k: its
// first frame alone (as the original's first chunk skips time_conv), then
// the time_conv with stride 2 and no padding over all of them. A later
// chunk of 2k frames becomes k: the time_conv over the frame before it (the
// last of its history, as the original's feat_cache keeps it) and its own.
ggml_tensor* downsample(ggml_context* ctx, nn::ComputeTarget target, const Resample& r, ggml_tensor* x, Time& time) {
    x = nn::conv2d(ctx, target, r.conv, nn::pad_right_and_bottom(ctx, x, target.seams));
    if (!r.time_conv || !time.clip) return x;
    ggml_tensor* past = time.past(x);
    if (!time.starts_clip && !past) {
        time.fits = false;
        return x;
    }
    ggml_tensor* frames = time.starts_clip ? x : ggml_concat(ctx, frame_range(ctx, past, kHistoryFrames - 1, 1), x, 3);
    const int64_t T = x->ne[3];
    // The history is the chunk's last two frames (the first chunk's one frame twice).
    time.keep(ggml_cont(ctx, T >= kHistoryFrames ? frame_range(ctx, x, T - kHistoryFrames, kHistoryFrames)
                                                 : ggml_concat(ctx, x, x, 3)));
    const int64_t inputs = frames->ne[3];
    if (inputs < kTemporalKernel) return x;
    const int64_t outputs = (inputs - kTemporalKernel) / 2 + 1;
    const CausalConv& c = *r.time_conv;
    ggml_tensor* out = nullptr;
    for (int k = c.kt - 1; k >= 0; --k) {
        // Frames k, k + 2, ...
        ggml_tensor* strided = ggml_cont(
            ctx, ggml_view_4d(ctx, frames, frames->ne[0], frames->ne[1], frames->ne[2], outputs, frames->nb[1],
                              frames->nb[2], 2 * frames->nb[3], static_cast<size_t>(k) * frames->nb[3]));
        ggml_tensor* y = nn::conv2d(ctx, target, kernel_slice(ctx, c, k, k == c.kt - 1), strided);
        out = out ? ggml_add(ctx, out, y) : y;
    }
    return time.starts_clip ? ggml_concat(ctx, frame_range(ctx, x, 0, 1), out, 3) : out;
}

// Wan 2.2's patchify: ne [W, H, C, T] -> ne [W / p, H / p, C p p, T], each
// channel's p x p pixels (row offset q, column offset r) becoming channels
// (c, r, q), q fastest (einops' "b c f (h q) (w r) -> b (c r q) f h w").
ggml_tensor* patchify(ggml_context* ctx, ggml_tensor* x, int p) {
    if (p == 1) return x;
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], T = x->ne[3], n = C * T;
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, p, W / p, H, n), 2, 0, 1, 3));  // [W/p, H, r, n]
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, W / p, p, H / p, p * n), 0, 2, 1, 3));
    return ggml_reshape_4d(ctx, x, W / p, H / p, C * p * p, T);  // [W/p, H/p, q, (r, c)], T
}

// Its inverse: ne [w, h, C p p, T] -> ne [w p, h p, C, T].
ggml_tensor* unpatchify(ggml_context* ctx, ggml_tensor* x, int p) {
    if (p == 1) return x;
    const int64_t w = x->ne[0], h = x->ne[1], C = x->ne[2] / (p * p), T = x->ne[3], n = C * T;
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, w, h, p, p * n), 0, 2, 1, 3));  // [w, q, h, (r, n)]
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, w, h * p, p, n), 1, 2, 0, 3));  // [r, w, H, n]
    return ggml_reshape_4d(ctx, x, w * p, h * p, C, T);
}

// AvgDown3D on a level's input ne [W, H, C, T]: the configurations it takes
// (WanVae::read_config) average whole 2x2 pixel blocks, so its channels are
// (c, time offset) of the 2x2 average pool, or their mean over the time
// offsets where the width stays. A clip of an odd frame count has a zero
// frame put before it, as the original pads; one-frame clips are each such.
ggml_tensor* average_down(ggml_context* ctx, const LevelShortcut& s, ggml_tensor* x, const Time& time) {
    ggml_tensor* pooled =
        s.space == 1 ? x : ggml_pool_2d(ctx, x, GGML_OP_POOL_AVG, s.space, s.space, s.space, s.space, 0.0f, 0.0f);
    if (s.time == 1) return pooled;
    const int64_t w = pooled->ne[0], h = pooled->ne[1], C = pooled->ne[2];
    if (time.clip && pooled->ne[3] % 2 == 1) pooled = ggml_pad_ext(ctx, pooled, 0, 0, 0, 0, 0, 0, 1, 0);
    if (!time.clip) {
        // Each item: a zero frame, then itself.
        if (s.out == s.in) return ggml_scale(ctx, pooled, 0.5f);
        const int64_t N = pooled->ne[3];
        ggml_tensor* item = ggml_reshape_4d(ctx, pooled, w * h, 1, C, N);
        ggml_tensor* pair = ggml_concat(ctx, ggml_fill(ctx, item, 0.0f), item, 1);  // [wh, a, C, N]
        return ggml_reshape_4d(ctx, pair, w, h, 2 * C, N);
    }
    const int64_t pairs = pooled->ne[3] / 2;
    ggml_tensor* frames = ggml_reshape_4d(ctx, pooled, w * h, C, 2, pairs);  // [wh, c, a, t']
    if (s.out == s.in) {
        ggml_tensor* even =
            ggml_view_4d(ctx, frames, w * h, C, 1, pairs, frames->nb[1], frames->nb[2], frames->nb[3], 0);
        ggml_tensor* odd =
            ggml_view_4d(ctx, frames, w * h, C, 1, pairs, frames->nb[1], frames->nb[2], frames->nb[3], frames->nb[2]);
        return ggml_reshape_4d(ctx, ggml_scale(ctx, ggml_add(ctx, even, odd), 0.5f), w, h, C, pairs);
    }
    return ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_permute(ctx, frames, 0, 2, 1, 3)), w, h, 2 * C, pairs);
}

// DupUp3D on a level's input ne [W, H, C, T]: output channel o at time
// offset a, row offset b, column offset d is input channel
// (o * factor + component) / repeats, component (a space + b) space + d;
// the clip's first chunk drops the first time - 1 frames (one-frame clips
// keep their last time copy alone).
ggml_tensor* duplicate_up(ggml_context* ctx, const LevelShortcut& s, ggml_tensor* x, const Time& time) {
    const int64_t W = x->ne[0], H = x->ne[1], T = x->ne[3], Cout = s.out;
    const int64_t factor = static_cast<int64_t>(s.time) * s.space * s.space, repeats = Cout * factor / s.in;
    const int64_t step = factor / repeats;  // input channels per output channel
    const int sp = s.space;
    auto source = [&](int64_t component) {
        const int64_t first = component / repeats;
        if (step == 1 && first == 0) return x;
        return ggml_cont(ctx, ggml_view_4d(ctx, x, W, H, Cout, T, x->nb[1], x->nb[2] * step, x->nb[3],
                                           static_cast<size_t>(first) * x->nb[2]));
    };
    auto plane = [&](int a) {  // ne [W sp, H sp, Cout, T]: time offset a
        ggml_tensor* rows = nullptr;
        for (int b = 0; b < sp; ++b) {
            ggml_tensor* cols = nullptr;
            for (int d = 0; d < sp; ++d) {
                ggml_tensor* c = ggml_reshape_4d(ctx, source((a * sp + b) * sp + d), 1, W, H * Cout * T, 1);
                cols = cols ? ggml_concat(ctx, cols, c, 0) : c;
            }
            ggml_tensor* r = ggml_reshape_4d(ctx, cols, W * sp, 1, H, Cout * T);
            rows = rows ? ggml_concat(ctx, rows, r, 1) : r;
        }
        return ggml_reshape_4d(ctx, rows, W * sp, H * sp, Cout, T);
    };
    if (!time.clip) return plane(s.time - 1);
    ggml_tensor* frames = nullptr;
    for (int a = 0; a < s.time; ++a) {
        ggml_tensor* p = ggml_reshape_4d(ctx, plane(a), W * sp * H * sp, Cout, 1, T);
        frames = frames ? ggml_concat(ctx, frames, p, 2) : p;
    }
    frames = ggml_reshape_4d(ctx, frames, W * sp, H * sp, Cout, s.time * T);
    if (!time.starts_clip || s.time == 1) return frames;
    return frame_range(ctx, frames, s.time - 1, s.time * T - (s.time - 1));
}

// The levels of the encoder (`decoder` false) or decoder, each layer in
// turn; Wan 2.2's level shortcuts are added where their level ends.
ggml_tensor* run_levels(ggml_context* ctx, nn::ComputeTarget target, const std::vector<Layer>& layers, bool decoder,
                        ggml_tensor* h, Time& time) {
    ggml_tensor* level_input = nullptr;
    for (const Layer& layer : layers) {
        if (layer.starts_level) level_input = h;
        if (layer.residual) {
            // The level's first block reads the input its shortcut reads later.
            h = residual(ctx, target, *layer.residual, h, time, layer.starts_level);
        } else {
            h = decoder ? upsample(ctx, target, *layer.resample, h, time)
                        : downsample(ctx, target, *layer.resample, h, time);
        }
        if (layer.shortcut) {
            ggml_tensor* s = layer.shortcut->up ? duplicate_up(ctx, *layer.shortcut, level_input, time)
                                                : average_down(ctx, *layer.shortcut, level_input, time);
            h = ggml_add(ctx, h, s);
        }
        if (!layer.cut.empty()) h = nn::mark_cut(h, layer.cut);
    }
    return h;
}

// A 5-D convolution weight's shape, or null when `name` is missing, not 5-D
// or has an empty dimension.
const std::vector<int64_t>* conv3d_shape_of(const io::WeightDeclarer& weights, const std::string& name) {
    const io::TensorInfo* t = weights.info(name);
    if (!t || t->shape.size() != 5) return nullptr;
    for (int64_t d : t->shape)
        if (d <= 0) return nullptr;
    return &t->shape;
}

}  // namespace

int64_t WanVaeConfig::temporal_downscale() const {
    int64_t factor = 1;
    for (bool temporal : temporal_downsample) factor *= temporal ? 2 : 1;
    return factor;
}

struct WanVae::Blocks {
    // Encoder.
    CausalConv enc_in;
    std::vector<Layer> enc_layers;
    Middle enc_mid;
    RmsNorm enc_head_norm;
    CausalConv enc_head;
    CausalConv quant;  // conv1: mean | log variance
    // Decoder.
    CausalConv post_quant;  // conv2
    CausalConv dec_in;
    Middle dec_mid;
    std::vector<Layer> dec_layers;
    RmsNorm dec_head_norm;
    CausalConv dec_head;
};

WanVae::WanVae() = default;
WanVae::~WanVae() = default;

Result<std::unique_ptr<WanVae>> WanVae::create(io::WeightDeclarer& weights) {
    std::unique_ptr<WanVae> vae(new WanVae());
    KILN_TRY(vae->read_config(weights));
    vae->declare(weights);
    const WanVaeConfig& c = vae->config_;
    vae->format_ = {3, c.z_dim, c.downscale(), c.has_encoder, static_cast<int>(c.temporal_downscale())};
    return vae;
}

Status WanVae::read_config(const io::WeightDeclarer& weights) {
    if (weights.has("decoder.upsamples.0.upsamples.0.residual.2.weight")) return read_wan22_config(weights);
    const std::string where = "Wan VAE under '" + weights.prefix() + "'";
    auto fail = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    auto conv3d_shape = [&](const std::string& name) { return conv3d_shape_of(weights, name); };
    WanVaeConfig& c = config_;
    const std::vector<int64_t>* dec_in = conv3d_shape("decoder.conv1.weight");
    if (!dec_in) return fail("no decoder.conv1.weight [out, 16, 3, 3, 3] (not a Wan 2.1 VAE?)");
    c.z_dim = (*dec_in)[1];
    if (c.z_dim != static_cast<int64_t>(kWan21Mean.size())) {
        return fail("decoder.conv1.weight takes " + std::to_string(c.z_dim) +
                    " latent channels; Wan 2.1's latent statistics are for 16");
    }
    // The decoder's levels, from decoder.upsamples: residual blocks, each
    // level but the last closed by a Resample (temporal with a time_conv).
    std::vector<std::vector<int64_t>> levels(1);  // each block's output width
    std::vector<bool> temporal_upsample;
    for (int i = 0;; ++i) {
        const std::string p = "decoder.upsamples." + std::to_string(i) + ".";
        if (weights.has(p + "residual.2.weight")) {
            const std::vector<int64_t>* s = conv3d_shape(p + "residual.2.weight");
            if (!s) return fail(p + "residual.2.weight is not a 5-D convolution weight");
            levels.back().push_back((*s)[0]);
        } else if (weights.has(p + "resample.1.weight")) {
            temporal_upsample.push_back(weights.has(p + "time_conv.weight"));
            levels.emplace_back();
        } else if (weights.has(p + "to_qkv.weight")) {
            return fail(p + "to_qkv: attention inside the decoder's levels (attn_scales) is not Wan 2.1's layout");
        } else {
            break;
        }
    }
    if (levels.size() > kMaxLevels) {
        return fail(std::to_string(levels.size()) + " decoder levels; Wan 2.1's layout has at most " +
                    std::to_string(kMaxLevels));
    }
    const size_t blocks = levels.front().size();
    if (blocks == 0) return fail("no decoder.upsamples.0.residual.2.weight: the decoder has no levels");
    for (size_t i = 0; i < levels.size(); ++i) {
        if (levels[i].empty() || levels[i].size() != blocks) {
            return fail("decoder level " + std::to_string(i) + " has " + std::to_string(levels[i].size()) +
                        " residual blocks where level 0 has " + std::to_string(blocks));
        }
    }
    c.res_blocks = static_cast<int>(blocks) - 1;
    c.has_encoder = weights.has("encoder.conv1.weight");
    if (c.has_encoder) {
        const std::vector<int64_t>* enc_in = conv3d_shape("encoder.conv1.weight");
        if (!enc_in) return fail("encoder.conv1.weight is not a 5-D convolution weight");
        c.dim = (*enc_in)[0];
    } else {
        c.dim = levels.back().front();  // dim_mult[0] is 1 in every Wan VAE
    }
    const size_t L = levels.size();
    c.dim_mult.clear();
    for (size_t j = 0; j < L; ++j) {
        const int64_t width = levels[L - 1 - j].front();
        if (width % c.dim != 0) {
            return fail("decoder level " + std::to_string(L - 1 - j) + " is " + std::to_string(width) +
                        " channels wide, not a multiple of the base width " + std::to_string(c.dim));
        }
        c.dim_mult.push_back(width / c.dim);
    }
    c.dec_dim = c.dim;
    c.temporal_downsample.assign(temporal_upsample.rbegin(), temporal_upsample.rend());
    // The encoder's resamples mirror the decoder's (the original builds the
    // decoder from the encoder's temperal_downsample reversed).
    for (size_t i = 0; c.has_encoder && i + 1 < L; ++i) {
        const std::string p = "encoder.downsamples." + std::to_string((i + 1) * c.res_blocks + i) + ".";
        if (!weights.has(p + "resample.1.weight")) {
            return fail("no " + p + "resample.1.weight: the encoder's levels differ from the decoder's (" +
                        std::to_string(c.res_blocks) + " residual blocks each)");
        }
        if (weights.has(p + "time_conv.weight") != c.temporal_downsample[i]) {
            return fail(p + "time_conv: the encoder's temporal downsampling differs from the decoder's upsampling");
        }
    }
    return Status::Ok();
}

// Wan 2.2's layout: decoder.upsamples.N.upsamples.M, M below the level's
// residual blocks, M after them the level's Resample; encoder.downsamples
// the same; the statistics and the shortcuts fix what else it may be.
Status WanVae::read_wan22_config(const io::WeightDeclarer& weights) {
    const std::string where = "Wan 2.2 VAE under '" + weights.prefix() + "'";
    auto fail = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    auto conv3d_shape = [&](const std::string& name) { return conv3d_shape_of(weights, name); };
    WanVaeConfig& c = config_;
    c.wan22 = true;
    const std::vector<int64_t>* dec_in = conv3d_shape("decoder.conv1.weight");
    if (!dec_in) return fail("no decoder.conv1.weight [out, 48, 3, 3, 3]");
    c.z_dim = (*dec_in)[1];
    if (c.z_dim != static_cast<int64_t>(kWan22Mean.size())) {
        return fail("decoder.conv1.weight takes " + std::to_string(c.z_dim) +
                    " latent channels; Wan 2.2's latent statistics are for 48");
    }
    const std::vector<int64_t>* head = conv3d_shape("decoder.head.2.weight");
    const int64_t pixels = head ? (*head)[0] : 0;
    c.patch = static_cast<int>(std::lround(std::sqrt(static_cast<double>(pixels) / 3.0)));
    if (c.patch < 1 || 3 * c.patch * c.patch != pixels)
        return fail("decoder.head.2.weight gives no 3 x p x p patchified pixels");
    std::vector<int64_t> widths;  // each decoder level's output width
    std::vector<bool> temporal_upsample;
    int blocks = 0;
    for (int i = 0;; ++i) {
        const std::string p = "decoder.upsamples." + std::to_string(i) + ".upsamples.";
        int j = 0;
        while (weights.has(p + std::to_string(j) + ".residual.2.weight")) ++j;
        if (j == 0) break;
        if (i == 0) blocks = j;
        if (j != blocks) {
            return fail("decoder level " + std::to_string(i) + " has " + std::to_string(j) +
                        " residual blocks where level 0 has " + std::to_string(blocks));
        }
        const std::vector<int64_t>* conv = conv3d_shape(p + "0.residual.2.weight");
        if (!conv) return fail(p + "0.residual.2.weight is not a 5-D convolution weight");
        widths.push_back((*conv)[0]);
        const std::string resample = p + std::to_string(j) + ".";
        if (weights.has(resample + "resample.1.weight"))
            temporal_upsample.push_back(weights.has(resample + "time_conv.weight"));
        if (temporal_upsample.size() != widths.size() && temporal_upsample.size() + 1 != widths.size())
            return fail("decoder level " + std::to_string(i) + " follows a level without a Resample");
    }
    const size_t L = widths.size();
    if (L < 2 || temporal_upsample.size() != L - 1)
        return fail("the decoder's levels must end in a Resample, all but the last");
    c.res_blocks = blocks - 1;
    c.dec_dim = widths.back();  // dim_mult[0] is 1
    c.dim_mult.assign(L, 0);
    for (size_t i = 0; i < L; ++i) {
        if (widths[i] % c.dec_dim != 0) return fail("decoder level widths are not multiples of the last level's");
        c.dim_mult[L - 1 - i] = widths[i] / c.dec_dim;
    }
    if ((*dec_in)[0] != c.dec_dim * c.dim_mult.back())
        return fail("decoder.conv1.weight's output width is not its first level's");
    c.temporal_downsample.assign(temporal_upsample.rbegin(), temporal_upsample.rend());
    // DupUp3D: output channel o reads input channel o (factor / repeats) + component / repeats.
    std::vector<int64_t> dec_dims = {(*dec_in)[0]};
    dec_dims.insert(dec_dims.end(), widths.begin(), widths.end());
    for (size_t i = 0; i + 1 < L; ++i) {
        const int64_t in = dec_dims[i], out = dec_dims[i + 1], factor = (temporal_upsample[i] ? 2 : 1) * 4;
        if ((out * factor) % in != 0 || factor % (out * factor / in) != 0)
            return fail("decoder level " + std::to_string(i) + " goes from " + std::to_string(in) + " to " +
                        std::to_string(out) + " channels, which Wan 2.2's DupUp3D shortcut does not");
    }
    c.has_encoder = weights.has("encoder.conv1.weight");
    if (!c.has_encoder) {
        c.dim = c.dec_dim;
        return Status::Ok();
    }
    const std::vector<int64_t>* enc_in = conv3d_shape("encoder.conv1.weight");
    if (!enc_in || (*enc_in)[1] != pixels)
        return fail("encoder.conv1.weight does not take the " + std::to_string(pixels) + " patchified channels");
    c.dim = (*enc_in)[0];
    std::vector<int64_t> dims = {c.dim};
    for (int64_t m : c.dim_mult) dims.push_back(c.dim * m);
    for (size_t i = 0; i < L; ++i) {
        const std::string p = "encoder.downsamples." + std::to_string(i) + ".downsamples.";
        const bool down = i + 1 < L;
        if (!weights.has(p + std::to_string(c.res_blocks - 1) + ".residual.2.weight") ||
            weights.has(p + std::to_string(c.res_blocks) + ".resample.1.weight") != down) {
            return fail("encoder level " + std::to_string(i) + " is not the decoder's mirror (" +
                        std::to_string(c.res_blocks) + " residual blocks, then a Resample but on the last level)");
        }
        if (down && weights.has(p + std::to_string(c.res_blocks) + ".time_conv.weight") != c.temporal_downsample[i])
            return fail(p + std::to_string(c.res_blocks) + ".time_conv: the encoder's temporal downsampling differs");
        // AvgDown3D as average_down computes it: a 2x2 pool per channel, the
        // time offsets kept apart (twice the width) or averaged (the same).
        const bool doubles = down && c.temporal_downsample[i];
        const bool fits =
            down ? (dims[i + 1] == dims[i] || (doubles && dims[i + 1] == 2 * dims[i])) : dims[i + 1] == dims[i];
        if (!fits) {
            return fail("encoder level " + std::to_string(i) + " goes from " + std::to_string(dims[i]) + " to " +
                        std::to_string(dims[i + 1]) + " channels, which Wan 2.2's AvgDown3D shortcut does not");
        }
    }
    return Status::Ok();
}

void WanVae::declare_wan22(io::WeightDeclarer& w) {
    const WanVaeConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const size_t L = c.dim_mult.size();
    const int64_t pixels = 3 * c.patch * c.patch;
    auto level = [](std::vector<Layer>& layers, const std::string& stem, int blocks, io::WeightDeclarer& weights,
                    int64_t in, int64_t out) {
        for (int j = 0; j < blocks; ++j) {
            Layer layer;
            layer.residual = declare_residual(weights, stem + std::to_string(j) + ".", in, out);
            layer.starts_level = j == 0;
            layers.push_back(std::move(layer));
            in = out;
        }
    };
    if (c.has_encoder) {
        std::vector<int64_t> dims = {c.dim};
        for (int64_t m : c.dim_mult) dims.push_back(c.dim * m);
        b.enc_in = declare_causal(w, "encoder.conv1", pixels, dims[0], kTemporalKernel, 3, 1);
        for (size_t i = 0; i < L; ++i) {
            const std::string stem = "encoder.downsamples." + std::to_string(i) + ".downsamples.";
            const int64_t out = dims[i + 1];
            const bool down = i + 1 < L;
            level(b.enc_layers, stem, c.res_blocks, w, dims[i], out);
            if (down) {
                const std::string p = stem + std::to_string(c.res_blocks) + ".";
                Resample r;
                r.conv = nn::declare_conv2d(w, p + "resample.1", out, out, 3, 2, 0);
                if (c.temporal_downsample[i]) r.time_conv = declare_causal(w, p + "time_conv", out, out, 3, 1, 0);
                Layer layer;
                layer.resample = r;
                b.enc_layers.push_back(std::move(layer));
            }
            // Every level's AvgDown3D, the last's the identity.
            b.enc_layers.back().shortcut =
                LevelShortcut{false, dims[i], out, down && c.temporal_downsample[i] ? 2 : 1, down ? 2 : 1};
            b.enc_layers.back().cut = "encoder.downsamples." + std::to_string(i);
        }
        const int64_t top = dims.back();
        b.enc_mid = declare_middle(w, "encoder.", top);
        b.enc_head_norm = declare_rms(w, "encoder.head.0.gamma", top, false);
        b.enc_head = declare_causal(w, "encoder.head.2", top, 2 * c.z_dim, kTemporalKernel, 3, 1);
        b.quant = declare_causal(w, "conv1", 2 * c.z_dim, 2 * c.z_dim, 1, 1, 0);
    }
    b.post_quant = declare_causal(w, "conv2", c.z_dim, c.z_dim, 1, 1, 0);
    std::vector<int64_t> dims = {c.dec_dim * c.dim_mult.back()};
    for (size_t j = L; j-- > 0;) dims.push_back(c.dec_dim * c.dim_mult[j]);
    b.dec_in = declare_causal(w, "decoder.conv1", c.z_dim, dims[0], kTemporalKernel, 3, 1);
    b.dec_mid = declare_middle(w, "decoder.", dims[0]);
    for (size_t i = 0; i < L; ++i) {
        const std::string stem = "decoder.upsamples." + std::to_string(i) + ".upsamples.";
        const int64_t out = dims[i + 1];
        const bool up = i + 1 < L;
        level(b.dec_layers, stem, c.res_blocks + 1, w, dims[i], out);
        if (up) {
            const bool temporal = c.temporal_downsample[L - 2 - i];
            const std::string p = stem + std::to_string(c.res_blocks + 1) + ".";
            Resample r;
            r.conv = nn::declare_conv2d(w, p + "resample.1", out, out, 3, 1, 1);
            if (temporal) r.time_conv = declare_causal(w, p + "time_conv", out, 2 * out, 3, 1, 0);
            Layer layer;
            layer.resample = r;
            b.dec_layers.push_back(std::move(layer));
            b.dec_layers.back().shortcut = LevelShortcut{true, dims[i], out, temporal ? 2 : 1, 2};
        } else {
            b.dec_layers[b.dec_layers.size() - static_cast<size_t>(c.res_blocks + 1)].starts_level = false;
        }
        b.dec_layers.back().cut = "decoder.upsamples." + std::to_string(i);
    }
    b.dec_head_norm = declare_rms(w, "decoder.head.0.gamma", dims.back(), false);
    b.dec_head = declare_causal(w, "decoder.head.2", dims.back(), pixels, kTemporalKernel, 3, 1);
}

void WanVae::declare(io::WeightDeclarer& w) {
    if (config_.wan22) return declare_wan22(w);
    const WanVaeConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const size_t L = c.dim_mult.size();
    if (c.has_encoder) {
        std::vector<int64_t> dims = {c.dim};  // the original's [dim * u for u in [1] + dim_mult]
        for (int64_t m : c.dim_mult) dims.push_back(c.dim * m);
        b.enc_in = declare_causal(w, "encoder.conv1", 3, dims[0], kTemporalKernel, 3, 1);
        int n = 0;
        for (size_t i = 0; i < L; ++i) {
            int64_t in = dims[i];
            const int64_t out = dims[i + 1];
            for (int j = 0; j < c.res_blocks; ++j, ++n) {
                b.enc_layers.push_back(
                    {declare_residual(w, "encoder.downsamples." + std::to_string(n) + ".", in, out), std::nullopt, ""});
                in = out;
            }
            if (i + 1 < L) {
                const std::string p = "encoder.downsamples." + std::to_string(n) + ".";
                Resample r;
                r.conv = nn::declare_conv2d(w, p + "resample.1", out, out, 3, 2, 0);
                if (c.temporal_downsample[i]) r.time_conv = declare_causal(w, p + "time_conv", out, out, 3, 1, 0);
                b.enc_layers.push_back({std::nullopt, r, ""});
                ++n;
            }
            if (!b.enc_layers.empty()) b.enc_layers.back().cut = "encoder.downsamples." + std::to_string(n - 1);
        }
        const int64_t top = dims.back();
        b.enc_mid = declare_middle(w, "encoder.", top);
        b.enc_head_norm = declare_rms(w, "encoder.head.0.gamma", top, false);
        b.enc_head = declare_causal(w, "encoder.head.2", top, 2 * c.z_dim, kTemporalKernel, 3, 1);
        b.quant = declare_causal(w, "conv1", 2 * c.z_dim, 2 * c.z_dim, 1, 1, 0);
    }
    b.post_quant = declare_causal(w, "conv2", c.z_dim, c.z_dim, 1, 1, 0);
    // The original's [dim * u for u in [dim_mult[-1]] + dim_mult[::-1]].
    std::vector<int64_t> dims = {c.dim * c.dim_mult.back()};
    for (size_t j = L; j-- > 0;) dims.push_back(c.dim * c.dim_mult[j]);
    b.dec_in = declare_causal(w, "decoder.conv1", c.z_dim, dims[0], kTemporalKernel, 3, 1);
    b.dec_mid = declare_middle(w, "decoder.", dims[0]);
    int n = 0;
    for (size_t i = 0; i < L; ++i) {
        // After an upsampler, which halves the channels.
        int64_t in = i > 0 ? dims[i] / 2 : dims[i];
        const int64_t out = dims[i + 1];
        for (int j = 0; j <= c.res_blocks; ++j, ++n) {
            b.dec_layers.push_back(
                {declare_residual(w, "decoder.upsamples." + std::to_string(n) + ".", in, out), std::nullopt, ""});
            in = out;
        }
        if (i + 1 < L) {
            const std::string p = "decoder.upsamples." + std::to_string(n) + ".";
            Resample r;
            r.conv = nn::declare_conv2d(w, p + "resample.1", out, out / 2, 3, 1, 1);
            if (c.temporal_downsample[L - 2 - i])
                r.time_conv = declare_causal(w, p + "time_conv", out, 2 * out, 3, 1, 0);
            b.dec_layers.push_back({std::nullopt, r, ""});
            ++n;
        }
        b.dec_layers.back().cut = "decoder.upsamples." + std::to_string(n - 1);
    }
    b.dec_head_norm = declare_rms(w, "decoder.head.0.gamma", dims.back(), false);
    b.dec_head = declare_causal(w, "decoder.head.2", dims.back(), 3, kTemporalKernel, 3, 1);
}

ggml_tensor* WanVae::build_decoder(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target, bool clip,
                                   const std::vector<ggml_tensor*>& history_in, std::vector<ggml_tensor*>* history_out,
                                   int64_t max_patch_bytes) const {
    const Blocks& b = *blocks_;
    Time time;
    time.clip = clip;
    time.max_patch_bytes = max_patch_bytes;
    time.starts_clip = history_in.empty();
    time.history_in = &history_in;
    // The normalised latent back to the VAE's: z * std + mean.
    const bool wan22 = config_.wan22;
    ggml_tensor* z = ggml_add(ctx, ggml_mul(ctx, latent, channel_constants(ctx, latent_std(wan22))),
                              channel_constants(ctx, latent_mean(wan22)));
    ggml_tensor* h = causal_conv(ctx, target, b.post_quant, z, time);
    h = causal_conv(ctx, target, b.dec_in, h, time);
    h = nn::mark_cut(middle(ctx, target, b.dec_mid, h, time), "decoder.middle");
    h = run_levels(ctx, target, b.dec_layers, true, h, time);
    h = norm_silu_conv(ctx, target, b.dec_head_norm, b.dec_head, h, time, nullptr);
    if (!time.fits || !time.all_used()) return nullptr;
    if (history_out) *history_out = std::move(time.history_out);
    return unpatchify(ctx, h, config_.patch);
}

ggml_tensor* WanVae::build_encoder(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target, bool clip,
                                   LatentEncoding encoding, const std::vector<ggml_tensor*>& history_in,
                                   std::vector<ggml_tensor*>* history_out) const {
    const Blocks& b = *blocks_;
    Time time;
    time.clip = clip;
    time.starts_clip = history_in.empty();
    time.history_in = &history_in;
    ggml_tensor* h = causal_conv(ctx, target, b.enc_in, patchify(ctx, image, config_.patch), time);
    h = run_levels(ctx, target, b.enc_layers, false, h, time);
    h = nn::mark_cut(middle(ctx, target, b.enc_mid, h, time), "encoder.middle");
    h = norm_silu_conv(ctx, target, b.enc_head_norm, b.enc_head, h, time, nullptr);
    h = causal_conv(ctx, target, b.quant, h, time);
    if (!time.fits || !time.all_used()) return nullptr;
    if (history_out) *history_out = std::move(time.history_out);
    // (mu - mean) / std.
    const int64_t zc = config_.z_dim;
    const ChannelValues& std_dev = latent_std(config_.wan22);
    ggml_tensor* mean =
        ggml_div(ctx, ggml_sub(ctx, channel_range(ctx, h, 0, zc), channel_constants(ctx, latent_mean(config_.wan22))),
                 channel_constants(ctx, std_dev));
    if (encoding == LatentEncoding::Mean) return mean;
    // A Gaussian through (x - m) / s: its log variance less log s^2.
    ChannelValues log_var2(std_dev.size());
    for (size_t i = 0; i < log_var2.size(); ++i) log_var2[i] = 2.0f * std::log(std_dev[i]);
    ggml_tensor* log_var = ggml_sub(ctx, channel_range(ctx, h, zc, zc), channel_constants(ctx, log_var2));
    return ggml_concat(ctx, mean, log_var, 2);
}

ggml_tensor* WanVae::decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const {
    return build_decoder(ctx, latent, target, false, {}, nullptr);
}

ggml_tensor* WanVae::decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target,
                            int64_t max_patch_bytes) const {
    return build_decoder(ctx, latent, target, false, {}, nullptr, max_patch_bytes);
}

ggml_tensor* WanVae::encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                            LatentEncoding encoding) const {
    return build_encoder(ctx, image, target, false, encoding, {}, nullptr);
}

ClipChunk WanVae::decode_chunk(ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history,
                               nn::ComputeTarget target) const {
    return decode_chunk(ctx, latent, history, target, kMaxPatchBytes);
}

ClipChunk WanVae::decode_chunk(ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history,
                               nn::ComputeTarget target, int64_t max_patch_bytes) const {
    ClipChunk chunk;
    chunk.frames = build_decoder(ctx, latent, target, true, history, &chunk.history, max_patch_bytes);
    if (!chunk.frames) return {};
    return chunk;
}

ggml_tensor* WanVae::encode_clip(ggml_context* ctx, ggml_tensor* video, nn::ComputeTarget target,
                                 LatentEncoding encoding) const {
    // The original encodes chunks of 1, 4, 4, ... frames and never sees the
    // frames after the last whole chunk.
    const int64_t factor = config_.temporal_downscale();
    const int64_t frames = 1 + (video->ne[3] - 1) / factor * factor;
    if (frames < video->ne[3]) video = frame_range(ctx, video, 0, frames);
    return build_encoder(ctx, video, target, true, encoding, {}, nullptr);
}

ClipChunk WanVae::encode_chunk(ggml_context* ctx, ggml_tensor* video, const std::vector<ggml_tensor*>& history,
                               nn::ComputeTarget target, LatentEncoding encoding) const {
    const int64_t factor = config_.temporal_downscale();
    if (video->ne[3] != (history.empty() ? 1 : factor)) return {};
    ClipChunk chunk;
    chunk.frames = build_encoder(ctx, video, target, true, encoding, history, &chunk.history);
    if (!chunk.frames) return {};
    return chunk;
}

}  // namespace kiln::models
