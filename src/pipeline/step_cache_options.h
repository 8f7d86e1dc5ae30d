// sd-cli's step caches as a request states them: --cache-mode, --cache-option
// "key=value,...", --scm-mask and --scm-policy (docs/caching.md). A cache
// reuses or forecasts work between denoising steps; each mode is opt-in and
// off by default.
//
//   ucache      UNets: the network's residual (output - input) of each
//               condition, reused while the accumulated estimate of the
//               output's change stays under `threshold` (step_cache.h)
//   easycache   DiTs: the same residual, reused while the accumulated
//               relative output change stays under `threshold`
//   dbcache     DiTs: the first Fn blocks always run; when their residual
//               differs from the last computed step's by less than
//               `threshold` (relative L1), the middle blocks' residual is
//               reused and only the last Bn blocks run (block_cache.h)
//   taylorseer  DiTs: after `warmup` steps, every other step forecasts the
//               middle blocks' residual by a Taylor series
//   cache-dit   dbcache's decision with taylorseer's forecast
//   spectrum    UNets and DiTs: the denoised output itself forecast from
//               past steps (Chebyshev ridge fit blended with Taylor,
//               spectrum_forecast.h)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace kiln::pipeline {

enum class CacheMode { None, UCache, EasyCache, DbCache, TaylorSeer, CacheDit, Spectrum };

// sd-cli's name ("ucache", ..., "cache-dit", "spectrum"); "disabled" for None.
std::string_view cache_mode_name(CacheMode mode);
// The names, comma-separated, for help and error texts.
std::string cache_mode_names();
// A --cache-mode value (case-insensitive); "", "none" and "disabled" (the
// sd-server's spelling) are None. The error lists the modes.
Result<CacheMode> parse_cache_mode(std::string_view name);

// Whether the mode skips work inside the network's block loop (dbcache,
// taylorseer, cache-dit) rather than whole evaluations.
bool is_block_cache(CacheMode mode);

struct StepCacheOptions {
    CacheMode mode = CacheMode::None;

    // ucache, easycache (threshold, start, end), dbcache and cache-dit
    // (threshold): the mode's default unless set.
    float threshold = 0.0f;
    float start = 0.15f;   // share of the steps before which every step computes
    float end = 0.95f;     // share after which every step computes
    float decay = 1.0f;    // ucache: the accumulated error's decay per check
    bool relative = true;  // ucache: the threshold is relative to the output's scale
    bool reset = true;     // ucache: the error restarts after a computed step

    // dbcache, taylorseer, cache-dit.
    int front_blocks = 8;  // Fn: blocks that always run first
    int back_blocks = 0;   // Bn: blocks that always run last
    int warmup = 8;        // steps that always compute (taylorseer: 2)
    // Steps computation mask (1 compute, 0 may cache), one per step; empty: none.
    std::vector<int> scm_mask;
    bool scm_dynamic = true;  // a 0 step still checks the threshold ("dynamic"); "static" caches it

    // spectrum.
    float w = 0.40f;     // Chebyshev share of the blend (0 Taylor, 1 Chebyshev)
    int m = 3;           // Chebyshev degree
    float lam = 1.0f;    // ridge regularisation
    int window = 2;      // compute every window-th step at first
    float flex = 0.50f;  // window growth per computed step after warmup
    float stop = 0.9f;   // share of the steps after which every step computes

    bool enabled() const { return mode != CacheMode::None; }
};

// The options for `mode` from sd-cli's strings: `options` "key=value,..."
// (the mode's keys, case-insensitive), `scm_mask` "1,1,0,..." and
// `scm_policy` "dynamic" or "static" (empty: dynamic). Every error is an
// invalid request naming the option: an unknown mode or key (listing the
// mode's keys), a value that is not a finite number, a threshold below 0, a
// share outside [0, 1], start after end, a count below 0, a mask value
// other than 0 and 1, or --scm-mask / --scm-policy for a mode without steps
// computation masks. The mask's length is checked against the steps by
// validate_step_cache.
Result<StepCacheOptions> make_step_cache_options(std::string_view mode, std::string_view options,
                                                 std::string_view scm_mask = {}, std::string_view scm_policy = {});

// The request's cache against the model and its steps: a usage error naming
// the family and the modes that apply when the mode does not (ucache on a
// DiT, a block-level mode on a network that does not run its blocks in
// parts, a UNet's block-level mode), Fn + Bn leaving no block between them,
// or an --scm-mask whose length is not `steps`.
struct CacheTarget {
    std::string family;  // "Flux.1-dev": messages
    bool unet = false;   // the network is a UNet
    int64_t blocks = 0;  // the block loop a block-level cache splits (0: none)
};
Status validate_step_cache(const StepCacheOptions& options, const CacheTarget& target, int steps);

// "ucache threshold=1, start=0.15, end=0.95": the mode and its settings,
// for -v and the job record.
std::string describe_step_cache(const StepCacheOptions& options);

}  // namespace kiln::pipeline
