#include "nn/im2col_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

// ggml-cpu's SiLU over a row (ggml-cpu/vec.h, not an installed header): the
// function ggml_silu runs, so a fused normalisation gives its bits.
extern "C" void ggml_vec_silu_f32(const int n, float* y, const float* x);

namespace kiln::nn {
namespace {

// The kernel's geometry and the band's first output row travel in the custom
// op's userdata pointer, packed into its bits: the op then owns no memory
// that must outlive the graph, and the plan cache's layout hash (which reads
// op params) tells geometries and bands apart.
struct Geometry {
    int kw, kh, stride, padding;  // each below 256
    int64_t first_row;            // below 2^30
    Seams seams;
};
constexpr int64_t kFirstRowLimit = int64_t{1} << 30;

void* pack(Geometry g) {
    const uint64_t bits = static_cast<uint64_t>(g.kw) | static_cast<uint64_t>(g.kh) << 8 |
                          static_cast<uint64_t>(g.stride) << 16 | static_cast<uint64_t>(g.padding) << 24 |
                          static_cast<uint64_t>(g.seams.x) << 32 | static_cast<uint64_t>(g.seams.y) << 33 |
                          static_cast<uint64_t>(g.first_row) << 34;
    return reinterpret_cast<void*>(static_cast<uintptr_t>(bits));
}

Geometry unpack(void* userdata) {
    const uint64_t bits = reinterpret_cast<uintptr_t>(userdata);
    return {static_cast<int>(bits & 0xff),
            static_cast<int>(bits >> 8 & 0xff),
            static_cast<int>(bits >> 16 & 0xff),
            static_cast<int>(bits >> 24 & 0xff),
            static_cast<int64_t>(bits >> 34),
            Seams{(bits >> 32 & 1) != 0, (bits >> 33 & 1) != 0}};
}

// Index i of a padded axis of n samples: inside, or across a seam the
// sample on the other side (PyTorch's circular padding: i mod n); -1 for
// the zero padding.
int64_t padded_index(int64_t i, int64_t n, bool seam) {
    if (i >= 0 && i < n) return i;
    if (!seam) return -1;
    return ((i % n) + n) % n;
}

// Thread `ith` of `nth` fills a contiguous range of output rows (one output
// row: the OW patches of one (oh, n)), so no two threads write the same cache
// line. Within a row the loops run over input channel, kernel row and kernel
// column, with the OW patches innermost: each input row is read in order, and
// the row's OW * K floats (under 1 MiB for SD's shapes) stay in cache while
// they are written. `read_row(n, ic, ih)` gives input row ih of channel ic.
// The input is IW x IH with dst->src[0]'s channels (a 2x upsample's input
// is half that size).
template <class ReadRow>
void unfold_rows_with(ggml_tensor* dst, int ith, int nth, const Geometry& g, int64_t IW, int64_t IH,
                      ReadRow read_row) {
    const int64_t IC = dst->src[0]->ne[2];
    const int64_t K = dst->ne[0], OW = dst->ne[1], band_rows = dst->ne[2], N = dst->ne[3];
    const int64_t rows = band_rows * N;
    const int64_t first = rows * ith / nth, last = rows * (ith + 1) / nth;
    const int64_t taps = static_cast<int64_t>(g.kh) * g.kw;
    for (int64_t r = first; r < last; ++r) {
        const int64_t n = r / band_rows, oh = g.first_row + r % band_rows;
        float* out = static_cast<float*>(dst->data) + r * OW * K;
        for (int64_t ic = 0; ic < IC; ++ic) {
            for (int64_t kh = 0; kh < g.kh; ++kh) {
                const int64_t ih = padded_index(oh * g.stride + kh - g.padding, IH, g.seams.y);
                const bool inside = ih >= 0;
                const float* in_row = inside ? read_row(n, ic, ih) : nullptr;
                for (int64_t kw = 0; kw < g.kw; ++kw) {
                    float* column = out + ic * taps + kh * g.kw + kw;
                    for (int64_t ow = 0; ow < OW; ++ow) {
                        const int64_t iw = padded_index(ow * g.stride + kw - g.padding, IW, g.seams.x);
                        column[ow * K] = inside && iw >= 0 ? in_row[iw] : 0.0f;
                    }
                }
            }
        }
    }
}

const float* row_of(const ggml_tensor* x, int64_t n, int64_t c, int64_t h) {
    return reinterpret_cast<const float*>(static_cast<const char*>(x->data) + n * x->nb[3] + c * x->nb[2] +
                                          h * x->nb[1]);
}

void unfold_rows(ggml_tensor* dst, int ith, int nth, void* userdata) {
    const ggml_tensor* x = dst->src[0];
    unfold_rows_with(dst, ith, nth, unpack(userdata), x->ne[0], x->ne[1],
                     [x](int64_t n, int64_t ic, int64_t ih) { return row_of(x, n, ic, ih); });
}

// As unfold_rows, of the input's nearest-neighbour 2x upsample: row ih of
// the upsample is row ih / 2 of the input, each sample twice, as
// ggml_upscale's nearest mode makes it (which also takes the source
// sample floor(i / 2)).
void unfold_rows_upsampled(ggml_tensor* dst, int ith, int nth, void* userdata) {
    const ggml_tensor* x = dst->src[0];
    const int64_t width = 2 * x->ne[0];
    std::vector<float> row(static_cast<size_t>(width));
    unfold_rows_with(dst, ith, nth, unpack(userdata), width, 2 * x->ne[1], [&](int64_t n, int64_t ic, int64_t ih) {
        const float* in = row_of(x, n, ic, ih / 2);
        for (int64_t i = 0; i < width; ++i) row[static_cast<size_t>(i)] = in[i / 2];
        return static_cast<const float*>(row.data());
    });
}

// As unfold_rows, each input row first normalised and passed through SiLU
// into a buffer of the thread's, in the operations and order of kiln's
// graph (nn::group_norm then ggml_silu): x - mean, times the group's scale
// (ggml_group_norm), times gamma (ggml_mul), plus beta (ggml_add), then
// ggml-cpu's own SiLU over the whole row (its vector kernel and the scalar
// tail fall on the same elements as in ggml_silu, which also works a row at
// a time), so the patches hold the bits the unfused graph would unfold.
void unfold_rows_normalised(ggml_tensor* dst, int ith, int nth, void* userdata) {
    const ggml_tensor* x = dst->src[0];
    const float* stats = static_cast<const float*>(dst->src[1]->data);  // [mean, scale] per group, per image
    const float* gamma = static_cast<const float*>(dst->src[2]->data);
    const float* beta = static_cast<const float*>(dst->src[3]->data);
    const int64_t groups = dst->src[1]->ne[1], channels = x->ne[2];
    const int64_t per_group = (channels + groups - 1) / groups;  // as ggml_group_norm splits them
    const int64_t width = x->ne[0];
    std::vector<float> row(static_cast<size_t>(width));
    unfold_rows_with(dst, ith, nth, unpack(userdata), width, x->ne[1], [&](int64_t n, int64_t ic, int64_t ih) {
        const float* in = row_of(x, n, ic, ih);
        const float* group = stats + 2 * (n * groups + ic / per_group);
        for (int64_t i = 0; i < width; ++i) {
            float v = in[i] - group[0];
            v = v * group[1];
            v = v * gamma[ic];
            row[static_cast<size_t>(i)] = v + beta[ic];
        }
        ggml_vec_silu_f32(static_cast<int>(width), row.data(), row.data());
        return static_cast<const float*>(row.data());
    });
}

// Thread `ith` of `nth` takes groups in turn and writes each group's mean and
// scale (1 / sqrt(variance + eps)) for each image, summed as ggml's CPU group
// norm sums them (double per row, rows in order, two passes), so they are
// its numbers to the bit.
void group_statistics(ggml_tensor* dst, int ith, int nth, void* userdata) {
    float eps;
    const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(userdata));
    std::memcpy(&eps, &bits, sizeof eps);
    const ggml_tensor* x = dst->src[0];
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], N = x->ne[3];
    const int64_t groups = dst->ne[1];
    const int64_t per_group = (C + groups - 1) / groups;
    for (int64_t g = ith; g < groups; g += nth) {
        const int64_t start = g * per_group, end = std::min(start + per_group, C);
        for (int64_t n = 0; n < N; ++n) {
            double sum = 0.0;
            for (int64_t c = start; c < end; ++c) {
                for (int64_t h = 0; h < H; ++h) {
                    const float* in = row_of(x, n, c, h);
                    double row_sum = 0.0;
                    for (int64_t i = 0; i < W; ++i) row_sum += static_cast<double>(in[i]);
                    sum += row_sum;
                }
            }
            const float mean = static_cast<float>(sum / static_cast<double>(W * H * (end - start)));
            double sum2 = 0.0;
            for (int64_t c = start; c < end; ++c) {
                for (int64_t h = 0; h < H; ++h) {
                    const float* in = row_of(x, n, c, h);
                    double row_sum = 0.0;
                    for (int64_t i = 0; i < W; ++i) {
                        const float v = in[i] - mean;
                        row_sum += static_cast<double>(v * v);
                    }
                    sum2 += row_sum;
                }
            }
            const float variance = static_cast<float>(sum2 / static_cast<double>(W * H * (end - start)));
            float* out = static_cast<float*>(dst->data) + 2 * (n * groups + g);
            out[0] = mean;
            out[1] = 1.0f / std::sqrt(variance + eps);
        }
    }
}

}  // namespace

