// ggml_group_norm's statistics of an image made a band of rows at a time and
// never held whole (nn/upsampled_block_cpu.h): each band's per-group sums of
// x and x^2 (in double) go into a running total as the band is made, and the
// total becomes each group's mean and 1 / sqrt(variance + eps), laid out as
// group_norm_statistics_cpu's (nn/im2col_cpu.h). ggml sums twice, the mean
// first and then the squares about it, which would need the image twice
// more; one pass in double gives the same numbers up to the last bits of a
// float. GGML_OP_CUSTOM nodes: only ggml's CPU backend runs them.
#pragma once

#include "ggml.h"

namespace kiln::nn {

// `total` (null for the first band) plus the sums of `band` (ne [W, rows, C,
// N], F32, contiguous) over each of `groups` channel groups, split as
// ggml_group_norm splits them: ne [3, groups, N] F64 (sum, sum of squares,
// values counted).
ggml_tensor* add_group_sums_cpu(ggml_context* ctx, ggml_tensor* total, ggml_tensor* band, int groups);

// ne [2, groups, N] F32: each group's mean and 1 / sqrt(variance + eps).
ggml_tensor* group_norm_statistics_of_sums_cpu(ggml_context* ctx, ggml_tensor* total, float eps);

}  // namespace kiln::nn
