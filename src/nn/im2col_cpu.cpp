#include "nn/im2col_cpu.h"

#include <algorithm>
#include <cstdint>

namespace kiln::nn {
namespace {

// The kernel's geometry travels in the custom op's userdata pointer, packed
// into its bits: the op then owns no memory that must outlive the graph, and
// the plan cache's layout hash (which reads op params) tells geometries apart.
struct Geometry {
    int kw, kh, stride, padding;  // each below 256
};

void* pack(Geometry g) {
    const uintptr_t bits = static_cast<uintptr_t>(g.kw) | static_cast<uintptr_t>(g.kh) << 8 |
                           static_cast<uintptr_t>(g.stride) << 16 | static_cast<uintptr_t>(g.padding) << 24;
    return reinterpret_cast<void*>(bits);
}

Geometry unpack(void* userdata) {
    const uintptr_t bits = reinterpret_cast<uintptr_t>(userdata);
    return {static_cast<int>(bits & 0xff), static_cast<int>(bits >> 8 & 0xff), static_cast<int>(bits >> 16 & 0xff),
            static_cast<int>(bits >> 24 & 0xff)};
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
    const int64_t K = dst->ne[0], OW = dst->ne[1], OH = dst->ne[2], N = dst->ne[3];
    const int64_t rows = OH * N;
    const int64_t first = rows * ith / nth, last = rows * (ith + 1) / nth;
    const int64_t taps = static_cast<int64_t>(g.kh) * g.kw;
    for (int64_t r = first; r < last; ++r) {
        const int64_t n = r / OH, oh = r % OH;
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

ggml_tensor* im2col_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride, int padding) {
    const int kw = static_cast<int>(kernel->ne[0]), kh = static_cast<int>(kernel->ne[1]);
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float)) return nullptr;
    if (std::max({kw, kh, stride, padding}) > 255 || stride < 1 || padding < 0) return nullptr;
    const int64_t OW = (x->ne[0] + 2 * padding - kw) / stride + 1;
    const int64_t OH = (x->ne[1] + 2 * padding - kh) / stride + 1;
    ggml_tensor* args[] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, kernel->ne[0] * kernel->ne[1] * x->ne[2], OW, OH, x->ne[3], args, 1,
                          unfold_rows, GGML_N_TASKS_MAX, pack({kw, kh, stride, padding}));
}

}  // namespace kiln::nn
