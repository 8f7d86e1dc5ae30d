#include "pipeline/block_cache.h"

#include <cmath>

namespace kiln::pipeline {

BlockCache::BlockCache(const StepCacheOptions& options, int step_offset) : options_(options), offset_(step_offset) {}

float BlockCache::relative_l1(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        diff += std::fabs(static_cast<double>(a[i]) - b[i]);
        norm += std::fabs(static_cast<double>(b[i]));
    }
    return norm > 0.0 && a.size() == b.size() ? static_cast<float>(diff / norm) : 1.0f;
}

bool BlockCache::skips_middle(int pass, int step, const std::vector<float>& front_residual) {
    decider_ = pass;
    if (step == decided_step_ && skipping_) return true;  // a second-order sampler's second evaluation follows
    decided_step_ = step;
    skipping_ = false;
    const int job_step = step + offset_;
    if (job_step < options_.warmup || last_middle_.empty()) return false;
    bool check = true;  // the threshold decides
    if (!options_.scm_mask.empty() && job_step < static_cast<int>(options_.scm_mask.size())) {
        if (options_.scm_mask[static_cast<size_t>(job_step)] == 1) return false;
        check = options_.scm_dynamic;
    }
    if (options_.mode == CacheMode::TaylorSeer) {
        skipping_ = !check || job_step % 2 == 1;
    } else {
        skipping_ = !check || relative_l1(front_residual, last_front_) < options_.threshold;
    }
    if (skipping_ && forecasts()) {
        // A forecast needs two computed evaluations: until then taylorseer's
        // step runs and cache-dit's reuses the last residual as dbcache does.
        auto first = series_.find(pass);
        if (first == series_.end() || !first->second.ready()) skipping_ = options_.mode == CacheMode::CacheDit;
    }
    if (skipping_) ++skipped_;
    return skipping_;
}

std::vector<float> BlockCache::middle_residual(int pass, int step) const {
    if (forecasts()) {
        auto series = series_.find(pass);
        if (series != series_.end() && series->second.ready()) return series->second.forecast(step);
    }
    auto found = last_middle_.find(pass);
    return found == last_middle_.end() ? std::vector<float>{} : found->second;
}

void BlockCache::computed(int pass, int step, const std::vector<float>& middle,
                          const std::vector<float>& front_residual) {
    last_middle_[pass] = middle;
    if (forecasts()) series_.try_emplace(pass, 1).first->second.record(step, middle);
    if (pass == decider_) last_front_ = front_residual;
}

}  // namespace kiln::pipeline
