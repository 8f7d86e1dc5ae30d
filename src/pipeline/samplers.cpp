#include "pipeline/samplers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <utility>

namespace kiln::pipeline {
namespace {

struct SamplerName {
    SamplerKind kind;
    std::string_view name;
};

// Canonical names, in sd.cpp's order.
constexpr SamplerName kSamplerNames[] = {
    {SamplerKind::Euler, "euler"},
    {SamplerKind::EulerA, "euler_a"},
    {SamplerKind::Heun, "heun"},
    {SamplerKind::Dpm2, "dpm2"},
    {SamplerKind::DpmPp2SA, "dpm++2s_a"},
    {SamplerKind::DpmPp2M, "dpm++2m"},
    {SamplerKind::DpmPp2Mv2, "dpm++2mv2"},
    {SamplerKind::Ipndm, "ipndm"},
    {SamplerKind::Lcm, "lcm"},
    {SamplerKind::DdimTrailing, "ddim_trailing"},
    {SamplerKind::Tcd, "tcd"},
};

// Other spellings people bring from k-diffusion, ComfyUI and the webui.
constexpr SamplerName kSamplerAliases[] = {
    {SamplerKind::EulerA, "euler_ancestral"}, {SamplerKind::Dpm2, "dpm_2"},
    {SamplerKind::DpmPp2SA, "dpmpp_2s_a"},    {SamplerKind::DpmPp2SA, "dpmpp_2s_ancestral"},
    {SamplerKind::DpmPp2M, "dpmpp_2m"},       {SamplerKind::DpmPp2Mv2, "dpmpp_2m_v2"},
    {SamplerKind::DpmPp2Mv2, "dpm++2m_v2"},   {SamplerKind::DdimTrailing, "ddim"},
};

std::string lower(std::string_view text) {
    std::string out(text);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

using Vec = std::vector<float>;

// One sampler run: checks what the denoiser and the RNG hand back, reports progress.
class Run {
  public:
    Run(const DenoiseFn& denoise, Rng& rng, const ProgressFn& progress, size_t size, int steps)
        : denoise_(denoise), rng_(rng), progress_(progress), size_(size), steps_(steps) {}

    int steps() const { return steps_; }

    Result<Vec> denoise(const Vec& x, double sigma, int step) const {
        Result<Vec> out = denoise_(x, static_cast<float>(sigma), step);
        if (out.ok() && out->size() != size_) {
            return Error{"denoiser returned " + std::to_string(out->size()) + " values for a latent of " +
                         std::to_string(size_)};
        }
        return out;
    }

    Result<Vec> noise() const {
        Vec out = rng_.randn(size_);
        if (out.size() != size_) return Error{"rng returned " + std::to_string(out.size()) + " values"};
        return out;
    }

    void step_done(int step) const {
        if (progress_) progress_(step + 1, steps_);
    }

  private:
    const DenoiseFn& denoise_;
    Rng& rng_;
    const ProgressFn& progress_;
    size_t size_;
    int steps_;
};

// Unwraps a Result<Vec> into `name`, returning its error from the enclosing sampler.
#define KILN_SAMPLER_TRY(name, expr)                       \
    Result<Vec> name##_result = (expr);                    \
    if (!name##_result.ok()) return name##_result.error(); \
    const Vec& name = *name##_result

// k-diffusion get_ancestral_step: the deterministic target sigma_down and the noise sigma_up, with
// sigma_down^2 + sigma_up^2 = sigma_to^2.
struct AncestralStep {
    double down;
    double up;
};

AncestralStep ancestral_step(double sigma_from, double sigma_to, double eta) {
    if (eta == 0.0) return {sigma_to, 0.0};
    const double up =
        std::min(sigma_to, eta * std::sqrt(sigma_to * sigma_to * (sigma_from * sigma_from - sigma_to * sigma_to) /
                                           (sigma_from * sigma_from)));
    return {std::sqrt(sigma_to * sigma_to - up * up), up};
}

// out = x + (x - den) / sigma * dt: one Euler step along k-diffusion's
// to_d(x, sigma, denoised). `out` may be `x`.
void euler_step(const Vec& x, const Vec& den, double sigma, double dt, Vec& out) {
    for (size_t j = 0; j < x.size(); ++j) out[j] = static_cast<float>(x[j] + (x[j] - den[j]) / sigma * dt);
}

// x += noise * scale.
Result<Vec> add_noise(const Run& run, Vec x, double scale) {
    KILN_SAMPLER_TRY(noise, run.noise());
    for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(x[j] + noise[j] * scale);
    return x;
}

// ---- first-order and Heun-type -------------------------------------------------------------------------------------

Result<Vec> sample_euler(const Run& run, Vec x, const Vec& sigmas) {
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double dt = sigmas[i + 1] - s;
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        euler_step(x, den, s, dt, x);
        run.step_done(i);
    }
    return x;
}

Result<Vec> sample_euler_ancestral(const Run& run, Vec x, const Vec& sigmas, double eta) {
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        const AncestralStep a = ancestral_step(s, s_next, eta);
        const double dt = a.down - s;
        euler_step(x, den, s, dt, x);
        if (s_next > 0) {
            Result<Vec> noised = add_noise(run, std::move(x), a.up);
            if (!noised.ok()) return noised;
            x = std::move(*noised);
        }
        run.step_done(i);
    }
    return x;
}

Result<Vec> sample_heun(const Run& run, Vec x, const Vec& sigmas) {
    Vec x2(x.size());
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        const double dt = s_next - s;
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        if (s_next == 0) {
            euler_step(x, den, s, dt, x);
        } else {
            euler_step(x, den, s, dt, x2);
            KILN_SAMPLER_TRY(den2, run.denoise(x2, s_next, i));
            for (size_t j = 0; j < x.size(); ++j) {
                const double d = (x[j] - den[j]) / s;
                const double d2 = (x2[j] - den2[j]) / s_next;
                x[j] = static_cast<float>(x[j] + (d + d2) / 2 * dt);
            }
        }
        run.step_done(i);
    }
    return x;
}

Result<Vec> sample_dpm2(const Run& run, Vec x, const Vec& sigmas) {
    Vec x2(x.size());
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        if (s_next == 0) {
            const double dt = s_next - s;
            euler_step(x, den, s, dt, x);
        } else {
            // Midpoint in log sigma.
            const double s_mid = std::exp(0.5 * (std::log(s) + std::log(s_next)));
            const double dt_1 = s_mid - s;
            const double dt_2 = s_next - s;
            euler_step(x, den, s, dt_1, x2);
            KILN_SAMPLER_TRY(den2, run.denoise(x2, s_mid, i));
            for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(x[j] + (x2[j] - den2[j]) / s_mid * dt_2);
        }
        run.step_done(i);
    }
    return x;
}

