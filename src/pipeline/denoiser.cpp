#include "pipeline/denoiser.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace kiln::pipeline {

Scalings get_scalings(Prediction prediction, float sigma) {
    const double s = sigma;
    const double norm = std::sqrt(s * s + 1.0);
    Scalings out;
    out.c_in = static_cast<float>(1.0 / norm);
    switch (prediction) {
        case Prediction::Eps:  // k-diffusion DiscreteEpsDDPMDenoiser: x + eps * c_out
            out.c_skip = 1.0f;
            out.c_out = -sigma;
            break;
        case Prediction::V:  // k-diffusion DiscreteVDDPMDenoiser
            out.c_skip = static_cast<float>(1.0 / (s * s + 1.0));
            out.c_out = static_cast<float>(-s / norm);
            break;
        case Prediction::Flow:  // ComfyUI CONST: x - sigma * v, the network sees x unscaled
            out.c_in = 1.0f;
            out.c_skip = 1.0f;
            out.c_out = -sigma;
            break;
    }
    return out;
}

std::vector<float> denoised_from_output(const Scalings& sc, const std::vector<float>& x,
                                        const std::vector<float>& model_output) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = sc.c_skip * x[i] + sc.c_out * model_output[i];
    return out;
}

NetworkStep network_step(Prediction prediction, const NoiseSchedule& schedule, float sigma, int timestep_shift) {
    NetworkStep out{schedule.sigma_to_t(sigma), get_scalings(prediction, sigma)};
    if (timestep_shift <= 0) return out;
    out.timestep = std::clamp(std::round(out.timestep * (static_cast<float>(timestep_shift) / 1000.0f)), 0.0f, 999.0f);
    const Scalings shifted = get_scalings(prediction, schedule.t_to_sigma(out.timestep));
    out.scalings.c_skip = shifted.c_skip * out.scalings.c_in / shifted.c_in;
    out.scalings.c_out = shifted.c_out;
    return out;
}

DiscreteSchedule::DiscreteSchedule(std::vector<float> alphas_cumprod) : alphas_cumprod_(std::move(alphas_cumprod)) {
    sigmas_.resize(alphas_cumprod_.size());
    log_sigmas_.resize(alphas_cumprod_.size());
    for (size_t t = 0; t < alphas_cumprod_.size(); ++t) {
        // k-diffusion: ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5 on the float32 buffer, in float32.
        const float a = alphas_cumprod_[t];
        sigmas_[t] = std::sqrt((1.0f - a) / a);
        log_sigmas_[t] = std::log(sigmas_[t]);
    }
}

DiscreteSchedule DiscreteSchedule::scaled_linear(double beta_start, double beta_end, int timesteps) {
    // ldm: torch.linspace(beta_start ** 0.5, beta_end ** 0.5, T, dtype=float64) ** 2, then np.cumprod(1 - betas).
    // torch.linspace fills the first half from the start and the second half from the end; done the same way here
    // so that the double values (and so their float32 roundings) agree.
    const int n = std::max(timesteps, 2);
    const double start = std::sqrt(beta_start);
    const double end = std::sqrt(beta_end);
    const double step = (end - start) / (n - 1);
    std::vector<float> alphas_cumprod(static_cast<size_t>(n));
    double product = 1.0;
    for (int t = 0; t < n; ++t) {
        const double root = t < n / 2 ? start + step * t : end - step * (n - 1 - t);
        product *= 1.0 - root * root;
        alphas_cumprod[static_cast<size_t>(t)] = static_cast<float>(product);
    }
    return DiscreteSchedule(std::move(alphas_cumprod));
}

const DiscreteSchedule& DiscreteSchedule::stable_diffusion() {
    static const DiscreteSchedule schedule = scaled_linear();
    return schedule;
}

