// The discrete denoiser and the sigma schedules against
// tests/golden/sampling/{denoiser,schedules}.txt (training/make_sampling_fixtures.py,
// a float64 PyTorch reference on the float32 SD tables).
#include "pipeline/schedulers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "golden.h"
#include "pipeline/denoiser.h"

namespace kiln::pipeline {
namespace {

using test::Records;

Records load_golden(const std::string& file) { return test::load_sampling_records(file); }
const std::vector<double>& get(const Records& records, const std::string& name) { return test::record(records, name); }

// |got - want| <= rel * |want| + abs, element by element.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, double rel, double abs,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), rel * std::fabs(want[i]) + abs)
            << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
}

const DiscreteSchedule& sd() { return DiscreteSchedule::stable_diffusion(); }

TEST(Denoiser, ScaledLinearTableMatchesReference) {
    const Records records = load_golden("denoiser.txt");
    ASSERT_EQ(sd().size(), 1000u);
    // Same float32 values up to the last bit or so (the reference takes a float32 log/sqrt through torch's
    // vectorised kernels).
    expect_close(sd().alphas_cumprod(), get(records, "alphas_cumprod"), 1e-7, 0.0, "alphas_cumprod");
    expect_close(sd().sigmas(), get(records, "sigmas"), 2e-7, 0.0, "sigmas");
    EXPECT_NEAR(sd().sigma_min(), 0.0291675f, 1e-6f);
    EXPECT_NEAR(sd().sigma_max(), 14.6146f, 1e-4f);
}

TEST(Denoiser, TimestepConversionsMatchReference) {
    const Records records = load_golden("denoiser.txt");
    const std::vector<double>& ts = get(records, "t_to_sigma/t");
    std::vector<float> sigmas;
    for (double t : ts) sigmas.push_back(sd().t_to_sigma(static_cast<float>(t)));
    expect_close(sigmas, get(records, "t_to_sigma/sigma"), 1e-6, 0.0, "t_to_sigma");

    const std::vector<double>& in = get(records, "sigma_to_t/sigma");
    std::vector<float> t_out;
    for (double s : in) t_out.push_back(sd().sigma_to_t(static_cast<float>(s)));
    expect_close(t_out, get(records, "sigma_to_t/t"), 0.0, 1e-3, "sigma_to_t");
    // Round trip inside the table.
    for (float t : {0.0f, 3.5f, 400.25f, 999.0f}) EXPECT_NEAR(sd().sigma_to_t(sd().t_to_sigma(t)), t, 2e-3f);
}

TEST(Denoiser, ScalingsMatchReference) {
    const Records records = load_golden("denoiser.txt");
    const std::vector<double>& sigmas = get(records, "scalings/sigma");
    for (Prediction prediction : {Prediction::Eps, Prediction::V}) {
        const std::string name = prediction == Prediction::Eps ? "eps" : "v";
        std::vector<float> flat;
        for (double s : sigmas) {
            const Scalings sc = get_scalings(prediction, static_cast<float>(s));
            flat.insert(flat.end(), {sc.c_skip, sc.c_out, sc.c_in});
        }
        expect_close(flat, get(records, "scalings/" + name), 1e-6, 1e-7, "scalings/" + name);
    }
}

TEST(Denoiser, DenoisedFromOutput) {
    // eps: x - sigma * eps; v at sigma = 1: (x - v) / 2.
    EXPECT_EQ(denoised_from_output(get_scalings(Prediction::Eps, 2.0f), {1.0f, 3.0f}, {0.5f, -1.0f}),
              (std::vector<float>{0.0f, 5.0f}));
    const std::vector<float> v = denoised_from_output(get_scalings(Prediction::V, 1.0f), {1.0f}, {0.5f});
    EXPECT_NEAR(v[0], 0.5f * 1.0f - std::sqrt(0.5f) * 0.5f, 1e-6f);
}

// sd-cli's --timestep-shift, worked out for eps by hand: the network sees
// the whole step round(t * N / 1000), and the estimate is
// x * sqrt(s'^2 + 1) / sqrt(s^2 + 1) - s' * eps with s' that step's sigma.
TEST(Denoiser, ShiftedTimestepAsSdCli) {
    const DiscreteSchedule& sd = DiscreteSchedule::stable_diffusion();
    const float sigma = 3.0f;
    const NetworkStep plain = network_step(Prediction::Eps, sd, sigma);
    EXPECT_FLOAT_EQ(plain.timestep, sd.sigma_to_t(sigma));
    EXPECT_FLOAT_EQ(plain.scalings.c_out, -3.0f);
    const NetworkStep shifted = network_step(Prediction::Eps, sd, sigma, 500);
    const float t = std::round(sd.sigma_to_t(sigma) * 0.5f);
    EXPECT_EQ(shifted.timestep, t);
    EXPECT_EQ(shifted.timestep, std::floor(shifted.timestep));
    const double s2 = sd.t_to_sigma(t);
    EXPECT_NEAR(shifted.scalings.c_out, -s2, 1e-6);
    EXPECT_NEAR(shifted.scalings.c_skip, std::sqrt(s2 * s2 + 1) / std::sqrt(10.0), 1e-6);
    EXPECT_FLOAT_EQ(shifted.scalings.c_in, plain.scalings.c_in);  // the input is scaled as before
    // Clamped to the table: a shift of 1000 keeps the step, rounded.
    EXPECT_EQ(network_step(Prediction::Eps, sd, sd.sigma_max(), 1000).timestep, 999.0f);
}

TEST(Denoiser, RejectsBadAlphasCumprod) {
    EXPECT_FALSE(DiscreteSchedule::from_alphas_cumprod({0.5f}).ok());
    EXPECT_FALSE(DiscreteSchedule::from_alphas_cumprod({0.9f, 0.95f}).ok());
    EXPECT_FALSE(DiscreteSchedule::from_alphas_cumprod({1.0f, 0.5f}).ok());
    auto good = DiscreteSchedule::from_alphas_cumprod(sd().alphas_cumprod());
    ASSERT_TRUE(good.ok());
    EXPECT_EQ(good->sigmas(), sd().sigmas());
}

TEST(Schedulers, ParsesNames) {
    for (SchedulerKind kind : {SchedulerKind::Discrete, SchedulerKind::Karras, SchedulerKind::Exponential,
                               SchedulerKind::Ays, SchedulerKind::SgmUniform, SchedulerKind::Simple}) {
        EXPECT_EQ(parse_scheduler(scheduler_name(kind)).value(), kind);
    }
    EXPECT_EQ(parse_scheduler("Karras").value(), SchedulerKind::Karras);
    auto bad = parse_scheduler("gits");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message,
              "--scheduler: unknown scheduler 'gits' (valid: discrete, karras, exponential, ays, sgm_uniform, simple)");
}

