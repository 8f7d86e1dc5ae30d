// Denoisers in k-diffusion's continuous-sigma form, and the noise schedules
// the samplers walk.
//
// Discrete DDPM (k-diffusion's DiscreteSchedule / DiscreteEpsDDPMDenoiser /
// DiscreteVDDPMDenoiser, stable-diffusion.cpp's CompVisDenoiser /
// CompVisVDenoiser): a model trained on timesteps t = 0..T-1 with cumulative
// alphas a_t is run at noise level sigma: sigma_t = sqrt((1 - a_t) / a_t); the
// sampler's x is x0 + sigma * noise; the network sees c_in * x at the
// (fractional) timestep sigma_to_t(sigma), and the denoised estimate is
// c_skip * x + c_out * output.
//
// Rectified flow (Flux; Liu et al. 2022, Esser et al. 2024): x = (1 - sigma)
// x0 + sigma * noise with sigma in [0, 1]; the network predicts the velocity
// v = noise - x0 at timestep sigma, so the denoised estimate is x - sigma * v
// (ComfyUI's CONST model sampling, stable-diffusion.cpp's FluxFlowDenoiser).
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
//   flow: c_skip = 1, c_out = -sigma, c_in = 1
Scalings get_scalings(Prediction prediction, float sigma);

// denoised[i] = c_skip * x[i] + c_out * model_output[i]. Sizes must match (programmer error otherwise).
std::vector<float> denoised_from_output(const Scalings& scalings, const std::vector<float>& x,
                                        const std::vector<float>& model_output);

// The per-timestep noise table a model was trained on, as the schedulers
// (schedulers.h) and samplers read it. Index t is the timestep (0..size()-1);
// sigmas ascend with t.
class NoiseSchedule {
  public:
    virtual ~NoiseSchedule() = default;
    virtual size_t size() const = 0;
    virtual const std::vector<float>& sigmas() const = 0;
    float sigma_min() const { return sigmas().front(); }
    float sigma_max() const { return sigmas().back(); }
    // The network's timestep input at `sigma`.
    virtual float sigma_to_t(float sigma) const = 0;
    // Sigma at a fractional timestep t in [0, size()-1] (clamped).
    virtual float t_to_sigma(float t) const = 0;
    // Whether this is a rectified-flow schedule (x = (1 - sigma) x0 + sigma
    // noise) rather than a variance-exploding one (x = x0 + sigma noise):
    // the samplers mix noise in differently.
    virtual bool flow() const { return false; }
};

// One network evaluation's timestep and scalings at `sigma`: t =
// schedule.sigma_to_t(sigma) and get_scalings(sigma), or with sd-cli's
// --timestep-shift N > 0 (NitroFusion's SDXL models) the whole timestep t'
// = round(t * N / 1000) in [0, 999] and, with sigma' = t_to_sigma(t'),
// c_skip(sigma') * c_in(sigma) / c_in(sigma') and c_out(sigma'); the input
// keeps c_in(sigma). (For eps: c_skip = sqrt(sigma'^2 + 1) / sqrt(sigma^2 +
// 1), c_out = -sigma'.)
struct NetworkStep {
    float timestep = 0.0f;
    Scalings scalings;
};
NetworkStep network_step(Prediction prediction, const NoiseSchedule& schedule, float sigma, int timestep_shift = 0);

// A discrete DDPM schedule.
class DiscreteSchedule : public NoiseSchedule {
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

    size_t size() const override { return sigmas_.size(); }
    const std::vector<float>& alphas_cumprod() const { return alphas_cumprod_; }
    // sigma_t = sqrt((1 - a_t) / a_t) in float32 arithmetic, as k-diffusion computes it from the float32 buffer.
    const std::vector<float>& sigmas() const override { return sigmas_; }
    const std::vector<float>& log_sigmas() const { return log_sigmas_; }

    // k-diffusion DiscreteSchedule.sigma_to_t (quantize=False): linear in
    // log sigma between the two neighbouring table entries, clamped to [0, T-1].
    float sigma_to_t(float sigma) const override;
    // k-diffusion DiscreteSchedule.t_to_sigma: exp of the log-sigma table
    // interpolated linearly at t (t in [0, T-1]; clamped).
    float t_to_sigma(float t) const override;

  private:
    explicit DiscreteSchedule(std::vector<float> alphas_cumprod);

    std::vector<float> alphas_cumprod_;
    std::vector<float> sigmas_;
    std::vector<float> log_sigmas_;
};

// The rectified-flow schedule of Flux with its time shift: 1000 timesteps,
// sigma(t) = shift((t + 1) / 1000) where
//   shift(s) = e^mu / (e^mu + (1 / s - 1))
// (BFL's time_shift with sigma 1; equivalently s' = k s / (1 + (k - 1) s),
// k = e^mu). mu = 0 is no shift (Flux.1-schnell). The table is
// stable-diffusion.cpp's FluxFlowDenoiser and ComfyUI's ModelSamplingFlux, so
// the "simple" scheduler visits BFL's shifted linspace(1, 0, n + 1) exactly.
// The network's timestep input is sigma itself.
class FlowSchedule : public NoiseSchedule {
  public:
    static constexpr int kTimesteps = 1000;
    explicit FlowSchedule(float mu);

    // BFL's resolution-dependent shift (flux/sampling.py get_schedule):
    // mu linear in the image's token count, 0.5 at 256 tokens and 1.15 at
    // 4096 (a 1024x1024 Flux image).
    static float resolution_mu(int64_t image_tokens, float base_mu = 0.5f, float max_mu = 1.15f);
    // BFL's FLUX.2 shift (flux2/sampling.py compute_empirical_mu): mu from
    // the image's token count and the number of steps, fitted between 10
    // and 200 steps; linear in the tokens alone above 4300 tokens.
    static float empirical_mu(int64_t image_tokens, int steps);
    // shift(s) for s in (0, 1]; shift(0) = 0.
    static float time_shift(float mu, float s);

    float mu() const { return mu_; }
    size_t size() const override { return sigmas_.size(); }
    const std::vector<float>& sigmas() const override { return sigmas_; }
    float sigma_to_t(float sigma) const override { return sigma; }
    float t_to_sigma(float t) const override;
    bool flow() const override { return true; }

  private:
    float mu_;
    std::vector<float> sigmas_;
};

}  // namespace kiln::pipeline
