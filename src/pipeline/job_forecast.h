// `kiln plan` / `--dry-run`: what a generation job would need where, without
// running it. The text encoder, ControlNet (when the model has one), UNet
// (CFG batch of two) and VAE decoder graphs of the job, and the VAE encoder
// and hires pass when it has them, are built and planned by each module's
// executor at the device's current limit; nothing is uploaded or computed.
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
    bool tiled = false;         // the VAE would not fit whole: figures for one tile
    bool separate_cfg = false;  // the UNet's CFG batch of two would not fit: figures for one pass
    std::string pass;           // "" for the job's own size; "init image encode", "hires pass", ...
    // Weights this run reads from disk: its params are on disk, or they are
    // the mapped model file and RAM cannot hold them beside the job (the
    // page cache lets them go before the next run: every step, for the
    // diffusion model). 0: they stay in memory.
    uint64_t streamed_from_disk = 0;
};

// What a job runs besides its text encoding, one denoising pass and a decode
// at its own size.
struct JobPasses {
    // Image-to-image or inpainting: the init image's encode, at its own size
    // (the output's, or another with GenerationRequest::init_latent_resize).
    std::optional<std::pair<int, int>> init_encode_size;
    const ValidatedHires* hires = nullptr;  // the hires fix: its encode (pixel upscalers), UNet and decode
    // The hires fix's model upscaler (its name and memory), held in RAM for
    // the whole job; the caller measures it (Upscaler::memory).
    std::optional<std::pair<std::string, UpscalerMemory>> upscaler;
    // A block-level step cache: the diffusion network runs its front, rest
    // and cached stages (models::BlockStage) instead of whole evaluations,
    // each planned with its own inputs. The hires pass runs whole.
    std::optional<models::BlockSplit> block_stages;
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
};

// The passes `request` runs besides the plain one, as validated into `job`
// (which the result points into): the init image's encode, the hires fix,
// and its model upscaler, measured (its weights are read, tens of MB, so
// that its tile graph can be). Errors: the upscaler's file.
Result<JobPasses> passes_of(const GenerationRequest& request, const ValidatedRequest& job);

// `cfg`: the UNet runs the conditional and unconditional passes as one batch.
// `prompt`: the job's prompt, whose length under an LLM's chat template is
// the LLM's and the DiT's context length (null: the family's plan_tokens).
Result<JobForecast> forecast_job(Model& model, int width, int height, bool cfg, bool flash_attention,
                                 const std::string* prompt = nullptr, const JobPasses& passes = {});

// The placement, per-device peaks, per-module segment counts and the
// verdict, with what streaming from disk costs a step when it must.
std::string describe_forecast(const Model& model, const JobForecast& forecast);

}  // namespace kiln::pipeline