TEST(Schedulers, MatchReference) {
    const Records records = load_golden("schedules.txt");
    int checked = 0;
    for (SchedulerKind kind : {SchedulerKind::Discrete, SchedulerKind::Karras, SchedulerKind::Exponential,
                               SchedulerKind::Ays, SchedulerKind::SgmUniform, SchedulerKind::Simple}) {
        for (int steps : {1, 2, 3, 10, 20, 30}) {
            const std::string name = "sigmas/" + std::string(scheduler_name(kind)) + "/steps=" + std::to_string(steps);
            auto sigmas = get_sigmas(kind, steps, sd());
            ASSERT_TRUE(sigmas.ok()) << name;
            ASSERT_EQ(sigmas->size(), static_cast<size_t>(steps) + 1) << name;
            EXPECT_EQ(sigmas->back(), 0.0f) << name;
            EXPECT_TRUE(std::is_sorted(sigmas->rbegin(), sigmas->rend())) << name;
            expect_close(*sigmas, get(records, name), 1e-6, 0.0, name);
            ++checked;
        }
    }
    EXPECT_EQ(checked, 36);
}

TEST(Schedulers, KnownShapes) {
    // discrete and karras start at the table's sigma_max; karras ends at its sigma_min.
    const std::vector<float> discrete = get_sigmas(SchedulerKind::Discrete, 20, sd()).value();
    EXPECT_EQ(discrete.front(), sd().t_to_sigma(999.0f));
    const std::vector<float> karras = get_sigmas(SchedulerKind::Karras, 20, sd()).value();
    EXPECT_NEAR(karras.front(), sd().sigma_max(), 1e-5f);
    EXPECT_NEAR(karras[19], sd().sigma_min(), 1e-7f);
    // ays at its native 10 steps is the published table.
    const std::vector<float> ays = get_sigmas(SchedulerKind::Ays, 10, sd()).value();
    EXPECT_FLOAT_EQ(ays[1], 6.4745760956f);
    EXPECT_FLOAT_EQ(ays[9], 0.1515232662f);
    // simple takes table entries directly: 30 steps index 999 - int(i * 33.33...), i = 3 -> 899 (not 900).
    const std::vector<float> simple = get_sigmas(SchedulerKind::Simple, 30, sd()).value();
    EXPECT_EQ(simple[3], sd().sigmas()[899]);
}

TEST(Schedulers, RejectsZeroSteps) {
    auto bad = get_sigmas(SchedulerKind::Karras, 0, sd());
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message, "--steps: must be at least 1, got 0");
}

}  // namespace
}  // namespace kiln::pipeline
