#include "nn/layers.h"

#include <algorithm>
#include <vector>

#include "nn/concat_rows_cpu.h"
#include "nn/conv_cpu.h"
#include "nn/im2col_cpu.h"

namespace kiln::nn {

Linear declare_linear(io::WeightDeclarer& w, const std::string& name, int64_t in, int64_t out, bool bias) {
    Linear l;
    l.weight = w.require(name + ".weight", {out, in});
    if (bias) l.bias = w.require(name + ".bias", {out});
    return l;
}

ggml_tensor* linear(ggml_context* ctx, const Linear& layer, ggml_tensor* x) {
    ggml_tensor* y = ggml_mul_mat(ctx, layer.weight, x);
    if (layer.bias) y = ggml_add(ctx, y, layer.bias);
    return y;
}

Conv2d declare_conv2d(io::WeightDeclarer& w, const std::string& name, int64_t in, int64_t out, int kernel, int stride,
                      int padding, bool bias) {
    Conv2d c;
    c.weight = w.require(name + ".weight", {out, in, kernel, kernel});
    if (bias) c.bias = w.require(name + ".bias", {out});
    c.stride = stride;
    c.padding = padding;
    return c;
}

namespace {

// The most bytes of F32 patches a convolution on the CPU unfolds at once.
// Bands this size still give sgemm thousands of pixel rows per product.
constexpr int64_t kMaxPatchBytesOnCpu = 64ll << 20;
// On a device: ggml's im2col and product, a band of output rows at a time
// when the patches would be over this; F32 patches up to this size whole.
constexpr int64_t kMaxPatchBytesOnDevice = 64ll << 20;
constexpr int64_t kMaxF32PatchBytesOnDevice = 64ll << 20;
constexpr int64_t kMaxBands = 64;

}  // namespace

namespace {

// x padded by `padding` across its seams (ggml's im2col pads with zeros
// only), and the zero padding left for im2col on each axis.
struct SeamPadded {
    ggml_tensor* x;
    int pad_x, pad_y;
};
SeamPadded pad_across_seams(ggml_context* ctx, ggml_tensor* x, int padding, Seams seams) {
    if (!seams.any() || padding == 0) return {x, padding, padding};
    const int px = seams.x ? padding : 0, py = seams.y ? padding : 0;
    if (x->type != GGML_TYPE_F32) x = ggml_cast(ctx, x, GGML_TYPE_F32);  // ggml pads F32
    return {ggml_pad_ext_circular(ctx, x, px, px, py, py, 0, 0, 0, 0), padding - px, padding - py};
}

// What a banded convolution unfolds: its input as it is, the input's group
// norm and SiLU, or the input's nearest 2x upsample (the last two never made
// whole: nn/im2col_cpu.h folds them into the unfold).
struct BandInput {
    enum class Kind { Plain, GroupNormSilu, Upsampled2x } kind = Kind::Plain;
    const Norm* norm = nullptr;  // GroupNormSilu
    int groups = 32;
    float eps = 1e-5f;
};

// `added_to`: null, or a tensor of the output's shape that each band is
// added into in place (a residual block's x + conv(h)), so the output is
// never a tensor of its own.
ggml_tensor* conv_in_row_bands(ggml_context* ctx, const Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                               const BandInput& input, Seams seams, ggml_tensor* added_to = nullptr) {
    ggml_tensor* w = layer.weight;
    const int64_t scale = input.kind == BandInput::Kind::Upsampled2x ? 2 : 1;
    const int64_t N = x->ne[3];
    const int64_t OW = (scale * x->ne[0] + 2 * layer.padding - w->ne[0]) / layer.stride + 1;
    const int64_t OH = (scale * x->ne[1] + 2 * layer.padding - w->ne[1]) / layer.stride + 1;
    const int64_t K = w->ne[0] * w->ne[1] * w->ne[2];
    ggml_tensor* kernel = kernel_matrix_for_cpu(ctx, w);
    // F32 patches (kiln's unfold, nn/im2col_cpu.h) by the F32 kernel: the
    // product sgemm takes, several times faster than ggml's F16 dot products.
    // Patches first, so the result is already pixels by channels.
    //
    // A band of output rows at a time when the patches would be large: a
    // full-size VAE decoder's top level unfolds 2.4 GB of them at 512x512.
    // Each band's patches are freed before the next band's are made, and
    // each band's result goes into the output as it is made. At most
    // kMaxBands bands, so a graph's node count stays within a constant
    // factor of the unbanded one's at any size (GraphSession's context is
    // sized in nodes).
    const int64_t row_bytes = std::max<int64_t>(1, K * OW * N * static_cast<int64_t>(sizeof(float)));
    const int64_t fewest_rows = (OH + kMaxBands - 1) / kMaxBands;
    const int64_t band_rows = std::clamp<int64_t>(max_patch_bytes / row_bytes, fewest_rows, OH);
    ggml_tensor* statistics = input.kind == BandInput::Kind::GroupNormSilu
                                  ? group_norm_statistics_cpu(ctx, x, input.groups, input.eps)
                                  : nullptr;
    std::vector<ggml_tensor*> bands;
    for (int64_t first = 0; first < OH; first += band_rows) {
        const int64_t rows = std::min(band_rows, OH - first);
        ggml_tensor* patches = nullptr;
        switch (input.kind) {
            case BandInput::Kind::Plain:
                patches = im2col_f32_cpu(ctx, w, x, layer.stride, layer.padding, first, rows, nullptr, seams);
                break;
            case BandInput::Kind::GroupNormSilu:
                patches = im2col_group_norm_silu_f32_cpu(ctx, w, x, statistics, input.norm->weight, input.norm->bias,
                                                         layer.stride, layer.padding, first, rows, seams);
                break;
            case BandInput::Kind::Upsampled2x:
                patches =
                    im2col_upsampled_2x_f32_cpu(ctx, w, x, layer.stride, layer.padding, first, rows, nullptr, seams);
                break;
        }
        if (!patches) {  // an input kiln's unfold does not take: ggml's, whole
            GGML_ASSERT(first == 0 && input.kind == BandInput::Kind::Plain);
            const SeamPadded in = pad_across_seams(ctx, x, layer.padding, seams);
            patches = ggml_im2col(ctx, w, in.x, layer.stride, layer.stride, in.pad_x, in.pad_y, 1, 1,
                                  /*is_2D=*/true, GGML_TYPE_F32);
            ggml_tensor* y = pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, patches, K, OW * OH * N), kernel, OW,
                                                         OH, N, layer.bias);
            return added_to ? ggml_add(ctx, added_to, y) : y;
        }
        ggml_tensor* band = pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, patches, K, OW * rows * N), kernel,
                                                        OW, rows, N, layer.bias);
        if (added_to) {
            // added_to + band, into added_to's rows in place: ggml_vec_add_f32
            // on the same two operands as ggml_add, so the same bits.
            added_to = ggml_acc_inplace(ctx, added_to, band, added_to->nb[1], added_to->nb[2], added_to->nb[3],
                                        static_cast<size_t>(first) * added_to->nb[1]);
        } else {
            bands.push_back(band);
        }
    }
    return added_to ? added_to : concat_rows_cpu(ctx, bands);
}

