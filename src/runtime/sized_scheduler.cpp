#include "runtime/sized_scheduler.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "ggml-impl.h"  // struct ggml_cgraph: its leaf count
#include "util/format.h"

namespace kiln::runtime {

size_t graph_tensor_count(ggml_cgraph* graph) {
    return static_cast<size_t>(graph->n_nodes) + static_cast<size_t>(graph->n_leafs);
}

Status SizedScheduler::make(size_t capacity) {
    free();
    // ggml does not check its own reservation (it aborts later on the null
    // buffer): try it first, so a limit is an error here. The size is
    // ggml_backend_sched_new's context buffer (GGML_SCHED_MAX_SPLIT_INPUTS is
    // 30); twice it leaves room for the scheduler's other tables and the
    // graph contexts ggml makes beside it.
    const size_t reserved = capacity * 30 * 2 * sizeof(ggml_tensor) + ggml_graph_overhead_custom(capacity, false);
    void* probe = std::malloc(2 * reserved);
    if (!probe) {
        return Error::out_of_memory("out of memory: a ggml scheduler for graphs of " + std::to_string(capacity) +
                                    " tensors needs " + human_bytes(reserved) + " of address space");
    }
    std::free(probe);
    sched_ = ggml_backend_sched_new(backends_.data(), nullptr, static_cast<int>(backends_.size()), capacity,
                                    /*parallel=*/false, /*op_offload=*/false);
    if (!sched_) {
        return Error::out_of_memory("out of memory: cannot make a ggml scheduler for graphs of " +
                                    std::to_string(capacity) + " tensors");
    }
    capacity_ = capacity;
    return Status::Ok();
}

void SizedScheduler::free() {
    if (sched_) ggml_backend_sched_free(sched_);
    sched_ = nullptr;
}

Result<ggml_backend_sched_t> SizedScheduler::fit(ggml_cgraph* graph, bool* grew) {
    // The scheduler's hash set holds the graph's tensors and the copies its
    // splits add: room for twice the graph.
    const size_t needed = graph ? 2 * graph_tensor_count(graph) + 1024 : 0;
    if (grew) *grew = false;
    if (sched_ && needed <= capacity_) return sched_;
    size_t capacity = std::max(kFirstCapacity, capacity_ * 2);
    while (capacity < needed) capacity *= 2;
    KILN_TRY(make(capacity));
    if (grew) *grew = true;
    return sched_;
}

Status SizedScheduler::renew() { return make(std::max(capacity_, kFirstCapacity)); }

}  // namespace kiln::runtime