Result<DiscreteSchedule> DiscreteSchedule::from_alphas_cumprod(std::vector<float> alphas_cumprod) {
    if (alphas_cumprod.size() < 2) {
        return Error{"alphas_cumprod: need at least 2 timesteps, got " + std::to_string(alphas_cumprod.size())};
    }
    for (size_t t = 0; t < alphas_cumprod.size(); ++t) {
        const float a = alphas_cumprod[t];
        if (!(a > 0.0f && a < 1.0f)) {
            return Error{"alphas_cumprod: value " + std::to_string(a) + " at timestep " + std::to_string(t) +
                         " is not in (0, 1)"};
        }
        if (t > 0 && !(a < alphas_cumprod[t - 1])) {
            return Error{"alphas_cumprod: not decreasing at timestep " + std::to_string(t)};
        }
    }
    return DiscreteSchedule(std::move(alphas_cumprod));
}

float DiscreteSchedule::sigma_to_t(float sigma) const {
    const double log_sigma = std::log(static_cast<double>(sigma));
    // low_idx = (number of table entries <= log_sigma) - 1, kept inside [0, T-2] (k-diffusion: the argmax of the
    // cumulative sum of dists >= 0, clamped).
    const auto above = std::upper_bound(log_sigmas_.begin(), log_sigmas_.end(), log_sigma,
                                        [](double value, float entry) { return value < static_cast<double>(entry); });
    const long count = static_cast<long>(above - log_sigmas_.begin());
    const long low_idx = std::min(std::max(count - 1, 0L), static_cast<long>(log_sigmas_.size()) - 2);
    const double low = log_sigmas_[static_cast<size_t>(low_idx)];
    const double high = log_sigmas_[static_cast<size_t>(low_idx + 1)];
    const double w = std::clamp((low - log_sigma) / (low - high), 0.0, 1.0);
    return static_cast<float>((1.0 - w) * static_cast<double>(low_idx) + w * static_cast<double>(low_idx + 1));
}

float DiscreteSchedule::t_to_sigma(float t) const {
    const double tt = std::clamp(static_cast<double>(t), 0.0, static_cast<double>(log_sigmas_.size() - 1));
    const double low_t = std::floor(tt);
    const size_t low_idx = static_cast<size_t>(low_t);
    const size_t high_idx = static_cast<size_t>(std::ceil(tt));
    const double w = tt - low_t;
    const double log_sigma = (1.0 - w) * log_sigmas_[low_idx] + w * log_sigmas_[high_idx];
    return static_cast<float>(std::exp(log_sigma));
}

float FlowSchedule::time_shift(float mu, float s) {
    if (s <= 0.0f) return 0.0f;
    // In float, as stable-diffusion.cpp's flux_time_shift computes it.
    return std::exp(mu) / (std::exp(mu) + (1.0f / s - 1.0f));
}

float FlowSchedule::resolution_mu(int64_t image_tokens, float base_mu, float max_mu) {
    // BFL get_lin_function(x1=256, y1=base_shift, x2=4096, y2=max_shift).
    const double m = (static_cast<double>(max_mu) - base_mu) / (4096.0 - 256.0);
    const double b = base_mu - m * 256.0;
    return static_cast<float>(m * static_cast<double>(image_tokens) + b);
}

float FlowSchedule::empirical_mu(int64_t image_tokens, int steps) {
    const double a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666;
    const auto seq = static_cast<double>(image_tokens);
    if (image_tokens > 4300) return static_cast<float>(a2 * seq + b2);
    const double m_200 = a2 * seq + b2, m_10 = a1 * seq + b1;
    const double a = (m_200 - m_10) / 190.0;
    const double b = m_200 - 200.0 * a;
    return static_cast<float>(a * steps + b);
}

FlowSchedule::FlowSchedule(float mu) : mu_(mu), sigmas_(kTimesteps) {
    for (int t = 0; t < kTimesteps; ++t) sigmas_[static_cast<size_t>(t)] = t_to_sigma(static_cast<float>(t));
}

float FlowSchedule::t_to_sigma(float t) const {
    const float tt = std::clamp(t, 0.0f, static_cast<float>(kTimesteps - 1));
    return time_shift(mu_, (tt + 1.0f) / static_cast<float>(kTimesteps));
}

}  // namespace kiln::pipeline
