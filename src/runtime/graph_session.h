// One graph evaluation: a fresh no_alloc context to build in, input tensors
// whose data is uploaded once the scheduler has placed them, and helpers to
// read results back. Cut-marked tensors ("cut:<name>") can be kept readable
// for inspection (tests compare them block by block with a reference).
#pragma once

#include <string>
#include <vector>

#include "ggml.h"
#include "runtime/compute.h"
#include "runtime/device_budget.h"
#include "util/result.h"

namespace kiln::runtime {

class Executor;

class GraphSession {
  public:
    explicit GraphSession(size_t max_nodes = 65536);
    ~GraphSession();
    GraphSession(const GraphSession&) = delete;
    GraphSession& operator=(const GraphSession&) = delete;

    ggml_context* ctx() const { return ctx_; }

    // An input tensor of `type` with ggml shape `ne` (innermost first); `data`
    // (ggml_nbytes of it) is copied now and uploaded at run(). Null data
    // uploads zeros and holds no copy (a graph built only to be planned).
    ggml_tensor* input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name = nullptr);

    // Replaces the data an input tensor uploads at the next run() (its ggml_nbytes).
    void set_input(ggml_tensor* tensor, const void* data);

    // A tensor besides the output that the caller reads after a run (a
    // video decode's causal history): part of the graph, never overwritten
    // by it, and kept across segments by the executor. Before graph().
    void add_output(ggml_tensor* tensor) { extra_outputs_.push_back(tensor); }

    // Builds the graph that ends at `output` (once: later calls reuse it)
    // and runs it. A rerun on the same compute, with nothing else computed
    // there in between, reuses the allocation too: only the inputs are
    // uploaded again. With keep_cuts, every "cut:" tensor stays readable.
    Status run(Compute& compute, ggml_tensor* output, bool keep_cuts = false);
    // Runs under the memory system (runtime/executor.h).
    Status run(Executor& executor, ggml_tensor* output);

    // The graph ending at `output`, built on the first call.
    ggml_cgraph* graph(ggml_tensor* output, bool keep_cuts = false);
    uint64_t id() const { return id_; }
    // Allocates the input tensors in one buffer of `buft` (once), so a
    // segmented run finds them on its device; the ledger counts the buffer
    // until the session ends. Then upload_inputs() writes their data.
    Status bind_inputs(ggml_backend_buffer_type_t buft, DeviceLedger& ledger);
    bool inputs_bound() const { return input_buffer_ != nullptr; }
    // The bytes bind_inputs() will allocate in `buft`.
    uint64_t input_bytes(ggml_backend_buffer_type_t buft) const;
    void upload_inputs();
    // Takes ownership of the buffer holding the activations a segmented run
    // keeps between segments (counted in `ledger` until replaced or the
    // session ends): the tensors in it belong to this session's graph. A
    // layer split keeps one per device: `slot` is the device's place in the
    // split (0 for the first or only device).
    void adopt_kept_buffer(ggml_backend_buffer_t buffer, DeviceLedger& ledger, size_t slot = 0);
    ggml_backend_buffer_t kept_buffer(size_t slot = 0) const {
        return slot < kept_.size() ? kept_[slot].buffer : nullptr;
    }

    // The graph's tensor called `name` ("cut:input_blocks.3"), or nullptr.
    ggml_tensor* find(const std::string& name) const;
    // Copies a computed F32 tensor out.
    static std::vector<float> read(const ggml_tensor* tensor);

  private:
    ggml_context* ctx_ = nullptr;
    ggml_cgraph* graph_ = nullptr;
    std::vector<ggml_tensor*> extra_outputs_;
    size_t max_nodes_;
    uint64_t id_;  // distinguishes this session's graph from any other, even at the same address
    std::vector<std::pair<ggml_tensor*, std::vector<uint8_t>>> inputs_;
    ggml_backend_buffer_t input_buffer_ = nullptr;
    DeviceLedger* input_ledger_ = nullptr;
    struct Kept {
        ggml_backend_buffer_t buffer = nullptr;
        DeviceLedger* ledger = nullptr;
    };
    std::vector<Kept> kept_;
};

}  // namespace kiln::runtime
