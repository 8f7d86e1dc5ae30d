// The block loop of a DiT that builds the BlockStage parts of an evaluation
// (models/network.h) for block-level step caches: which blocks a stage runs,
// what stream it starts from, and what its graph gives back. A network
// embeds its tokens, hands its blocks to run_block_stage and its final layer's
// prediction to block_stage_output; nothing else in it knows the stages.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ggml.h"
#include "models/network.h"

namespace kiln::models {

// Whether the stage starts from the embedded tokens (Whole, Front) rather than
// the stream inputs (Rest, Cached): a network skips its embeddings otherwise.
bool stage_embeds(const BlockSplit& split);

// Runs `block(i, x)` for the blocks the stage covers, from `embedded` (Whole,
// Front), `stream` (Rest) or `stream + residual` (Cached), and returns the
// stream after them; what the Front and Rest outputs also need is left in
// `kept` for block_stage_output.
struct StageResults {
    ggml_tensor* first = nullptr;   // Front: the stream the first block took
    ggml_tensor* middle = nullptr;  // Rest: the middle blocks' residual
};
ggml_tensor* run_block_stage(ggml_context* ctx, const BlockSplit& split, int64_t blocks, ggml_tensor* embedded,
                             ggml_tensor* stream, ggml_tensor* residual,
                             const std::function<ggml_tensor*(int64_t, ggml_tensor*)>& block, StageResults& kept);

// The stage's graph output (BlockStage says what): `stream` is what
// run_block_stage returned, `prediction` the final layer's (null for Front).
ggml_tensor* block_stage_output(ggml_context* ctx, const BlockSplit& split, ggml_tensor* stream,
                                ggml_tensor* prediction, const StageResults& kept);

// The stream and residual inputs a Rest or Cached stage takes, ne [width,
// tokens, batch], made in `inputs` into `tensors`.
void make_stage_inputs(nn::GraphInputs& inputs, const BlockSplit& split, int64_t width, int64_t tokens, int64_t batch,
                       DiffusionTensors& tensors);

// What is wrong with the stream and residual inputs a stage was given (Rest:
// the stream, Cached: both, ne [width, tokens, batch] each; Whole and Front:
// neither is read), or empty when nothing is.
std::string stage_inputs_problem(const BlockSplit& split, const ggml_tensor* stream, const ggml_tensor* residual,
                                 int64_t width, int64_t tokens, int64_t batch);

}  // namespace kiln::models
