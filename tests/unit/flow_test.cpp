// Rectified flow (Flux) against tests/golden/sampling/flow.txt: BFL's
// get_schedule and Euler loop, ComfyUI's euler_ancestral_RF and LCM with
// CONST noise scaling, all from training/reference/sampling.py in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "golden.h"
#include "pipeline/denoiser.h"
#include "pipeline/samplers.h"
#include "pipeline/schedulers.h"

namespace kiln::pipeline {
namespace {

using test::Records;

const Records& flow() {
    static const Records records = test::load_sampling_records("flow.txt");
    return records;
}
const std::vector<double>& get(const std::string& name) { return test::record(flow(), name); }

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(static_cast<double>(got[i]), want[i], tol * (1.0 + std::fabs(want[i]))) << what << "[" << i << "]";
    }
}

// The reference's toy denoiser (tests/unit/golden.h).
Result<std::vector<float>> toy_denoiser(const std::vector<float>& x, float sigma) {
    return test::toy_denoiser(x, sigma);
}

class StreamRng final : public Rng {
  public:
    explicit StreamRng(std::vector<float> stream) : stream_(std::move(stream)) {}
    std::vector<float> randn(size_t n) override {
        ++draws;
        std::vector<float> out(stream_.begin() + static_cast<long>(pos_),
                               stream_.begin() + static_cast<long>(pos_ + n));
        pos_ += n;
        return out;
    }
    int draws = 0;

  private:
    std::vector<float> stream_;
    size_t pos_ = 0;
};

std::vector<float> floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(FlowSchedule, ResolutionShiftIsBflsLinearFunction) {
    for (int tokens : {256, 1024, 4096}) {
        EXPECT_NEAR(FlowSchedule::resolution_mu(tokens), get("mu/tokens=" + std::to_string(tokens))[0], 1e-6);
    }
}

// kiln's "simple" scheduler on the shifted table is ComfyUI's default Flux
// schedule, and BFL's shifted linspace(1, 0, n + 1) when 1000 / n is whole.
TEST(FlowSchedule, SimpleSchedulerIsBflsGetSchedule) {
    for (int steps : {1, 4, 20, 28}) {
        for (int tokens : {256, 1024, 4096}) {
            const FlowSchedule dev(FlowSchedule::resolution_mu(tokens));
            const std::string n = "steps=" + std::to_string(steps) + "/tokens=" + std::to_string(tokens);
            const std::vector<float> got = get_sigmas(SchedulerKind::Simple, steps, dev).value();
            expect_close(got, get("comfy_simple/" + n), 2e-6, "comfy " + n);
            if (1000 % steps == 0) expect_close(got, get("bfl/dev/" + n), 2e-6, "bfl " + n);
        }
        if (1000 % steps != 0) continue;
        const FlowSchedule schnell(0.0f);
        const std::string key = "bfl/schnell/steps=" + std::to_string(steps);
        expect_close(get_sigmas(SchedulerKind::Simple, steps, schnell).value(), get(key), 2e-6, key);
    }
}

TEST(FlowSchedule, TableAndTimestepInput) {
    const FlowSchedule s(1.15f);
    ASSERT_EQ(s.size(), 1000u);
    EXPECT_FLOAT_EQ(s.sigma_max(), 1.0f);
    EXPECT_NEAR(s.sigma_min(), std::exp(1.15) / (std::exp(1.15) + 999.0), 1e-7);
    EXPECT_TRUE(s.flow());
    EXPECT_FLOAT_EQ(s.sigma_to_t(0.25f), 0.25f);  // the network's timestep is sigma
    // mu = 0 is the identity: schnell's unshifted linspace.
    EXPECT_NEAR(FlowSchedule(0.0f).t_to_sigma(499.0f), 0.5f, 1e-7);
    // Flow scalings: D = x - sigma * v, input unscaled.
    const Scalings sc = get_scalings(Prediction::Flow, 0.7f);
    EXPECT_FLOAT_EQ(sc.c_in, 1.0f);
    EXPECT_FLOAT_EQ(sc.c_skip, 1.0f);
    EXPECT_FLOAT_EQ(sc.c_out, -0.7f);
    // Align Your Steps has SD's levels, not a flow model's.
    auto ays = get_sigmas(SchedulerKind::Ays, 10, s);
    ASSERT_FALSE(ays.ok());
    EXPECT_EQ(ays.error().kind, ErrorKind::InvalidRequest);
}

// kiln's Euler on D is BFL's Euler on the velocity (x - D) / sigma.
TEST(FlowSamplers, EulerIsBflsDenoiseLoop) {
    for (int steps : {4, 10}) {
        const std::string n = "steps=" + std::to_string(steps);
        StreamRng rng(floats(get("noise")));
        auto out = sample(
            SamplerKind::Euler, [](const auto& x, float s, int) { return toy_denoiser(x, s); }, floats(get("x_init")),
            floats(get("schedule/" + n)), rng, 0.0f, nullptr, FlowSchedule(0.63f));
        ASSERT_TRUE(out.ok()) << out.error().message;
        expect_close(*out, get("final/" + n + "/euler"), 2e-5, n + " euler");
        EXPECT_EQ(rng.draws, 0);
    }
}

TEST(FlowSamplers, AncestralAndLcmMixNoiseAsTheFlowDoes) {
    for (int steps : {4, 10}) {
        const std::string n = "steps=" + std::to_string(steps);
        for (auto [kind, name] : {std::pair{SamplerKind::EulerA, "euler_a"}, std::pair{SamplerKind::Lcm, "lcm"}}) {
            StreamRng rng(floats(get("noise")));
            auto out = sample(
                kind, [](const auto& x, float s, int) { return toy_denoiser(x, s); }, floats(get("x_init")),
                floats(get("schedule/" + n)), rng, 1.0f, nullptr, FlowSchedule(0.63f));
            ASSERT_TRUE(out.ok()) << out.error().message;
            expect_close(*out, get("final/" + n + "/" + name), 2e-5, n + " " + name);
            EXPECT_EQ(rng.draws, static_cast<int>(get("draws/" + n + "/" + name)[0])) << name;
        }
    }
}

TEST(FlowSamplers, UndefinedSamplersAreAnInvalidRequestNamingThem) {
    for (SamplerKind kind : {SamplerKind::DpmPp2SA, SamplerKind::DdimTrailing, SamplerKind::Tcd}) {
        StreamRng rng(floats(get("noise")));
        auto out = sample(
            kind, [](const auto& x, float s, int) { return toy_denoiser(x, s); }, floats(get("x_init")),
            floats(get("schedule/steps=4")), rng, 0.0f, nullptr, FlowSchedule(0.63f));
        ASSERT_FALSE(out.ok());
        EXPECT_EQ(out.error().kind, ErrorKind::InvalidRequest);
        EXPECT_NE(out.error().message.find(std::string(sampler_name(kind))), std::string::npos) << out.error().message;
    }
    // Every other sampler runs.
    for (SamplerKind kind :
         {SamplerKind::Heun, SamplerKind::Dpm2, SamplerKind::DpmPp2M, SamplerKind::DpmPp2Mv2, SamplerKind::Ipndm}) {
        StreamRng rng(floats(get("noise")));
        auto out = sample(
            kind, [](const auto& x, float s, int) { return toy_denoiser(x, s); }, floats(get("x_init")),
            floats(get("schedule/steps=4")), rng, 0.0f, nullptr, FlowSchedule(0.63f));
        EXPECT_TRUE(out.ok()) << sampler_name(kind);
    }
}

}  // namespace
}  // namespace kiln::pipeline
