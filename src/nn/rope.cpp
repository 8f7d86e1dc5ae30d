#include "nn/rope.h"

namespace kiln::nn {

ggml_tensor* rope_pairs(ggml_context* ctx, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin) {
    const int64_t D = x->ne[0], H = x->ne[1], L = x->ne[2], B = x->ne[3];
    ggml_tensor* pairs = ggml_reshape_4d(ctx, x, 2, D / 2, H, L * B);
    auto element = [&](int i) {  // element i of every pair: ne [1, D/2, H, L*B]
        return ggml_view_4d(ctx, pairs, 1, D / 2, H, L * B, pairs->nb[1], pairs->nb[2], pairs->nb[3], i * pairs->nb[0]);
    };
    ggml_tensor* swapped = ggml_reshape_4d(ctx, ggml_concat(ctx, element(1), element(0), 0), D, H, L, B);
    ggml_tensor* out = ggml_add(ctx, ggml_mul(ctx, x, cos), ggml_mul(ctx, swapped, sin));
    return ggml_reshape_3d(ctx, out, D * H, L, B);
}

}  // namespace kiln::nn