// ---- DPM-Solver++ (Lu et al. 2022), in t = -log sigma ------------------------------------------------------------

Result<Vec> sample_dpmpp_2s_ancestral(const Run& run, Vec x, const Vec& sigmas, double eta) {
    Vec x2(x.size());
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        const AncestralStep a = ancestral_step(s, s_next, eta);
        if (a.down == 0) {
            // Euler to sigma 0 lands on the denoised estimate.
            const double dt = a.down - s;
            euler_step(x, den, s, dt, x);
        } else {
            const double h = std::log(s) - std::log(a.down);  // t_next - t
            const double s_mid = s * std::exp(-0.5 * h);      // sigma(t + h / 2)
            const double half_ratio = std::exp(-0.5 * h);
            const double half_coef = std::expm1(-0.5 * h);
            for (size_t j = 0; j < x.size(); ++j) x2[j] = static_cast<float>(half_ratio * x[j] - half_coef * den[j]);
            KILN_SAMPLER_TRY(den2, run.denoise(x2, s_mid, i));
            const double ratio = std::exp(-h);
            const double coef = std::expm1(-h);
            for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(ratio * x[j] - coef * den2[j]);
        }
        if (s_next > 0) {
            Result<Vec> noised = add_noise(run, std::move(x), a.up);
            if (!noised.ok()) return noised;
            x = std::move(*noised);
        }
        run.step_done(i);
    }
    return x;
}

