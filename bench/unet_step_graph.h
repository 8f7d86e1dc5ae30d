// The UNet graph of one denoising step, built as sampling builds it
// (pipeline/generate.cpp; pipeline/job_forecast.cpp measures it the same way)
// but never run: the benchmarks count its FLOPs and list its products.
#pragma once

#include <memory>

#include "ggml.h"
#include "pipeline/model.h"
#include "runtime/graph_session.h"

namespace kiln::bench {

struct UnetStepGraph {
    std::unique_ptr<runtime::GraphSession> session;  // owns the graph
    ggml_cgraph* graph = nullptr;
};

// A width x height job (pixels); with `cfg` the conditional and unconditional
// passes run as one batch of two, as generate() runs them. Needs the model's
// weight tensors declared, not loaded (a plan-only load will do). graph is
// null when the UNet refuses the shapes.
UnetStepGraph build_unet_step_graph(const pipeline::Model& model, int width, int height, bool cfg,
                                    bool flash_attention);

}  // namespace kiln::bench
