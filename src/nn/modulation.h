// adaLN modulation, as DiTs condition their blocks on the timestep (and
// guidance, pooled text): a linear layer's output of K vectors per batch
// item, each scaling, shifting or gating a sub-block's activations.
#pragma once

#include <cstdint>

#include "ggml.h"

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

}  // namespace kiln::nn
