// Every sampler against tests/golden/sampling/samplers.txt: the float64
// PyTorch reference of training/reference/sampling.py run on a toy denoiser,
// with the ancestral noise replayed from the stream the fixture stores.
#include "pipeline/samplers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "golden.h"

namespace kiln::pipeline {
namespace {

using test::Records;

Records load_golden(const std::string& file) { return test::load_sampling_records(file); }

std::vector<float> to_floats(const std::vector<double>& values) {
    return std::vector<float>(values.begin(), values.end());
}

// The reference's toy denoiser (tests/unit/golden.h).
Result<std::vector<float>> toy_denoiser(const std::vector<float>& x, float sigma) {
    return test::toy_denoiser(x, sigma);
}

// Hands out the fixture's noise stream in order, n values per draw; an empty vector once it runs out.
class ReplayRng final : public Rng {
  public:
    explicit ReplayRng(std::vector<float> stream) : stream_(std::move(stream)) {}
    std::vector<float> randn(size_t n) override {
        ++draws_;
        if (pos_ + n > stream_.size()) return {};
        std::vector<float> out(stream_.begin() + static_cast<long>(pos_),
                               stream_.begin() + static_cast<long>(pos_ + n));
        pos_ += n;
        return out;
    }
    int draws() const { return draws_; }

  private:
    std::vector<float> stream_;
    size_t pos_ = 0;
    int draws_ = 0;
};

std::vector<std::string> split(const std::string& text, char sep) {
    std::vector<std::string> parts;
    std::istringstream in(text);
    std::string part;
    while (std::getline(in, part, sep)) parts.push_back(part);
    return parts;
}

TEST(Samplers, ParsesNames) {
    const SamplerKind all[] = {SamplerKind::Euler,        SamplerKind::EulerA,   SamplerKind::Heun,
                               SamplerKind::Dpm2,         SamplerKind::DpmPp2SA, SamplerKind::DpmPp2M,
                               SamplerKind::DpmPp2Mv2,    SamplerKind::Ipndm,    SamplerKind::Lcm,
                               SamplerKind::DdimTrailing, SamplerKind::Tcd};
    for (SamplerKind kind : all) EXPECT_EQ(parse_sampler(sampler_name(kind)).value(), kind);
    EXPECT_EQ(parse_sampler("DPM++2M").value(), SamplerKind::DpmPp2M);
    EXPECT_EQ(parse_sampler("euler_ancestral").value(), SamplerKind::EulerA);
    EXPECT_EQ(parse_sampler("dpmpp_2s_ancestral").value(), SamplerKind::DpmPp2SA);
    EXPECT_EQ(parse_sampler("dpmpp_2m_v2").value(), SamplerKind::DpmPp2Mv2);
    auto bad = parse_sampler("unipc");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message,
              "--sampling-method: unknown sampling method 'unipc' (valid: euler, euler_a, heun, dpm2, dpm++2s_a, "
              "dpm++2m, dpm++2mv2, ipndm, lcm, ddim_trailing, tcd)");
    EXPECT_EQ(default_eta(SamplerKind::EulerA), 1.0f);
    EXPECT_EQ(default_eta(SamplerKind::DdimTrailing), 0.0f);
}

// Every "final/<schedule>/<sampler>/<eta>" record: same final x (float32 sampler vs float64 reference), same number
// of denoiser calls and noise draws, progress reported once per step.
TEST(Samplers, MatchReference) {
    const Records records = load_golden("samplers.txt");
    ASSERT_TRUE(records.count("noise"));
    const std::vector<float> noise = to_floats(records.at("noise"));
    std::set<SamplerKind> covered;
    int cases = 0;
    for (const auto& record : records) {
        const std::string& name = record.first;  // (not a structured binding: lambdas below capture it)
        const std::vector<double>& want = record.second;
        if (name.rfind("final/", 0) != 0) continue;
        const std::vector<std::string> parts = split(name, '/');
        ASSERT_EQ(parts.size(), 4u) << name;
        const std::string key = parts[1] + "/" + parts[2] + "/" + parts[3];
        auto kind = parse_sampler(parts[2]);
        ASSERT_TRUE(kind.ok()) << name;
        covered.insert(*kind);
        const float eta = std::stof(parts[3]);
        const std::vector<float> sigmas = to_floats(records.at("schedule/" + parts[1]));
        const std::vector<float> x_init = to_floats(records.at("x_init/" + parts[1]));

        int calls = 0;
        int last_step = -1;
        DenoiseFn denoise = [&](const std::vector<float>& x, float sigma, int step) {
            ++calls;
            EXPECT_GE(step, last_step) << name;
            last_step = step;
            return toy_denoiser(x, sigma);
        };
        std::vector<int> progress;
        ReplayRng rng(noise);
        auto out = sample(*kind, denoise, x_init, sigmas, rng, eta, [&](int step, int total) {
            EXPECT_EQ(total, static_cast<int>(sigmas.size()) - 1);
            progress.push_back(step);
        });
        ASSERT_TRUE(out.ok()) << name << ": " << out.error().message;
        ASSERT_EQ(out->size(), want.size()) << name;
        // float32 state vs the float64 reference: the differences seen are below 4e-7.
        for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_NEAR((*out)[i], want[i], 2e-5 * std::max(1.0, std::fabs(want[i]))) << name << "[" << i << "]";
        }
        EXPECT_EQ(calls, static_cast<int>(records.at("nfe/" + key).at(0))) << name;
        EXPECT_EQ(rng.draws(), static_cast<int>(records.at("draws/" + key).at(0))) << name;
        ASSERT_EQ(progress.size(), sigmas.size() - 1) << name;
        for (size_t i = 0; i < progress.size(); ++i) EXPECT_EQ(progress[i], static_cast<int>(i) + 1) << name;
        ++cases;
    }
    EXPECT_EQ(covered.size(), 11u) << "a sampler has no fixture";
    EXPECT_EQ(cases, 45);
}

