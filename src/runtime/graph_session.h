// One graph evaluation: a fresh no_alloc context to build in, input tensors
// whose data is uploaded once the scheduler has placed them, and helpers to
// read results back. Cut-marked tensors ("cut:<name>") can be kept readable
// for inspection (tests compare them block by block with a reference).
#pragma once

#include <string>
#include <vector>

#include "ggml.h"
#include "runtime/compute.h"
#include "util/result.h"

namespace kiln::runtime {

class GraphSession {
  public:
    explicit GraphSession(size_t max_nodes = 65536);
    ~GraphSession();
    GraphSession(const GraphSession&) = delete;
    GraphSession& operator=(const GraphSession&) = delete;

    ggml_context* ctx() const { return ctx_; }

    // An input tensor of `type` with ggml shape `ne` (innermost first); `data`
    // (ggml_nbytes of it) is copied now and uploaded at run().
    ggml_tensor* input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name = nullptr);

    // Replaces the data an input tensor uploads at the next run() (same size).
    void set_input(ggml_tensor* tensor, const void* data);

    // Builds the graph that ends at `output` (once: later calls reuse it)
    // and runs it. A rerun on the same compute, with nothing else computed
    // there in between, reuses the allocation too: only the inputs are
    // uploaded again. With keep_cuts, every "cut:" tensor stays readable.
    Status run(Compute& compute, ggml_tensor* output, bool keep_cuts = false);

    // The graph's tensor called `name` ("cut:input_blocks.3"), or nullptr.
    ggml_tensor* find(const std::string& name) const;
    // Copies a computed F32 tensor out.
    static std::vector<float> read(const ggml_tensor* tensor);

  private:
    ggml_context* ctx_ = nullptr;
    ggml_cgraph* graph_ = nullptr;
    size_t max_nodes_;
    uint64_t id_;  // distinguishes this session's graph from any other, even at the same address
    std::vector<std::pair<ggml_tensor*, std::vector<uint8_t>>> inputs_;
};

}  // namespace kiln::runtime
