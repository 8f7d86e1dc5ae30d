// The UNet of SD1.x / SD2.x (ldm's UNetModel) and SDXL (sgm's UNetModel),
// including the 9-channel inpainting variants. Its shape is read from the
// weights: base channels, channels per level, resnets per level, the
// transformer depth of every block (0: none; SDXL base 0/2/10 with 10 in the
// middle, SSD-1B and Vega fewer, and no middle transformer), context width,
// linear or 1x1-conv transformer projections (SD2 and SDXL use linear), and
// whether a label_emb takes a vector `y` into the time embedding (SDXL:
// adm_in_channels 2816, the pooled text embedding and size conditioning).
// Heads: SD1 (context 768) has 8 per transformer; others have 64-wide heads
// (ldm's SD2 and sgm's SDXL num_head_channels 64: 5 at 320 channels, 10 at
// 640, 20 at 1280). The metadata keys
// "kiln.unet.heads" (a fixed count) and "kiln.unet.head_channels" (a fixed
// width) override these (small test models).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct UnetConfig {
    int64_t in_channels = 4;
    int64_t out_channels = 4;
    int64_t model_channels = 320;
    int64_t time_embed_dim = 1280;
    int64_t context_dim = 768;
    int64_t adm_in_channels = 0;          // width of label_emb's input `y` (SDXL 2816); 0: no label_emb
    std::vector<int64_t> level_channels;  // channels of each level
    int res_blocks = 2;                   // resnets per down level (up levels have one more)
    // Transformer depth (transformer_blocks.N count) of every block, 0 where
    // it has none: input_blocks.1.. (downsamplers included, as 0), the middle
    // block (0: resnet, resnet), output_blocks.0..
    std::vector<int> input_depth;
    int middle_depth = 1;
    std::vector<int> output_depth;
    bool linear_projection = false;  // SD2, SDXL: proj_in/out are linear layers
    int64_t heads = 8;               // heads of every transformer, when head_channels is 0
    int64_t head_channels = 0;       // > 0: each transformer has channels / head_channels heads

    // Heads of a transformer over `channels` channels.
    int64_t heads_at(int64_t channels) const { return head_channels > 0 ? channels / head_channels : heads; }
};

// The inputs of one UNet evaluation (ggml ne order).
struct UnetInputs {
    ggml_tensor* x = nullptr;          // ne [W, H, in_channels, B]: the latent, already scaled by c_in
    ggml_tensor* timesteps = nullptr;  // F32 ne [B]
    ggml_tensor* context = nullptr;    // ne [context_dim, tokens, B]
    ggml_tensor* y = nullptr;          // ne [adm_in_channels, B] when the UNet has label_emb, else null
    // A ControlNet's residuals (models/nets/controlnet.h), as ldm's
    // ControlledUnetModel adds them: one per input block output (the shape
    // of input_blocks.K's output), then one for the middle block; each is
    // multiplied by control_strength and added to the skip connection the
    // output block reads, the last to the middle block's output. Empty: no
    // control, and the graph is the plain UNet's.
    std::vector<ggml_tensor*> control;
    float control_strength = 1.0f;
};

struct UnetBuildOptions {
    bool flash_attention = false;  // ggml's fused kernel: K/V in F16, not bit-identical
    // Where the graph computes (nn::conv2d's form, attention score blocks).
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
};

class Unet final : public DiffusionNetwork {
  public:
    static Result<std::unique_ptr<Unet>> create(io::WeightDeclarer& weights);
    ~Unet();
    const UnetConfig& config() const { return config_; }

    // Returns the model output ne [W, H, out_channels, B] (eps or v), with cut
    // markers "input_blocks.K", "middle_block", "output_blocks.K". An error
    // (nothing built) when the inputs do not fit the network: x's channels,
    // W and H not multiples of 2^(levels-1), the context width, batch sizes,
    // or `y` missing for a UNet with label_emb, given to one without, or of
    // the wrong width, or control residuals of the wrong count or shapes.
    Result<ggml_tensor*> build(ggml_context* ctx, const UnetInputs& inputs, const UnetBuildOptions& options) const;

    // DiffusionNetwork: the inputs above, the ControlNet's residuals when
    // the shape has them.
    const DiffusionCapabilities& capabilities() const override { return capabilities_; }
    Status check_conditioning(const ConditioningShape& shape) const override;
    Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const override;
    // Same context width (SD1 768, SD2 1024, SDXL 2048), channels and label_emb vector.
    Status check_control_net(const ControlNet& net, const std::string& family_label) const override;
    bool uses_sd_name_tables() const override { return true; }
    // The block layout as the diffusers name tables number blocks.
    std::optional<io::UnetLayout> unet_layout() const override;

    // SD1/SD2's call: build() without y. Requires a UNet without label_emb
    // and inputs that fit (the pipeline validates sizes first); null otherwise.
    ggml_tensor* build(ggml_context* ctx, ggml_tensor* x, ggml_tensor* timesteps, ggml_tensor* context,
                       bool flash_attention) const;

  private:
    struct Blocks;  // the decoder half; the encoder half is models/nets/unet_encoder.h's
    Unet();
    Status declare(io::WeightDeclarer& w);

    UnetConfig config_;
    DiffusionCapabilities capabilities_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
