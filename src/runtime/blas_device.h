// The BLAS device kiln's CPU scheduler runs (runtime/compute.cpp): ggml's,
// except that it leaves thin matrix products to ggml-cpu.
//
// ggml's BLAS backend takes every product whose dimensions are all at least
// 32, and first widens a weight that is not F32 to F32: the whole weight, on
// every product. For a language model's prompt of a few dozen tokens that
// widening is most of the work. ggml-cpu's vec_dot kernels (the activations
// rounded to the weight's vec_dot type) run at about one rate whatever the
// length; widening plus sgemm catches them between 64 and 128 rows, for F16
// (`kiln-gemm-bench --shapes llm`, a Qwen3-4B layer over 16 to 2048 tokens)
// and for q4_K (a Qwen3 encode: vec_dot 146 ms against BLAS 263 ms at 37
// tokens, 440 against 382 ms at 119). bench/README.md has the table.
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
