// CLIP text encoder (SD1 and SDXL's first encoder: OpenAI CLIP ViT-L/14 text
// tower in HF naming; SD2: OpenCLIP ViT-H and SDXL's second encoder: OpenCLIP
// ViT-bigG/14, in open_clip naming, fused q/k/v, with text_projection). Sizes
// come from the weights: vocabulary, width, layer count, context length,
// whether a text projection is present; heads are width / 64 as in every
// released CLIP.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/network.h"
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
    int64_t projection = 0;  // width of the pooled output after text_projection; 0: no projection
    // The projection is stored as a Linear's weight (P^T, HF and diffusers),
    // not as open_clip's P.
    bool projection_linear = false;
};

// What ClipTextEncoder::encode computes. The defaults are SD1/SD2's
// conditioning; SDXL asks for {layer_from_end 2, final_norm false} from both
// encoders and the pooled output from the second.
struct ClipTextOptions {
    // Hidden states after layer L - layer_from_end + 1 of L: 1 the last layer,
    // 2 the penultimate (clip skip); values past the first layer take the first.
    int layer_from_end = 1;
    // Whether the final layer norm is applied to those hidden states: SD1/SD2
    // yes; SDXL no (sgm's FrozenCLIPEmbedder layer "hidden" and
    // FrozenOpenCLIPEmbedder2 "penultimate" with legacy=False).
    bool final_norm = true;
    // Also compute the pooled output: the final layer norm of the LAST
    // layer's output (whatever layer_from_end says) at one position per
    // prompt, times text_projection when the weights have one (open_clip's
    // x @ P; HF-named encoders are taken without one). The position is the first one holding
    // `pooled_token` when set (as ComfyUI takes it: right with
    // textual-inversion ids above the vocabulary), else the first one holding
    // the largest token id (open_clip's and HF CLIP's argmax: the EOS).
    bool pooled = false;
    std::optional<int32_t> pooled_token;
    // F32 ne [width, n] rows for token ids vocab..vocab+n-1 (textual
    // inversion), or null.
    ggml_tensor* extra_embeddings = nullptr;
};

struct ClipTextOutput {
    ggml_tensor* hidden = nullptr;  // ne [width, context, batch]
    ggml_tensor* pooled = nullptr;  // ne [projection or width, batch]; null unless asked for
};

class ClipTextEncoder final : public TextEncoderNetwork {
  public:
    // `prefix`: where the encoder's tensors live ("cond_stage_model.transformer.",
    // "cond_stage_model.model.", SDXL's "conditioner.embedders.0.transformer." and
    // "conditioner.embedders.1.model."). Error if the tensors do not form a CLIP text encoder.
    // `hf_named_openclip`: the tower is in HF's naming but an OpenCLIP one
    // (CLIPTextModelWithProjection: SD3's CLIP-G): GELU, and the pooled
    // vector through text_projection.weight beside text_model. Otherwise an
    // HF-named tower is OpenAI's (quick GELU) and pools unprojected (Flux's
    // and SD3's CLIP-L, as their references take pooler_output).
    static Result<std::unique_ptr<ClipTextEncoder>> create(io::WeightDeclarer& weights,
                                                           bool hf_named_openclip = false);

    const ClipTextConfig& config() const { return config_; }

    // tokens: I32 ne [context, batch] (at most `context` tokens per prompt).
    // Cut markers "clip.layers.<i>" after each layer that runs.
    ClipTextOutput encode(ggml_context* ctx, ggml_tensor* tokens, const ClipTextOptions& options) const;

    // SD1/SD2's conditioning: encode() with {clip_skip, final_norm true,
    // extra_embeddings}, its hidden states.
    ggml_tensor* build(ggml_context* ctx, ggml_tensor* tokens, int clip_skip,
                       ggml_tensor* extra_embeddings = nullptr) const;

    // TextEncoderNetwork.
    int64_t width() const override { return config_.width; }
    int64_t pooled_width() const override { return config_.projection > 0 ? config_.projection : config_.width; }
    int64_t vocab() const override { return config_.vocab; }
    int64_t max_length() const override { return config_.context; }
    int64_t clip_skip_layers() const override { return config_.layers; }
    std::string label() const override { return "CLIP"; }
    bool uses_sd_name_tables() const override { return true; }
    TextEncoderTensors build(nn::GraphInputs& inputs, const TextEncodeShape& shape) const override;

  private:
    struct Layer;
    ClipTextEncoder() = default;
    void declare(io::WeightDeclarer& w);

    // HF names: "text_model.", where the tower's names start under the
    // declarer's prefix; "" for open_clip's names.
    std::string root_;
    // normed: ne [width, n, B], the final-normed last layer. Returns ne [projection or width, B].
    ggml_tensor* pool(ggml_context* ctx, ggml_tensor* normed, ggml_tensor* tokens,
                      std::optional<int32_t> pooled_token) const;

    ClipTextConfig config_;
    ggml_tensor* token_embedding_ = nullptr;
    ggml_tensor* position_embedding_ = nullptr;
    std::vector<std::shared_ptr<Layer>> layers_;
    ggml_tensor* final_norm_weight_ = nullptr;
    ggml_tensor* final_norm_bias_ = nullptr;
    ggml_tensor* projection_ = nullptr;  // open_clip: ne [projection, width] (x @ P); Linear: ne [width, projection]
};

}  // namespace kiln::models
