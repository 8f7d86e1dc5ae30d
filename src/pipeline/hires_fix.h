// The hires fix a request asks for (sd-cli's --hires options), apart from
// request.h so that ModelOptions can name it for auto-fit.
#pragma once

#include <string>
#include <vector>

#include "pipeline/upscaler.h"

namespace kiln::pipeline {

// The hires fix (sd-cli's --hires, A1111's "Hires. fix"): after the first
// pass, the result is upscaled to the hires size and denoised again there as
// image-to-image with `denoising_strength`. Text-to-image only.
struct HiresFix {
    float scale = 2.0f;  // --hires-scale: used when width and height are both 0
    int width = 0;       // --hires-width; 0: from the scale (or from height, keeping the aspect)
    int height = 0;      // --hires-height
    int steps = 0;       // --hires-steps: the second pass's schedule; 0: the first pass's steps
    // --hires-denoising-strength: share of the second schedule to run, [0, 1];
    // 0 runs none (the result is the upscaled first pass).
    float denoising_strength = 0.7f;
    // --hires-upscaler: "latent" (bilinear, sd-cli's default; "Latent" as
    // A1111 names it), "latent-nearest" ("Latent (nearest)"),
    // "latent-nearest-exact" ("Latent (nearest-exact)"), "lanczos"
    // ("Lanczos": the decoded image resized and encoded again), or the path
    // of an ESRGAN model file (the decoded image is upscaled, resized to the
    // hires size and encoded again).
    std::string upscaler = "latent";
    int upscale_tile = kDefaultUpscaleTile;  // --hires-upscale-tile-size, for a model upscaler
    // --hires-sigmas: the second pass's schedule as it runs (descending to a
    // last 0), replacing steps and denoising_strength: its first value is the
    // noise the upscaled image starts from. Empty: the scheduler's.
    std::vector<float> sigmas;
};

}  // namespace kiln::pipeline
