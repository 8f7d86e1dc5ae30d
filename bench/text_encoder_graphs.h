// The text-encoder graphs one generation computes, built as the conditioner
// builds them (pipeline/conditioner.cpp) but never run: kiln-bench counts
// their FLOPs and times their products, as it does the diffusion network's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/graphs.h"
#include "pipeline/model.h"

namespace kiln::bench {

struct TextEncoderJobGraph {
    const pipeline::TextEncoder* encoder = nullptr;
    std::string label;  // "llm, 42 tokens" / "clip_l, 77 tokens x 1 chunk"
    pipeline::TextEncoderGraph graph;
    ggml_cgraph* cgraph = nullptr;
};

// Every text-encoder graph of encoding `prompts` (the prompt, then the
// negative prompt when generate() encodes one): per prompt, one graph per
// encoder of the family, with the ids the conditioner gives it: an LLM's
// templated prompt (batch 1), T5's padded sequence (batch 1), CLIP's 77-token
// chunks as one batch (the first chunk only for an encoder used for its
// pooled vector alone). CLIP's graphs are built without textual-inversion
// rows (the bench loads no embeddings) at the family's clip skip.
std::vector<TextEncoderJobGraph> build_text_encoder_graphs(const pipeline::Model& model,
                                                           const std::vector<std::string>& prompts);

// The prompts generate() encodes for a job: the prompt, and with CFG the
// negative prompt unless the family zeroes an empty one instead.
std::vector<std::string> encoded_prompts(const pipeline::Model& model, const std::string& prompt,
                                         const std::string& negative_prompt, float cfg_scale);

}  // namespace kiln::bench