// dpm++2m and its v2 variant differ only in the step used for the correction's exponential.
Result<Vec> sample_dpmpp_2m(const Run& run, Vec x, const Vec& sigmas, bool v2) {
    Vec old_denoised;
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        if (s_next == 0) {
            x = den;  // sigma_next / sigma = 0 and expm1(-inf) = -1
        } else {
            const double h = std::log(s) - std::log(s_next);
            const double ratio = s_next / s;
            if (old_denoised.empty()) {
                const double coef = std::expm1(-h);
                for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(ratio * x[j] - coef * den[j]);
            } else {
                const double h_last = std::log(sigmas[i - 1]) - std::log(s);
                double r = h_last / h;
                double h_eff = h;
                if (v2) {
                    // webui discussion #8457: the ratio of the larger to the smaller step, and their mean as h.
                    const double h_min = std::min(h_last, h);
                    const double h_max = std::max(h_last, h);
                    r = h_max / h_min;
                    h_eff = (h_max + h_min) / 2;
                }
                const double coef = std::expm1(-h_eff);
                const double w_old = 1.0 / (2.0 * r);
                for (size_t j = 0; j < x.size(); ++j) {
                    const double den_d = (1.0 + w_old) * den[j] - w_old * old_denoised[j];
                    x[j] = static_cast<float>(ratio * x[j] - coef * den_d);
                }
            }
        }
        old_denoised = den;
        run.step_done(i);
    }
    return x;
}

// ---- multistep and consistency -------------------------------------------------------------------------------------

Result<Vec> sample_ipndm(const Run& run, Vec x, const Vec& sigmas) {
    constexpr size_t kMaxOrder = 4;
    std::deque<Vec> history;  // previous d's, oldest first, at most kMaxOrder - 1
    Vec d(x.size());
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double dt = sigmas[i + 1] - s;
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        for (size_t j = 0; j < x.size(); ++j) d[j] = static_cast<float>((x[j] - den[j]) / s);
        // Adams-Bashforth coefficients for orders 1-4 (newest first).
        const size_t order = std::min(kMaxOrder, history.size() + 1);
        const size_t h = history.size();
        for (size_t j = 0; j < x.size(); ++j) {
            double slope = 0;
            switch (order) {
                case 1: slope = d[j]; break;
                case 2: slope = (3.0 * d[j] - history[h - 1][j]) / 2.0; break;
                case 3: slope = (23.0 * d[j] - 16.0 * history[h - 1][j] + 5.0 * history[h - 2][j]) / 12.0; break;
                default:
                    slope =
                        (55.0 * d[j] - 59.0 * history[h - 1][j] + 37.0 * history[h - 2][j] - 9.0 * history[h - 3][j]) /
                        24.0;
                    break;
            }
            x[j] = static_cast<float>(x[j] + dt * slope);
        }
        if (history.size() == kMaxOrder - 1) history.pop_front();
        history.push_back(d);
        run.step_done(i);
    }
    return x;
}

Result<Vec> sample_lcm(const Run& run, Vec x, const Vec& sigmas) {
    for (int i = 0; i < run.steps(); ++i) {
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, sigmas[i], i));
        x = den;
        if (s_next > 0) {
            // ComfyUI model_sampling.noise_scaling for eps models: x0 + sigma * noise.
            Result<Vec> noised = add_noise(run, std::move(x), s_next);
            if (!noised.ok()) return noised;
            x = std::move(*noised);
        }
        run.step_done(i);
    }
    return x;
}

// ---- rectified flow (x = (1 - sigma) x0 + sigma noise) -------------------------------------------------------------

// ComfyUI's sample_euler_ancestral_RF: Euler to sigma_down along the straight
// line to the denoised estimate, then back up to sigma_next by scaling the
// signal and adding fresh noise, so x stays on the flow's (1 - sigma, sigma) mix.
Result<Vec> sample_euler_ancestral_flow(const Run& run, Vec x, const Vec& sigmas, double eta) {
    for (int i = 0; i < run.steps(); ++i) {
        const double s = sigmas[i];
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, s, i));
        if (s_next == 0) {
            x = den;
        } else {
            const double down = s_next * (1.0 + (s_next / s - 1.0) * eta);
            const double alpha_next = 1.0 - s_next;
            const double alpha_down = 1.0 - down;
            const double renoise = std::sqrt(
                std::max(0.0, s_next * s_next - down * down * alpha_next * alpha_next / (alpha_down * alpha_down)));
            const double ratio = down / s;
            KILN_SAMPLER_TRY(noise, run.noise());
            for (size_t j = 0; j < x.size(); ++j) {
                const double stepped = ratio * x[j] + (1.0 - ratio) * den[j];
                x[j] = static_cast<float>(alpha_next / alpha_down * stepped + noise[j] * renoise);
            }
        }
        run.step_done(i);
    }
    return x;
}

