// The step caches' formulas and decisions against training/reference/
// step_caches.py (numpy, written from the TaylorSeer and Spectrum papers and
// sd-cli's caching docs, not from kiln's code):
// tests/golden/sampling/step_caches.txt.
#include <gtest/gtest.h>

#include <cmath>

#include "golden.h"
#include "pipeline/block_cache.h"
#include "pipeline/condition_cache.h"
#include "pipeline/denoiser.h"
#include "pipeline/spectrum_forecast.h"
#include "pipeline/taylor_series.h"

namespace kiln::pipeline {
namespace {

using test::record;
using test::Records;

constexpr size_t kFeatures = 8;

const Records& records() {
    static const Records r = test::load_sampling_records("step_caches.txt");
    return r;
}

// Row `index` of record `name`, kFeatures values wide.
std::vector<float> row(const std::string& name, size_t index = 0) {
    const std::vector<double>& all = record(records(), name);
    std::vector<float> out;
    for (size_t k = index * kFeatures; k < (index + 1) * kFeatures && k < all.size(); ++k) {
        out.push_back(static_cast<float>(all[k]));
    }
    return out;
}

std::vector<bool> flags(const std::string& name) {
    std::vector<bool> out;
    for (double v : record(records(), name)) out.push_back(v != 0.0);
    return out;
}

void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                 const std::string& what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    for (size_t i = 0; i < actual.size(); ++i) {
        EXPECT_NEAR(actual[i], expected[i], tolerance * std::max(1.0, std::fabs(double(expected[i]))))
            << what << " [" << i << "]";
    }
}

// make_step_cache_fixtures.py's toy_output: a smooth trajectory per feature.
std::vector<float> toy_output(int n) {
    std::vector<float> h(kFeatures);
    for (size_t k = 0; k < kFeatures; ++k) {
        const double kk = static_cast<double>(k), nn = n;
        h[k] = static_cast<float>(std::sin(0.21 * nn + 0.7 * kk) + 0.05 * nn + 0.01 * nn * nn * std::cos(kk));
    }
    return h;
}

TEST(StepCacheFormulas, TaylorSeriesMatchesTheReferenceAtOrdersOneAndTwo) {
    const std::vector<double>& steps = record(records(), "taylor_steps");
    for (int order : {1, 2}) {
        TaylorSeries series(order);
        for (size_t i = 0; i < steps.size(); ++i) {
            series.record(static_cast<int>(steps[i]), row("taylor_feature_" + std::to_string(i)));
        }
        ASSERT_TRUE(series.ready());
        for (int at : {7, 9}) {
            const std::string name = "taylor_order" + std::to_string(order) + "_at" + std::to_string(at);
            expect_near(series.forecast(at), row(name), 1e-5, name);
        }
    }
}

TEST(StepCacheFormulas, ChebyshevRidgeFitMatchesTheReference) {
    const std::vector<double>& times = record(records(), "ridge_times");
    struct Case {
        const char* name;
        double tau;
        int m;
        double lam;
    };
    for (const Case& c :
         {Case{"ridge_fit_m3_lam1_at_0.4", 0.4, 3, 1.0}, Case{"ridge_fit_m2_lam0.1_at_0.3", 0.3, 2, 0.1}}) {
        const std::vector<double> a = SpectrumForecast::ridge_weights(times, c.tau, c.m, c.lam);
        ASSERT_EQ(a.size(), times.size());
        std::vector<float> fit(kFeatures, 0.0f);
        for (size_t k = 0; k < times.size(); ++k) {
            const std::vector<float> h = toy_output(static_cast<int>(k));
            for (size_t f = 0; f < kFeatures; ++f) fit[f] += static_cast<float>(a[k] * h[f]);
        }
        expect_near(fit, row(c.name), 1e-5, c.name);
    }
}

// A whole spectrum run: which evaluations are forecast and what every one gives.
TEST(StepCacheFormulas, SpectrumRunMatchesTheReference) {
    struct Case {
        const char* name;
        float w;
        int window;
        int warmup;
    };
    for (const Case& c : {Case{"spectrum_default", 0.4f, 2, 4}, Case{"spectrum_w0.7_window3", 0.7f, 3, 2}}) {
        StepCacheOptions o;
        o.mode = CacheMode::Spectrum;
        o.w = c.w;
        o.window = c.window;
        o.warmup = c.warmup;
        SpectrumForecast spectrum(o, 20);
        const std::vector<bool> forecast = flags(std::string(c.name) + "_forecast");
        ASSERT_EQ(forecast.size(), 20u);
        int forecasts = 0;
        for (int n = 0; n < 20; ++n) {
            ASSERT_EQ(spectrum.forecasts_next(), forecast[static_cast<size_t>(n)]) << c.name << " evaluation " << n;
            std::vector<float> out;
            if (spectrum.forecasts_next()) {
                out = spectrum.forecast();
                ++forecasts;
            } else {
                out = toy_output(n);
                spectrum.record(out);
            }
            expect_near(out, row(std::string(c.name) + "_outputs", static_cast<size_t>(n)), 1e-5,
                        std::string(c.name) + " evaluation " + std::to_string(n));
        }
        EXPECT_EQ(spectrum.forecast_count(), forecasts);
        EXPECT_GT(forecasts, 0) << c.name;
    }
}

TEST(StepCacheFormulas, RelativeL1AndDbCacheDecisionsMatchTheReference) {
    EXPECT_NEAR(BlockCache::relative_l1(row("l1_a"), row("l1_b")), record(records(), "l1_value")[0], 1e-6);
    const std::vector<double>& mask = record(records(), "db_mask");
    struct Case {
        const char* name;
        bool masked;
        bool dynamic;
    };
    for (const Case& c : {Case{"db_skips_t0.08_w2", false, true}, Case{"db_skips_t0.08_w2_dynamic", true, true},
                          Case{"db_skips_t0.08_w2_static", true, false}}) {
        StepCacheOptions o;
        o.mode = CacheMode::DbCache;
        o.threshold = 0.08f;
        o.warmup = 2;
        o.scm_dynamic = c.dynamic;
        if (c.masked) {
            for (double v : mask) o.scm_mask.push_back(static_cast<int>(v));
        }
        BlockCache cache(o);
        const std::vector<bool> expected = flags(c.name);
        for (size_t step = 0; step < expected.size(); ++step) {
            const std::vector<float> front = row("db_fronts", step);
            const bool skips = cache.skips_middle(0, static_cast<int>(step), front);
            EXPECT_EQ(skips, expected[step]) << c.name << " step " << step;
            if (!skips) cache.computed(0, static_cast<int>(step), std::vector<float>(kFeatures, 1.0f), front);
        }
    }
}

// EasyCache and UCache over a toy network's evaluations: which reuse, and the outputs they give.
TEST(StepCacheFormulas, ConditionCacheDecisionsMatchTheReference) {
    const std::vector<bool> active = flags("cond_active");
    const size_t n = active.size();
    // Flow sigmas 1 - k / n: easycache's window from the schedule's shares 0.1 and 0.9, ucache's from the steps'
    // 0.13 and 0.92, both evaluations 3 to 21, as cond_active says.
    std::vector<float> sigmas;
    for (size_t k = 0; k <= n; ++k) sigmas.push_back(1.0f - static_cast<float>(k) / static_cast<float>(n));
    const FlowSchedule schedule(0.0f);
    struct Case {
        const char* name;
        CacheMode mode;
        float threshold;
        float decay;
        bool reset;
        bool relative;
    };
    const Case cases[] = {
        {"easycache_t0.2", CacheMode::EasyCache, 0.2f, 1.0f, true, true},
        {"easycache_t0.5", CacheMode::EasyCache, 0.5f, 1.0f, true, true},
        {"ucache_t1", CacheMode::UCache, 1.0f, 1.0f, true, true},
        {"ucache_t3_decay0.8_noreset", CacheMode::UCache, 3.0f, 0.8f, false, true},
        {"ucache_t0.5_absolute", CacheMode::UCache, 0.5f, 1.0f, true, false},
    };
    for (const Case& c : cases) {
        StepCacheOptions o;
        o.mode = c.mode;
        o.threshold = c.threshold;
        o.decay = c.decay;
        o.reset = c.reset;
        o.relative = c.relative;
        o.start = c.mode == CacheMode::UCache ? 0.13f : 0.1f;
        o.end = c.mode == CacheMode::UCache ? 0.92f : 0.9f;
        ConditionCache cache(o, sigmas, schedule);
        const std::vector<bool> expected = flags(std::string(c.name) + "_reused");
        for (size_t k = 0; k < n; ++k) {
            const std::vector<float> input = row("cond_inputs", k);
            std::vector<float> out;
            const bool reuses = cache.reuses(static_cast<int>(k), sigmas[k], input);
            ASSERT_EQ(reuses, expected[k]) << c.name << " evaluation " << k;
            if (reuses) {
                out = cache.reused(0, input);
            } else {
                // The toy network: the reference's output, as computed.
                out = row(std::string(c.name) + "_outputs", k);
                cache.computed(0, input, out);
            }
            expect_near(out, row(std::string(c.name) + "_outputs", k), 1e-5,
                        std::string(c.name) + " evaluation " + std::to_string(k));
        }
    }
}

}  // namespace
}  // namespace kiln::pipeline
