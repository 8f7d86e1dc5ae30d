// The tiny Flux.1-dev pipeline's DiT at the job's second step against a
// second, independent reference: training/reference/flux_bfl.py, a
// transcription of Black Forest Labs' original code (src/flux/model.py,
// modules/layers.py, math.py, sampling.py), run by
// training/check_flux_bfl_reference.py. That script also checks the first
// reference's goldens (velocity0, latent of flux_tiny_txt2img) against BFL's
// code; this test checks kiln at a point the first reference never wrote:
// x1, the latent after the first Euler step, at the second sigma t1, with
// the job's T5 hidden states, pooled CLIP vector and guidance 3.5.
// Both x1 and velocity1 are in the unpacked latent layout [1, 16, 16, 16]
// (BFL's unpack of its packed 2x2 tokens), which is what kiln's DiT takes.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/flux_dit.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/rng.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

// As flux_pipeline_test's velocity0: F16 weights widened to F32 against a
// float64 reference.
constexpr double kTolerance = 1e-4;
constexpr float kGuidance = 3.5f;

io::ModelFile open_golden(const std::string& relative) {
    auto file = io::ModelFile::open({golden_path(relative)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

std::string part(const std::string& name) { return golden_path("pipeline/flux_tiny/" + name); }

struct FluxSecondStep : ::testing::Test {
    io::ModelFile job = open_golden("pipeline/flux_tiny_txt2img.safetensors");
    io::ModelFile step = open_golden("pipeline/flux_tiny_second_step.safetensors");
};

TEST_F(FluxSecondStep, GoldenIsTheJobsSecondSigma) {
    const auto t1 = fixture_tensor(step, "t1");
    const auto sigmas = fixture_tensor(job, "sigmas");
    ASSERT_EQ(t1.values.size(), 1u);
    ASSERT_GE(sigmas.values.size(), 2u);
    EXPECT_EQ(t1.values[0], sigmas.values[1]);
    EXPECT_EQ(fixture_tensor(step, "x1").shape, (std::vector<int64_t>{1, 16, 16, 16}));
    EXPECT_EQ(fixture_tensor(step, "velocity1").shape, (std::vector<int64_t>{1, 16, 16, 16}));
}

// kiln's DiT on its own: the network built over the pipeline's BFL-named
// weights (F32), the RoPE table made by kiln.
TEST_F(FluxSecondStep, DitMatchesBflAtTheSecondSigma) {
    auto weights = open_golden("pipeline/flux_tiny/flux_dit.safetensors");
    auto compute = test::golden_cpu();
    auto dit = test::declare_network<models::FluxDit>(weights, "", GGML_TYPE_F32);
    ASSERT_TRUE(dit.ok()) << dit.error().message;
    ASSERT_TRUE(dit->weights().load(compute->weights_backend()).ok());

    runtime::GraphSession session;
    auto input = [&](const io::ModelFile& file, const std::string& name) {
        const auto v = fixture_tensor(file, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    };
    models::FluxInputs in;
    in.x = input(step, "x1");
    in.timesteps = input(step, "t1");
    in.context = input(job, "t5.hidden");
    in.pooled = input(job, "clip.pooled");
    const float guidance = kGuidance;
    in.guidance = session.input(GGML_TYPE_F32, {1}, &guidance);
    const models::FluxConfig& cfg = (*dit)->config();
    const int64_t txt_tokens = in.context->ne[1];
    const models::FluxTokenGrid grid{in.x->ne[0] / 2, in.x->ne[1] / 2};
    const auto rope = models::flux_rope_table(cfg, txt_tokens, grid, {});
    in.rope = session.input(GGML_TYPE_F32, models::flux_rope_shape(cfg, txt_tokens, grid, {}), rope.data());

    auto out = (*dit)->build(session.ctx(), in, {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_TRUE(session.run(*compute, *out).ok());
    EXPECT_LT(relative_error(runtime::GraphSession::read(*out), fixture_tensor(step, "velocity1").values),
              kTolerance);
}

// The same evaluation through the pipeline's sampler: one Euler step from t1
// to 0 gives x1 - t1 * v.
TEST_F(FluxSecondStep, PipelineEulerFromTheSecondSigmaMatchesBfl) {
    pipeline::ModelPaths paths;
    paths.diffusion_model = part("flux_dit.safetensors");
    paths.vae = part("ae.safetensors");
    paths.clip_l = part("clip_l.safetensors");
    paths.t5xxl = part("t5xxl.safetensors");
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    auto loaded = pipeline::Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    pipeline::Model& model = **loaded;

    pipeline::Conditioning cond;
    cond.hidden = fixture_tensor(job, "t5.hidden").values;
    cond.tokens = 512;
    cond.width = 48;
    cond.y = fixture_tensor(job, "clip.pooled").values;
    const auto schedule = model.noise_schedule(32, 32, 20, std::nullopt);
    const float t1 = fixture_tensor(step, "t1").values[0];
    pipeline::SamplingRun run;
    run.latent_w = run.latent_h = 16;
    run.cfg_scale = 1.0f;
    run.sampler = pipeline::SamplerKind::Euler;
    run.sigmas = {t1, 0.0f};
    run.schedule = schedule.get();
    run.guidance = kGuidance;
    const std::vector<float> x1 = fixture_tensor(step, "x1").values;
    auto rng = pipeline::make_rng(pipeline::RngKind::Cuda, 11);
    auto out = pipeline::sample_latent(model, run, x1, cond, nullptr, *rng);
    ASSERT_TRUE(out.ok()) << out.error().message;
    std::vector<float> velocity(x1.size());
    for (size_t i = 0; i < x1.size(); ++i) velocity[i] = (x1[i] - (*out)[i]) / t1;
    EXPECT_LT(relative_error(velocity, fixture_tensor(step, "velocity1").values), kTolerance);
}

}  // namespace
}  // namespace kiln
