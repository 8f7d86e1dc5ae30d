// Wan 2.2 A14B's two experts (docs/wan.md, "Wan 2.2 A14B"): two 14B DiTs of
// one shape, the high-noise expert for the schedule's first steps and the
// low-noise one (the model's main diffusion network) for the rest, each with
// its own sampler and guidance, as sd-cli runs them:
//   - --high-noise-steps N > 0: the schedule has --steps + N steps; the
//     expert samples the first N;
//   - unset (-1, sd-cli's default): the schedule has --steps steps; the
//     expert samples those before the first sigma below --moe-boundary
//     (0.875, Wan 2.2 T2V's boundary; sigma = t / 1000 of a flow model);
//   - the sampler starts again at the switch (a multistep sampler's history
//     is the expert's own), on the same noise generator.
// Both are modules of one model in the same device books: with room for one,
// the expert's copies are evicted as the low-noise network's stream in.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::pipeline {

class Model;
struct GenerationRequest;
struct ValidatedRequest;

// sd-cli's --high-noise-* flags and --moe-boundary. Unset fields take the
// job's own (cfg, sampler) or the sampler's default (eta).
struct HighNoiseSampling {
    int steps = -1;  // --high-noise-steps; < 0: from the boundary
    std::optional<float> cfg_scale;
    std::string sampler;
    std::optional<float> eta;
    float moe_boundary = 0.875f;

    // Whether any flag was given (they do nothing without the expert).
    bool given() const { return steps >= 0 || cfg_scale || !sampler.empty() || eta || moe_boundary != 0.875f; }
};

// The steps of `sigmas` (a schedule of sigmas.size() - 1 steps) the
// high-noise expert samples: `requested` when >= 0 (at most the schedule's),
// else those before the first sigma below `boundary`.
int high_noise_step_count(const std::vector<float>& sigmas, int requested, float boundary);

// Checks the request's HighNoiseSampling (each an invalid request naming the
// flag: steps above kMaxSteps in all, cfg or eta out of range, an unknown
// sampler, a boundary outside [0, 1]) and fills ValidatedRequest's expert
// fields; `p` must hold the job's steps, sampler, scheduler and size. A
// model without the expert warns that the flags do nothing.
Status validate_high_noise(const Model& model, const GenerationRequest& r, ValidatedRequest& p);

// The model's diffusion accessors mean the high-noise expert while this lives.
class HighNoiseExpertScope {
  public:
    explicit HighNoiseExpertScope(Model& model);
    ~HighNoiseExpertScope();
    HighNoiseExpertScope(const HighNoiseExpertScope&) = delete;
    HighNoiseExpertScope& operator=(const HighNoiseExpertScope&) = delete;

  private:
    Model& model_;
};

}  // namespace kiln::pipeline