// LCM on a flow model: x = D, then noise mixed in at the next sigma as the
// flow mixes it (ComfyUI's CONST noise_scaling: sigma noise + (1 - sigma) x0).
Result<Vec> sample_lcm_flow(const Run& run, Vec x, const Vec& sigmas) {
    for (int i = 0; i < run.steps(); ++i) {
        const double s_next = sigmas[i + 1];
        KILN_SAMPLER_TRY(den, run.denoise(x, sigmas[i], i));
        x = den;
        if (s_next > 0) {
            KILN_SAMPLER_TRY(noise, run.noise());
            for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>((1.0 - s_next) * x[j] + s_next * noise[j]);
        }
        run.step_done(i);
    }
    return x;
}

// The DDPM quantities at one timestep.
struct Ddpm {
    const DiscreteSchedule& schedule;

    double alpha(long t) const { return schedule.alphas_cumprod()[static_cast<size_t>(t)]; }
    double sigma(long t) const { return std::sqrt((1.0 - alpha(t)) / alpha(t)); }
    long last() const { return static_cast<long>(schedule.size()) - 1; }
};

// One network evaluation in variance-preserving space: x_k = x_vp / sqrt(a_t) is what k-diffusion's denoiser
// expects; D is its x0 and eps = (x_k - D) / sigma_t the implied noise (for an eps model, exactly its output).
struct VpEval {
    Vec x0;
    Vec eps;
};

Result<VpEval> eval_vp(const Run& run, const Vec& x_vp, const Ddpm& ddpm, long t, int step) {
    const double s = ddpm.sigma(t);
    const double scale = std::sqrt(1.0 + s * s);
    Vec x_k(x_vp.size());
    for (size_t j = 0; j < x_vp.size(); ++j) x_k[j] = static_cast<float>(x_vp[j] * scale);
    Result<Vec> den = run.denoise(x_k, s, step);
    if (!den.ok()) return den.error();
    VpEval out{std::move(*den), Vec(x_vp.size())};
    for (size_t j = 0; j < x_vp.size(); ++j) out.eps[j] = static_cast<float>((x_k[j] - out.x0[j]) / s);
    return out;
}

Result<Vec> sample_ddim_trailing(const Run& run, Vec x, const Ddpm& ddpm, double eta) {
    const long timesteps = ddpm.last() + 1;
    const int steps = run.steps();
    const double step_ratio = static_cast<double>(timesteps) / steps;
    // diffusers "trailing": np.round(np.arange(T, 0, -T / steps)) - 1 (numpy rounds half to even, as nearbyint).
    auto timestep_at = [&](int i) {
        return std::clamp(static_cast<long>(std::nearbyint(static_cast<double>(timesteps) - i * step_ratio)) - 1, 0L,
                          ddpm.last());
    };
    const double sigma_first = ddpm.sigma(timestep_at(0));
    for (float& v : x) v = static_cast<float>(v / sigma_first);  // noise * sigma -> x_T = noise

    for (int i = 0; i < steps; ++i) {
        const long t = timestep_at(i);
        const long prev = t - timesteps / steps;
        Result<VpEval> ev = eval_vp(run, x, ddpm, t, i);
        if (!ev.ok()) return ev.error();
        const double a_t = ddpm.alpha(t);
        const double a_prev = prev >= 0 ? ddpm.alpha(prev) : ddpm.alpha(0);  // final_alpha_cumprod = a_0
        // Song et al. 2020, eq. (16): sigma_t(eta).
        const double variance = (1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev);
        const double std_dev = eta * std::sqrt(variance);
        const double x0_coef = std::sqrt(a_prev);
        const double eps_coef = std::sqrt(std::max(1.0 - a_prev - std_dev * std_dev, 0.0));
        for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(x0_coef * ev->x0[j] + eps_coef * ev->eps[j]);
        if (eta > 0) {
            Result<Vec> noised = add_noise(run, std::move(x), std_dev);
            if (!noised.ok()) return noised;
            x = std::move(*noised);
        }
        run.step_done(i);
    }
    return x;
}