bool is_pointwise(const Conv2d& layer) {
    return layer.weight->ne[0] == 1 && layer.weight->ne[1] == 1 && layer.stride == 1 && layer.padding == 0;
}

int64_t f32_bytes(const ggml_tensor* x) { return ggml_nelements(x) * static_cast<int64_t>(sizeof(float)); }

}  // namespace

ggml_tensor* pad_right_and_bottom(ggml_context* ctx, ggml_tensor* x, Seams seams) {
    if (!seams.any()) return ggml_pad(ctx, x, 1, 1, 0, 0);
    // The wrapped axes first, then zeros on the others.
    x = ggml_pad_ext_circular(ctx, x, 0, seams.x ? 1 : 0, 0, seams.y ? 1 : 0, 0, 0, 0, 0);
    if (seams.x && seams.y) return x;
    return ggml_pad(ctx, x, seams.x ? 0 : 1, seams.y ? 0 : 1, 0, 0);
}

ggml_tensor* conv2d_on_device_in_row_bands(ggml_context* ctx, const Conv2d& layer, int64_t in_w, int64_t in_h,
                                           int64_t batch, const InputRows& input_rows, int64_t max_patch_bytes,
                                           ggml_tensor* added_to, Seams seams) {
    ggml_tensor* w = layer.weight;
    const int s = layer.stride, p = layer.padding;
    const int64_t KH = w->ne[1], OC = w->ne[3], N = batch;
    const int64_t OW = (in_w + 2 * p - w->ne[0]) / s + 1;
    const int64_t OH = (in_h + 2 * p - KH) / s + 1;
    const int64_t K = w->ne[0] * w->ne[1] * w->ne[2];
    ggml_tensor* kernel = ggml_reshape_2d(ctx, w, K, OC);
    // F32 patches with the kernel first. An F16 kernel whose whole unfold
    // would be large takes F16 patches (the patches first), as it did when
    // the convolution was made whole: the same products (ggml multiplies an
    // F16 kernel by its operand rounded to F16 either way) in half the bytes.
    const bool f16_patches = w->type == GGML_TYPE_F16 && K * OW * OH * N * 4 > kMaxF32PatchBytesOnDevice;
    const int64_t row_bytes = std::max<int64_t>(1, K * OW * N * (f16_patches ? 2 : 4));
    const int64_t band_rows = std::clamp<int64_t>(max_patch_bytes / row_bytes, (OH + kMaxBands - 1) / kMaxBands, OH);
    // Rows [lo, hi) of the input across the top and bottom seam: the rows
    // beyond an edge are the other edge's, joined on in order.
    auto rows_across_seam = [&](int64_t lo, int64_t hi) {
        ggml_tensor* joined = nullptr;
        for (int64_t row = lo; row < hi;) {
            const int64_t start = ((row % in_h) + in_h) % in_h;
            const int64_t count = std::min(hi - row, in_h - start);
            ggml_tensor* piece = input_rows(start, start + count);
            joined = joined ? ggml_concat(ctx, joined, piece, 1) : piece;
            row += count;
        }
        return ggml_is_contiguous(joined) ? joined : ggml_cont(ctx, joined);  // as im2col takes it on a GPU
    };
    // The band's output rows [first, first + rows) as ne [OW, rows, OC, N],
    // with the bias: ggml's im2col of the input rows they read (the kernel's
    // halo included; the zero padding beyond the image's top and bottom edge
    // explicit, since im2col pads both edges alike, or across the seam the
    // other edge's rows), then the product.
    auto band = [&](int64_t first, int64_t rows) {
        ggml_tensor* in = nullptr;
        int vertical_padding = p;
        if (seams.y && p > 0) {
            in = rows_across_seam(first * s - p, (first + rows - 1) * s - p + KH);
            vertical_padding = 0;
        } else if (rows == OH) {
            in = input_rows(0, in_h);
        } else {
            const int64_t lo = first * s - p, hi = (first + rows - 1) * s - p + KH;
            const int64_t top = std::max<int64_t>(0, lo), bottom = std::min(in_h, hi);
            GGML_ASSERT(top < bottom);
            in = input_rows(top, bottom);
            const int pad_top = static_cast<int>(top - lo), pad_bottom = static_cast<int>(hi - bottom);
            if (pad_top == pad_bottom && ggml_is_contiguous(in)) {
                vertical_padding = pad_top;
            } else {
                // Contiguous (as im2col takes it on a GPU), with the zero rows.
                in = ggml_pad_ext(ctx, in, 0, 0, pad_top, pad_bottom, 0, 0, 0, 0);
                vertical_padding = 0;
            }
        }
        GGML_ASSERT(in->ne[0] == in_w && in->ne[3] == N);
        int horizontal_padding = p;
        if (seams.x && p > 0) {
            const SeamPadded padded = pad_across_seams(ctx, in, p, Seams{true, false});
            in = padded.x;
            horizontal_padding = 0;
        }
        ggml_tensor* y;
        if (!f16_patches) {
            ggml_tensor* patches = ggml_im2col(ctx, w, in, s, s, horizontal_padding, vertical_padding, 1, 1,
                                               /*is_2D=*/true, GGML_TYPE_F32);               // [K, OW, rows, N]
            y = ggml_mul_mat(ctx, kernel, ggml_reshape_2d(ctx, patches, K, OW * rows * N));  // [OC, OW*rows*N]
            y = ggml_reshape_4d(ctx, y, OC, OW, rows, N);                                    // [OC, OW, rows, N]
            y = ggml_cont(ctx, ggml_permute(ctx, y, 2, 0, 1, 3));                            // [OW, rows, OC, N]
        } else {
            ggml_tensor* patches = ggml_im2col(ctx, w, in, s, s, horizontal_padding, vertical_padding, 1, 1,
                                               /*is_2D=*/true, GGML_TYPE_F16);               // [K, OW, rows, N]
            y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, patches, K, OW * rows * N), kernel);  // [OW*rows*N, OC]
            y = ggml_reshape_4d(ctx, y, OW, rows, N, OC);                                    // [OW, rows, N, OC]
            y = ggml_cont(ctx, ggml_permute(ctx, y, 0, 1, 3, 2));                            // [OW, rows, OC, N]
        }
        GGML_ASSERT(y->ne[1] == rows);
        return add_channel_bias(ctx, y, layer.bias);
    };
    if (band_rows >= OH) {
        ggml_tensor* y = band(0, OH);
        return added_to ? ggml_add(ctx, y, added_to) : y;
    }
    if (added_to && (added_to->type != GGML_TYPE_F32 || !ggml_is_contiguous(added_to))) {
        // ggml_set writes into a contiguous F32 tensor only.
        return ggml_add(ctx,
                        conv2d_on_device_in_row_bands(ctx, layer, in_w, in_h, batch, input_rows, max_patch_bytes,
                                                      nullptr, seams),
                        added_to);
    }
    // Each band goes into the output as it is made (ggml_set, in place: a
    // copy of the band's rows alone), so the bands are never all held; with
    // `added_to`, the band plus added_to's rows (the same float additions
    // as ggml_add) goes into added_to.
    ggml_tensor* out = added_to;
    for (int64_t first = 0; first < OH; first += band_rows) {
        const int64_t rows = std::min(band_rows, OH - first);
        ggml_tensor* y = band(first, rows);
        if (added_to) {
            ggml_tensor* old = ggml_view_4d(ctx, out, OW, rows, OC, N, out->nb[1], out->nb[2], out->nb[3],
                                            static_cast<size_t>(first) * out->nb[1]);
            y = ggml_add(ctx, y, old);
        } else if (!out) {
            // The first band, padded with zero rows to the output's size.
            out = ggml_pad(ctx, y, 0, static_cast<int>(OH - rows), 0, 0);
            continue;
        }
        out =
            ggml_set_inplace(ctx, out, y, out->nb[1], out->nb[2], out->nb[3], static_cast<size_t>(first) * out->nb[1]);
    }
    return out;
}

