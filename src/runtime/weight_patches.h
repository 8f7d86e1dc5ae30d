// Changes to a module's weights that come from outside its model file
// (LoRA, LoHa, LoKr: pipeline/loras.h), applied to the graph a network
// builds rather than to the weights themselves, so that the base weights are
// never rewritten and another set of patches costs no reload.
//
// A patched weight W gets, in every matrix product that reads it:
//   - low-rank terms: the product's result plus scale * up (down x), the
//     LoRA form, which leaves a quantized W untouched (no requantization)
//     and costs two thin products;
//   - dense terms: plus delta x, for LoHa, LoKr and full diffs at run time, whose
//     delta is no low-rank product;
//   - or a replacement: W + delta computed once (merged), read instead of W.
// The extra tensors are the module's own weights (ModuleWeights::set_extras):
// the memory system places, streams and counts them with the module.
#pragma once

#include <unordered_map>
#include <vector>

#include "ggml.h"

namespace kiln::runtime {

struct LowRankTerm {
    ggml_tensor* down = nullptr;  // ne [in, rank]
    ggml_tensor* up = nullptr;    // ne [rank, out rows of W]: zero outside the rows the adapter names
    float scale = 1.0f;
};

struct WeightPatch {
    std::vector<LowRankTerm> low_rank;
    std::vector<ggml_tensor*> dense;  // ne [in, out] F32, scale included
    ggml_tensor* replacement = nullptr;
};

// Keyed by the module's weight tensor (as declared, ne [in, out] for a
// linear layer, [kw, kh, in, out] for a convolution).
using WeightPatches = std::unordered_map<const ggml_tensor*, WeightPatch>;

// Rewrites the graph ending at `out` so that every matrix product reading a
// patched weight (directly, through a reshape, a cast or a view of whole
// rows) includes its patch; returns the new output (`out` itself unless it
// was such a product). A cut marker on a patched product moves to the sum.
ggml_tensor* apply_weight_patches(ggml_context* ctx, ggml_tensor* out, const WeightPatches& patches);

}  // namespace kiln::runtime
