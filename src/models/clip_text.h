// CLIP text encoder (SD1: OpenAI CLIP ViT-L/14 text tower in HF naming; SD2:
// OpenCLIP ViT-H in open_clip naming, fused q/k/v). Sizes come from the
// weights: vocabulary, width, layer count, context length; heads are
// width / 64 as in every released CLIP.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/model_file.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::models {

struct ClipTextConfig {
    enum class Naming { HuggingFace, OpenClip };
    Naming naming = Naming::HuggingFace;
    int64_t vocab = 0;
    int64_t width = 0;
    int64_t layers = 0;
    int64_t heads = 0;
    int64_t context = 0;  // position embeddings (77)
    int64_t intermediate = 0;
    bool quick_gelu = true;  // OpenAI CLIP: quick_gelu; OpenCLIP: gelu
};

class ClipTextEncoder {
  public:
    // `prefix`: where the encoder's tensors live ("cond_stage_model.transformer." or
    // "cond_stage_model.model."). Error if the tensors do not form a CLIP text encoder.
    static Result<std::unique_ptr<ClipTextEncoder>> create(const io::ModelFile& file, const std::string& prefix,
                                                           std::optional<ggml_type> weight_type);

    const ClipTextConfig& config() const { return config_; }
    runtime::ModuleWeights& weights() { return *weights_; }
    const runtime::ModuleWeights& weights() const { return *weights_; }

    // tokens: I32 ne [context, batch]. clip_skip 1 = last layer, 2 = penultimate, ...;
    // the final layer norm is applied to the chosen layer's output (as SD does).
    // extra_embeddings: F32 ne [width, n] rows for token ids vocab..vocab+n-1
    // (textual inversion), or null. Returns ne [width, context, batch].
    ggml_tensor* build(ggml_context* ctx, ggml_tensor* tokens, int clip_skip,
                       ggml_tensor* extra_embeddings = nullptr) const;

  private:
    struct Layer;
    ClipTextEncoder() = default;
    void declare();

    ClipTextConfig config_;
    std::unique_ptr<runtime::ModuleWeights> weights_;
    ggml_tensor* token_embedding_ = nullptr;
    ggml_tensor* position_embedding_ = nullptr;
    std::vector<std::shared_ptr<Layer>> layers_;
    ggml_tensor* final_norm_weight_ = nullptr;
    ggml_tensor* final_norm_bias_ = nullptr;
};

}  // namespace kiln::models