namespace {

// Rows [top, bottom) of x ne [W, H, C, N], a view.
ggml_tensor* row_range(ggml_context* ctx, ggml_tensor* x, int64_t top, int64_t bottom) {
    if (top == 0 && bottom == x->ne[1]) return x;
    return ggml_view_4d(ctx, x, x->ne[0], bottom - top, x->ne[2], x->ne[3], x->nb[1], x->nb[2], x->nb[3],
                        static_cast<size_t>(top) * x->nb[1]);
}

}  // namespace

ggml_tensor* conv2d_device_in_row_bands(ggml_context* ctx, const Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                                        bool upsample_2x, Seams seams) {
    if (!upsample_2x) {
        return conv2d_on_device_in_row_bands(
            ctx, layer, x->ne[0], x->ne[1], x->ne[3],
            [&](int64_t top, int64_t bottom) { return row_range(ctx, x, top, bottom); }, max_patch_bytes, nullptr,
            seams);
    }
    return conv2d_on_device_in_row_bands(
        ctx, layer, 2 * x->ne[0], 2 * x->ne[1], x->ne[3],
        [&](int64_t top, int64_t bottom) {
            // Upsampled rows [top, bottom): x's rows [top / 2, (bottom + 1) / 2)
            // upsampled, less a first or last row of the pair it does not need.
            ggml_tensor* up = upsample_nearest_2x(ctx, row_range(ctx, x, top / 2, (bottom + 1) / 2));
            if (top % 2 == 0 && bottom % 2 == 0) return up;
            return ggml_view_4d(ctx, up, up->ne[0], bottom - top, up->ne[2], up->ne[3], up->nb[1], up->nb[2], up->nb[3],
                                static_cast<size_t>(top % 2) * up->nb[1]);
        },
        max_patch_bytes, nullptr, seams);
}

