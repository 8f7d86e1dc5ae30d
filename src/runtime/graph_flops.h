// The arithmetic a ggml graph performs in its matrix products, so a
// benchmark can turn a measured time into FLOP/s and compare it with the
// machine's GEMM limit (bench/README.md).
//
// Counted, with one multiply-add as 2 FLOPs:
//   GGML_OP_MUL_MAT         2 * K * (every element of the result); broadcast
//                           batches count once per result batch. kiln's
//                           convolutions (nn/layers.cpp: im2col + mul_mat, and
//                           1x1 convolutions as plain products) are counted here.
//   GGML_OP_CONV_2D         2 * (KW * KH * IC) * (every element of the result),
//                           for graphs that use ggml's direct convolution.
//   GGML_OP_FLASH_ATTN_EXT  2 * d * n_q * n_kv * heads * batch for Q K^T plus
//                           2 * d_v * n_q * n_kv * heads * batch for P V.
// Everything else (element-wise ops, norms, softmax, im2col's copies) is
// memory-bound and left out: the count is the work a GEMM limit applies to.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace kiln::runtime {

// FLOPs of one node (0 for ops not counted above).
uint64_t node_flops(const ggml_tensor* node);

// The sum of node_flops over every node of `graph`.
uint64_t graph_flops(const ggml_cgraph* graph);

}  // namespace kiln::runtime
