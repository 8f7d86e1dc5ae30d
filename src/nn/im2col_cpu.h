// The unfold of a 2-D convolution's input into patches (im2col) for graphs
// that compute on ggml's CPU backend: the same tensor ggml_im2col makes with
// an F32 result, filled by a kernel that is several times faster here.
//
// ggml's CPU im2col hands out input channels to threads in turn, so the
// threads write interleaved 36-byte pieces of the same patch rows (false
// sharing between cores) and every read jumps between channel planes; it
// took about 6% of a full-size SD1.5 UNet step and more of a VAE decode
// (docs/performance.md). This kernel gives each thread whole output rows and
// reads the input a row at a time.
#pragma once

#include "ggml.h"
#include "nn/seams.h"

namespace kiln::nn {

// `x`: ne [IW, IH, IC, N] F32 with contiguous rows; `kernel`: ne [KW, KH, IC,
// OC] (only its shape is read). Returns ne [IC*KH*KW, OW, OH, N] F32, element
// for element what ggml_im2col(ctx, kernel, x, stride, stride, padding,
// padding, 1, 1, true, GGML_TYPE_F32) computes. A GGML_OP_CUSTOM node: only
// ggml's CPU backend runs it. nullptr when `x` is not F32 with contiguous
// rows (callers use ggml_im2col then).
//
// `first_row` and `rows` (-1: to the last) unfold only that band of output
// rows, ne [IC*KH*KW, OW, rows, N]: the same patches as those rows of the
// whole unfold, so a large convolution can be multiplied a band at a time.
//
// `after`: null, or a tensor the graph must compute before this unfold. It
// is not read; it orders bands whose making interleaves (ggml's graph order
// follows the sources, first to last).
//
// `seams`: across a seam the padding reads the image's other edge (the
// unfold of ggml_pad_ext_circular's output with no padding), here and in
// the unfolds below.
ggml_tensor* im2col_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride, int padding,
                            int64_t first_row = 0, int64_t rows = -1, ggml_tensor* after = nullptr,
                            Seams seams = {});

// The same unfold of silu(group_norm(x) * gamma + beta), the normalised
// tensor never made: each input row is normalised as the unfold reads it,
// with `statistics` from group_norm_statistics_cpu. Bit for bit the patches
// of nn::group_norm followed by ggml_silu (the same float operations in the
// same order, ggml-cpu's own SiLU). `gamma` and `beta`: F32, one per
// channel. nullptr for an input or band im2col_f32_cpu does not take.
ggml_tensor* im2col_group_norm_silu_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x,
                                            ggml_tensor* statistics, ggml_tensor* gamma, ggml_tensor* beta, int stride,
                                            int padding, int64_t first_row, int64_t rows = -1, Seams seams = {});
// The same unfold of ggml_upscale(x, 2, nearest), the upsample never made:
// the unfold reads each sample of x where the upsample would hold it. Rows
// and the band are counted in the upsampled image's (and the output's)
// rows. nullptr for an input or band im2col_f32_cpu does not take.
ggml_tensor* im2col_upsampled_2x_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride,
                                         int padding, int64_t first_row, int64_t rows = -1,
                                         ggml_tensor* after = nullptr, Seams seams = {});
// ggml_group_norm's per-group numbers of `x` (ne [W, H, C, N], F32, rows
// contiguous): ne [2, groups, N], each group's mean and 1 / sqrt(variance +
// eps), summed as ggml's CPU group norm sums them. nullptr for other inputs.
ggml_tensor* group_norm_statistics_cpu(ggml_context* ctx, ggml_tensor* x, int groups, float eps);

// The output rows (OH) of a convolution of `x` by `kernel`.
int64_t conv_output_rows(const ggml_tensor* kernel, const ggml_tensor* x, int stride, int padding);

}  // namespace kiln::nn
