// Matrix-product shapes as ggml's mul_mat sees them, and the ones a graph
// actually computes, so the GEMM benchmark times the products the UNet runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace kiln::bench {

// `batch` products of an m x k matrix (src1: activations, m rows of k) by a
// k x n matrix (src0: n rows of k, a layer's weights or, for attention and
// im2col convolutions, activations too). src0 is shared by every product
// (weight_batch 1, a linear layer over a batch) or has one plane per product.
struct MatmulShape {
    std::string label;
    int64_t m = 0;
    int64_t k = 0;
    int64_t n = 0;
    int64_t batch = 1;
    int64_t weight_batch = 1;
    int count = 1;  // occurrences in one graph
};

// 2 * m * k * n * batch: one multiply-add is 2 FLOPs (runtime/graph_flops.h).
uint64_t matmul_flops(const MatmulShape& shape);

// "4096x320 by 320x320" with " (x16)" for batches.
std::string describe_shape(const MatmulShape& shape);

// Every distinct GGML_OP_MUL_MAT of `graph` (by shape), with its count,
// largest total FLOPs first; labels say what the product computes where the
// operand names tell ("weights", "activations").
std::vector<MatmulShape> graph_matmul_shapes(ggml_cgraph* graph);

// A representative set of SD1.5's UNet products at 512x512 with CFG as a
// batch of two (a 64x64 latent; levels of 320, 640, 1280, 1280 channels;
// 8 heads; 77 context tokens of 768), derived from the architecture.
std::vector<MatmulShape> sd15_matmul_shapes();

// One Qwen3-4B layer's products (2560 wide; q 4096, k and v 1024, SwiGLU
// 9728) over prompts of 16 to 2048 tokens: where thin products cross from
// ggml-cpu's vec_dot kernels to BLAS (runtime/thin_products.h).
std::vector<MatmulShape> llm_matmul_shapes();

// The product the first measurement used: 4096x14336 by 14336x512.
MatmulShape reference_shape();

}  // namespace kiln::bench
