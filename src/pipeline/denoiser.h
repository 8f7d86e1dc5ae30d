// The discrete-time DDPM denoiser in k-diffusion's continuous-sigma form
// (k-diffusion's DiscreteSchedule / DiscreteEpsDDPMDenoiser / DiscreteVDDPMDenoiser,
// stable-diffusion.cpp's CompVisDenoiser / CompVisVDenoiser).
//
// A model trained on timesteps t = 0..T-1 with cumulative alphas a_t is run
// at noise level sigma: sigma_t = sqrt((1 - a_t) / a_t); the sampler's x is
// x0 + sigma * noise; the network sees c_in * x at the (fractional) timestep
// sigma_to_t(sigma), and the denoised estimate is c_skip * x + c_out * output.
#pragma once

#include <cstddef>
#include <vector>

#include "models/family.h"
#include "util/result.h"

namespace kiln::pipeline {

using models::Prediction;

struct Scalings {
    float c_skip = 1.0f;
    float c_out = 0.0f;
    float c_in = 1.0f;
};

// Karras et al. 2022 (EDM), Table 1 with sigma_data = 1:
//   eps: c_skip = 1, c_out = -sigma, c_in = 1 / sqrt(sigma^2 + 1)
//   v:   c_skip = 1 / (sigma^2 + 1), c_out = -sigma / sqrt(sigma^2 + 1), c_in = 1 / sqrt(sigma^2 + 1)
Scalings get_scalings(Prediction prediction, float sigma);

// denoised[i] = c_skip * x[i] + c_out * model_output[i]. Sizes must match (programmer error otherwise).
std::vector<float> denoised_from_output(Prediction prediction, float sigma, const std::vector<float>& x,
                                        const std::vector<float>& model_output);

// The per-timestep noise table of a discrete model. Index t is the timestep;
// sigmas ascend with t.
class DiscreteSchedule {
  public:
    // SD's "scaled linear" betas (ldm make_beta_schedule("linear")):
    // beta_t = (sqrt(beta_start) + t/(T-1) * (sqrt(beta_end) - sqrt(beta_start)))^2,
    // a_t = prod_{s<=t} (1 - beta_s), computed in double and stored as float32
    // like the alphas_cumprod buffer of an SD checkpoint.
    static DiscreteSchedule scaled_linear(double beta_start = 0.00085, double beta_end = 0.012, int timesteps = 1000);
    // SD 1.x / 2.x: scaled_linear() with its defaults, built once.
    static const DiscreteSchedule& stable_diffusion();
    // A schedule from a checkpoint's alphas_cumprod buffer; values must be in
    // (0, 1), decreasing, at least 2 of them.
    static Result<DiscreteSchedule> from_alphas_cumprod(std::vector<float> alphas_cumprod);

    size_t size() const { return sigmas_.size(); }
    const std::vector<float>& alphas_cumprod() const { return alphas_cumprod_; }
    // sigma_t = sqrt((1 - a_t) / a_t) in float32 arithmetic, as k-diffusion computes it from the float32 buffer.
    const std::vector<float>& sigmas() const { return sigmas_; }
    const std::vector<float>& log_sigmas() const { return log_sigmas_; }
    float sigma_min() const { return sigmas_.front(); }
    float sigma_max() const { return sigmas_.back(); }

    // k-diffusion DiscreteSchedule.sigma_to_t (quantize=False): linear in
    // log sigma between the two neighbouring table entries, clamped to [0, T-1].
    float sigma_to_t(float sigma) const;
    // k-diffusion DiscreteSchedule.t_to_sigma: exp of the log-sigma table
    // interpolated linearly at t (t in [0, T-1]; clamped).
    float t_to_sigma(float t) const;

  private:
    explicit DiscreteSchedule(std::vector<float> alphas_cumprod);

    std::vector<float> alphas_cumprod_;
    std::vector<float> sigmas_;
    std::vector<float> log_sigmas_;
};

}  // namespace kiln::pipeline