Result<Vec> sample_tcd(const Run& run, Vec x, const Ddpm& ddpm, double eta) {
    constexpr long kOriginalSteps = 50;
    const long timesteps = ddpm.last() + 1;
    const long k = std::max(timesteps / kOriginalSteps, 1L);
    const int steps = run.steps();
    // diffusers TCDScheduler: the LCM training timesteps k*m - 1 (m = 1..50), from the top, every 50/steps-th.
    const double stride = static_cast<double>(kOriginalSteps) / steps;
    auto timestep_at = [&](int i) {
        return std::clamp(timesteps - 1 - k * static_cast<long>(std::floor(i * stride)), 0L, ddpm.last());
    };
    const double sigma_first = ddpm.sigma(timestep_at(0));
    for (float& v : x) v = static_cast<float>(v / sigma_first);

    // (1 - gamma) * prev in float32, as diffusers multiplies the integer timestep tensor by a Python float.
    const float keep = static_cast<float>(1.0 - static_cast<double>(eta));
    for (int i = 0; i < steps; ++i) {
        const long t = timestep_at(i);
        const long prev = i == steps - 1 ? 0 : timestep_at(i + 1);
        const long t_s = std::clamp(static_cast<long>(std::floor(keep * static_cast<float>(prev))), 0L, ddpm.last());
        Result<VpEval> ev = eval_vp(run, x, ddpm, t, i);
        if (!ev.ok()) return ev.error();
        const double a_prev = ddpm.alpha(prev);
        const double a_s = ddpm.alpha(t_s);
        // Zheng et al. 2024, eq. (32) with eta = 0: jump to x_s along the predicted trajectory.
        const double x0_coef = std::sqrt(a_s);
        const double eps_coef = std::sqrt(1.0 - a_s);
        for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(x0_coef * ev->x0[j] + eps_coef * ev->eps[j]);
        if (eta > 0 && i != steps - 1) {
            // Eq. (35): forward-diffuse x_s back to prev with fresh noise.
            KILN_SAMPLER_TRY(noise, run.noise());
            const double keep_coef = std::sqrt(a_prev / a_s);
            const double noise_coef = std::sqrt(std::max(1.0 - a_prev / a_s, 0.0));
            for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(keep_coef * x[j] + noise_coef * noise[j]);
        }
        run.step_done(i);
    }
    return x;
}

#undef KILN_SAMPLER_TRY

}  // namespace

std::string_view sampler_name(SamplerKind kind) {
    for (const SamplerName& entry : kSamplerNames) {
        if (entry.kind == kind) return entry.name;
    }
    return "?";
}

std::string sampler_names() {
    std::string names;
    for (const SamplerName& entry : kSamplerNames) {
        if (!names.empty()) names += ", ";
        names += entry.name;
    }
    return names;
}

Result<SamplerKind> parse_sampler(std::string_view name) {
    const std::string wanted = lower(name);
    for (const SamplerName& entry : kSamplerNames) {
        if (entry.name == wanted) return entry.kind;
    }
    for (const SamplerName& entry : kSamplerAliases) {
        if (entry.name == wanted) return entry.kind;
    }
    return Error{"--sampling-method: unknown sampling method '" + std::string(name) + "' (valid: " + sampler_names() +
                 ")"};
}

std::string flow_sampler_names() {
    std::string names;
    for (const SamplerName& entry : kSamplerNames) {
        if (entry.kind == SamplerKind::DpmPp2SA || entry.kind == SamplerKind::DdimTrailing ||
            entry.kind == SamplerKind::Tcd) {
            continue;
        }
        names += (names.empty() ? "" : ", ") + std::string(entry.name);
    }
    return names;
}

float default_eta(SamplerKind kind) {
    switch (kind) {
        case SamplerKind::EulerA:
        case SamplerKind::DpmPp2SA: return 1.0f;
        default: return 0.0f;
    }
}

