#include "nn/conv_cpu.h"

namespace kiln::nn {

ggml_tensor* add_channel_bias(ggml_context* ctx, ggml_tensor* y, ggml_tensor* bias) {
    return bias ? ggml_add(ctx, y, ggml_reshape_4d(ctx, bias, 1, 1, bias->ne[0], 1)) : y;
}

ggml_tensor* pixels_by_channels_to_image(ggml_context* ctx, ggml_tensor* pixels, ggml_tensor* kernel, int64_t W,
                                         int64_t H, int64_t N, ggml_tensor* bias) {
    const int64_t OC = kernel->ne[1];
    ggml_tensor* y = ggml_mul_mat(ctx, pixels, kernel);                       // [P, OC]
    y = ggml_permute(ctx, ggml_reshape_4d(ctx, y, W, H, N, OC), 0, 1, 3, 2);  // [W, H, OC, N], a view
    return bias ? add_channel_bias(ctx, y, bias) : ggml_cont(ctx, y);
}

ggml_tensor* kernel_for_cpu(ggml_context* ctx, ggml_tensor* kernel) {
    return kernel->type == GGML_TYPE_F32 ? kernel : ggml_cast(ctx, kernel, GGML_TYPE_F32);
}

ggml_tensor* kernel_matrix_for_cpu(ggml_context* ctx, ggml_tensor* weight) {
    return kernel_for_cpu(ctx, ggml_reshape_2d(ctx, weight, weight->ne[0] * weight->ne[1] * weight->ne[2],
                                               weight->ne[3]));
}

}  // namespace kiln::nn
