// Image-to-video (Wan 2.2 I2V-A14B, docs/wan.md): -i is the clip's first
// frame. A video DiT whose input has temporal_downscale + latent_channels
// planes more than its output takes them as a condition, as Wan's
// WanI2V.generate builds it:
//   - the clip [image, zeros...] of the job's frames at its size (the image
//     resized when it is another), encoded by the VAE a chunk at a time as
//     the original's encode loops: the latent's mean [C, T, h, w];
//   - a mask [temporal_downscale, T, h, w]: 1 on the first latent frame (the
//     image's, repeated over its temporal_downscale frames), 0 after;
//   - the DiT's input is then [noise latent, mask, image latent] along the
//     channels, for the conditional and the unconditional pass alike.
#pragma once

#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;
struct ValidatedRequest;

// Whether the model's diffusion network takes a first frame (above).
bool takes_first_frame(const Model& model);

// The condition planes of `image` as the clip's first frame: mask then
// latent, channel after channel, each frame after frame (SamplingRun::concat).
Result<std::vector<float>> first_frame_condition(Model& model, const image::Image& image, const ValidatedRequest& p);

}  // namespace kiln::pipeline