Result<std::vector<float>> sample(SamplerKind kind, const DenoiseFn& denoise, std::vector<float> x,
                                  const std::vector<float>& sigmas, Rng& rng, float eta, const ProgressFn& progress,
                                  const NoiseSchedule& schedule) {
    if (sigmas.size() < 2) {
        return Error{"sigmas: need at least 2 values (1 step), got " + std::to_string(sigmas.size())};
    }
    for (size_t i = 0; i < sigmas.size(); ++i) {
        const float s = sigmas[i];
        const bool last = i + 1 == sigmas.size();
        if (!std::isfinite(s) || s < 0.0f || (!last && s == 0.0f)) {
            return Error{"sigmas: value " + std::to_string(s) + " at index " + std::to_string(i) +
                         (last ? " must be finite and >= 0" : " must be finite and > 0 (only the last may be 0)")};
        }
        if (i > 0 && s > sigmas[i - 1]) {
            return Error{"sigmas: not descending at index " + std::to_string(i)};
        }
    }
    if (!std::isfinite(eta) || eta < 0.0f) return Error{"--eta: must be finite and >= 0, got " + std::to_string(eta)};

    const int steps = static_cast<int>(sigmas.size() - 1);
    const Run run(denoise, rng, progress, x.size(), steps);
    if (schedule.flow()) {
        if (sigmas.front() > 1.0f) return Error{"sigmas: a flow schedule's sigmas must be in [0, 1]"};
        switch (kind) {
            // The deterministic samplers integrate dx/dsigma = (x - D) / sigma,
            // which on a flow model is its velocity: the same code, as ComfyUI
            // and stable-diffusion.cpp run them.
            case SamplerKind::Euler: return sample_euler(run, std::move(x), sigmas);
            case SamplerKind::Heun: return sample_heun(run, std::move(x), sigmas);
            case SamplerKind::Dpm2: return sample_dpm2(run, std::move(x), sigmas);
            case SamplerKind::DpmPp2M: return sample_dpmpp_2m(run, std::move(x), sigmas, false);
            case SamplerKind::DpmPp2Mv2: return sample_dpmpp_2m(run, std::move(x), sigmas, true);
            case SamplerKind::Ipndm: return sample_ipndm(run, std::move(x), sigmas);
            case SamplerKind::EulerA: return sample_euler_ancestral_flow(run, std::move(x), sigmas, eta);
            case SamplerKind::Lcm: return sample_lcm_flow(run, std::move(x), sigmas);
            case SamplerKind::DpmPp2SA:
            case SamplerKind::DdimTrailing:
            case SamplerKind::Tcd:
                return Error::invalid_request("--sampling-method " + std::string(sampler_name(kind)) +
                                              ": not defined for flow models (Flux, Chroma); use " +
                                              flow_sampler_names());
        }
        return Error{"sample: unknown sampling method"};
    }
    const auto* ddpm = dynamic_cast<const DiscreteSchedule*>(&schedule);
    if (!ddpm && (kind == SamplerKind::DdimTrailing || kind == SamplerKind::Tcd)) {
        return Error{"sample: " + std::string(sampler_name(kind)) + " needs a DDPM schedule"};
    }
    const Ddpm vp{ddpm ? *ddpm : DiscreteSchedule::stable_diffusion()};
    switch (kind) {
        case SamplerKind::Euler: return sample_euler(run, std::move(x), sigmas);
        case SamplerKind::EulerA: return sample_euler_ancestral(run, std::move(x), sigmas, eta);
        case SamplerKind::Heun: return sample_heun(run, std::move(x), sigmas);
        case SamplerKind::Dpm2: return sample_dpm2(run, std::move(x), sigmas);
        case SamplerKind::DpmPp2SA: return sample_dpmpp_2s_ancestral(run, std::move(x), sigmas, eta);
        case SamplerKind::DpmPp2M: return sample_dpmpp_2m(run, std::move(x), sigmas, false);
        case SamplerKind::DpmPp2Mv2: return sample_dpmpp_2m(run, std::move(x), sigmas, true);
        case SamplerKind::Ipndm: return sample_ipndm(run, std::move(x), sigmas);
        case SamplerKind::Lcm: return sample_lcm(run, std::move(x), sigmas);
        case SamplerKind::DdimTrailing: return sample_ddim_trailing(run, std::move(x), vp, eta);
        case SamplerKind::Tcd: return sample_tcd(run, std::move(x), vp, eta);
    }
    return Error{"sample: unknown sampling method"};
}

}  // namespace kiln::pipeline