ggml_tensor* conv2d_cpu_in_row_bands(ggml_context* ctx, const Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                                     Seams seams) {
    return conv_in_row_bands(ctx, layer, x, max_patch_bytes, BandInput{}, seams);
}

// The folds below apply on the CPU where the input they spare would be
// large (as a whole conv2d would band it), for inputs the unfold takes.
bool worth_folding(ComputeTarget target, const Conv2d& layer, int64_t spared_bytes, int64_t max_patch_bytes) {
    return target == ComputeTarget::Cpu && !is_pointwise(layer) && spared_bytes > max_patch_bytes;
}

ggml_tensor* conv2d_of_group_norm_silu(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, const Norm& norm,
                                       ggml_tensor* x, int groups, float eps, int64_t max_patch_bytes,
                                       ggml_tensor* added_to) {
    const bool fold = worth_folding(target, layer, f32_bytes(x), max_patch_bytes) && x->type == GGML_TYPE_F32 &&
                      ggml_is_contiguous(x) && norm.weight->type == GGML_TYPE_F32 && norm.bias->type == GGML_TYPE_F32;
    if (target == ComputeTarget::Device && !is_pointwise(layer)) {
        // On a device the banded convolution adds each band into added_to
        // in place (the same bits as ggml_add), so the convolution's output
        // is not a tensor beside the sum. Its input rows are the normalised
        // tensor's, never added_to's.
        ggml_tensor* h = ggml_silu_inplace(ctx, group_norm(ctx, norm, x, groups, eps));
        return conv2d_on_device_in_row_bands(
            ctx, layer, h->ne[0], h->ne[1], h->ne[3],
            [&](int64_t top, int64_t bottom) { return row_range(ctx, h, top, bottom); }, kMaxPatchBytesOnDevice,
            added_to, target.seams);
    }
    if (!fold) {
        ggml_tensor* y = conv2d(ctx, target, layer, ggml_silu_inplace(ctx, group_norm(ctx, norm, x, groups, eps)));
        return added_to ? ggml_add(ctx, added_to, y) : y;
    }
    BandInput input;
    input.kind = BandInput::Kind::GroupNormSilu;
    input.norm = &norm;
    input.groups = groups;
    input.eps = eps;
    // In place only into another tensor than x: a band's unfold reads the
    // rows around it, which the band before would have changed.
    auto root = [](const ggml_tensor* t) {
        while (t->view_src) t = t->view_src;
        return t;
    };
    const bool accumulate =
        added_to && added_to->type == GGML_TYPE_F32 && ggml_is_contiguous(added_to) && root(added_to) != root(x);
    ggml_tensor* y =
        conv_in_row_bands(ctx, layer, x, max_patch_bytes, input, target.seams, accumulate ? added_to : nullptr);
    return added_to && !accumulate ? ggml_add(ctx, added_to, y) : y;
}

