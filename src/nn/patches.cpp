#include "nn/patches.h"

namespace kiln::nn {

ggml_tensor* patchify(ggml_context* ctx, ggml_tensor* x, int p, PatchFeatures order) {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], B = x->ne[3];
    const int64_t w = W / p, h = H / p;
    // [pw, col, ph, (row, C, B)] -> [pw, ph, col, (row, C, B)]
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, p, w, p, h * C * B), 0, 2, 1, 3));
    x = ggml_reshape_4d(ctx, x, p * p, w * h, C, B);
    if (order == PatchFeatures::ChannelSlowest) {
        // [(pw ph), (col row), C, B] -> [(pw ph), C, (col row), B]
        x = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3));
    } else {
        // [(pw ph), (col row), C, B] -> [C, (pw ph), (col row), B]
        x = ggml_cont(ctx, ggml_permute(ctx, x, 1, 2, 0, 3));
    }
    return ggml_reshape_3d(ctx, x, p * p * C, w * h, B);
}

ggml_tensor* unpatchify(ggml_context* ctx, ggml_tensor* x, int64_t w, int64_t h, int p, PatchFeatures order) {
    const int64_t C = x->ne[0] / (p * p), B = x->ne[2];
    if (order == PatchFeatures::ChannelSlowest) {
        // [(pw ph), C, (col row), B] -> [(pw ph), (col row), C, B]
        x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, p * p, C, w * h, B), 0, 2, 1, 3));
    } else {
        // [C, (pw ph), (col row), B] -> [(pw ph), (col row), C, B]
        x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, C, p * p, w * h, B), 2, 0, 1, 3));
    }
    // [pw, ph, col, (row, C, B)] -> [pw, col, ph, (row, C, B)]
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, p, p, w, h * C * B), 0, 2, 1, 3));
    return ggml_reshape_4d(ctx, x, w * p, h * p, C, B);
}

}  // namespace kiln::nn
