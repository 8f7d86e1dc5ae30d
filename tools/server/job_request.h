// One generation as the server queues it, whichever API it came from, and
// the error a request gets when a field is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln.h"

namespace kiln::server {

// An HTTP error that names the field at fault ("steps: expected an integer
// from 1 to 150, got 500"). Thrown while a request is read; the route turns
// it into the status and a JSON error body.
struct RequestError {
    int status = 400;
    std::string field;  // "" when the whole body is at fault
    std::string message;
    int retry_after = 0;  // seconds, sent as Retry-After when > 0 (429)
};

// A decoded image owned by the request (kiln_images_free on release).
using SharedImage = std::shared_ptr<kiln_image>;
SharedImage share_image(kiln_image* image);

// The parts a job's model is loaded with, as files (kiln_context_params'
// vae_path, clip_l_path, ...); "" leaves the server's own flag.
struct ModelParts {
    std::string vae, clip_l, clip_g, t5xxl, llm;
    // "" for none, else " with vae=..., t5xxl=...": a loaded model is known by its name and this.
    std::string describe() const;
    void apply(kiln_context_params& params) const;
};

struct JobRequest {
    std::string model;  // a name the registry resolved
    ModelParts parts;   // the separate files the request named (a model folder's vae/, text_encoders/)
    std::string prompt;
    std::string negative_prompt;
    int width = 0;   // 0: the model's default
    int height = 0;  // 0: the model's default
    int steps = 0;   // 0: the model's default
    int batch = 1;
    float cfg_scale = -1.0f;  // < 0: the model's default
    float eta = -1.0f;        // A1111's and sd-cli's eta, [0, 1] (kiln_generation_params.eta); < 0: the sampler's
    // Wan 2.2 A14B's high-noise expert (kiln_generation_params' high_noise_*
    // and moe_boundary): sd-server's high_noise_sample_params.
    int high_noise_steps = -1;
    float high_noise_cfg_scale = -1.0f;
    std::string high_noise_sampler;  // kiln's name; "": the job's sampler
    float high_noise_eta = -1.0f;
    float moe_boundary = 0.875f;
    int64_t seed = -1;        // -1: the server picks one (reported with the results)
    std::string sampler;      // kiln's name ("euler_a"); "": the model's default
    std::string scheduler;    // kiln's name ("karras"); "": the model's default
    float strength = 0.75f;   // image-to-image: the share of the schedule to run
    SharedImage init_image;   // RGB, or null for text-to-image
    // The init image keeps its own size and its latent is resized to
    // width x height (kiln_generation_params.init_latent_resize).
    bool init_latent_resize = false;
    SharedImage mask;                   // RGB, white repaints; needs init_image
    SharedImage end_image;              // an image-to-video clip's last frame (init_image its first)
    // Reference images (Flux.1-Kontext, Qwen-Image-Edit: kiln -r), as sd-cli's
    // --disable-auto-resize-ref-image and --increase-ref-index take them.
    std::vector<SharedImage> ref_images;
    bool auto_resize_ref_images = true;
    bool increase_ref_index = false;
    bool circular_x = false, circular_y = false;  // a seamless image (sd-cli's --circularx, --circulary)
    // A Wan VACE DiT's control clip (kiln --control-video; init_image is then
    // its reference image) and the factor on its hints.
    std::vector<SharedImage> control_frames;
    float vace_strength = 1.0f;
    std::string output_format = "png";  // png, jpeg or webp; a clip's: webm, avi or webp (animated)
    // A video model's clips (kiln_generation_params.video_frames; 0: the
    // model's one frame) at fps frames a second in their files.
    int video_frames = 0;
    int fps = 16;

    // Live previews: "none", "proj", "tae", "vae", or "" for the server's --preview,
    // every preview_interval-th step (0: the server's --preview-interval).
    std::string preview;
    int preview_interval = 0;
    // Previews of the noisy latent instead of the denoised estimate (sd-cli's
    // --preview-noisy); unset: the server's --preview-noisy.
    std::optional<bool> preview_noisy;

    // A1111's hires fix (enable_hr): the first pass upscaled by hires_scale
    // (or to hires_width x hires_height, 0: from the scale) and denoised
    // again over hires_denoising_strength of hires_steps (0: steps) steps,
    // with a latent upscaler or Lanczos (kiln_generation_params.hires*).
    bool hires = false;
    float hires_scale = 2.0f;
    int hires_width = 0, hires_height = 0, hires_steps = 0;
    float hires_denoising_strength = 0.7f;
    std::string hires_upscaler = "latent";

    // Step caches, as sd-cli's --cache-mode, --cache-option, --scm-mask and
    // --scm-policy (kiln_generation_params); "": none.
    std::string cache_mode, cache_option, scm_mask, scm_policy;

    // sd-cli's sampling and VAE options, as kiln_generation_params takes
    // them (the sd-server API's sample_params and vae_tiling_params).
    int clip_skip = 0;       // <= 0: the model's
    float guidance = -1.0f;  // distilled guidance; < 0: the model's
    std::optional<float> flow_shift;
    int timestep_shift = 0;
    std::vector<float> sigmas, hires_sigmas;  // empty: the scheduler's
    float slg_scale = 0.0f;
    std::vector<int> skip_layers = {7, 8, 9};
    float skip_layer_start = 0.01f, skip_layer_end = 0.2f;
    bool vae_tiling = false;
    int vae_tile_size = 32;
    float vae_tile_overlap = 0.5f;
    float vae_relative_tile_w = 0.0f, vae_relative_tile_h = 0.0f;
    bool embed_metadata = true;  // false: the images carry no parameters text
};

}  // namespace kiln::server
