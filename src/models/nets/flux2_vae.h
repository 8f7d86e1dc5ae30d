// FLUX.2's autoencoder (BFL's flux2 autoencoder.py): the KL autoencoder of
// models/nets/vae.h with 32 latent channels and its quant convolutions
// inside encoder and decoder, whose latent the DiT sees patchified 2x2 and
// normalised by the batch-norm statistics the file carries:
//   encode: mean of encoder(x) (32 ch) -> patchify "c (i 2) (j 2) -> (c 2 2) i j"
//           -> z = (p - bn.running_mean) / sqrt(bn.running_var + 1e-4)   (128 ch, 16x)
//   decode: the inverse, then the decoder.
// No other scale or shift. BFL's `ae.safetensors` (sd-cli's
// flux2_ae.safetensors) and `full_encoder_small_decoder.safetensors` (a
// narrower decoder, read from its widths) both load.
#pragma once

#include <memory>

#include "io/weight_declarer.h"
#include "models/nets/vae.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

class Flux2Vae final : public AutoencoderNetwork {
  public:
    // Error (BadFile) when the KL autoencoder is missing or its latent does
    // not match the statistics (4 x latent channels of them).
    static Result<std::unique_ptr<Flux2Vae>> create(io::WeightDeclarer& weights);
    ~Flux2Vae() override;

    // The KL autoencoder inside (its 32-channel latent).
    const Vae& kl() const { return *kl_; }

    const AutoencoderFormat& format() const override { return format_; }
    ggml_tensor* decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const override;
    ggml_tensor* encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                        LatentEncoding encoding) const override;

  private:
    Flux2Vae();
    // p ne [w, h, 128, B] -> (p - mean) / std, and its inverse.
    ggml_tensor* normalize(ggml_context* ctx, ggml_tensor* p) const;
    ggml_tensor* denormalize(ggml_context* ctx, ggml_tensor* z) const;
    ggml_tensor* bn_std(ggml_context* ctx) const;

    std::unique_ptr<Vae> kl_;
    ggml_tensor* running_mean_ = nullptr;  // F32 ne [128]
    ggml_tensor* running_var_ = nullptr;
    AutoencoderFormat format_;
};

}  // namespace kiln::models