ggml_tensor* conv2d_of_upsample_2x(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, ggml_tensor* x,
                                   int64_t max_patch_bytes) {
    if (target == ComputeTarget::Device && !is_pointwise(layer) && x->type == GGML_TYPE_F32) {
        return conv2d_device_in_row_bands(ctx, layer, x, max_patch_bytes, /*upsample_2x=*/true, target.seams);
    }
    if (!worth_folding(target, layer, 4 * f32_bytes(x), max_patch_bytes) || x->type != GGML_TYPE_F32 ||
        x->nb[0] != sizeof(float)) {
        return conv2d(ctx, target, layer, upsample_nearest_2x(ctx, x));
    }
    BandInput input;
    input.kind = BandInput::Kind::Upsampled2x;
    return conv_in_row_bands(ctx, layer, x, max_patch_bytes, input, target.seams);
}

ggml_tensor* conv2d(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, ggml_tensor* x) {
    ggml_tensor* w = layer.weight;
    const bool on_cpu = target == ComputeTarget::Cpu;
    const int64_t OC = w->ne[3], N = x->ne[3];
    const bool pointwise = is_pointwise(layer);
    // On the CPU a large 1x1 convolution goes a band of rows at a time too:
    // its input turned channels-first whole is as large as the input (a
    // 1024x1024 VAE decoder's top-level shortcut: 1 GiB).
    if (pointwise && on_cpu && f32_bytes(x) > kMaxPatchBytesOnCpu) {
        return conv2d_cpu_in_row_bands(ctx, layer, x, kMaxPatchBytesOnCpu);
    }
    // On a device a large one goes in bands of rows (ggml's im2col of a 1x1
    // kernel is the channels-first transpose the product below takes): the
    // transposed input and the product are a band at a time, not each as
    // large as the input and the output (SDXL's VAE at 1024x1024: the top
    // level's shortcut, 1 GiB in).
    if (pointwise && !on_cpu && x->type == GGML_TYPE_F32 && f32_bytes(x) > kMaxPatchBytesOnDevice) {
        return conv2d_device_in_row_bands(ctx, layer, x, kMaxPatchBytesOnDevice);
    }
    if (pointwise) {
        // A 1x1 convolution is a matrix product over channels; skip im2col.
        const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2];
        ggml_tensor* flat =
            ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, x, W * H, C, N), 1, 0, 2, 3));  // [C, WH, N]
        ggml_tensor* w2 = conv1x1_as_linear(ctx, layer).weight;                                   // [C, OC]
        if (on_cpu) {
            return pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, flat, C, W * H * N), kernel_for_cpu(ctx, w2),
                                               W, H, N, layer.bias);
        }
        ggml_tensor* y = ggml_mul_mat(ctx, w2, flat);          // [out, WH, N]
        y = ggml_cont(ctx, ggml_permute(ctx, y, 1, 0, 2, 3));  // [WH, out, N]
        return add_channel_bias(ctx, ggml_reshape_4d(ctx, y, W, H, OC, N), layer.bias);
    }
    if (on_cpu) return conv2d_cpu_in_row_bands(ctx, layer, x, kMaxPatchBytesOnCpu, target.seams);
    return conv2d_device_in_row_bands(ctx, layer, x, kMaxPatchBytesOnDevice, /*upsample_2x=*/false, target.seams);
}

