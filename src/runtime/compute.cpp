#include "runtime/compute.h"

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ggml-cpu.h"
#include "runtime/blas_core.h"
#include "runtime/blas_device.h"
#include "runtime/blas_threads.h"
#include "runtime/host_memory.h"
#include "util/format.h"
#include "util/log.h"
#if __has_include("ggml-blas.h")
#include "ggml-blas.h"
#endif

namespace kiln::runtime {

Result<std::unique_ptr<Compute>> Compute::create(ggml_backend_dev_t device, int threads) {
    std::unique_ptr<Compute> c(new Compute());
    c->threads_ = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    c->cpu_ = ggml_backend_cpu_init();
    if (!c->cpu_) return Error{"cannot initialise ggml's CPU backend"};
    ggml_backend_cpu_set_n_threads(c->cpu_, c->threads_);
    std::vector<ggml_backend_t> backends;
    if (device && ggml_backend_dev_type(device) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        c->device_ = ggml_backend_dev_init(device, nullptr);
        if (!c->device_) return Error{std::string("cannot initialise device ") + ggml_backend_dev_name(device)};
        c->device_dev_ = device;
        c->device_name_ = ggml_backend_dev_name(device);
        backends.push_back(c->device_);
    }
#ifdef GGML_USE_BLAS
    c->blas_ = getenv("KILN_NO_BLAS") || !blas_device() ? nullptr : ggml_backend_dev_init(blas_device(), nullptr);
    if (c->blas_) {
        const CpuThreadSplit split = split_cpu_threads(c->threads_, blas_shares_openmp_pool());
        ggml_backend_cpu_set_n_threads(c->cpu_, split.ggml_cpu);
        ggml_backend_blas_set_n_threads(c->blas_, split.blas);
        backends.push_back(c->blas_);
        static const bool logged = [] {  // once a process: the kernels are the library's, chosen as it loaded
            const char* requested = std::getenv("OPENBLAS_CORETYPE");
            const char* fallback = std::getenv("KILN_BLAS_RESTARTED");  // tools/cli/main.cpp
            std::string why;
            if (requested) {
                why = std::string(" (OPENBLAS_CORETYPE=") + requested;
                if (fallback) why += std::string(", set by kiln: OpenBLAS fell back to its ") + fallback + " kernels";
                why += ")";
            }
            KILN_LOG_VERBOSE("OpenBLAS runs its %s kernels%s", openblas_core().c_str(), why.c_str());
            return true;
        }();
        (void)logged;
    }
#endif
    backends.push_back(c->cpu_);  // the scheduler's last backend must be the CPU
    c->backends_ = backends;
    c->sched_ = std::make_unique<SizedScheduler>(backends);
    c->measure_sched_ = std::make_unique<SizedScheduler>(backends);
    return c;
}

ggml_backend_buffer_type_t Compute::buffer_type() const {
    return device_ ? ggml_backend_get_default_buffer_type(device_) : ggml_backend_cpu_buffer_type();
}

uint64_t Compute::workspace_bytes() const {
    ggml_backend_sched_t sched = sched_ ? sched_->get() : nullptr;
    if (!sched) return 0;
    if (device_) return ggml_backend_sched_get_buffer_size(sched, device_);
    uint64_t total = 0;
    for (ggml_backend_t b : backends_) total += ggml_backend_sched_get_buffer_size(sched, b);
    return total;
}

Status Compute::release_workspace() {
    last_graph_id_ = 0;
    return sched_->get() ? sched_->renew() : Status::Ok();
}

Result<ggml_backend_sched_t> Compute::sched_for(ggml_cgraph* graph, bool* grew) {
    bool made = false;
    auto sched = sched_->fit(graph, &made);
    if (made) last_graph_id_ = 0;
    if (grew) *grew = made;
    return sched;
}

Result<ggml_backend_sched_t> Compute::measure_sched_for(ggml_cgraph* graph) { return measure_sched_->fit(graph); }

Compute::~Compute() {
    sched_.reset();  // before the backends it runs on
    measure_sched_.reset();
    if (blas_) ggml_backend_free(blas_);
    if (cpu_) ggml_backend_free(cpu_);
    if (device_) ggml_backend_free(device_);
}

Status Compute::compute(ggml_cgraph* graph, uint64_t graph_id, const std::function<void()>& upload_inputs) {
    auto fitted = sched_for(graph);
    if (!fitted.ok()) return fitted.error();
    ggml_backend_sched_t sched = *fitted;
    // Uploads the inputs and runs the graph the scheduler holds allocated.
    auto run_allocated = [&]() -> Status {
        if (upload_inputs) upload_inputs();
        const ggml_status status = ggml_backend_sched_graph_compute(sched, graph);
        if (status == GGML_STATUS_SUCCESS) return Status::Ok();
        last_graph_id_ = 0;
        return Error{"graph compute failed on " + device_name_ + ": " + ggml_status_to_string(status)};
    };
    if (graph_id != 0 && graph_id == last_graph_id_) {
        ++reuses_;
        return run_allocated();
    }
    last_graph_id_ = 0;  // until this graph is allocated
    ++allocations_;
    if (device_) {
        // On a device, measure-then-reserve on this scheduler loses the copies
        // of graph inputs that feed the device's split (seen with RPC), so
        // the graph is allocated directly (runtime/executor.h places the
        // inputs on the device first, and measures on a second scheduler).
        ggml_backend_sched_reset(sched);
        if (!ggml_backend_sched_alloc_graph(sched, graph)) {
            return Error::out_of_memory("out of memory on " + device_name_ +
                                        " allocating the compute buffers of a graph of " +
                                        std::to_string(ggml_graph_n_nodes(graph)) + " nodes");
        }
    } else {
        // On the CPU, measure first: a failed allocation inside ggml's
        // allocator leaves the scheduler unusable (and unsafe to free), while
        // a measured graph that does not fit is a plain error and the next
        // job still runs.
        std::vector<size_t> sizes(static_cast<size_t>(ggml_backend_sched_get_n_backends(sched)), 0);
        ggml_backend_sched_reserve_size(sched, graph, sizes.data());
        uint64_t needed = 0;
        for (size_t size : sizes) needed = needed + size < needed ? UINT64_MAX : needed + size;
        const uint64_t available = host_available_bytes();
        if (needed > available) {
            return Error::out_of_memory("out of memory: this step needs " + human_bytes(needed) +
                                        " of compute buffers, " + human_bytes(available) +
                                        " is available (try a smaller image or --vae-tiling)");
        }
        // The measure released the buffers it would have to grow; reserve
        // them for real before allocating the graph in them.
        if (!ggml_backend_sched_reserve(sched, graph) || !ggml_backend_sched_alloc_graph(sched, graph)) {
            return Error::out_of_memory("out of memory allocating the compute buffers of a graph of " +
                                        std::to_string(ggml_graph_n_nodes(graph)) + " nodes");
        }
    }
    last_graph_id_ = graph_id;
    return run_allocated();
}

}  // namespace kiln::runtime
