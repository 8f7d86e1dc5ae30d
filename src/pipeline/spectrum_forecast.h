// The spectrum step cache (--cache-mode spectrum; Spectrum: adaptive spectral
// feature forecasting, tingyu215/Spectrum, as sd-cli runs it): the
// denoiser's output at each computed evaluation is kept (the last K =
// max(m + 1, 6)), and an evaluation that is not computed is forecast as
//   (1 - w) * (h_last + (h_last - h_prev) / 2) + w * sum_k a_k h_k
// where a = X (X^T X + lam I)^-1 x* is the ridge fit of the kept outputs on
// the Chebyshev polynomials T_0..T_m of their times (X) evaluated at the
// forecast's time (x*). Times map evaluation n of N to 2 n / N - 1 in [-1, 1].
// After `warmup` evaluations every one runs until there are two outputs;
// then of every `window` evaluations one runs, the window growing by `flex`
// after each computed one, until the share `stop` of the evaluations.
#pragma once

#include <vector>

#include "pipeline/step_cache_options.h"

namespace kiln::pipeline {

class SpectrumForecast {
  public:
    // `evaluations`: the denoiser calls the sampler will make.
    SpectrumForecast(const StepCacheOptions& options, int evaluations);

    // Whether the next evaluation is forecast rather than computed.
    bool forecasts_next() const;
    // The next evaluation's output, forecast (forecasts_next()).
    std::vector<float> forecast();
    // The next evaluation's output, computed.
    void record(const std::vector<float>& output);

    int forecast_count() const { return forecasts_; }
    int evaluations() const { return evaluation_; }

    // The ridge fit's weights a_k on outputs kept at `times`, for the time
    // `tau`: the fit is sum_k a_k h_k.
    static std::vector<double> ridge_weights(const std::vector<double>& times, double tau, int m, double lam);

  private:
    double tau(int evaluation) const;

    StepCacheOptions options_;
    int total_;
    int evaluation_ = 0;  // evaluations so far
    int since_computed_ = 0;
    double window_;
    int forecasts_ = 0;
    std::vector<std::vector<float>> history_;
    std::vector<double> times_;
};

}  // namespace kiln::pipeline
