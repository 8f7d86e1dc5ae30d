// A prompt and a negative prompt of different chunk counts: each pass is
// conditioned on its own chunks (sd-cli, A1111's default), not padded with
// empty chunks. Repeating the shorter side's chunks when the counts divide
// (so CFG still runs as one batch) gives the result of two passes of their
// own lengths, up to rounding (the repeated keys and values leave attention
// unchanged); padding gives a different one.
#include <gtest/gtest.h>

#include "golden.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/schedulers.h"

namespace kiln::pipeline {
namespace {

class CfgChunks : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ModelPaths paths;
        paths.model = {test::golden_path("models/sd1_tiny.safetensors")};
        paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
        ModelOptions options;
        options.threads = 1;
        auto loaded = Model::load(paths, options);
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
    }
    static void TearDownTestSuite() { delete model_; }

    // The final latent of a 3-step euler run with these conditionings.
    static std::vector<float> sample(const Conditioning& cond, const Conditioning& uncond, bool batch_cfg,
                                     bool* apart = nullptr) {
        SamplingRun run;
        run.latent_w = 8;
        run.latent_h = 8;
        run.cfg_scale = 6.0f;
        run.sampler = SamplerKind::Euler;
        run.batch_cfg = batch_cfg;
        run.sigmas = get_sigmas(SchedulerKind::Discrete, 3, DiscreteSchedule::stable_diffusion()).value();
        auto rng = make_rng(RngKind::Cuda, 3);
        std::vector<float> x = rng->randn(static_cast<size_t>(8 * 8 * model_->diffusion().capabilities().out_channels));
        for (float& v : x) v *= run.sigmas.front();
        auto out = sample_latent(*model_, run, std::move(x), cond, &uncond, *rng, nullptr, apart);
        EXPECT_TRUE(out.ok()) << out.error().message;
        return out.ok() ? *out : std::vector<float>();
    }

    static Conditioning encode(const std::string& prompt) {
        auto c = encode_prompt(*model_, prompt, 0);
        EXPECT_TRUE(c.ok()) << c.error().message;
        return c.ok() ? *c : Conditioning{};
    }

    static Model* model_;
};
Model* CfgChunks::model_ = nullptr;

// `c`'s chunks `times` times over.
Conditioning repeated(const Conditioning& c, int times) {
    Conditioning out = c;
    for (int i = 1; i < times; ++i) out.hidden.insert(out.hidden.end(), c.hidden.begin(), c.hidden.end());
    out.tokens = c.tokens * times;
    return out;
}

TEST_F(CfgChunks, RepeatedChunksGiveTheTwoPassesOfTheirOwnLengths) {
    const Conditioning cond = encode("a red circle BREAK on white");
    const Conditioning uncond = encode("ugly");
    ASSERT_EQ(cond.tokens, 2 * uncond.tokens);

    bool apart = false;
    const std::vector<float> own_lengths = sample(cond, uncond, /*batch_cfg=*/true, &apart);
    EXPECT_TRUE(apart);  // contexts of different lengths cannot share a batch
    bool batched_apart = true;
    const std::vector<float> batched = sample(cond, repeated(uncond, 2), /*batch_cfg=*/true, &batched_apart);
    EXPECT_FALSE(batched_apart);
    // Padding the negative with an empty chunk (the old behaviour) is another
    // result.
    Conditioning padded = uncond;
    const Conditioning empty = encode("");
    padded.hidden.insert(padded.hidden.end(), empty.hidden.begin(), empty.hidden.end());
    padded.tokens += empty.tokens;
    const double padding_error = test::relative_error(sample(cond, padded, true), own_lengths);
    // Rounding: the batch of two and two passes of one of the same contexts
    // differ in summation order (3e-4 to 1e-3 after 3 steps at cfg 6 on this
    // random tiny model, by the CPU's kernels). Repeated chunks differ from
    // the passes of their own lengths by rounding alone, which 3 steps at
    // cfg 6 amplify (up to 6 times the same-context rounding measured here);
    // padding differs by far more.
    const double rounding = test::relative_error(sample(cond, cond, true), sample(cond, cond, false));
    EXPECT_GT(padding_error, 30 * rounding);
    EXPECT_LT(test::relative_error(batched, own_lengths), 10 * rounding + 1e-5);
    EXPECT_LT(test::relative_error(sample(cond, repeated(uncond, 2), false), own_lengths), 10 * rounding + 1e-5);
    EXPECT_LT(test::relative_error(batched, own_lengths), padding_error / 10);
}

TEST_F(CfgChunks, GenerateRunsCountsThatDoNotDivideApart) {
    GenerationRequest r;
    r.prompt = "a BREAK b BREAK c";
    r.negative_prompt = "x BREAK y";
    r.width = r.height = 32;
    r.steps = 2;
    GenerationTimings timings;
    auto images = generate(*model_, r, nullptr, &timings);
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_TRUE(timings.cfg_passes_apart);
    // 2 and 1 chunks divide: one batch.
    r.negative_prompt = "x";
    r.prompt = "a BREAK b";
    images = generate(*model_, r, nullptr, &timings);
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_FALSE(timings.cfg_passes_apart);
}

}  // namespace
}  // namespace kiln::pipeline
