// The SD1.x / SD2.x UNet (ldm's UNetModel) including the 9-channel
// inpainting variant. Its shape is read from the weights: base channels,
// channels per level, resnets per level, which levels have attention,
// transformer depth, context width, linear or 1x1-conv transformer projections
// (SD2 uses linear). Heads: SD1 (context 768) has 8; others 64-wide heads;
// the metadata key "kiln.unet.heads" overrides both (small test models).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::models {

struct UnetConfig {
    int64_t in_channels = 4;
    int64_t out_channels = 4;
    int64_t model_channels = 320;
    int64_t time_embed_dim = 1280;
    int64_t context_dim = 768;
    std::vector<int64_t> level_channels;  // channels of each level
    std::vector<bool> level_attention;    // whether each level has transformers
    int res_blocks = 2;                   // resnets per down level (up levels have one more)
    int transformer_depth = 1;
    bool linear_projection = false;  // SD2: proj_in/out are linear layers
    int64_t heads = 8;
};

class Unet {
  public:
    static Result<std::unique_ptr<Unet>> create(const io::ModelFile& file, const std::string& prefix,
                                                std::optional<ggml_type> weight_type);
    ~Unet();
    const UnetConfig& config() const { return config_; }
    runtime::ModuleWeights& weights() { return *weights_; }
    const runtime::ModuleWeights& weights() const { return *weights_; }

    // x: ne [W, H, in_channels, B] (latent, already scaled by c_in);
    // timesteps: F32 ne [B]; context: ne [context_dim, tokens, B].
    // Returns the model output ne [W, H, out_channels, B] (eps or v).
    // W and H must be multiples of 2^(levels-1).
    ggml_tensor* build(ggml_context* ctx, ggml_tensor* x, ggml_tensor* timesteps, ggml_tensor* context,
                       bool flash_attention) const;

  private:
    struct Blocks;
    Unet();
    Status declare();

    UnetConfig config_;
    std::unique_ptr<runtime::ModuleWeights> weights_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
