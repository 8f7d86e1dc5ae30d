// A ggml scheduler as large as the graphs it has met. ggml reserves memory in
// proportion to a scheduler's graph capacity when it makes one (its context
// buffer: 1.5 GB of address space at 65536 nodes), so schedulers made for the
// largest graph kiln builds would need 15 GB of address space for a 64x64 job
// and abort under `ulimit -v`. One starts at kFirstCapacity and is made anew,
// at least twice as large, when a graph needs more; making it fails as an
// out-of-memory error, not an abort.
#pragma once

#include <cstddef>
#include <vector>

#include "ggml-backend.h"
#include "util/result.h"

namespace kiln::runtime {

class SizedScheduler {
  public:
    static constexpr size_t kFirstCapacity = 4096;

    explicit SizedScheduler(std::vector<ggml_backend_t> backends) : backends_(std::move(backends)) {}
    ~SizedScheduler() { free(); }
    SizedScheduler(const SizedScheduler&) = delete;
    SizedScheduler& operator=(const SizedScheduler&) = delete;

    // The scheduler, with room for `graph` (null: the current one, or the
    // first); a new, empty one when it had too little. `grew` (if given) says
    // whether it was made anew (its buffers and allocation are gone).
    Result<ggml_backend_sched_t> fit(ggml_cgraph* graph, bool* grew = nullptr);
    // The scheduler as it is (null before the first fit).
    ggml_backend_sched_t get() const { return sched_; }
    // Makes it anew at its capacity: its compute buffers are released.
    Status renew();

  private:
    Status make(size_t capacity);
    void free();

    std::vector<ggml_backend_t> backends_;
    ggml_backend_sched_t sched_ = nullptr;
    size_t capacity_ = 0;
};

// The tensors a scheduler meets in `graph`: its nodes and leaves.
size_t graph_tensor_count(ggml_cgraph* graph);

}  // namespace kiln::runtime
