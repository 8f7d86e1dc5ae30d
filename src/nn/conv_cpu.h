// The product and layout of a convolution on the CPU, shared by the layers
// (nn/layers.cpp) and the banded decoder block (nn/upsampled_block_cpu.cpp).
#pragma once

#include <cstdint>

#include "ggml.h"

namespace kiln::nn {

// y: ne [W, H, OC, N]; bias: ne [OC] or null.
ggml_tensor* add_channel_bias(ggml_context* ctx, ggml_tensor* y, ggml_tensor* bias);

// The product of pixel rows [K, P] (P = W * H * N pixels) by a kernel [K, OC]
// whose result is pixels by output channels, [P, OC], laid out as the image
// [W, H, OC, N] with the bias added: the add reads the permuted result and
// writes it contiguously, so the layout costs no copy of its own.
ggml_tensor* pixels_by_channels_to_image(ggml_context* ctx, ggml_tensor* pixels, ggml_tensor* kernel, int64_t W,
                                         int64_t H, int64_t N, ggml_tensor* bias);

// On the CPU the product goes to OpenBLAS's sgemm through ggml's BLAS
// backend, which takes an F32 second operand: the kernel is widened once
// per graph run, as the BLAS backend would otherwise do inside the product.
ggml_tensor* kernel_for_cpu(ggml_context* ctx, ggml_tensor* kernel);

// A convolution's kernel ne [KW, KH, IC, OC] as the F32 matrix [KW*KH*IC, OC]
// its unfolded patches multiply.
ggml_tensor* kernel_matrix_for_cpu(ggml_context* ctx, ggml_tensor* weight);

}  // namespace kiln::nn
