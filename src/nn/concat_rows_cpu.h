// Images made a band of rows at a time, put back together: the concatenation
// along ne1 (rows) of tensors ne [W, rows_i, C, N], each band copied once.
//
// Convolutions on the CPU multiply their patches a band of output rows at a
// time (nn/layers.cpp), so that a large one's F32 patches never exist whole;
// this joins the bands. ggml_concat joins two tensors, and a chain of them
// copies the first band once per later band. Joining all bands in one op
// would keep every band alive until the join, beside the joined image: twice
// the output. Here each band goes into the image as soon as it is made and
// is freed, so the image and one band are what the join holds.
#pragma once

#include <vector>

#include "ggml.h"

namespace kiln::nn {

// `parts`: F32, contiguous, equal in ne0, ne2 and ne3, at least one. A part
// alone is returned as it is. The first part is copied by a GGML_OP_CUSTOM
// node, which only ggml's CPU backend runs; the others by in-place
// GGML_OP_SET nodes, so the result is a view of that node's tensor. The
// parts are computed in order, each just before it is copied (ggml's graph
// order follows the first source first).
ggml_tensor* concat_rows_cpu(ggml_context* ctx, const std::vector<ggml_tensor*>& parts);

// The same join a part at a time, for bands whose making interleaves with
// other work: an image of `rows` rows whose top rows are `first` (the
// GGML_OP_CUSTOM node that allocates it), then each later part set into its
// rows in place (a view of that image).
ggml_tensor* image_from_first_rows_cpu(ggml_context* ctx, ggml_tensor* first, int64_t rows);
ggml_tensor* set_rows_cpu(ggml_context* ctx, ggml_tensor* image, ggml_tensor* part, int64_t first_row);

}  // namespace kiln::nn
