#include "pipeline/experts.h"

#include <algorithm>
#include <cmath>

#include "pipeline/model.h"
#include "pipeline/request.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {

int high_noise_step_count(const std::vector<float>& sigmas, int requested, float boundary) {
    const int steps = std::max(0, static_cast<int>(sigmas.size()) - 1);
    if (requested >= 0) return std::min(requested, steps);
    for (int i = 0; i < steps; ++i) {
        if (sigmas[static_cast<size_t>(i)] < boundary) return i;
    }
    return steps;
}

Status validate_high_noise(const Model& model, const GenerationRequest& r, ValidatedRequest& p) {
    const HighNoiseSampling& h = r.high_noise;
    if (!model.has_high_noise_expert()) {
        if (h.given()) {
            KILN_LOG_WARN(
                "the --high-noise-* flags and --moe-boundary do nothing without "
                "--high-noise-diffusion-model (Wan 2.2 A14B's high-noise expert)");
        }
        return Status::Ok();
    }
    if (!(h.moe_boundary >= 0.0f && h.moe_boundary <= 1.0f)) {
        return Error::invalid_request("--moe-boundary must be a number in [0, 1] (a flow sigma), got " +
                                      format_number(h.moe_boundary));
    }
    p.high_noise_cfg = h.cfg_scale.value_or(p.cfg);
    if (!(p.high_noise_cfg >= 0.0f && p.high_noise_cfg <= kMaxCfgScale)) {
        return Error::invalid_request("--high-noise-cfg-scale must be a number in [0, " + format_number(kMaxCfgScale) +
                                      "], got " + format_number(p.high_noise_cfg));
    }
    if (h.eta && !(*h.eta >= 0.0f && *h.eta <= 1.0f)) {
        return Error::invalid_request("--high-noise-eta must be a number in [0, 1], got " + format_number(*h.eta));
    }
    p.high_noise_eta = h.eta;
    p.high_noise_sampler = p.sampler;
    if (!h.sampler.empty()) {
        auto sampler = parse_sampler(h.sampler);
        if (!sampler.ok())
            return sampler.error().as(ErrorKind::InvalidRequest).in_context("--high-noise-sampling-method: ");
        p.high_noise_sampler = *sampler;
    }
    std::vector<float> sigmas = r.sigmas;
    if (sigmas.empty()) {
        auto scheduled =
            get_sigmas(p.scheduler, p.steps, *model.noise_schedule(p.width, p.height, p.steps, r.flow_shift));
        if (!scheduled.ok()) return scheduled.error();
        sigmas = std::move(scheduled).value();
    }
    p.high_noise_steps = high_noise_step_count(sigmas, h.steps, h.moe_boundary);
    return Status::Ok();
}

HighNoiseExpertScope::HighNoiseExpertScope(Model& model) : model_(model) { model_.use_high_noise_expert(true); }

HighNoiseExpertScope::~HighNoiseExpertScope() { model_.use_high_noise_expert(false); }

}  // namespace kiln::pipeline
