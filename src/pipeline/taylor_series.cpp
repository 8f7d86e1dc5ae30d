#include "pipeline/taylor_series.h"

#include <algorithm>

namespace kiln::pipeline {

void TaylorSeries::record(int step, const std::vector<float>& feature) {
    const float gap = records_ > 0 ? static_cast<float>(std::max(step - last_step_, 1)) : 1.0f;
    std::vector<std::vector<float>> next(static_cast<size_t>(order_) + 1);
    next[0] = feature;
    // D_{i+1} = (D_i now - D_i before) / gap, as far as the records reach.
    const int known = std::min(records_, order_);
    for (int i = 0; i < known; ++i) {
        const std::vector<float>& now = next[static_cast<size_t>(i)];
        const std::vector<float>& before = differences_[static_cast<size_t>(i)];
        std::vector<float>& d = next[static_cast<size_t>(i) + 1];
        d.resize(now.size());
        for (size_t k = 0; k < now.size(); ++k) d[k] = (now[k] - before[k]) / gap;
    }
    differences_ = std::move(next);
    last_step_ = step;
    ++records_;
}

std::vector<float> TaylorSeries::forecast(int step) const {
    const float k = static_cast<float>(step - last_step_);
    std::vector<float> out(differences_[0]);
    float coefficient = 1.0f;  // k^i / i!
    for (size_t i = 1; i < differences_.size() && !differences_[i].empty(); ++i) {
        coefficient *= k / static_cast<float>(i);
        const std::vector<float>& d = differences_[i];
        for (size_t j = 0; j < out.size(); ++j) out[j] += coefficient * d[j];
    }
    return out;
}

}  // namespace kiln::pipeline
