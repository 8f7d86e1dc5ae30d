// Runs ggml graphs for one module on one compute device. The scheduler runs
// over [device, BLAS, CPU]: the device (when it is not the CPU) takes every op
// it supports, large CPU matrix products and convolutions (im2col + matmul)
// reach OpenBLAS, everything else runs on ggml's CPU kernels. compute() runs
// a whole graph for callers outside the memory system (tests, tools); the
// pipeline's modules run through runtime/executor.h, which uses the same
// schedulers under budgets and segments.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "runtime/sized_scheduler.h"
#include "util/result.h"

namespace kiln::runtime {

class Compute {
  public:
    // A compute on `device` (nullptr or a CPU device: this machine's CPU).
    // threads <= 0: the number of cores.
    static Result<std::unique_ptr<Compute>> create(ggml_backend_dev_t device, int threads);
    static Result<std::unique_ptr<Compute>> create(int threads) { return create(nullptr, threads); }
    ~Compute();
    Compute(const Compute&) = delete;
    Compute& operator=(const Compute&) = delete;

    // The backend the module's weights are loaded for: the device's, or the CPU.
    ggml_backend_t weights_backend() const { return device_ ? device_ : cpu_; }
    ggml_backend_t cpu() const { return cpu_; }
    // "CPU", "RPC0", ...
    const std::string& device_name() const { return device_name_; }
    // Measures the graph's buffers (an error if they cannot fit), allocates
    // them, calls `upload_inputs` (which writes the input tensors with
    // ggml_backend_tensor_set), computes, and keeps the results readable
    // until the next compute() call. The graph's context must have been
    // created with no_alloc = true. `graph_id` names the graph: when it is the
    // graph computed last, its allocation is still in place and is reused
    // (a sampler's every step runs the same UNet graph).
    Status compute(ggml_cgraph* graph, uint64_t graph_id, const std::function<void()>& upload_inputs);
    // Graphs allocated, and runs that reused the previous allocation.
    int allocations() const { return allocations_; }
    int reuses() const { return reuses_; }
    int threads() const { return threads_; }

    // For the memory system's executor, which allocates graphs itself: the
    // scheduler that runs graphs and the one that measures them, each with
    // room for `graph` (runtime/sized_scheduler.h; a scheduler that had to
    // grow starts empty). An out-of-memory error when one cannot be made.
    Result<ggml_backend_sched_t> sched_for(ggml_cgraph* graph, bool* grew = nullptr);
    Result<ggml_backend_sched_t> measure_sched_for(ggml_cgraph* graph);
    ggml_backend_t device_backend() const { return device_; }  // null on the CPU
    ggml_backend_dev_t device() const { return device_dev_; }  // null on the CPU
    // The buffer type weights and inputs of this compute live in.
    ggml_backend_buffer_type_t buffer_type() const;
    // Bytes of the compute buffers the scheduler holds, counting only the
    // device's (all of them on the CPU).
    uint64_t workspace_bytes() const;
    // Frees the scheduler's compute buffers (a new one starts empty).
    Status release_workspace();
    // Forget any allocation kept for reuse (the executor moved tensors).
    void invalidate() { last_graph_id_ = 0; }

  private:
    Compute() = default;
    ggml_backend_t device_ = nullptr;  // null when computing on the CPU
    ggml_backend_dev_t device_dev_ = nullptr;
    ggml_backend_t cpu_ = nullptr;
    ggml_backend_t blas_ = nullptr;  // null when built without KILN_BLAS or with KILN_NO_BLAS set
    std::unique_ptr<SizedScheduler> sched_;
    std::unique_ptr<SizedScheduler> measure_sched_;
    std::vector<ggml_backend_t> backends_;
    std::string device_name_ = "CPU";
    int threads_ = 1;
    uint64_t last_graph_id_ = 0;  // 0: none
    int allocations_ = 0;
    int reuses_ = 0;
};

}  // namespace kiln::runtime
