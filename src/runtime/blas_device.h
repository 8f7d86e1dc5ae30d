// The BLAS device kiln's CPU scheduler runs (runtime/compute.cpp): ggml's,
// except that it leaves thin matrix products to ggml-cpu.
//
// ggml's BLAS backend takes every product whose dimensions are all at least
// 32, and first widens a weight that is not F32 to F32: the whole weight, on
// every product. For a language model's prompt of a few dozen tokens that
// widening is most of the work. `kiln-gemm-bench --shapes llm` (one Qwen3-4B
// layer over 16 to 2048 tokens; bench/README.md) measured on 2 cores, F16
// weights: through BLAS 47-86 GFLOP/s at 32 tokens, 94-115 at 64, 119-151 at
// 96, 140-186 at 128; on ggml-cpu's vec_dot kernels (activations converted
// to F16) 126-163 GFLOP/s at every length. A q4_K Qwen3 encode crosses at
// the same place: vec_dot 146 ms against BLAS 263 ms at 37 tokens, 440
// against 382 ms at 119.
#pragma once

#include <cstdint>

#include "ggml-backend.h"

namespace kiln::runtime {

// A product whose weight is not F32 (F32 has nothing to widen) and that has
// fewer rows of activations than this (tokens, pixels: the second operand's
// rows per batch item) stays on ggml-cpu.
constexpr int64_t kThinProductRows = 96;

// Whether `op` is a matrix product the BLAS device declines for being thin.
bool is_thin_product(const ggml_tensor* op);

// The BLAS device with that rule; null when kiln was built without BLAS.
ggml_backend_dev_t blas_device();

}  // namespace kiln::runtime
