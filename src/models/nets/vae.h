// AutoencoderKL (ldm naming: encoder.*, decoder.*, quant_conv, post_quant_conv),
// BFL's Flux autoencoder (the same network with 16 latent channels and no
// quant convolutions), and the KL core of FLUX.2's (32 latent channels, its
// quant convolutions inside encoder and decoder; models/nets/flux2_vae adds
// its latent normalisation).
// Channels per level, resnets per level and the latent width are read from
// the weights. The latent scale factor (0.18215 for SD1/SD2) is applied by the
// pipeline, not here.
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

struct VaeConfig {
    int64_t image_channels = 3;
    int64_t latent_channels = 4;
    std::vector<int64_t> level_channels;  // decoder level i (up.i)
    // Encoder level i (down.i): the decoder's, except where a distilled
    // decoder is narrower (FLUX.2's full_encoder_small_decoder: 128 vs 96).
    std::vector<int64_t> encoder_level_channels;
    int res_blocks = 2;  // encoder resnets per level (decoder has one more)
    bool has_encoder = true;
    bool mid_attention = true;
    // quant_conv and post_quant_conv (ldm's SD VAEs); Flux's autoencoder has
    // neither; FLUX.2's keeps them inside: encoder.quant_conv,
    // decoder.post_quant_conv.
    bool quant_convs = true;
    std::string quant_conv = "quant_conv";
    std::string post_quant_conv = "post_quant_conv";
    // Image pixels per latent pixel along each side: 2^(levels-1).
    int downscale() const { return 1 << (level_channels.size() - 1); }
};

class Vae final : public AutoencoderNetwork {
  public:
    static Result<std::unique_ptr<Vae>> create(io::WeightDeclarer& weights);
    ~Vae();
    const VaeConfig& config() const { return config_; }

    // An upsampler's output larger than this is never made whole on the CPU
    // when the block after it has a shortcut (nn/upsampled_block_cpu.h):
    // 1 GiB at 1024x1024, where it is what holds the decode's peak; 256 MiB
    // at 512x512, where the fold would cost time and save nothing needed.
    static constexpr int64_t kMaxWholeUpsampleBytes = 512ll << 20;

    // latent: ne [w, h, latent_channels, B] (unscaled) -> image ne [W, H, 3, B] in [-1, 1].
    ggml_tensor* build_decoder(ggml_context* ctx, ggml_tensor* latent,
                               nn::ComputeTarget target = nn::ComputeTarget::Cpu,
                               int64_t max_whole_upsample_bytes = kMaxWholeUpsampleBytes) const;
    // image: ne [W, H, 3, B] in [-1, 1] -> the latent distribution's mean ne
    // [w, h, latent_channels, B], or with `moments` its mean then its log
    // variance ne [w, h, 2 * latent_channels, B]. Requires config().has_encoder.
    ggml_tensor* build_encoder(ggml_context* ctx, ggml_tensor* image,
                               nn::ComputeTarget target = nn::ComputeTarget::Cpu) const;
    ggml_tensor* build_encoder_moments(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target) const;

    // AutoencoderNetwork: the builders above.
    const AutoencoderFormat& format() const override { return format_; }
    ggml_tensor* decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const override {
        return build_decoder(ctx, latent, target);
    }
    ggml_tensor* encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                        LatentEncoding encoding) const override {
        return encoding == LatentEncoding::Moments ? build_encoder_moments(ctx, image, target)
                                                   : build_encoder(ctx, image, target);
    }

  private:
    struct Blocks;
    Vae();
    void declare(io::WeightDeclarer& w);

    VaeConfig config_;
    AutoencoderFormat format_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
