// Times one matrix product on each path a CPU run of kiln could take, so
// the benchmarks can compare kiln's matmuls with the machine's best GEMM.
#pragma once

#include <optional>
#include <string>

#include "matmul_shapes.h"

namespace kiln::bench {

enum class GemmPath {
    OpenBlasSgemm,  // cblas_sgemm called directly: the machine's limit
    GgmlCpuF32,     // ggml's CPU backend, F32 weights
    GgmlCpuF16,     // ggml's CPU backend, F16 weights (activations converted to F16)
    GgmlBlasF32,    // ggml's BLAS backend, F32 weights
    GgmlBlasF16,    // ggml's BLAS backend, F16 weights (widened to F32 on every product)
};
constexpr GemmPath kAllGemmPaths[] = {GemmPath::OpenBlasSgemm, GemmPath::GgmlCpuF32, GemmPath::GgmlCpuF16,
                                      GemmPath::GgmlBlasF32, GemmPath::GgmlBlasF16};

// "OpenBLAS sgemm", "ggml CPU f32", ...; `key` is the JSON name ("openblas_sgemm").
const char* gemm_path_name(GemmPath path);
const char* gemm_path_key(GemmPath path);

// The best wall time, in seconds, of `repetitions` products (more for
// products shorter than a millisecond) after one warm-up, with `threads`
// threads; the operands hold small random values.
// nullopt when the path cannot run here: built without OpenBLAS or ggml's
// BLAS backend, or a shape ggml's scheduler would not give the BLAS backend
// (a dimension under 32), which kiln then computes on the CPU path, or no
// memory for the operands.
std::optional<double> time_matmul(GemmPath path, const MatmulShape& shape, int threads, int repetitions);

// Every matrix product of `graph` (graph_matmul_shapes), each timed alone on
// `path` and counted as often as the graph computes it: the seconds the
// graph's products take at that path's speed, and their FLOPs in `flops`.
// Progress goes to stderr. nullopt when the path cannot take one of them.
std::optional<double> time_graph_products(ggml_cgraph* graph, GemmPath path, int threads, int repetitions,
                                          uint64_t* flops);

// Which OpenBLAS this process runs; empty strings when built without it.
struct OpenBlasInfo {
    std::string corename;  // openblas_get_corename(): the kernel set chosen at run time ("SkylakeX", "Haswell")
    std::string config;    // openblas_get_config(): version and build options
    int threads = 0;       // openblas_get_num_threads() now
};
OpenBlasInfo openblas_info();

}  // namespace kiln::bench