TEST(Samplers, DenoiserErrorsStopTheRun) {
    DenoiseFn failing = [](const std::vector<float>&, float, int step) -> Result<std::vector<float>> {
        if (step == 2) return Error{"cancelled"};
        return std::vector<float>(4, 0.0f);
    };
    ReplayRng rng(std::vector<float>(100, 0.0f));
    const std::vector<float> sigmas = {4.0f, 2.0f, 1.0f, 0.5f, 0.0f};
    for (SamplerKind kind : {SamplerKind::Euler, SamplerKind::Heun, SamplerKind::DdimTrailing}) {
        auto out = sample(kind, failing, std::vector<float>(4, 1.0f), sigmas, rng);
        ASSERT_FALSE(out.ok());
        EXPECT_EQ(out.error().message, "cancelled");
    }
    DenoiseFn wrong_size = [](const std::vector<float>&, float, int) -> Result<std::vector<float>> {
        return std::vector<float>(3, 0.0f);
    };
    auto out = sample(SamplerKind::Euler, wrong_size, std::vector<float>(4, 1.0f), sigmas, rng);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().message, "denoiser returned 3 values for a latent of 4");
}

TEST(Samplers, RejectsBadSigmas) {
    DenoiseFn identity = [](const std::vector<float>& x, float, int) -> Result<std::vector<float>> { return x; };
    ReplayRng rng({});
    const std::vector<float> x(2, 1.0f);
    EXPECT_FALSE(sample(SamplerKind::Euler, identity, x, {1.0f}, rng).ok());
    EXPECT_FALSE(sample(SamplerKind::Euler, identity, x, {1.0f, 0.0f, 0.5f, 0.0f}, rng).ok());
    EXPECT_FALSE(sample(SamplerKind::Euler, identity, x, {1.0f, 2.0f, 0.0f}, rng).ok());
    EXPECT_FALSE(sample(SamplerKind::Euler, identity, x, {NAN, 0.0f}, rng).ok());
    EXPECT_FALSE(sample(SamplerKind::EulerA, identity, x, {1.0f, 0.0f}, rng, -1.0f).ok());
    auto one_step = sample(SamplerKind::Euler, identity, x, {1.0f, 0.0f}, rng);
    ASSERT_TRUE(one_step.ok());
    EXPECT_EQ(*one_step, x);
}

TEST(Samplers, AncestralNoiseComesFromTheRng) {
    // With an Rng that runs dry, a stochastic step fails instead of inventing noise.
    DenoiseFn zero = [](const std::vector<float>& x, float, int) -> Result<std::vector<float>> {
        return std::vector<float>(x.size(), 0.0f);
    };
    ReplayRng dry({});
    auto out = sample(SamplerKind::EulerA, zero, {1.0f, 1.0f}, {2.0f, 1.0f, 0.0f}, dry);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().message, "rng returned 0 values");
}

}  // namespace
}  // namespace kiln::pipeline
