#include "nn/im2col_cpu.h"

#include <algorithm>
#include <cstdint>

namespace kiln::nn {
namespace {

// The kernel's geometry and the band's first output row travel in the custom
// op's userdata pointer, packed into its bits: the op then owns no memory
// that must outlive the graph, and the plan cache's layout hash (which reads
// op params) tells geometries and bands apart.
struct Geometry {
    int kw, kh, stride, padding;  // each below 256
    int64_t first_row;            // below 2^32
};

void* pack(Geometry g) {
    const uint64_t bits = static_cast<uint64_t>(g.kw) | static_cast<uint64_t>(g.kh) << 8 |
                          static_cast<uint64_t>(g.stride) << 16 | static_cast<uint64_t>(g.padding) << 24 |
                          static_cast<uint64_t>(g.first_row) << 32;
    return reinterpret_cast<void*>(static_cast<uintptr_t>(bits));
}

Geometry unpack(void* userdata) {
    const uint64_t bits = reinterpret_cast<uintptr_t>(userdata);
    return {static_cast<int>(bits & 0xff), static_cast<int>(bits >> 8 & 0xff), static_cast<int>(bits >> 16 & 0xff),
            static_cast<int>(bits >> 24 & 0xff), static_cast<int64_t>(bits >> 32)};
}

// Thread `ith` of `nth` fills a contiguous range of output rows (one output
// row: the OW patches of one (oh, n)), so no two threads write the same cache
// line. Within a row the loops run over input channel, kernel row and kernel
// column, with the OW patches innermost: each input row is read in order, and
// the row's OW * K floats (under 1 MiB for SD's shapes) stay in cache while
// they are written.
void unfold_rows(ggml_tensor* dst, int ith, int nth, void* userdata) {
    const Geometry g = unpack(userdata);
    const ggml_tensor* x = dst->src[0];
    const int64_t IW = x->ne[0], IH = x->ne[1], IC = x->ne[2];
    const int64_t K = dst->ne[0], OW = dst->ne[1], band_rows = dst->ne[2], N = dst->ne[3];
    const int64_t rows = band_rows * N;
    const int64_t first = rows * ith / nth, last = rows * (ith + 1) / nth;
    const int64_t taps = static_cast<int64_t>(g.kh) * g.kw;
    for (int64_t r = first; r < last; ++r) {
        const int64_t n = r / band_rows, oh = g.first_row + r % band_rows;
        float* out = static_cast<float*>(dst->data) + r * OW * K;
        for (int64_t ic = 0; ic < IC; ++ic) {
            const char* plane = static_cast<const char*>(x->data) + n * x->nb[3] + ic * x->nb[2];
            for (int64_t kh = 0; kh < g.kh; ++kh) {
                const int64_t ih = oh * g.stride + kh - g.padding;
                const bool inside = ih >= 0 && ih < IH;
                const float* in_row = inside ? reinterpret_cast<const float*>(plane + ih * x->nb[1]) : nullptr;
                for (int64_t kw = 0; kw < g.kw; ++kw) {
                    float* column = out + ic * taps + kh * g.kw + kw;
                    for (int64_t ow = 0; ow < OW; ++ow) {
                        const int64_t iw = ow * g.stride + kw - g.padding;
                        column[ow * K] = inside && iw >= 0 && iw < IW ? in_row[iw] : 0.0f;
                    }
                }
            }
        }
    }
}

}  // namespace

int64_t conv_output_rows(const ggml_tensor* kernel, const ggml_tensor* x, int stride, int padding) {
    return (x->ne[1] + 2 * padding - kernel->ne[1]) / stride + 1;
}

ggml_tensor* im2col_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride, int padding,
                            int64_t first_row, int64_t rows) {
    const int kw = static_cast<int>(kernel->ne[0]), kh = static_cast<int>(kernel->ne[1]);
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float)) return nullptr;
    if (std::max({kw, kh, stride, padding}) > 255 || stride < 1 || padding < 0) return nullptr;
    const int64_t OW = (x->ne[0] + 2 * padding - kw) / stride + 1;
    const int64_t OH = conv_output_rows(kernel, x, stride, padding);
    if (rows < 0) rows = OH - first_row;
    if (first_row < 0 || rows < 1 || first_row + rows > OH || first_row >= (int64_t{1} << 32)) return nullptr;
    ggml_tensor* args[] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, kernel->ne[0] * kernel->ne[1] * x->ne[2], OW, rows, x->ne[3], args, 1,
                          unfold_rows, GGML_N_TASKS_MAX, pack({kw, kh, stride, padding, first_row}));
}

}  // namespace kiln::nn
