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
ggml_tensor* im2col_f32_cpu(ggml_context* ctx, const ggml_tensor* kernel, ggml_tensor* x, int stride, int padding,
                            int64_t first_row = 0, int64_t rows = -1);

// The output rows (OH) of a convolution of `x` by `kernel`.
int64_t conv_output_rows(const ggml_tensor* kernel, const ggml_tensor* x, int stride, int padding);

}  // namespace kiln::nn
