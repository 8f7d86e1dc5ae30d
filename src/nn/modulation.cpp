#include "nn/modulation.h"

namespace kiln::nn {

ModulationTable ModulationTable::from_chunks(ggml_context* ctx, ggml_tensor* chunks) {
    return {ggml_cont(ctx, ggml_permute(ctx, chunks, 0, 2, 1, 3))};
}

ModulationTable ModulationTable::split(ggml_context* ctx, ggml_tensor* out, int64_t k) {
    return from_chunks(ctx, ggml_reshape_3d(ctx, out, out->ne[0] / k, k, out->ne[1]));
}

ggml_tensor* ModulationTable::at(ggml_context* ctx, int64_t k) const {
    return ggml_view_3d(ctx, table, table->ne[0], 1, table->ne[1], table->nb[1], table->nb[1], k * table->nb[2]);
}

ggml_tensor* one_plus(ggml_context* ctx, ggml_tensor* x) { return ggml_scale_bias(ctx, x, 1.0f, 1.0f); }

ggml_tensor* modulate(ggml_context* ctx, ggml_tensor* normed, ggml_tensor* scale1, ggml_tensor* shift) {
    ggml_tensor* scaled = ggml_mul(ctx, normed, scale1);
    return shift ? ggml_add(ctx, scaled, shift) : scaled;
}

ggml_tensor* gated_add(ggml_context* ctx, ggml_tensor* x, ggml_tensor* y, ggml_tensor* gate) {
    return ggml_add(ctx, x, ggml_mul(ctx, y, gate));
}

}  // namespace kiln::nn
