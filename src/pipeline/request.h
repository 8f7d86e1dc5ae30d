// A generation request and the one validation every entry point runs
// before any graph is built: the CLI and the C API (kiln_generate), kiln plan
// (kiln_plan) and auto-fit's check of a job. Every error is an invalid
// request naming the field and the accepted range, so no request reaches a
// ggml assert.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "image/image.h"
#include "nn/seams.h"
#include "pipeline/conditioner.h"
#include "pipeline/experts.h"
#include "pipeline/hires_fix.h"
#include "pipeline/latent_resize.h"
#include "pipeline/preview.h"
#include "pipeline/request_limits.h"
#include "pipeline/rng.h"
#include "pipeline/samplers.h"
#include "pipeline/schedulers.h"
#include "pipeline/step_cache_options.h"
#include "pipeline/upscaler.h"
#include "pipeline/vae_tiling.h"
#include "runtime/device_budget.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;

// Where the second pass starts: the first pass's latent resized, or its
// decoded image resized (Lanczos) or upscaled by a model, encoded again.
enum class HiresUpscaler { Latent, Lanczos, Model };

// sd-cli's skip-layer guidance (--slg-scale, --skip-layers,
// --skip-layer-start, --skip-layer-end), for Flux's and Chroma's DiTs: on a
// step whose 1-based number n has int(start * S) < n < int(end * S), S the
// schedule's sigma count, a third pass of the conditional prompt with
// `blocks` left out (models::FluxBuildOptions numbering) adds scale *
// (conditional - skipped) to the guided output. scale 0: off.
struct SkipLayerGuidance {
    float scale = 0.0f;
    std::vector<int> blocks = {7, 8, 9};
    float start = 0.01f;
    float end = 0.2f;

    bool applies(int step, size_t sigmas) const {
        const int n = step + 1, s = static_cast<int>(sigmas);
        return scale != 0.0f && n > static_cast<int>(start * s) && n < static_cast<int>(end * s);
    }
};

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
    // --sampler-rng: the stochastic samplers' noise from a stream of its own
    // (seeded as the image's); unset: the image's stream, continued after
    // the initial noise (sd-cli's default).
    std::optional<RngKind> sampler_rng;
    std::optional<float> eta;  // --eta, [0, 1]; unset: default_eta(sampler)
    // --timestep-shift N in [0, 1000] (SamplingRun::shifted_timestep);
    // families without Schedule::shifted_timestep ignore it with a warning.
    int timestep_shift = 0;
    SkipLayerGuidance slg;
    // --sigmas: the schedule itself (descending to a last 0), replacing the
    // scheduler's; its length less one is the step count.
    std::vector<float> sigmas;
    int clip_skip = 0;  // <= 0: the model's default
    bool flash_attention = false;
    // Image-to-image: the starting image (its size is the output size; a
    // different width or height is an error) and how much of the schedule to
    // run (1 = all of it, like txt2img).
    std::optional<image::Image> init_image;
    // First-last-frame video (--end-img): the clip's last frame, with
    // init_image its first (pipeline/image_to_video.h).
    std::optional<image::Image> end_image;
    // VACE (pipeline/vace_context.h): --control-video's frames in order (the
    // clip's first frames; init_image is then the reference image) and
    // --vace-strength, the hints' factor in [0, kMaxVaceStrength].
    std::vector<image::Image> control_frames;
    float vace_strength = 1.0f;
    float strength = 0.75f;
    // A1111's resize_mode 3, "Just resize (latent upscale)": the init image
    // keeps its own size (a multiple of the size stride), is encoded there,
    // and its latent is resized to the output's (bilinear, as torch's
    // F.interpolate). Not with a mask.
    bool init_latent_resize = false;
    // Inpainting (needs init_image): white repaints, black keeps (A1111's
    // convention), the init image's size. A 9-channel inpainting UNet sees the
    // mask and the masked image; a regular UNet keeps the unmasked latent.
    std::optional<image::Image> mask;
    // --vae-tiling: decode and encode in overlapping tiles with blended seams.
    std::optional<VaeTiling> vae_tiling;
    // --circular, --circularx, --circulary: a seamless image, whose edges
    // continue each other (nn/seams.h); networks that cannot wrap refuse it.
    nn::Seams seams;
    // CFG's conditional and unconditional passes run as one batch of two
    // (each weight read once per step) unless the batch does not fit, when
    // they run one after the other. False always runs them separately
    // (benchmarks compare the two).
    bool batch_cfg = true;
    // Flux: distilled guidance (--guidance; unset: the family's), the flow
    // time shift (--flow-shift; unset: the family's), and Kontext's
    // reference images (-r).
    std::optional<float> guidance;
    std::optional<float> flow_shift;
    std::vector<image::Image> ref_images;
    // sd-cli's reference handling: each is first resized (nearest) to about
    // the output's area, at most 1024x1024 (auto_resize_ref_images, sd-cli's
    // default; --disable-auto-resize-ref-image turns it off), and they sit
    // side by side at index 1 unless increase_ref_index numbers them 1, 2, ...
    bool auto_resize_ref_images = true;
    bool increase_ref_index = false;
    T5Options t5_options;           // --chroma-* and --max-sequence-length (pipeline/conditioner.h)
    std::optional<HiresFix> hires;  // --hires
    // --control-image: the ControlNet's (--control-net) condition, any
    // channels, resized to the output size when it has the same aspect
    // ratio; and --control-strength, sd-cli's factor on its residuals.
    std::optional<image::Image> control_image;
    float control_strength = 0.9f;
    bool control_canny = false;  // --canny: edges of the resized control image (image/canny.h)
    // Live previews (--preview, pipeline/preview.h); only made when
    // generate() is given a preview callback.
    PreviewOptions preview;
    // --cache-mode and its options (pipeline/step_cache_options.h); the
    // hires fix's second pass computes every step.
    StepCacheOptions cache;
    // A1111's "Model hash" and "Lora hashes" in the images' parameters
    // (io/file_hashes.h). Off when the front-end writes no metadata
    // (--disable-image-metadata): hashing a large checkpoint the first time
    // reads all of it, for nothing.
    bool file_hashes = true;
    // A video model's job (Wan): --video-frames, at least 1 (unset: 1, as
    // sd-cli), made 4k + 1 as sd-cli makes it (the VAE's first latent frame
    // is one frame, each later one four); an image model refuses it.
    std::optional<int> video_frames;
    // Wan 2.2 A14B's high-noise expert's sampling (pipeline/experts.h).
    HighNoiseSampling high_noise;
};

