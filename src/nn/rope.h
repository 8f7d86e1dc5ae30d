// Rotary position embedding from a table the caller computes on the host
// (the DiTs' multi-axis positions: models/nets/flux_dit, models/nets/z_image_dit), for
// heads whose features rotate in consecutive pairs (BFL's and Tongyi's
// complex-number RoPE). ggml_rope_ext serves the one-axis NeoX layout
// (models/nets/llm_encoder) and needs no table.
#pragma once

#include "ggml.h"

namespace kiln::nn {

// x ne [head_dim, heads, L, B] (contiguous) rotated by the table's planes
// `cos` and `sin` (each ne [head_dim, 1, L, 1 or B]; per pair j, cos holds
// (cos a_j, cos a_j) and sin the signed (-sin a_j, sin a_j)):
// x * cos + swap_pairs(x) * sin. Returns ne [heads * head_dim, L, B].
ggml_tensor* rope_pairs(ggml_context* ctx, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin);

}  // namespace kiln::nn
