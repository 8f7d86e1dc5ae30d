// CLIP's vision tower (OpenCLIP ViT-H/14, "CLIP-vision-H"), as Wan 2.1's
// image-to-video and first-last-frame models read an image: the hidden
// states of every token (the class token, then the patches in row order)
// after all transformer layers but the last, without the final norm (Wan's
// CLIPModel.visual with use_31_block, sd-cli's clip_skip -2). PyTorch
// reference: training/reference/clip_vision.py.
//
// Weights in HF's CLIPVisionModelWithProjection names, as ComfyUI's
// clip_vision_h.safetensors has them: vision_model.embeddings.{class_embedding,
// patch_embedding (a Conv2d without bias, kernel = stride = patch),
// position_embedding}, vision_model.pre_layrnorm, vision_model.encoder.layers.N
// (layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2:
// pre-norm, GELU). The last layer, post_layernorm and visual_projection are
// never read, so they are not loaded. Configuration from the weights: width
// and patch from the patch embedding, the image side from the position
// embedding's (side / patch)^2 + 1 rows; heads 16 (ViT-H's), or metadata
// "kiln.clip.heads" (small test models).
//
// An image enters at exactly image_side() x image_side() with values in
// [0, 1]; the tower normalises it by CLIP's mean and deviation itself.
#pragma once

#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct ClipVisionConfig {
    int64_t width = 1280;
    int64_t patch = 14;
    int64_t image_side = 224;
    int64_t heads = 16;
    int64_t intermediate = 5120;
    int layers = 32;  // in the file; the tower runs layers - 1

    int64_t patches_per_side() const { return image_side / patch; }
    int64_t tokens() const { return patches_per_side() * patches_per_side() + 1; }
};

class ClipVisionEncoder final : public VisionEncoderNetwork {
  public:
    // Error (BadFile) naming what is wrong when the tensors under the
    // declarer's prefix are not a CLIP vision tower.
    static Result<std::unique_ptr<ClipVisionEncoder>> create(io::WeightDeclarer& weights);
    ~ClipVisionEncoder() override;

    const ClipVisionConfig& config() const { return config_; }
    int64_t out_width() const override { return config_.width; }
    int64_t size_unit() const override { return config_.patch; }
    int64_t input_side() const override { return config_.image_side; }
    int64_t tokens(int64_t width, int64_t height) const override {
        return (width / config_.patch) * (height / config_.patch) + 1;
    }
    // Returns ne [width, tokens()]. An image of another size than
    // image_side() gives a null out.
    VisionEncoderTensors build(nn::GraphInputs& inputs, const VisionEncodeShape& shape) const override;

    // The normalised patches of an image ne [side, side, 3] in [0, 1]: one
    // row of 3 * patch * patch values (channel, row, column: the patch
    // kernel's order) per patch, patches in row order.
    std::vector<float> patch_rows(const float* image) const;

  private:
    struct Layer;
    ClipVisionEncoder();
    void declare(io::WeightDeclarer& w);

    ClipVisionConfig config_;
    ggml_tensor* patch_kernel_ = nullptr;  // ne [p, p, 3, width]
    ggml_tensor* class_embedding_ = nullptr;
    ggml_tensor* position_embedding_ = nullptr;
    nn::Norm pre_norm_;
    std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace kiln::models