// A hires fix with its sizes worked out.
struct ValidatedHires {
    int width = 0, height = 0;  // the final image's
    int64_t latent_w = 0, latent_h = 0;
    int steps = 0;
    std::vector<float> sigmas;  // --hires-sigmas, run as given; empty: the scheduler's
    HiresUpscaler upscaler = HiresUpscaler::Latent;
    LatentResize latent_mode = LatentResize::Bilinear;  // HiresUpscaler::Latent
    std::string model_path;                             // HiresUpscaler::Model
    std::string label;  // "Latent", "Latent (nearest)" or the model file's stem (A1111's "Hires upscaler")
};

// A request with the model's defaults filled in and every field checked.
struct ValidatedRequest {
    int width = 0, height = 0, steps = 0;
    int64_t latent_w = 0, latent_h = 0;
    float cfg = 1.0f;
    SamplerKind sampler = SamplerKind::Euler;
    SchedulerKind scheduler = SchedulerKind::Discrete;
    float guidance = 0.0f;  // the DiT's distilled guidance (0: the network takes none)
    std::optional<ValidatedHires> hires;
    // A video model's: the frames it makes (4k + 1) and its latent frames
    // (k + 1); an image model's job is one frame.
    int frames = 1;
    int64_t latent_frames = 1;
    bool video = false;  // the model is a video model: the job's result is a clip
    // Image-to-video (pipeline/image_to_video.h): -i is the clip's first frame, not image-to-image.
    bool first_frame = false;
    bool last_frame = false;  // and --end-img its last
    // TI2V-5B's image-to-video (pipeline/image_to_video.h): -i is the clip's first latent frame.
    bool first_latent = false;
    // A VACE DiT's job (pipeline/vace_context.h); with -i, its reference
    // image's latent frame leads latent_frames and is not decoded.
    bool vace = false;
    bool vace_reference = false;
    // -i is a video job's own input (a first frame, a first latent or a VACE
    // reference), not image-to-image's init image.
    bool init_image_in_clip() const { return first_frame || first_latent || vace_reference; }
    // Wan 2.2 A14B (pipeline/experts.h): the high-noise expert samples the
    // schedule's first high_noise_steps of `steps` with its own sampler, cfg
    // and eta (unset: the sampler's default); 0: the main network samples all.
    int high_noise_steps = 0;
    SamplerKind high_noise_sampler = SamplerKind::Euler;
    float high_noise_cfg = 1.0f;
    std::optional<float> high_noise_eta;
};

// Errors (each an invalid request naming the field and what is accepted):
// width or height not a positive multiple of the model's size stride or
// above image::kMaxDimension; an init image of another size than asked
// (with init_latent_resize: an init image whose sides are not multiples of
// the stride, or with a mask);
// a mask of another size than the init image, or without one; steps outside
// [1, kMaxSteps]; cfg not finite or outside [0, kMaxCfgScale]; batch count
// outside [1, kMaxBatchCount]; unknown sampler or scheduler; strength outside
// (0, 1] with an init image; bad VAE tiling; guidance outside [0,
// kMaxCfgScale]; flow shift outside [-kMaxFlowShift, kMaxFlowShift];
// reference images for a family that takes none, more than
// kMaxReferenceImages, or of a side outside [stride, kMaxDimension]; a hires
// fix with an init image, a scale not in (0, kMaxHiresScale], a width or
// height not a multiple of the stride or above kMaxDimension, steps outside
// [0, kMaxSteps], a denoising strength outside [0, 1], an upscaler that is
// neither a latent mode nor an existing file, or a bad upscale tile size; a
// control image without a ControlNet, or of another aspect ratio than the
// output; a control strength outside [0, kMaxControlStrength]; a preview
// interval outside [1, kMaxPreviewInterval]; --preview proj for a latent
// format without a projection of the model's latent channels; --eta
// outside [0, 1]; --sigmas that are not 2 to kMaxSteps + 1 values descending
// from at most kMaxSigma (1 for flow models) to a last 0; a step cache that
// does not apply to the model or its steps (validate_step_cache).
Result<ValidatedRequest> validate_request(const Model& model, const GenerationRequest& request);

// RAM a job holds for the request's decoded images (init image, mask,
// reference images): per image, its 8-bit pixels, the RGB copy the VAE
// encoder's input is made from and that input's three float planes.
uint64_t request_image_bytes(const GenerationRequest& request);

// Counts request_image_bytes on the model's host ledger (RAM's books) for as
// long as the reservation lives, so a job's runs and kiln plan see the
// images; an out-of-memory error when RAM's budget cannot hold them.
Result<runtime::LedgerReservation> reserve_request_images(Model& model, const GenerationRequest& request);

}  // namespace kiln::pipeline
