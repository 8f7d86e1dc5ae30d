#include "models/nets/block_stages.h"

#include <algorithm>
#include <vector>

#include "nn/shapes.h"

namespace kiln::models {

bool stage_embeds(const BlockSplit& split) {
    return split.stage == BlockStage::Whole || split.stage == BlockStage::Front;
}

ggml_tensor* run_block_stage(ggml_context* ctx, const BlockSplit& split, int64_t blocks, ggml_tensor* embedded,
                             ggml_tensor* stream, ggml_tensor* residual,
                             const std::function<ggml_tensor*(int64_t, ggml_tensor*)>& block, StageResults& kept) {
    const int64_t front = std::clamp<int64_t>(split.front, 0, blocks);
    const int64_t back_start = std::clamp<int64_t>(blocks - split.back, front, blocks);
    int64_t first = 0, last = blocks;
    ggml_tensor* x = embedded;
    switch (split.stage) {
        case BlockStage::Whole: break;
        case BlockStage::Front: last = front; break;
        case BlockStage::Rest:
            x = stream;
            first = front;
            break;
        case BlockStage::Cached:
            x = ggml_add(ctx, stream, residual);
            first = back_start;
            break;
    }
    kept.first = x;
    ggml_tensor* before_back = nullptr;
    for (int64_t i = first; i < last; ++i) {
        if (i == back_start) before_back = x;
        x = block(i, x);
    }
    if (split.stage == BlockStage::Rest) kept.middle = ggml_sub(ctx, before_back ? before_back : x, stream);
    return x;
}

namespace {

ggml_tensor* flat(ggml_context* ctx, ggml_tensor* t) {
    return ggml_reshape_1d(ctx, ggml_cont(ctx, t), ggml_nelements(t));
}

}  // namespace

ggml_tensor* block_stage_output(ggml_context* ctx, const BlockSplit& split, ggml_tensor* stream,
                                ggml_tensor* prediction, const StageResults& kept) {
    switch (split.stage) {
        case BlockStage::Front: return ggml_concat(ctx, stream, ggml_sub(ctx, stream, kept.first), 2);
        case BlockStage::Rest: return ggml_concat(ctx, flat(ctx, prediction), flat(ctx, kept.middle), 0);
        case BlockStage::Whole:
        case BlockStage::Cached: break;
    }
    return prediction;
}

void make_stage_inputs(nn::GraphInputs& inputs, const BlockSplit& split, int64_t width, int64_t tokens, int64_t batch,
                       DiffusionTensors& tensors) {
    if (stage_embeds(split)) return;
    tensors.stream = inputs.input(GGML_TYPE_F32, {width, tokens, batch}, nullptr, "stream");
    if (split.stage == BlockStage::Cached) {
        tensors.residual = inputs.input(GGML_TYPE_F32, {width, tokens, batch}, nullptr, "residual");
    }
}

std::string stage_inputs_problem(const BlockSplit& split, const ggml_tensor* stream, const ggml_tensor* residual,
                                 int64_t width, int64_t tokens, int64_t batch) {
    if (stage_embeds(split)) return {};
    const std::vector<int64_t> ne = {width, tokens, batch};
    auto check = [&](const ggml_tensor* t, const char* name) -> std::string {
        if (!t) return std::string("this block stage needs the ") + name + " input, ne " + nn::ne_string(ne);
        if (t->type != GGML_TYPE_F32 || !nn::has_ne(t, ne))
            return std::string(name) + " is " + nn::ne_string(t) + ", this block stage needs F32 " + nn::ne_string(ne);
        return {};
    };
    std::string problem = check(stream, "stream");
    if (problem.empty() && split.stage == BlockStage::Cached) problem = check(residual, "residual");
    return problem;
}

}  // namespace kiln::models
