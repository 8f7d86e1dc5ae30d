// Runs ggml graphs on this machine's CPU through a scheduler over [BLAS, CPU],
// so large matrix products and convolutions (im2col + matmul) reach OpenBLAS
// while every other op runs on ggml's CPU kernels. The memory system (devices,
// budgets, segments) builds on this later; models only see "compute this graph".
#pragma once

#include <functional>
#include <memory>

#include "ggml-backend.h"
#include "util/result.h"

namespace kiln::runtime {

class CpuCompute {
  public:
    // threads <= 0: the number of cores. Fails if ggml has no CPU backend.
    static Result<std::unique_ptr<CpuCompute>> create(int threads);
    ~CpuCompute();
    CpuCompute(const CpuCompute&) = delete;
    CpuCompute& operator=(const CpuCompute&) = delete;

    // The backend weights are loaded for (host memory).
    ggml_backend_t cpu() const { return cpu_; }
    // Allocates the graph's tensors, calls `upload_inputs` (which writes the
    // input tensors with ggml_backend_tensor_set), computes, and keeps the
    // results readable until the next compute() call. The graph's context
    // must have been created with no_alloc = true.
    Status compute(ggml_cgraph* graph, const std::function<void()>& upload_inputs);
    int threads() const { return threads_; }

  private:
    CpuCompute() = default;
    ggml_backend_t cpu_ = nullptr;
    ggml_backend_t blas_ = nullptr;  // null when built without KILN_BLAS
    ggml_backend_sched_t sched_ = nullptr;
    int threads_ = 1;
};

}  // namespace kiln::runtime