Linear conv1x1_as_linear(ggml_context* ctx, const Conv2d& layer) {
    GGML_ASSERT(layer.weight->ne[0] == 1 && layer.weight->ne[1] == 1 && layer.stride == 1 && layer.padding == 0);
    return Linear{ggml_reshape_2d(ctx, layer.weight, layer.weight->ne[2], layer.weight->ne[3]), layer.bias};
}

Norm declare_norm(io::WeightDeclarer& w, const std::string& name, int64_t channels) {
    return Norm{w.require(name + ".weight", {channels}), w.require(name + ".bias", {channels})};
}

ggml_tensor* layer_norm(ggml_context* ctx, const Norm& norm, ggml_tensor* x, float eps) {
    ggml_tensor* y = ggml_norm(ctx, x, eps);
    return ggml_add(ctx, ggml_mul(ctx, y, norm.weight), norm.bias);
}

ggml_tensor* group_norm(ggml_context* ctx, const Norm& norm, ggml_tensor* x, int groups, float eps) {
    ggml_tensor* y = ggml_group_norm(ctx, x, groups, eps);
    const int64_t C = norm.weight->ne[0];
    // In place on the fresh normalised tensor: the scale and shift never
    // need a second activation-sized buffer, whatever the allocator does
    // (a 1024x1024 VAE decoder's top level: 1 GiB each).
    return ggml_add_inplace(ctx, ggml_mul_inplace(ctx, y, ggml_reshape_4d(ctx, norm.weight, 1, 1, C, 1)),
                            ggml_reshape_4d(ctx, norm.bias, 1, 1, C, 1));
}

