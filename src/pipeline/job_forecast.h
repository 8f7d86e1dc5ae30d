// `kiln plan` / `--dry-run`: what a generation job would need where, without
// running it. The text encoder, ControlNet (when the model has one), UNet
// (CFG batch of two, or its two passes one after the other) and VAE decoder
// graphs of the job, and the VAE encoder, reference images and hires pass
// when it has them, are built and planned by each module's executor at the
// device's current limit; nothing is uploaded or computed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/request.h"
#include "runtime/executor.h"
#include "util/result.h"

namespace kiln::pipeline {

struct ModuleForecast {
    std::string module;  // "te", "diffusion", "control", "vae"
    std::string device;  // where it computes
    runtime::RunForecast run;
    bool tiled = false;  // the VAE would not fit whole: figures for one tile
    // CFG's two passes run one after the other: the batch of two would not
    // fit, or their contexts differ in length (JobForecast::cfg_contexts).
    // Figures for one pass (the longer's).
    bool separate_cfg = false;
    // How often a denoising step runs this graph: 2 with separate_cfg, so
    // the weights it streams (below) are read twice a step.
    int runs_per_step = 1;
    std::string pass;  // "" for the job's own size; "init image encode", "hires pass", ...
    // Weights this run reads from disk: its params are on disk, or they are
    // the mapped model file and RAM cannot hold them beside the job (the
    // page cache lets them go before the next run: every step, for the
    // diffusion model). 0: they stay in memory.
    uint64_t streamed_from_disk = 0;
    // Weights this run uploads to its device at most: it runs in segments
    // with its params elsewhere (RAM, disk, another device), so the weights
    // the budget cannot keep from the last run are uploaded again. 0: none.
    uint64_t streamed_to_device = 0;
};

// What a job runs besides its text encoding, one denoising pass and a decode
// at its own size.
struct JobPasses {
    // Image-to-image or inpainting: the init image's encode, at its own size
    // (the output's, or another with GenerationRequest::init_latent_resize).
    std::optional<std::pair<int, int>> init_encode_size;
    const ValidatedHires* hires = nullptr;  // the hires fix: its encode (pixel upscalers), UNet and decode
    // The reference images (-r) as given, {width, height} each: Kontext's
    // and an edit model's, VAE-encoded at auto_reference_size of the
    // output's size (or their own, without auto_resize_references) for the
    // DiT, and with a vision tower (Model::has_vision) also encoded by it
    // for the LLM's prompt.
    std::vector<std::pair<int, int>> reference_images;
    bool auto_resize_references = true;
    bool increase_ref_index = false;
    nn::Seams seams;  // --circular: the graphs are the job's, across its seams
    // The hires fix's model upscaler (its name and memory), held in RAM for
    // the whole job; the caller measures it (Upscaler::memory).
    std::optional<std::pair<std::string, UpscalerMemory>> upscaler;
    // A block-level step cache: the diffusion network runs its front, rest
    // and cached stages (models::BlockStage) instead of whole evaluations,
    // each planned with its own inputs. The hires pass runs whole.
    std::optional<models::BlockSplit> block_stages;
    // A video model's clip (ValidatedRequest::video): its latent frames in
    // every evaluation, and the decode a latent frame at a time, the later
    // chunks with the history the one before left.
    bool video = false;
    int64_t latent_frames = 1;
    // Wan 2.2 A14B (pipeline/experts.h): the high-noise expert's share of
    // the job's `steps`, planned before the main network, and whether it runs
    // CFG's two passes (its own --high-noise-cfg-scale). 0: no expert runs.
    int high_noise_steps = 0;
    int steps = 0;
    bool high_noise_cfg = false;
    // Image-to-video (ValidatedRequest::first_frame): the clip at the job's
    // size, encoded a chunk at a time before sampling.
    bool first_frame = false;
    // TI2V's (ValidatedRequest::first_latent): the image encoded as one
    // frame, and the DiT's first latent frame clean.
    bool first_latent = false;
    // A VACE DiT's job (ValidatedRequest::vace): its context's clips encoded
    // a chunk at a time before sampling; with a reference image
    // (vace_reference) latent_frames counts its frame, which is not decoded.
    bool vace = false;
    bool vace_reference = false;
};

struct DeviceForecast {
    std::string device;
    // Predicted managed peak: weights kept there, what earlier modules leave
    // behind, and the hungriest module's run, capped by the limit (eviction).
    uint64_t peak = 0;
    uint64_t weights_kept = 0;  // of which: weights whose params live there
    // The least the job needs there: the hungriest module's unevictable
    // bytes and its hungriest segment. Past it, a budget holds streamed
    // weights between segments and steps, so the peak fills the budget.
    uint64_t needed = 0;
    std::string needed_by;  // that module ("diffusion", "vae (hires pass)", ...)
    std::optional<uint64_t> budget;
    uint64_t limit = 0;
};

struct JobForecast {
    std::vector<ModuleForecast> modules;
    std::optional<std::pair<std::string, UpscalerMemory>> upscaler;  // JobPasses::upscaler
    std::vector<DeviceForecast> devices;
    bool fits = true;
    // Fits, but only by reading weights from disk at every step
    // (ModuleForecast::streamed_from_disk of a diffusion run).
    bool streams_from_disk = false;
    // What a step reads from disk then: the diffusion model's weights, once
    // for each run a step makes (ModuleForecast::runs_per_step).
    uint64_t streamed_per_step = 0;
    // Set when CFG's passes cannot be batched: {the prompt's, the negative
    // prompt's} context tokens, which differ. A DiT's joint attention cannot
    // batch contexts of different lengths (a UNet's cross-attention can
    // where one's CLIP chunks repeat to the other's), so every step runs the
    // two passes one after the other at batch 1 (generate's run_diffusion).
    std::optional<std::pair<int64_t, int64_t>> cfg_contexts;
    // Wan 2.2 A14B: {the high-noise expert's steps, the job's steps}; the
    // experts take turns on their device (JobPasses::high_noise_steps).
    std::optional<std::pair<int, int>> expert_steps;
};

// The passes `request` runs besides the plain one, as validated into `job`
// (which the result points into): the init image's encode, the hires fix,
// its model upscaler, measured (its weights are read, tens of MB, so that
// its tile graph can be), and the reference images' sizes. Errors: the
// upscaler's file.
Result<JobPasses> passes_of(const GenerationRequest& request, const ValidatedRequest& job);

// `cfg`: the UNet (the main diffusion network) runs the conditional and
// unconditional passes, as one batch where their contexts have one length.
// `prompt`: the job's prompt, whose length under an LLM's chat template is
// the LLM's and the DiT's context length (null: the family's plan_tokens);
// `negative_prompt` the same for the unconditional pass (with cfg).
// Errors: a graph's planning, a reference image the vision tower refuses.
Result<JobForecast> forecast_job(Model& model, int width, int height, bool cfg, bool flash_attention,
                                 const std::string* prompt = nullptr, const JobPasses& passes = {},
                                 const std::string& negative_prompt = {});

// The placement, per-device peaks, per-module segment counts and the
// verdict, with what streaming from disk costs a step when it must.
std::string describe_forecast(const Model& model, const JobForecast& forecast);

}  // namespace kiln::pipeline
