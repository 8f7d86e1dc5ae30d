// Images made a band of rows at a time, put back together: the concatenation
// along ne1 (rows) of tensors ne [W, rows_i, C, N], in one copy.
//
// Convolutions on the CPU multiply their patches a band of output rows at a
// time (nn/layers.cpp), so that a large one's F32 patches never exist whole;
// this joins the bands. ggml_concat joins two tensors, and a chain of them
// copies the first band once per later band.
#pragma once

#include <vector>

#include "ggml.h"

namespace kiln::nn {

// `parts`: F32, contiguous, equal in ne0, ne2 and ne3, at least one. A part
// alone is returned as it is. More parts than one custom op takes sources
// are joined in groups first. GGML_OP_CUSTOM nodes: only ggml's CPU backend
// runs them.
ggml_tensor* concat_rows_cpu(ggml_context* ctx, const std::vector<ggml_tensor*>& parts);

}  // namespace kiln::nn