ggml_tensor* quick_gelu(ggml_context* ctx, ggml_tensor* x) {
    return ggml_mul(ctx, x, ggml_sigmoid(ctx, ggml_scale(ctx, x, 1.702f)));
}

ggml_tensor* gelu_tanh(ggml_context* ctx, ComputeTarget target, ggml_tensor* x) {
    if (target == ComputeTarget::Device) return ggml_gelu(ctx, x);
    // 0.5 (1 + tanh(z)) = sigmoid(2 z), z = sqrt(2/pi) (x + 0.044715 x^3).
    constexpr float kTwoRootTwoOverPi = 1.5957691216057308f;  // 2 sqrt(2 / pi)
    ggml_tensor* inner = ggml_scale_bias(ctx, ggml_sqr(ctx, x), kTwoRootTwoOverPi * 0.044715f, kTwoRootTwoOverPi);
    return ggml_mul(ctx, x, ggml_sigmoid(ctx, ggml_mul(ctx, x, inner)));
}

ggml_tensor* upsample_nearest_2x(ggml_context* ctx, ggml_tensor* x) {
    return ggml_upscale(ctx, x, 2, GGML_SCALE_MODE_NEAREST);
}

ggml_tensor* mark_cut(ggml_tensor* x, const std::string& name) {
    ggml_format_name(x, "cut:%s", name.c_str());
    return x;
}

Linear linear_rows(ggml_context* ctx, const Linear& layer, int64_t first, int64_t count) {
    const ggml_tensor* w = layer.weight;
    Linear part;
    part.weight = ggml_view_2d(ctx, layer.weight, w->ne[0], count, w->nb[1], first * w->nb[1]);
    if (layer.bias) part.bias = ggml_view_1d(ctx, layer.bias, count, first * layer.bias->nb[0]);
    return part;
}

ggml_tensor* rms_norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

ggml_tensor* head_rms_norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* weight, int64_t heads, float eps) {
    x = ggml_reshape_4d(ctx, x, x->ne[0] / heads, heads, x->ne[1], x->ne[2]);
    return rms_norm(ctx, x, weight, eps);
}

ggml_tensor* token_range(ggml_context* ctx, ggml_tensor* x, int64_t first, int64_t count) {
    ggml_tensor* v = ggml_view_3d(ctx, x, x->ne[0], count, x->ne[2], x->nb[1], x->nb[2], first * x->nb[1]);
    ggml_set_name(v, "tokens");
    if (ggml_is_contiguous(v)) return v;
    return ggml_set_name(ggml_cont(ctx, v), "tokens");
}

}  // namespace kiln::nn
