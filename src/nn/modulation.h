// adaLN modulation, as DiTs condition their blocks on the timestep (and
// guidance, pooled text): a linear layer's output of K vectors per batch
// item, each scaling, shifting or gating a sub-block's activations.
#pragma once

#include <cstdint>

#include "ggml.h"
#include "nn/layers.h"

namespace kiln::nn {

// K modulation vectors as one contiguous table ne [width, B, K], so vector k
// of every batch item is one contiguous chunk.
struct ModulationTable {
    ggml_tensor* table = nullptr;

    // From ne [width, K, B] (vectors of one batch item side by side).
    static ModulationTable from_chunks(ggml_context* ctx, ggml_tensor* chunks);
    // From a modulation layer's output ne [K * width, B].
    static ModulationTable split(ggml_context* ctx, ggml_tensor* out, int64_t k);
    // Vector k, ne [width, 1, B]: broadcasts over the tokens.
    ggml_tensor* at(ggml_context* ctx, int64_t k) const;
};

// 1 + x: a modulation's scale as multiplied in (1 + scale) * x.
ggml_tensor* one_plus(ggml_context* ctx, ggml_tensor* x);
// normed * scale1 + shift (shift may be null).
ggml_tensor* modulate(ggml_context* ctx, ggml_tensor* normed, ggml_tensor* scale1, ggml_tensor* shift);
// x + gate * y.
ggml_tensor* gated_add(ggml_context* ctx, ggml_tensor* x, ggml_tensor* y, ggml_tensor* gate);

// BFL's DiTs (Flux.1, Chroma, FLUX.2): (shift, scale, gate) of one modulated
// sub-block, each ne [width, 1, B]; `scale1` is 1 + scale.
struct ShiftScaleGate {
    ggml_tensor* shift = nullptr;
    ggml_tensor* scale1 = nullptr;
    ggml_tensor* gate = nullptr;  // null without one (a final layer's)
};
// Vectors k, k + 1 (and k + 2) of `table` as BFL chunks them.
ShiftScaleGate shift_scale_gate(ggml_context* ctx, const ModulationTable& table, int64_t k, bool with_gate = true);
// Vectors k and k + 1 in diffusers' AdaLayerNormContinuous order (scale,
// shift), as its conversions store a final layer's modulation; no gate.
ShiftScaleGate scale_shift(ggml_context* ctx, const ModulationTable& table, int64_t k);
// (1 + scale) * LayerNorm(x) + shift, the LayerNorm without affine.
ggml_tensor* modulate_layer_norm(ggml_context* ctx, ggml_tensor* x, const ShiftScaleGate& m, float eps);

// BFL's MLPEmbedder: out_layer(silu(in_layer(x))).
struct MlpEmbedder {
    Linear in, out;
};
ggml_tensor* mlp_embed(ggml_context* ctx, const MlpEmbedder& e, ggml_tensor* x);
// BFL's timestep_embedding(t, dim): t * 1000, cat([cos, sin]).
ggml_tensor* bfl_time_embedding(ggml_context* ctx, ggml_tensor* t, int dim);

}  // namespace kiln::nn
