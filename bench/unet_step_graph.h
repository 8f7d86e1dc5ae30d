// The diffusion network's graph of one denoising step (a UNet or a DiT),
// built as sampling builds it (pipeline/generate.cpp; pipeline/job_forecast.cpp
// measures it the same way) but never run: the benchmarks count its FLOPs and
// list its products.
#pragma once

#include <memory>
#include <string>

#include "ggml.h"
#include "pipeline/model.h"
#include "runtime/graph_session.h"

namespace kiln::bench {

struct UnetStepGraph {
    std::unique_ptr<runtime::GraphSession> session;  // owns the graph
    ggml_cgraph* graph = nullptr;
};

// A width x height job (pixels); with `cfg` the conditional and unconditional
// passes run as one batch of two, as generate() runs them. The context is as
// long as `prompt` makes it (pipeline::context_length: an LLM's templated
// prompt; CLIP's one chunk and T5's fixed length whatever the prompt; null:
// the length kiln plan assumes). Needs the model's weight tensors declared,
// not loaded (a plan-only load will do), and the LLM's tokenizer for a
// prompt. graph is null when the network refuses the shapes.
// A video network's step covers `latent_frames` latent frames.
UnetStepGraph build_unet_step_graph(const pipeline::Model& model, int width, int height, bool cfg, bool flash_attention,
                                    const std::string* prompt, int64_t latent_frames = 1);

}  // namespace kiln::bench
