// Text-to-image and image-to-image for every family: prompt -> conditioning
// -> sampler loop with classifier-free guidance over the diffusion network
// (a UNet, or a Flux DiT with its distilled guidance and reference images)
// -> VAE decode -> image.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "image/image.h"
#include "image/png_metadata.h"
#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "pipeline/preview.h"
#include "pipeline/request.h"
#include "pipeline/rng.h"
#include "pipeline/samplers.h"
#include "pipeline/step_cache_options.h"
#include "pipeline/vae_tiling.h"
#include "util/result.h"

namespace kiln::pipeline {

struct GeneratedImage {
    image::Image image;          // RGB; a video job's first frame
    image::GenerationInfo info;  // for the PNG "parameters" chunk
    std::vector<image::Image> frames;  // a video job's clip (ValidatedRequest::video); empty for an image
};

// Called with step 0 when an image's sampling starts, then after each
// denoising step: (image index, steps done, total steps).
using StepCallback = std::function<void(int image, int step, int total)>;
// Called as a job enters a phase besides sampling (kiln_phase): the prompts'
// encoding (image 0), an image's decode, an image's hires fix.
enum class JobPhase { Encode = 1, Decode = 2, Hires = 3 };
using PhaseCallback = std::function<void(JobPhase phase, int image)>;
// A video's decode, after each latent frame: the clip's frames decoded so
// far and its frame count.
using DecodeCallback = std::function<void(int image, int frames_done, int frames)>;

// What a step cache did in one sampling run: of `evaluations` denoiser
// calls, `skipped` reused or forecast the network's work (its middle blocks,
// for a block-level cache).
struct StepCacheReport {
    CacheMode mode = CacheMode::None;
    int skipped = 0;
    int evaluations = 0;
};

// Where a generation's wall-clock time went (steady_clock), for benchmarks.
// Summed over the images of a batch; step_s has one entry per denoising step
// of every image, in order. Image-to-image encoding is in none of them.
struct GenerationTimings {
    double text_encoding_s = 0;  // the prompt and, with CFG, the negative prompt
    double sampling_s = 0;       // the sampler loop: every denoising step
    double vae_s = 0;            // VAE decode of the final latent (without --hires)
    // --hires: the second pass after the first pass's sampling: upscale,
    // encode, sampling and decode (its steps are in step_s too).
    double hires_s = 0;
    std::vector<double> step_s;     // each denoising step
    bool cfg_passes_apart = false;  // CFG's passes ran one after the other (batch_cfg off, or no room)
    StepCacheReport cache;          // the step cache's work, summed over the images
};

// The request is checked first (validate_request, pipeline/request.h), so a
// bad one fails before any graph is built. Other errors: out of memory,
// cancelled (kiln_cancel), a failed graph. With `timings`, it is reset and
// filled. With `on_preview` and request.preview.mode not None, a preview is
// made after every request.preview.interval-th step of each image (steps
// count from 1, as on_step's) and handed to it; its time is no step's. A
// preview that fails to decode is a warning, not a failed job. `on_phase`
// hears of the phases besides sampling, `on_decode` of a clip's decode.
Result<std::vector<GeneratedImage>> generate(Model& model, const GenerationRequest& request,
                                             const StepCallback& on_step = nullptr,
                                             GenerationTimings* timings = nullptr,
                                             const PreviewCallback& on_preview = nullptr,
                                             const PhaseCallback& on_phase = nullptr,
                                             const DecodeCallback& on_decode = nullptr);

// The sampling loop alone, for callers that bring their own conditioning
// and starting latent (tests compare it with the reference sampler).
struct SamplingRun {
    int64_t latent_w = 0;
    int64_t latent_h = 0;
    int64_t latent_frames = 1;  // a video network's (models::DiffusionShape::frames)
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
    // The DiT's image context, one batch item's (Wan 2.1 I2V and FLF2V:
    // CLIP vision's rows; pipeline/image_to_video.h); every item reads it.
    std::vector<float> image_context;
    // A VACE DiT's context, one batch item's (pipeline/vace_context.h), and
    // the factor of its hints; every item and pass reads it.
    std::vector<float> vace_context;
    float vace_strength = 1.0f;
    // The first latent frame is the given image's (keep_weight holds it): the
    // DiT sees its tokens at timestep 0 (DiffusionShape::clean_first_frame).
    bool clean_first_frame = false;
    // Latent masking for a regular UNet: where keep_weight is 1 the
    // denoised estimate is replaced by keep_latent (the init image).
    std::vector<float> keep_weight;
    std::vector<float> keep_latent;
    // The noise table the sigmas come from: its sigma_to_t is the
    // network's timestep (null: SD's DDPM schedule).
    const NoiseSchedule* schedule = nullptr;
    // Flux-dev's distilled guidance (--guidance), for a DiT that takes it.
    float guidance = 3.5f;
    // Flux.1-Kontext's reference latents (scaled) and their sizes.
    std::vector<std::vector<float>> refs;
    std::vector<models::LatentSize> ref_sizes;
    bool increase_ref_index = false;
    // sd-cli's --timestep-shift (NitroFusion; 0: none; pipeline/denoiser.h network_step).
    int shifted_timestep = 0;
    SkipLayerGuidance slg;  // off unless the request asks and the DiT takes it
    // ControlNet (Model::has_control_net()): its condition, planar RGB in
    // [0, 1] at 8x the latent's size (empty: no control, the plain UNet),
    // and --control-strength, the factor on its residuals.
    std::vector<float> control_hint;
    float control_strength = 0.9f;
    // Called after each denoiser evaluation with its input x, sigma and the
    // denoised estimate (after latent masking); previews read them. Null: none.
    std::function<void(const std::vector<float>& x, float sigma, const std::vector<float>& denoised)> on_denoised;
    // The step cache (--cache-mode; validated against the model), and the
    // steps of the job's schedule cut before the first that runs
    // (image-to-image), which its step counts skip.
    StepCacheOptions cache;
    int cache_step_offset = 0;
};

// Runs the sampler from `x` (noise * sigmas[0], plus the init latent for
// img2img) with CFG over `cond`/`uncond` (uncond may be null when cfg is 1)
// and returns the final latent (scaled, before the VAE).
// `passes_apart` (if given) says whether CFG's passes ran one after the
// other; `cache_report` (if given) what the step cache did.
Result<std::vector<float>> sample_latent(Model& model, const SamplingRun& run, std::vector<float> x,
                                         const Conditioning& cond, const Conditioning* uncond, Rng& rng,
                                         const ProgressFn& progress = nullptr, bool* passes_apart = nullptr,
                                         StepCacheReport* cache_report = nullptr);

// A1111's display name of a kiln sampler ("euler_a" -> "Euler a").
std::string a1111_sampler_name(const std::string& sampler);

}  // namespace kiln::pipeline
