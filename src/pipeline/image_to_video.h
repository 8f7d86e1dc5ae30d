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
// First-last-frame (--end-img, Wan's WanFLF2V.generate): the clip is [image,
// zeros..., last image] and the mask is also 1 on the last pixel frame's
// plane of the last latent frame (the mask's last plane there).
// Wan 2.1's I2V and FLF2V DiTs also read an image context: CLIP vision's
// rows of the first frame (FLF2V: then of the last), each image stretched to
// the tower's square with torch's bicubic as Wan's CLIPModel.visual does
// (sd-cli crops the centre square instead; kiln follows Wan's release).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;
struct SamplingRun;
struct ValidatedRequest;

// A clip at the job's size through the VAE's encoder a chunk at a time, as
// Wan's encode loops (the first frame, then temporal_downscale frames each,
// with the causal history the one before left): `chunk_pixels(t)` gives
// latent frame t's pixel planes (ne [W, H, 3] per frame, in [-1, 1]). The
// latent's mean [C, latent_frames, h, w], scaled as the sampler's latent.
Result<std::vector<float>> encode_clip(Model& model, const ValidatedRequest& p, int64_t latent_frames,
                                       const std::function<const float*(int64_t)>& chunk_pixels);

// Whether the model's diffusion network takes a first frame (above).
bool takes_first_frame(const Model& model);

// The condition planes of `image` as the clip's first frame (and `last`, when
// given, as its last): mask then latent, channel after channel, each frame
// after frame (SamplingRun::concat).
Result<std::vector<float>> first_frame_condition(Model& model, const image::Image& image, const image::Image* last,
                                                 const ValidatedRequest& p);

// TI2V-5B's image-to-video (Wan 2.2's WanTI2V.i2v): a video DiT whose input
// is its output's planes alone, on Wan 2.2's 48-channel latent, takes -i as
// the clip's first latent frame: the VAE's encode of the image at the job's
// size, which the sampler keeps as it is (SamplingRun::keep_weight) and the
// DiT sees at timestep 0 (DiffusionShape::clean_first_frame).
bool takes_first_latent(const Model& model);
// That latent frame, ne [w, h, C] (scaled as the sampler's latent).
Result<std::vector<float>> first_frame_latent(Model& model, const image::Image& image, const ValidatedRequest& p);
// The run keeping it (keep_weight, keep_latent) with its tokens clean.
Status keep_first_latent(Model& model, const image::Image& image, const ValidatedRequest& p, SamplingRun& run);

// Whether the model's DiT reads an image context (Wan 2.1 I2V, FLF2V), and
// its rows per batch item (of image_context_images images; CLIP-vision-H's
// when no tower is loaded).
bool takes_image_context(const Model& model);
int64_t image_context_rows(const Model& model);

// The image context of one batch item, ne [width, image_context_rows]: the
// first frame's rows, then the last's for a DiT that reads two images.
// Requires Model::has_vision().
Result<std::vector<float>> image_context(Model& model, const image::Image& first, const image::Image* last);

}  // namespace kiln::pipeline
