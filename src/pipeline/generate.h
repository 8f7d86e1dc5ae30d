// Text-to-image and image-to-image for SD1.x / SD2.x: prompt -> conditioning ->
// sampler loop with classifier-free guidance -> VAE decode -> image.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "image/image.h"
#include "image/png_metadata.h"
#include "pipeline/conditioner.h"
#include "pipeline/rng.h"
#include "pipeline/samplers.h"
#include "pipeline/sd_model.h"
#include "pipeline/vae_tiling.h"
#include "util/result.h"

namespace kiln::pipeline {

struct GenerationRequest {
    std::string prompt;
    std::string negative_prompt;
    int width = 0;            // 0: the model's default
    int height = 0;           // 0: the model's default
    int steps = 0;            // 0: the model's default
    float cfg_scale = -1.0f;  // < 0: the model's default; 1 disables the unconditional pass
    int64_t seed = 42;        // image i of a batch uses seed + i
    int batch_count = 1;
    std::string sampler;          // "": the model's default
    std::string scheduler;        // "": the model's default
    RngKind rng = RngKind::Cuda;  // stable-diffusion.cpp's default
    int clip_skip = 0;            // <= 0: the model's default
    bool flash_attention = false;
    // Image-to-image: the starting image (its size is the output size; a
    // different width or height is an error) and how much of the schedule to
    // run (1 = all of it, like txt2img).
    std::optional<image::Image> init_image;
    float strength = 0.75f;
    // Inpainting (needs init_image): white repaints, black keeps (A1111's
    // convention), the init image's size. A 9-channel inpainting UNet sees the
    // mask and the masked image; a regular UNet keeps the unmasked latent.
    std::optional<image::Image> mask;
    // --vae-tiling: decode and encode in overlapping tiles with blended seams.
    std::optional<VaeTiling> vae_tiling;
    // CFG's conditional and unconditional passes run as one batch of two
    // (each weight read once per step) unless the batch does not fit, when
    // they run one after the other. False always runs them separately
    // (benchmarks compare the two).
    bool batch_cfg = true;
};

struct GeneratedImage {
    image::Image image;          // RGB
    image::GenerationInfo info;  // for the PNG "parameters" chunk
};

// Called with step 0 when an image's sampling starts, then after each
// denoising step: (image index, steps done, total steps).
using StepCallback = std::function<void(int image, int step, int total)>;

// Where a generation's wall-clock time went (steady_clock), for benchmarks.
// Summed over the images of a batch; step_s has one entry per denoising step
// of every image, in order. Image-to-image encoding is in none of them.
struct GenerationTimings {
    double text_encoding_s = 0;     // the prompt and, with CFG, the negative prompt
    double sampling_s = 0;          // the sampler loop: every denoising step
    double vae_s = 0;               // VAE decode of the final latent
    std::vector<double> step_s;     // each denoising step
    bool cfg_passes_apart = false;  // CFG's passes ran one after the other (batch_cfg off, or no room)
};

// Errors (each names the parameter and the valid range or names): width or
// height not a positive multiple of the model's latent stride, steps < 1,
// negative cfg, unknown sampler or scheduler, strength outside (0, 1],
// out of memory, and a failed graph. With `timings`, it is reset and filled.
Result<std::vector<GeneratedImage>> generate(StableDiffusionModel& model, const GenerationRequest& request,
                                             const StepCallback& on_step = nullptr,
                                             GenerationTimings* timings = nullptr);

// The sampling loop alone, for callers that bring their own conditioning
// and starting latent (tests compare it with the reference sampler).
struct SamplingRun {
    int64_t latent_w = 0;
    int64_t latent_h = 0;
    float cfg_scale = 7.0f;  // 1: no unconditional pass
    SamplerKind sampler = SamplerKind::EulerA;
    std::vector<float> sigmas;  // from get_sigmas, possibly shortened for img2img
    float eta = 1.0f;
    bool flash_attention = false;
    bool batch_cfg = true;  // GenerationRequest::batch_cfg
    // Extra UNet input channels after the latent (an inpainting UNet's mask
    // and masked-image latent), in_channels - out_channels planes; empty
    // fills them with "repaint everything" (mask 1, masked image 0).
    std::vector<float> concat;
    // Latent masking for a regular UNet: where keep_weight is 1 the
    // denoised estimate is replaced by keep_latent (the init image).
    std::vector<float> keep_weight;
    std::vector<float> keep_latent;
};

// Runs the sampler from `x` (noise * sigmas[0], plus the init latent for
// img2img) with CFG over `cond`/`uncond` (uncond may be null when cfg is 1)
// and returns the final latent (scaled, before the VAE).
// `passes_apart` (if given) says whether CFG's passes ran one after the other.
Result<std::vector<float>> sample_latent(StableDiffusionModel& model, const SamplingRun& run, std::vector<float> x,
                                         const Conditioning& cond, const Conditioning* uncond, Rng& rng,
                                         const ProgressFn& progress = nullptr, bool* passes_apart = nullptr);

// A1111's display name of a kiln sampler ("euler_a" -> "Euler a").
std::string a1111_sampler_name(const std::string& sampler);

}  // namespace kiln::pipeline
