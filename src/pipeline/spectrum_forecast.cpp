#include "pipeline/spectrum_forecast.h"

#include <algorithm>
#include <cmath>

namespace kiln::pipeline {
namespace {

// T_0..T_m at t.
std::vector<double> chebyshev(double t, int m) {
    std::vector<double> T(static_cast<size_t>(m) + 1, 1.0);
    if (m >= 1) T[1] = t;
    for (size_t j = 2; j < T.size(); ++j) T[j] = 2.0 * t * T[j - 1] - T[j - 2];
    return T;
}

// Solves the symmetric positive definite A x = b (n x n, row-major) by
// Gaussian elimination with partial pivoting, in double.
std::vector<double> solve(std::vector<double> A, std::vector<double> b) {
    const size_t n = b.size();
    for (size_t col = 0; col < n; ++col) {
        size_t pivot = col;
        for (size_t r = col + 1; r < n; ++r) {
            if (std::fabs(A[r * n + col]) > std::fabs(A[pivot * n + col])) pivot = r;
        }
        if (pivot != col) {
            for (size_t k = 0; k < n; ++k) std::swap(A[col * n + k], A[pivot * n + k]);
            std::swap(b[col], b[pivot]);
        }
        const double d = A[col * n + col];
        if (d == 0.0) continue;  // singular only without ridge and with too few outputs: that term stays 0
        for (size_t r = col + 1; r < n; ++r) {
            const double f = A[r * n + col] / d;
            for (size_t k = col; k < n; ++k) A[r * n + k] -= f * A[col * n + k];
            b[r] -= f * b[col];
        }
    }
    std::vector<double> x(n, 0.0);
    for (size_t i = n; i-- > 0;) {
        double s = b[i];
        for (size_t k = i + 1; k < n; ++k) s -= A[i * n + k] * x[k];
        x[i] = A[i * n + i] != 0.0 ? s / A[i * n + i] : 0.0;
    }
    return x;
}

}  // namespace

SpectrumForecast::SpectrumForecast(const StepCacheOptions& options, int evaluations)
    : options_(options), total_(std::max(evaluations, 1)), window_(options.window) {}

double SpectrumForecast::tau(int evaluation) const { return 2.0 * evaluation / total_ - 1.0; }

bool SpectrumForecast::forecasts_next() const {
    if (evaluation_ < options_.warmup) return false;
    if (evaluation_ >= static_cast<int>(options_.stop * static_cast<float>(total_))) return false;
    if (history_.size() < 2) return false;
    const int window = std::max(1, static_cast<int>(std::floor(window_)));
    return (since_computed_ + 1) % window != 0;
}

std::vector<double> SpectrumForecast::ridge_weights(const std::vector<double>& times, double tau, int m, double lam) {
    const size_t M = static_cast<size_t>(m) + 1, K = times.size();
    std::vector<std::vector<double>> X;
    for (double t : times) X.push_back(chebyshev(t, m));
    std::vector<double> gram(M * M, 0.0);
    for (size_t i = 0; i < M; ++i) {
        for (size_t j = 0; j < M; ++j) {
            for (size_t k = 0; k < K; ++k) gram[i * M + j] += X[k][i] * X[k][j];
            if (i == j) gram[i * M + j] += lam;
        }
    }
    const std::vector<double> v = solve(gram, chebyshev(tau, m));
    std::vector<double> weights(K, 0.0);
    for (size_t k = 0; k < K; ++k) {
        for (size_t j = 0; j < M; ++j) weights[k] += X[k][j] * v[j];
    }
    return weights;
}

std::vector<float> SpectrumForecast::forecast() {
    const std::vector<double> a = ridge_weights(times_, tau(evaluation_), options_.m, options_.lam);
    const std::vector<float>& last = history_.back();
    const std::vector<float>& before = history_[history_.size() - 2];
    const double w = options_.w;
    std::vector<float> out(last.size());
    for (size_t f = 0; f < out.size(); ++f) {
        double fit = 0.0;
        for (size_t k = 0; k < history_.size(); ++k) fit += a[k] * history_[k][f];
        const double taylor = last[f] + 0.5 * (static_cast<double>(last[f]) - before[f]);
        out[f] = static_cast<float>((1.0 - w) * taylor + w * fit);
    }
    ++since_computed_;
    ++forecasts_;
    ++evaluation_;
    return out;
}

void SpectrumForecast::record(const std::vector<float>& output) {
    history_.push_back(output);
    times_.push_back(tau(evaluation_));
    const size_t keep = static_cast<size_t>(std::max(options_.m + 1, 6));
    if (history_.size() > keep) {
        history_.erase(history_.begin());
        times_.erase(times_.begin());
    }
    if (evaluation_ >= options_.warmup) window_ += options_.flex;
    since_computed_ = 0;
    ++evaluation_;
}

}  // namespace kiln::pipeline
