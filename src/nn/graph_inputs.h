// Where a graph builder gets its inputs: leaves whose data the host gives.
// A network makes its own inputs through this, host-side tables included
// (RoPE, masks, pads), as llama.cpp's graph inputs fill themselves, so no
// caller prepares another network's tables. The caller (pipeline/graphs.h)
// implements it over a graph session of the runtime, and sets the inputs
// that change per evaluation (the latent, the timestep) before each run.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml.h"

namespace kiln::nn {

class GraphInputs {
  public:
    virtual ~GraphInputs() = default;
    // The context the graph is built in.
    virtual ggml_context* ctx() = 0;
    // A leaf of `type` and ggml shape `ne` (innermost first) named `name`,
    // holding `data` (ggml_nbytes of it, copied now), or zeros when `data`
    // is null.
    virtual ggml_tensor* input(ggml_type type, const std::vector<int64_t>& ne, const void* data, const char* name) = 0;
};

}  // namespace kiln::nn