int64_t conv_output_rows(const ggml_tensor* kernel, const ggml_tensor* x, int stride, int padding) {
    return (x->ne[1] + 2 * padding - kernel->ne[1]) / stride + 1;
}

ggml_tensor* group_norm_statistics_cpu(ggml_context* ctx, ggml_tensor* x, int groups, float eps) {
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || groups < 1) return nullptr;
    uint32_t bits;
    std::memcpy(&bits, &eps, sizeof bits);
    ggml_tensor* args[] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, 2, groups, x->ne[3], 1, args, 1, group_statistics, GGML_N_TASKS_MAX,
                          reinterpret_cast<void*>(static_cast<uintptr_t>(bits)));
}

namespace {

// The unfold's geometry and output shape, or nullopt for an input or band
// the unfold does not take.
struct Band {
    Geometry geometry;
    int64_t k, ow, rows;
};

std::optional<Band> band_of(const ggml_tensor* kernel, const ggml_tensor* x, int stride, int padding,
                            int64_t first_row, int64_t rows, Seams seams, int64_t scale = 1) {
    const int kw = static_cast<int>(kernel->ne[0]), kh = static_cast<int>(kernel->ne[1]);
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float)) return std::nullopt;
    if (std::max({kw, kh, stride, padding}) > 255 || stride < 1 || padding < 0) return std::nullopt;
    const int64_t OW = (scale * x->ne[0] + 2 * padding - kw) / stride + 1;
    const int64_t OH = (scale * x->ne[1] + 2 * padding - kh) / stride + 1;
    if (rows < 0) rows = OH - first_row;
    if (first_row < 0 || rows < 1 || first_row + rows > OH || first_row >= kFirstRowLimit) return std::nullopt;
    return Band{{kw, kh, stride, padding, first_row, seams}, kernel->ne[0] * kernel->ne[1] * x->ne[2], OW, rows};
}

}  // namespace

