// The condition-level step caches (--cache-mode ucache, easycache), as sd-cli
// runs them: each pass of an evaluation (the conditional, the unconditional,
// skip-layer guidance's) keeps its network residual, output - input, from the
// last evaluation that computed it. On an evaluation inside the active window
// (sigma at most the one at `start` of the schedule and above the one at
// `end`), the first pass decides for all: with the mean absolute change of
// the network input since the last computed evaluation, d_in, and the rate k
// = d_out / d_in the last two computed evaluations showed (d_out their
// outputs' mean absolute change), the output's change is estimated as k d_in;
//
//   easycache  accumulates k d_in / |out| (|out| the last output's mean
//              absolute value) and reuses while the sum stays under threshold;
//   ucache     accumulates (decay times the sum) k d_in / sqrt(|out| g), g the
//              running mean of d_out times 1.6, grown by half for each
//              evaluation reused in a row; it reuses while the sum stays under
//              threshold times 0.5 in the first fifth of the active
//              evaluations and 1.5 in the last fifth; `relative` 0 compares k
//              d_in with threshold |out| instead; `reset` restarts the sum
//              after an evaluation that computes.
//
// A reused pass's output is its input plus its kept residual. With a
// threshold of 0 nothing is reused.
#pragma once

#include <map>
#include <vector>

#include "pipeline/denoiser.h"
#include "pipeline/step_cache_options.h"

namespace kiln::pipeline {

class ConditionCache {
  public:
    // `sigmas`: the schedule the sampler walks (n + 1 values).
    ConditionCache(const StepCacheOptions& options, const std::vector<float>& sigmas, const NoiseSchedule& schedule);

    // Whether evaluation `step` at `sigma` reuses every pass's residual on
    // the network input `input` instead of running.
    bool reuses(int step, float sigma, const std::vector<float>& input);
    // Pass `pass`'s reused output at `input`; empty when it has no residual
    // yet (it runs).
    std::vector<float> reused(int pass, const std::vector<float>& input) const;
    // Pass `pass` ran on `input` and gave `output` (pass 0 first).
    void computed(int pass, const std::vector<float>& input, const std::vector<float>& output);

    int reused_count() const { return reused_; }

  private:
    float threshold_now() const;

    StepCacheOptions options_;
    float start_sigma_ = 0.0f, end_sigma_ = 0.0f;
    int active_steps_ = 0;  // evaluations the window holds, for ucache's threshold ramp
    int step_ = -1;
    bool active_ = false;
    bool reusing_ = false;
    std::map<int, std::vector<float>> residuals_;
    std::vector<float> last_input_, last_output_;
    float input_change_ = 0.0f;  // this evaluation's d_in, 0 until measured
    float output_scale_ = 0.0f;  // |out| of the last computed evaluation
    float rate_ = 0.0f;          // k; 0 until two computed evaluations measured it
    float change_mean_ = 0.0f;   // ucache: the running mean of d_out
    float accumulated_ = 0.0f;
    int computed_in_window_ = 0;
    int reused_in_row_ = 0;
    int reused_ = 0;
};

}  // namespace kiln::pipeline
