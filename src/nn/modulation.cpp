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

ShiftScaleGate shift_scale_gate(ggml_context* ctx, const ModulationTable& table, int64_t k, bool with_gate) {
    ShiftScaleGate m;
    m.shift = table.at(ctx, k);
    m.scale1 = one_plus(ctx, table.at(ctx, k + 1));
    if (with_gate) m.gate = table.at(ctx, k + 2);
    return m;
}

ShiftScaleGate scale_shift(ggml_context* ctx, const ModulationTable& table, int64_t k) {
    ShiftScaleGate m;
    m.scale1 = one_plus(ctx, table.at(ctx, k));
    m.shift = table.at(ctx, k + 1);
    return m;
}

ggml_tensor* modulate_layer_norm(ggml_context* ctx, ggml_tensor* x, const ShiftScaleGate& m, float eps) {
    return modulate(ctx, ggml_norm(ctx, x, eps), m.scale1, m.shift);
}

ggml_tensor* mlp_embed(ggml_context* ctx, const MlpEmbedder& e, ggml_tensor* x) {
    return linear(ctx, e.out, ggml_silu(ctx, linear(ctx, e.in, x)));
}

ggml_tensor* bfl_time_embedding(ggml_context* ctx, ggml_tensor* t, int dim) {
    return ggml_timestep_embedding(ctx, ggml_scale(ctx, t, 1000.0f), dim, 10000);
}

}  // namespace kiln::nn
