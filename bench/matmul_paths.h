// Which kernel each matrix product of a graph reaches on the CPU, the way
// kiln's scheduler over [BLAS, CPU] (runtime/compute.cpp) assigns it:
// ggml's BLAS backend takes every product it supports (ggml-blas.cpp's
// supports_op: contiguous operands, F32 activations, every dimension at least
// 32, and a first operand that is F32 or has a to_float, which every float
// and quantized type has); the rest run on ggml-cpu's vec_dot kernels, the
// activations converted to the weight type's vec_dot_type. So kiln-bench can
// say, per weight type, where the products went (bench/README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace kiln::bench {

struct MatmulPathRow {
    std::string network;  // "diffusion", "text encoder"
    std::string type;     // the first operand's ggml type: "q4_K", "f16", "f32"
    std::string path;     // "BLAS: to_float + sgemm", "CPU: vec_dot q4_K x q8_K"
    int products = 0;     // in the graphs given
    uint64_t flops = 0;   // their FLOPs (runtime/graph_flops.h)
};

// Whether the scheduler of a CPU module has ggml's BLAS backend: built with
// it and KILN_NO_BLAS unset (runtime/compute.cpp).
bool cpu_scheduler_has_blas();

// The products of `graphs`, grouped by type and path, for a module computed
// on the CPU (`blas`: cpu_scheduler_has_blas()), added to `rows`.
void add_matmul_paths(const std::string& network, const std::vector<ggml_cgraph*>& graphs, bool blas,
                      std::vector<MatmulPathRow>* rows);

}  // namespace kiln::bench
