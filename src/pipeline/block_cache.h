// The block-level step caches (--cache-mode dbcache, taylorseer, cache-dit;
// cache-dit's DBCache and TaylorSeer, vipshop/cache-dit). A DiT that builds
// the BlockStage parts of an evaluation (models/network.h) runs its first
// Fn blocks, and this cache decides from their residual whether the middle
// blocks run or their residual is reused (dbcache) or forecast (taylorseer,
// cache-dit); the last Bn blocks always run.
//
//   dbcache     after `warmup` steps, reuses the middle residual of the last
//               computed evaluation when the front residual's relative L1
//               difference from that evaluation's, sum |a - b| / sum |b|, is
//               under `threshold`
//   taylorseer  after `warmup` steps, forecasts the middle residual on every
//               other step (odd step numbers) by a first-order Taylor series
//               of the computed ones (taylor_series.h)
//   cache-dit   dbcache's decision, with taylorseer's forecast in place of
//               the plain reuse
//
// A steps computation mask (--scm-mask) makes its 1 steps compute; its 0
// steps check the threshold ("dynamic") or cache outright ("static").
// Each pass of an evaluation (CFG's batch or its passes, numbered by the
// caller) keeps its own middle residual; the first pass decides for all.
#pragma once

#include <map>
#include <vector>

#include "pipeline/step_cache_options.h"
#include "pipeline/taylor_series.h"

namespace kiln::pipeline {

class BlockCache {
  public:
    // `step_offset`: the steps of the schedule cut before the first that
    // runs (image-to-image), so the mask and warmup count the job's steps.
    BlockCache(const StepCacheOptions& options, int step_offset = 0);

    // Decides evaluation `step` from the front residual of its first pass,
    // `pass`: whether the middle blocks are skipped.
    bool skips_middle(int pass, int step, const std::vector<float>& front_residual);
    // The middle residual pass `pass` uses at `step` when skipped; empty
    // when it has none (it runs).
    std::vector<float> middle_residual(int pass, int step) const;
    // Pass `pass` ran its middle blocks at `step` with this residual (and,
    // for the pass that decides, the front residual the next decision compares).
    void computed(int pass, int step, const std::vector<float>& middle, const std::vector<float>& front_residual);

    int skipped_count() const { return skipped_; }

    // sum |a - b| / sum |b| (1 when b is all zeros).
    static float relative_l1(const std::vector<float>& a, const std::vector<float>& b);

  private:
    bool forecasts() const { return options_.mode != CacheMode::DbCache; }

    StepCacheOptions options_;
    int offset_;
    int decider_ = -1;  // the pass that decides
    std::vector<float> last_front_;
    std::map<int, std::vector<float>> last_middle_;
    std::map<int, TaylorSeries> series_;
    int decided_step_ = -1;
    bool skipping_ = false;
    int skipped_ = 0;
};

}  // namespace kiln::pipeline
