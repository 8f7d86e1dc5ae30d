#include "pipeline/schedulers.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace kiln::pipeline {
namespace {

struct SchedulerName {
    SchedulerKind kind;
    std::string_view name;
};

constexpr SchedulerName kSchedulerNames[] = {
    {SchedulerKind::Discrete, "discrete"},       {SchedulerKind::Karras, "karras"},
    {SchedulerKind::Exponential, "exponential"}, {SchedulerKind::Ays, "ays"},
    {SchedulerKind::SgmUniform, "sgm_uniform"},  {SchedulerKind::Simple, "simple"},
};

// Align Your Steps, SD 1.5, 10 steps (NVIDIA's published levels at full precision, as ComfyUI and sd.cpp ship them).
constexpr double kAysSd1[] = {14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092,
                              0.9642583904,  0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582};

std::string lower(std::string_view text) {
    std::string out(text);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

// torch.linspace / np.linspace: `count` points from start to end inclusive (just start when count == 1).
std::vector<double> linspace(double start, double end, int count) {
    std::vector<double> out(static_cast<size_t>(count));
    if (count == 1) {
        out[0] = start;
        return out;
    }
    const double step = (end - start) / (count - 1);
    for (int i = 0; i < count; ++i)
        out[static_cast<size_t>(i)] = i < count / 2 ? start + step * i : end - step * (count - 1 - i);
    return out;
}

// np.interp for ascending xp (x inside [xp.front(), xp.back()]).
double interp(double x, const std::vector<double>& xp, const std::vector<double>& fp) {
    if (x <= xp.front()) return fp.front();
    if (x >= xp.back()) return fp.back();
    size_t j = static_cast<size_t>(std::upper_bound(xp.begin(), xp.end(), x) - xp.begin()) - 1;
    const double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    return slope * (x - xp[j]) + fp[j];
}

// NVIDIA's AYS howto, loglinear_interp: interpolate log sigma (ascending) on an even grid over [0, 1].
std::vector<double> loglinear_interp(const std::vector<double>& levels, int count) {
    const int m = static_cast<int>(levels.size());
    const std::vector<double> xs = linspace(0.0, 1.0, m);
    std::vector<double> ys(levels.size());
    for (int i = 0; i < m; ++i) ys[static_cast<size_t>(i)] = std::log(levels[static_cast<size_t>(m - 1 - i)]);
    const std::vector<double> new_xs = linspace(0.0, 1.0, count);
    std::vector<double> out(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i)
        out[static_cast<size_t>(count - 1 - i)] = std::exp(interp(new_xs[static_cast<size_t>(i)], xs, ys));
    return out;
}

std::vector<float> sigmas_at_timesteps(const std::vector<double>& timesteps, const NoiseSchedule& schedule) {
    std::vector<float> out;
    out.reserve(timesteps.size() + 1);
    for (double t : timesteps) out.push_back(schedule.t_to_sigma(static_cast<float>(t)));
    out.push_back(0.0f);
    return out;
}

}  // namespace

std::string_view scheduler_name(SchedulerKind kind) {
    for (const SchedulerName& entry : kSchedulerNames) {
        if (entry.kind == kind) return entry.name;
    }
    return "?";
}

std::string scheduler_names() {
    std::string names;
    for (const SchedulerName& entry : kSchedulerNames) {
        if (!names.empty()) names += ", ";
        names += entry.name;
    }
    return names;
}

Result<SchedulerKind> parse_scheduler(std::string_view name) {
    const std::string wanted = lower(name);
    for (const SchedulerName& entry : kSchedulerNames) {
        if (entry.name == wanted) return entry.kind;
    }
    return Error{"--scheduler: unknown scheduler '" + std::string(name) + "' (valid: " + scheduler_names() + ")"};
}

Result<std::vector<float>> get_sigmas(SchedulerKind kind, int steps, const NoiseSchedule& schedule) {
    if (steps < 1) return Error{"--steps: must be at least 1, got " + std::to_string(steps)};
    const int n = steps;
    const double t_max = static_cast<double>(schedule.size() - 1);
    const double sigma_min = schedule.sigma_min();
    const double sigma_max = schedule.sigma_max();

    switch (kind) {
        case SchedulerKind::Discrete: return sigmas_at_timesteps(linspace(t_max, 0.0, n), schedule);

        case SchedulerKind::SgmUniform: {
            std::vector<double> timesteps = linspace(t_max, 0.0, n + 1);
            timesteps.pop_back();
            return sigmas_at_timesteps(timesteps, schedule);
        }

        case SchedulerKind::Karras: {
            // sigma_i = (max^(1/rho) + i/(n-1) * (min^(1/rho) - max^(1/rho)))^rho
            constexpr double kRho = 7.0;
            const double min_inv_rho = std::pow(sigma_min, 1.0 / kRho);
            const double max_inv_rho = std::pow(sigma_max, 1.0 / kRho);
            std::vector<float> out;
            for (double ramp : linspace(0.0, 1.0, n)) {
                out.push_back(static_cast<float>(std::pow(max_inv_rho + ramp * (min_inv_rho - max_inv_rho), kRho)));
            }
            out.push_back(0.0f);
            return out;
        }

        case SchedulerKind::Exponential: {
            std::vector<float> out;
            for (double log_sigma : linspace(std::log(sigma_max), std::log(sigma_min), n)) {
                out.push_back(static_cast<float>(std::exp(log_sigma)));
            }
            out.push_back(0.0f);
            return out;
        }

        case SchedulerKind::Ays: {
            if (schedule.flow()) {
                return Error::invalid_request(
                    "--scheduler ays: its levels are SD's and not defined for flow models (use simple, "
                    "discrete, karras, exponential or sgm_uniform)");
            }
            // n + 1 levels from the 11 published ones; the last (sigma_min) is replaced by 0, as ComfyUI and sd.cpp.
            const std::vector<double> table(std::begin(kAysSd1), std::end(kAysSd1));
            const std::vector<double> levels =
                static_cast<size_t>(n + 1) == table.size() ? table : loglinear_interp(table, n + 1);
            std::vector<float> out(levels.begin(), levels.end() - 1);
            out.push_back(0.0f);
            return out;
        }

        case SchedulerKind::Simple: {
            // ComfyUI simple_scheduler: sigmas[-(1 + int(i * T / n))], straight from the table. The step is a double
            // in Python and must be here too: in float, i * (T / n) can land just below an integer (n = 30, i = 3).
            const double stride = static_cast<double>(schedule.size()) / n;
            std::vector<float> out;
            for (int i = 0; i < n; ++i) {
                const long offset = static_cast<long>(i * stride);
                const long index = std::max(static_cast<long>(schedule.size()) - 1 - offset, 0L);
                out.push_back(schedule.sigmas()[static_cast<size_t>(index)]);
            }
            out.push_back(0.0f);
            return out;
        }
    }
    return Error{"get_sigmas: unknown scheduler"};
}

}  // namespace kiln::pipeline
