#include "pipeline/condition_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::pipeline {
namespace {

float mean_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double sum = 0.0;
    for (size_t i = 0; i < a.size(); ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
    return a.empty() ? 0.0f : static_cast<float>(sum / static_cast<double>(a.size()));
}

float mean_abs(const std::vector<float>& a) {
    double sum = 0.0;
    for (float v : a) sum += std::fabs(static_cast<double>(v));
    return a.empty() ? 0.0f : static_cast<float>(sum / static_cast<double>(a.size()));
}

// The sigma `share` of the way through the model's timesteps (easycache).
float sigma_at_share(const NoiseSchedule& schedule, float share) {
    if (share <= 0.0f) return std::numeric_limits<float>::max();
    if (share >= 1.0f) return 0.0f;
    return schedule.t_to_sigma((1.0f - share) * static_cast<float>(schedule.size() - 1));
}

}  // namespace

ConditionCache::ConditionCache(const StepCacheOptions& options, const std::vector<float>& sigmas,
                               const NoiseSchedule& schedule)
    : options_(options) {
    const size_t steps = sigmas.size() > 1 ? sigmas.size() - 1 : 1;
    if (options.mode == CacheMode::UCache) {
        // ucache: the schedule's own sigmas at the step shares.
        const size_t start = std::min(static_cast<size_t>(options.start * static_cast<float>(steps)), steps - 1);
        const size_t end = std::min(static_cast<size_t>(options.end * static_cast<float>(steps)), steps - 1);
        start_sigma_ = std::max(sigmas[start], sigmas[end]);
        end_sigma_ = std::min(sigmas[start], sigmas[end]);
    } else {
        start_sigma_ = sigma_at_share(schedule, options.start);
        end_sigma_ = sigma_at_share(schedule, options.end);
    }
    active_steps_ = static_cast<int>(steps);
}

float ConditionCache::threshold_now() const {
    if (options_.mode != CacheMode::UCache) return options_.threshold;
    const float progress =
        std::clamp(static_cast<float>(computed_in_window_) / static_cast<float>(active_steps_), 0.0f, 1.0f);
    float t = options_.threshold * (progress < 0.2f ? 0.5f : progress > 0.8f ? 1.5f : 1.0f);
    if (!options_.relative) t *= output_scale_;
    return t;
}

bool ConditionCache::reuses(int step, float sigma, const std::vector<float>& input) {
    if (step != step_) {
        step_ = step;
        reusing_ = false;
        active_ = sigma <= start_sigma_ && sigma > end_sigma_;
    }
    input_change_ = 0.0f;
    if (!active_) return false;
    if (reusing_) return true;  // a later evaluation of a step that already reuses (a second-order sampler's)
    if (last_input_.size() != input.size() || last_output_.empty() || residuals_.empty()) return false;
    input_change_ = mean_abs_difference(input, last_input_);
    if (!(rate_ > 0.0f) || !(input_change_ > 0.0f) || !(output_scale_ > 0.0f)) return false;
    const float estimate = rate_ * input_change_;
    if (options_.mode == CacheMode::UCache) {
        float change = estimate;
        if (options_.relative) {
            const float base = std::max(output_scale_, 1e-6f);
            const float dynamic = change_mean_ > 0.0f ? std::max(change_mean_ * 1.6f, 1e-6f) : base;
            change = estimate / std::sqrt(base * dynamic);
        }
        change *= 1.0f + 0.5f * static_cast<float>(reused_in_row_);
        accumulated_ = accumulated_ * options_.decay + change;
    } else {
        accumulated_ += estimate / output_scale_;
    }
    if (accumulated_ < threshold_now()) {
        reusing_ = true;
        ++reused_;
        ++reused_in_row_;
        return true;
    }
    if (options_.mode != CacheMode::UCache || options_.reset) accumulated_ = 0.0f;
    return false;
}

std::vector<float> ConditionCache::reused(int pass, const std::vector<float>& input) const {
    auto found = residuals_.find(pass);
    if (found == residuals_.end() || found->second.size() != input.size()) return {};
    std::vector<float> out(input);
    for (size_t i = 0; i < out.size(); ++i) out[i] += found->second[i];
    return out;
}

void ConditionCache::computed(int pass, const std::vector<float>& input, const std::vector<float>& output) {
    if (!active_ || input.size() != output.size()) return;
    std::vector<float>& residual = residuals_[pass];
    residual.resize(output.size());
    for (size_t i = 0; i < output.size(); ++i) residual[i] = output[i] - input[i];
    if (pass != 0) return;
    // The first pass measures the rates the next decision reads.
    ++computed_in_window_;
    reused_in_row_ = 0;
    const float output_change = last_output_.size() == output.size() ? mean_abs_difference(output, last_output_) : 0.0f;
    if (options_.mode == CacheMode::UCache && std::isfinite(output_change) && output_change > 0.0f) {
        change_mean_ = change_mean_ > 0.0f ? 0.8f * change_mean_ + 0.2f * output_change : output_change;
    }
    if (input_change_ > 0.0f && output_change > 0.0f) {
        const float rate = output_change / input_change_;
        if (std::isfinite(rate)) rate_ = rate;
    }
    last_input_ = input;
    last_output_ = output;
    output_scale_ = mean_abs(output);
    if (options_.mode != CacheMode::UCache) accumulated_ = 0.0f;
    input_change_ = 0.0f;
}

}  // namespace kiln::pipeline
