// VACE's context (Wan 2.1 VACE; docs/wan.md "VACE"): what a DiT with VACE
// blocks (models::DiffusionCapabilities::vace_channels) reads beside the
// noise, as Wan's WanVace builds it (vace_encode_frames, vace_encode_masks,
// vace_latent) from sd-cli's inputs:
//   - the control clip: --control-video's frames at the job's size, the
//     first of them as many as the clip has; frames past the given ones are
//     mid grey (0 in [-1, 1]), as sd-cli fills them;
//   - the mask is 1 everywhere (sd-cli takes no VACE mask): the "inactive"
//     clip (frames where the mask is 0) is all grey and the "reactive" one
//     is the control clip. Each is encoded by the VAE a chunk at a time;
//   - per latent frame, 96 planes: inactive's 16, reactive's 16, then the
//     mask's 64 (8 x 8 pixels of each latent pixel, all 1 here);
//   - -i, a reference image: its latent is one more frame before the clip's,
//     with 16 zero planes where reactive's go and a zero mask. The noise,
//     the DiT's input and its output then have that frame too
//     (ValidatedRequest::vace_reference), and it is dropped before the decode.
// Each CFG pass reads the same context; the hints are scaled by
// --vace-strength (models::DiffusionShape::vace_strength).
#pragma once

#include <cstdint>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;
struct ValidatedRequest;

// Whether the model's diffusion network has VACE blocks.
bool takes_vace_context(const Model& model);

// Latent frames the reference image adds in front of the clip's.
constexpr int64_t kVaceReferenceFrames = 1;

// One batch item's context, ne [w, h, latent_frames * vace_channels]
// (channel after channel, each frame after frame), for p.latent_frames
// latent frames (the reference's included when p.vace_reference).
// `reference` is -i (null: none); extra control frames are not read.
Result<std::vector<float>> vace_context(Model& model, const std::vector<image::Image>& control_frames,
                                        const image::Image* reference, const ValidatedRequest& p);

// The clip's own latent frames of a sampled VACE latent [C, T, h, w]: the
// reference frame dropped (the latent as it is without one).
std::vector<float> without_reference_frames(const std::vector<float>& latent, const ValidatedRequest& p);

}  // namespace kiln::pipeline
