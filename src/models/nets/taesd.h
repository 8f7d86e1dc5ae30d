// The decoder of a Tiny AutoEncoder (madebyollin's TAESD for SD1.x/SD2.x,
// TAESDXL for SDXL, TAEF1 for Flux's 16-channel latent, which Chroma and
// Z-Image share): a small stack of 3x3 convolutions and ReLUs that turns a
// diffusion latent into an image almost for free (--preview tae, --taesd).
//
//   tanh(z / 3) * 3                      the Clamp: latents past +-3 saturate
//   conv(latent, C), ReLU
//   stages of Blocks, each but the last followed by a 2x nearest upsample and
//   a 3x3 conv without bias; Block(x) = ReLU(conv(ReLU(conv(ReLU(conv(x))))) + skip(x))
//   conv(C, 3)                            the image in [0, 1]
//
// It reads the scaled latent the sampler works on (the same "latent API"
// as the model's VAE after its scale and shift), not the VAE's raw latent.
// The layout (latent channels, width, blocks per stage, where the upsamples
// are) is read from the weights, in either naming:
//   madebyollin's taesd_decoder.safetensors   "1.weight", "3.conv.0.weight", ...
//                                             (its nn.Sequential indices; 0 is the Clamp)
//   diffusers' AutoencoderTiny, sd-cli's      "decoder.layers.0.weight", "decoder.layers.2.conv.0.weight", ...
//                                             (the same layers one index lower; the Clamp is in forward())
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

struct TaesdConfig {
    int64_t latent_channels = 4;
    int64_t channels = 64;              // the width of every Block
    std::vector<int> blocks_per_stage;  // {3, 3, 3, 1}: one stage more than upsamples
    // Image pixels per latent pixel along each side: 2^(stages-1) (8).
    int upscale() const { return 1 << (blocks_per_stage.size() - 1); }
};

class Taesd final : public Network {
  public:
    // A preview decoder: LoRAs trained for the model do not change it.
    bool takes_lora() const override { return false; }

    // The decoder's tensors in `file` under `prefix` + either naming above.
    // Errors name what is missing or malformed.
    static Result<std::unique_ptr<Taesd>> create(io::WeightDeclarer& weights);
    ~Taesd();
    const TaesdConfig& config() const { return config_; }

    // latent: ne [w, h, latent_channels, B] (scaled) -> image ne [w * upscale, h * upscale, 3, B],
    // about [0, 1] (not clamped).
    ggml_tensor* build_decoder(ggml_context* ctx, ggml_tensor* latent,
                               nn::ComputeTarget target = nn::ComputeTarget::Cpu) const;

  private:
    struct Layers;
    Taesd();

    TaesdConfig config_;
    std::unique_ptr<Layers> layers_;
};

}  // namespace kiln::models
