// Inpainting with the plain (4-channel) tiny SD1 UNet against a reference of
// A1111's masking (training/make_sd1_inpaint_fixture.py with
// training/reference/a1111_inpaint.py): the init image's VAE sample is the
// start and the kept latent, the mask resized to the latent and rounded,
// the kept region blended back after every denoiser call and once after
// sampling; cfg 6 with a negative prompt, 4 euler steps at strength 0.8,
// seed 7, --rng cuda. The whole job, and its sampling alone.
#include <gtest/gtest.h>

#include "golden.h"
#include "pipeline/generate.h"
#include "pipeline/prompt_weights.h"
#include "pipeline/schedulers.h"

namespace kiln::pipeline {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr int kSize = 32;
constexpr int kLatent = 16;

class Sd1InpaintGolden : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ModelPaths paths;
        paths.model = {golden_path("models/sd1_tiny.safetensors")};
        paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
        auto loaded = Model::load(paths, test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        auto io = io::ModelFile::open({golden_path("pipeline/sd1_tiny_inpaint.safetensors")});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        model_ = nullptr;
        io_ = nullptr;
    }

    // An 8-bit image from a fixture tensor of 0..255 values ([H, W, C] or [H, W]).
    static image::Image fixture_image(const std::string& name, int channels) {
        const auto t = fixture_tensor(*io_, name);
        image::Image img = image::make_image(kSize, kSize, channels);
        EXPECT_EQ(t.values.size(), img.pixels.size()) << name;
        for (size_t i = 0; i < img.pixels.size() && i < t.values.size(); ++i)
            img.pixels[i] = static_cast<uint8_t>(t.values[i]);
        return img;
    }

    static std::string meta(const char* key) { return io_->metadata_string(key, ""); }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* Sd1InpaintGolden::model_ = nullptr;
io::ModelFile* Sd1InpaintGolden::io_ = nullptr;

TEST_F(Sd1InpaintGolden, PromptsEncodeToTheReferenceContexts) {
    ASSERT_NE(model_, nullptr);
    for (const auto& [key, side] : {std::pair{"prompt", "cond"}, std::pair{"negative_prompt", "uncond"}}) {
        const std::string text = meta(key);
        SCOPED_TRACE(text);
        const TokenChunks chunks = tokenize_with_weights(model_->tokenizer(), text);
        ASSERT_EQ(chunks.tokens.size(), 1u);
        EXPECT_EQ(std::vector<float>(chunks.tokens[0].begin(), chunks.tokens[0].end()),
                  fixture_tensor(*io_, std::string(side) + "_tokens").values);
        auto c = encode_prompt(*model_, text, 1);
        ASSERT_TRUE(c.ok()) << c.error().message;
        EXPECT_LT(relative_error(c->hidden, fixture_tensor(*io_, side).values), 1e-4);
    }
}

// The sampling alone, from the reference's kept latent and latent mask:
// kiln's latent masking (SamplingRun::keep_weight / keep_latent) against
// A1111's blend after every denoiser call and after sampling.
TEST_F(Sd1InpaintGolden, SamplingWithTheLatentMaskMatchesTheReference) {
    ASSERT_NE(model_, nullptr);
    const auto init_latent = fixture_tensor(*io_, "init_latent");
    const auto repaint = fixture_tensor(*io_, "latent_mask");
    const auto noise = fixture_tensor(*io_, "noise");
    const auto expected = fixture_tensor(*io_, "final");
    const size_t plane = static_cast<size_t>(kLatent) * kLatent;
    ASSERT_EQ(init_latent.values.size(), 4 * plane);
    ASSERT_EQ(repaint.values.size(), plane);

    auto c = encode_prompt(*model_, meta("prompt"), 1);
    auto u = encode_prompt(*model_, meta("negative_prompt"), 1);
    ASSERT_TRUE(c.ok() && u.ok());
    SamplingRun run;
    run.latent_w = kLatent;
    run.latent_h = kLatent;
    run.cfg_scale = 6.0f;
    run.sampler = parse_sampler("euler").value();
    run.sigmas = get_sigmas(parse_scheduler("discrete").value(), 4, DiscreteSchedule::stable_diffusion()).value();
    // strength 0.8 of 4 steps: t_enc = 3, all five sigmas stay (A1111's and sd-cli's cut).
    EXPECT_EQ(run.sigmas, fixture_tensor(*io_, "sigmas").values);
    run.keep_latent = init_latent.values;
    run.keep_weight.resize(init_latent.values.size());
    for (size_t k = 0; k < run.keep_weight.size(); ++k) run.keep_weight[k] = 1.0f - repaint.values[k % plane];

    // The sampling noise is the first randn of Philox(7), the same numbers
    // the VAE sample drew (sd-cli seeds the generator again for each image).
    auto rng = make_rng(RngKind::Cuda, 7);
    std::vector<float> x = rng->randn(noise.values.size());
    ASSERT_EQ(x, noise.values);
    ASSERT_EQ(x, fixture_tensor(*io_, "encode_noise").values);
    for (size_t k = 0; k < x.size(); ++k) x[k] = x[k] * run.sigmas.front() + init_latent.values[k];
    EXPECT_LT(relative_error(x, fixture_tensor(*io_, "x_start").values), 1e-6);

    auto final_latent = sample_latent(*model_, run, std::move(x), *c, &*u, *rng);
    ASSERT_TRUE(final_latent.ok()) << final_latent.error().message;
    EXPECT_LT(relative_error(*final_latent, expected.values), 1e-4);
    // The kept region is the init latent itself, exactly.
    int kept = 0;
    for (size_t k = 0; k < final_latent->size(); ++k) {
        if (repaint.values[k % plane] != 0.0f) continue;
        ++kept;
        ASSERT_EQ((*final_latent)[k], init_latent.values[k]) << k;
    }
    EXPECT_EQ(kept, 4 * (256 - 64));
}

// kiln's whole job: encoding the init image (a sample, its noise from the
// job's generator), the latent mask from the pixel mask, sampling, decoding.
TEST_F(Sd1InpaintGolden, WholeJobMatchesTheReferenceImage) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r;
    r.prompt = meta("prompt");
    r.negative_prompt = meta("negative_prompt");
    r.width = r.height = kSize;
    r.steps = 4;
    r.cfg_scale = 6.0f;
    r.seed = 7;
    r.sampler = "euler";
    r.scheduler = "discrete";
    r.rng = RngKind::Cuda;
    r.clip_skip = 1;
    r.init_image = fixture_image("init_pixels", 3);
    r.mask = fixture_image("mask_pixels", 1);
    r.strength = 0.8f;
    r.file_hashes = false;
    auto images = generate(*model_, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    // The reference's decode rounded to 8 bits as kiln's PNG is: float32
    // against float64 moves a pixel by at most one level.
    EXPECT_LE(test::difference_from_reference(images->front().image, *io_, "image"), 1)
        << "largest pixel difference from the reference";
}

}  // namespace
}  // namespace kiln::pipeline