ggml_tensor* im2col_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride, int padding,
                            int64_t first_row, int64_t rows, ggml_tensor* after, Seams seams) {
    const auto band = band_of(kernel, x, stride, padding, first_row, rows, seams);
    if (!band) return nullptr;
    ggml_tensor* args[] = {x, after};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, band->k, band->ow, band->rows, x->ne[3], args, after ? 2 : 1,
                          unfold_rows, GGML_N_TASKS_MAX, pack(band->geometry));
}

ggml_tensor* im2col_upsampled_2x_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride,
                                         int padding, int64_t first_row, int64_t rows, ggml_tensor* after,
                                         Seams seams) {
    const auto band = band_of(kernel, x, stride, padding, first_row, rows, seams, 2);
    if (!band) return nullptr;
    ggml_tensor* args[] = {x, after};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, band->k, band->ow, band->rows, x->ne[3], args, after ? 2 : 1,
                          unfold_rows_upsampled, GGML_N_TASKS_MAX, pack(band->geometry));
}

ggml_tensor* im2col_group_norm_silu_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x,
                                            ggml_tensor* statistics, ggml_tensor* gamma, ggml_tensor* beta, int stride,
                                            int padding, int64_t first_row, int64_t rows, Seams seams) {
    const auto band = band_of(kernel, x, stride, padding, first_row, rows, seams);
    if (!band || !ggml_is_contiguous(x) || gamma->type != GGML_TYPE_F32 || beta->type != GGML_TYPE_F32 ||
        ggml_nelements(gamma) != x->ne[2] || ggml_nelements(beta) != x->ne[2]) {
        return nullptr;
    }
    ggml_tensor* args[] = {x, statistics, gamma, beta};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, band->k, band->ow, band->rows, x->ne[3], args, 4, unfold_rows_normalised,
                          GGML_N_TASKS_MAX, pack(band->geometry));
}

}  // namespace kiln::nn
