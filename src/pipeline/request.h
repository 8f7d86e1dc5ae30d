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
#include "pipeline/rng.h"
#include "pipeline/samplers.h"
#include "pipeline/schedulers.h"
#include "pipeline/vae_tiling.h"
#include "runtime/device_budget.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;

// Limits of a request (and of a model file's defaults).
constexpr int kMaxSteps = 10000;
constexpr float kMaxCfgScale = 100.0f;
constexpr int kMaxBatchCount = 1000;
constexpr float kMaxFlowShift = 20.0f;
constexpr size_t kMaxReferenceImages = 8;

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
    // Flux: distilled guidance (--guidance; unset: the family's), the flow
    // time shift (--flow-shift; unset: the family's), and Kontext's
    // reference images (-r).
    std::optional<float> guidance;
    std::optional<float> flow_shift;
    std::vector<image::Image> ref_images;
};

// A request with the model's defaults filled in and every field checked.
struct ValidatedRequest {
    int width = 0, height = 0, steps = 0;
    int64_t latent_w = 0, latent_h = 0;
    float cfg = 1.0f;
    SamplerKind sampler = SamplerKind::Euler;
    SchedulerKind scheduler = SchedulerKind::Discrete;
    float guidance = 0.0f;  // the DiT's distilled guidance (0: the network takes none)
};

// Errors (each an invalid request naming the field and what is accepted):
// width or height not a positive multiple of the model's size stride or
// above image::kMaxDimension; an init image of another size than asked;
// a mask of another size than the init image, or without one; steps outside
// [1, kMaxSteps]; cfg not finite or outside [0, kMaxCfgScale]; batch count
// outside [1, kMaxBatchCount]; unknown sampler or scheduler; strength outside
// (0, 1] with an init image; bad VAE tiling; guidance outside [0,
// kMaxCfgScale]; flow shift outside [-kMaxFlowShift, kMaxFlowShift];
// reference images for a family that takes none, more than
// kMaxReferenceImages, or of a side outside [stride, kMaxDimension].
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
