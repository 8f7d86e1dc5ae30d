// TaylorSeer's forecast of a feature from the steps that computed it (Liu et
// al. 2025, "From Reusing to Forecasting: Accelerating Diffusion Models with
// TaylorSeers", eq. 7-8): after each computed step the feature's finite
// differences up to `order` are kept, each divided by the steps between the
// last two computations, and a later step k steps on is forecast as
// sum_i D_i k^i / i!.
#pragma once

#include <cstddef>
#include <vector>

namespace kiln::pipeline {

class TaylorSeries {
  public:
    explicit TaylorSeries(int order = 1) : order_(order) {}

    // The feature as computed at `step` (steps increase).
    void record(int step, const std::vector<float>& feature);
    // Whether every difference up to the order is known (order + 1 records).
    bool ready() const { return records_ > order_; }
    // The forecast at `step` (after the last record); needs ready().
    std::vector<float> forecast(int step) const;
    // The finite differences D_0 (the feature) .. D_order.
    const std::vector<std::vector<float>>& differences() const { return differences_; }

  private:
    int order_;
    int records_ = 0;
    int last_step_ = 0;
    std::vector<std::vector<float>> differences_;
};

}  // namespace kiln::pipeline
