// SDXL's conditioning for a prompt and a non-empty negative prompt against a
// second, independent reference: training/check_sgm_conditioning.py, a
// transcription of Stability's sgm GeneralConditioner (CLIP-L hidden state
// at layer_idx 11 of 12, bigG's penultimate state and pooled output through
// text_projection, three ConcatTimestepEmbedderND), on the tiny SDXL. Also
// one CFG evaluation (cfg 6) of the UNet with both conditionings, as sgm's
// VanillaCFG over its discrete eps denoiser computes it.
#include <gtest/gtest.h>

#include "golden.h"
#include "pipeline/generate.h"
#include "pipeline/prompt_weights.h"
#include "pipeline/size_conditioning.h"

namespace kiln::pipeline {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr const char* kPrompt = "a red circle";
constexpr const char* kNegative = "ugly";
constexpr int kImageSize = 256;  // the job the fixture's y is for (original = target = 256x256, no crop)
constexpr int kSizeDim = 8;      // the tiny SDXL's size embeddings (SDXL: 256)

class SdxlCfgNegative : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ModelPaths paths;
        paths.model = {golden_path("models/sdxl_tiny.safetensors")};
        paths.vae = golden_path("models/sd1_tiny.safetensors");  // the tiny SDXL has no VAE of its own
        paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
        auto loaded = Model::load(paths, test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        auto io = io::ModelFile::open({golden_path("pipeline/sdxl_cfg_negative.safetensors")});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        model_ = nullptr;
        io_ = nullptr;
    }

    // kiln's conditioning of `prompt`, with y as kiln conditions a 256x256 job.
    static Conditioning conditioning(const std::string& prompt) {
        auto c = encode_prompt(*model_, prompt, 0);
        EXPECT_TRUE(c.ok()) << c.error().message;
        if (!c.ok()) return {};
        SizeConditioning size;
        size.original_height = size.target_height = kImageSize;
        size.original_width = size.target_width = kImageSize;
        c->y = sdxl_conditioning_vector(c->pooled, size, kSizeDim);
        return std::move(c).value();
    }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* SdxlCfgNegative::model_ = nullptr;
io::ModelFile* SdxlCfgNegative::io_ = nullptr;

TEST_F(SdxlCfgNegative, FixtureIsTheJobThisTestRuns) {
    ASSERT_NE(io_, nullptr);
    EXPECT_EQ(io_->metadata_string("prompt", ""), kPrompt);
    EXPECT_EQ(io_->metadata_string("negative_prompt", ""), kNegative);
    EXPECT_EQ(io_->metadata_string("width", ""), std::to_string(kImageSize));
    EXPECT_EQ(io_->metadata_string("cfg_scale", ""), "6");
}

TEST_F(SdxlCfgNegative, TokensAreSgms) {
    ASSERT_NE(model_, nullptr);
    // CLIP-L's row (EOS padding), as HF's CLIPTokenizer makes it for sgm.
    for (const auto& [text, key] : {std::pair{kPrompt, "cond.tokens_l"}, std::pair{kNegative, "uncond.tokens_l"}}) {
        const TokenChunks chunks = tokenize_with_weights(model_->tokenizer(), text);
        ASSERT_EQ(chunks.tokens.size(), 1u) << text;
        EXPECT_EQ(std::vector<float>(chunks.tokens[0].begin(), chunks.tokens[0].end()),
                  fixture_tensor(*io_, key).values)
            << text;
    }
}

TEST_F(SdxlCfgNegative, PromptAndNegativePromptConditionAsSgm) {
    ASSERT_NE(model_, nullptr);
    for (const auto& [text, side] : {std::pair{kPrompt, "cond"}, std::pair{kNegative, "uncond"}}) {
        SCOPED_TRACE(text);
        const Conditioning c = conditioning(text);
        const auto context = fixture_tensor(*io_, std::string(side) + ".context");
        const auto y = fixture_tensor(*io_, std::string(side) + ".y");
        ASSERT_EQ(context.shape, (std::vector<int64_t>{1, 77, 64}));
        EXPECT_EQ(c.tokens, 77);
        EXPECT_EQ(c.width, 64);  // CLIP-L 32 then bigG 32, sgm's crossattn order
        EXPECT_LT(relative_error(c.hidden, context.values), 1e-4);
        ASSERT_EQ(c.pooled.size(), 48u);
        ASSERT_EQ(c.y.size(), 96u);  // pooled 48 + 6 x 8
        // sgm's size embeddings are float32, kiln's double rounded once: a
        // few 1e-7 here at 256, more (~1e-4) near 1024.
        EXPECT_LT(relative_error(c.y, y.values), 1e-4);
    }
}

TEST_F(SdxlCfgNegative, CfgEvaluationMatchesSgm) {
    ASSERT_NE(model_, nullptr);
    const Conditioning cond = conditioning(kPrompt);
    const Conditioning uncond = conditioning(kNegative);
    const auto x = fixture_tensor(*io_, "cfg.x");
    const float sigma = fixture_tensor(*io_, "cfg.sigma").values.at(0);
    const auto denoised = fixture_tensor(*io_, "cfg.denoised");
    ASSERT_EQ(x.shape, (std::vector<int64_t>{1, 4, 8, 8}));
    // One euler step from sigma to 0 lands on the denoiser's output:
    // x + (x - D) / sigma * (0 - sigma) = D.
    SamplingRun run;
    run.latent_w = 8;
    run.latent_h = 8;
    run.cfg_scale = 6.0f;
    run.sampler = parse_sampler("euler").value();
    run.sigmas = {sigma, 0.0f};
    auto rng = make_rng(RngKind::Cuda, 0);
    for (bool batch_cfg : {true, false}) {
        SCOPED_TRACE(batch_cfg ? "CFG as one batch" : "CFG passes apart");
        run.batch_cfg = batch_cfg;
        auto out = sample_latent(*model_, run, x.values, cond, &uncond, *rng);
        ASSERT_TRUE(out.ok()) << out.error().message;
        // F32 weights, float32 UNet against the float64 reference; kiln's
        // fractional timestep of the table's sigma is 700 up to float32.
        EXPECT_LT(relative_error(*out, denoised.values), 1e-4);
    }
}

}  // namespace
}  // namespace kiln::pipeline
