// Live previews of a running generation (sd-cli's --preview): every
// `interval`-th denoising step, the sampler's current estimate becomes an RGB
// image handed to a callback. What is shown is the denoised (x0) estimate of
// the step's last denoiser call, or with `noisy` the noisy latent the
// diffusion network was given (x * c_in), as sd-cli shows them.
//
//   proj  the latent-to-RGB linear projection of the family's latent format
//         (models/family.h LatentFormat::rgb_factors): one pixel per latent
//         pixel, no network, free
//   tae   a tiny autoencoder's decoder (--taesd; models/nets/taesd.h): the image size
//   vae   the model's own VAE: the image size, as slow as the final decode
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "image/image.h"
#include "models/family.h"
#include "util/result.h"

namespace kiln::pipeline {

enum class PreviewMode { None, Proj, Tae, Vae };

// "none", "proj", "tae", "vae".
std::string_view preview_mode_name(PreviewMode mode);
// sd-cli's names; the error lists them.
Result<PreviewMode> parse_preview_mode(std::string_view name);

struct PreviewOptions {
    PreviewMode mode = PreviewMode::None;
    int interval = 1;    // a preview after steps interval, 2 * interval, ... (steps count from 1)
    bool noisy = false;  // --preview-noisy: the network's noisy input instead of the denoised estimate
};

// (image index in the batch, steps done, the preview). The image is only
// valid during the call.
using PreviewCallback = std::function<void(int image, int step, const image::Image& rgb)>;

// The latent-to-RGB projection of `latent` (planar [channels][h][w], the
// scaled latent the sampler works on) with `format`'s factors: a w x h RGB
// image, each value (rgb + 1) / 2 clamped to [0, 1] and truncated to 8 bits
// as sd-cli's preview_latent_image does. Errors: a format without factors,
// or a latent whose size is not format.channels * w * h.
Result<image::Image> project_latent_to_rgb(const std::vector<float>& latent, int64_t w, int64_t h,
                                           const models::LatentFormat& format);

}  // namespace kiln::pipeline
