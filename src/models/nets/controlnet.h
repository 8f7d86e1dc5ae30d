// ControlNet (Zhang et al. 2023; ldm's cldm.py ControlNet, sgm's for SDXL):
// a copy of a UNet's encoder half (time and label embedding, input_blocks,
// middle_block; models/nets/unet_encoder.h) that also reads a control image
// through its input_hint_block (eight 3x3 convolutions with SiLU between,
// three of them with stride 2: the image at 8x the latent's size becomes
// input_blocks.0's width) and gives, through 1x1 zero convolutions
// (zero_convs.K after input_blocks.K, middle_block_out after the middle
// block), one residual per input block and one for the middle block. The
// UNet adds them to its skip connections (models/nets/unet.h UnetInputs::control).
//
// Configured from its weights like the UNet: tensors under "control_model."
// (the original .pth / .safetensors releases, control_v11p_sd15_canny) or
// with no prefix (diffusers-converted single files, ComfyUI). SDXL
// ControlNets have label_emb and per-level transformer depths. The metadata
// keys of models/nets/unet.h fix the heads of small test models.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/nets/unet.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

struct ControlNetConfig {
    UnetConfig unet;  // the encoder half's shape (out_channels and output_depth unused)
    int64_t hint_channels = 3;
    // Output channels of input_hint_block's convolutions (ldm: 16, 16, 32,
    // 32, 96, 96, 256, then model_channels).
    std::vector<int64_t> hint_widths;
    // The control image is this many times the latent's size (8).
    static constexpr int kHintDownscale = 8;
};

// One residual's shape, ne [W, H, C] (the batch is the UNet's).
struct ControlResidualShape {
    int64_t w = 0, h = 0, c = 0;
    int64_t values() const { return w * h * c; }
};

class ControlNet final : public Network {
  public:
    // LoRAs are trained for the model, not its ControlNet, whose bare
    // names (input_blocks.*) would make the UNet's ambiguous.
    bool takes_lora() const override { return false; }

    // The ControlNet under `prefix` in `file`; an error naming what is
    // missing or malformed when the tensors are no ControlNet.
    static Result<std::unique_ptr<ControlNet>> create(io::WeightDeclarer& weights);
    // "control_model." when a file holds ldm's names, else "" (bare names);
    // none when the file holds no ControlNet (no input_hint_block).
    static std::optional<std::string> find_prefix(const io::ModelFile& file);
    ~ControlNet();

    const ControlNetConfig& config() const { return config_; }

    // The residuals of a latent_w x latent_h latent, in the order build()
    // gives them and the UNet takes them: input_blocks.0.. then the middle.
    std::vector<ControlResidualShape> residual_shapes(int64_t latent_w, int64_t latent_h) const;

    // `inputs` as the UNet takes them (x already scaled by c_in; control
    // fields unused) and `hint` ne [8 W, 8 H, hint_channels, B or 1], the
    // control image in [0, 1]. Returns every residual flattened and
    // concatenated in residual_shapes() order, batch item after batch item
    // within each residual (a graph has one output), with cut markers
    // "input_hint_block", "input_blocks.K" and "middle_block". An error
    // (nothing built) when the inputs do not fit the network.
    Result<ggml_tensor*> build(ggml_context* ctx, const UnetInputs& inputs, ggml_tensor* hint,
                               const UnetBuildOptions& options) const;

  private:
    struct Blocks;
    ControlNet();

    ControlNetConfig config_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
