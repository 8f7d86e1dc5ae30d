// Whole SD3.5 text-to-image jobs on the tiny random SD3.5 of
// training/make_sd3_pipeline_fixtures.py, in Stability's release layout (the
// MMDiT and VAE in one file, CLIP-L, CLIP-G and T5-XXL beside it, as sd-cli's
// docs/sd3.md passes them), against the PyTorch references run end to end:
// sd3_infer.get_cond's join of the three encoders and its pooled vector, the
// flow schedule with shift 3, the MMDiT under CFG, Euler, the decode; and the
// same job without T5 (zeros in its place). Also the sizes the position
// embedding limits, and parts that do not go together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "golden.h"
#include "image/image.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/schedulers.h"
#include "test_files.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

// sd-cli's docs/sd3.md command, with the tiny parts.
ModelPaths release_parts(bool with_t5 = true) {
    ModelPaths paths;
    paths.model = {golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors")};
    paths.clip_l = golden_path("pipeline/flux_tiny/clip_l.safetensors");
    paths.clip_g = golden_path("pipeline/sd3_tiny/clip_g.safetensors");
    if (with_t5) paths.t5xxl = golden_path("pipeline/flux_tiny/t5xxl.safetensors");  // tokenizer_2/ beside it
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return paths;
}

class Sd3Pipeline : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = Model::load(release_parts(), test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        auto io = io::ModelFile::open({golden_path("pipeline/sd3_tiny_txt2img.safetensors")});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
    }

    static GenerationRequest job() {
        GenerationRequest r;
        r.prompt = io_->metadata_string("prompt", "");
        r.negative_prompt = "";
        r.width = r.height = 32;
        r.seed = 11;
        r.steps = 4;
        return r;
    }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* Sd3Pipeline::model_ = nullptr;
io::ModelFile* Sd3Pipeline::io_ = nullptr;

TEST_F(Sd3Pipeline, IsSd35LargeWithItsDefaults) {
    ASSERT_NE(model_, nullptr);
    EXPECT_EQ(model_->family_label(), "SD3.5-Large");
    EXPECT_EQ(model_->prediction(), Prediction::Flow);
    EXPECT_EQ(model_->size_stride(), 4);  // the tiny VAE's 2 times the patch 2
    EXPECT_EQ(model_->defaults().cfg_scale, 4.5f);
    EXPECT_EQ(model_->defaults().steps, 28);
    EXPECT_EQ(model_->defaults().sampler, "euler");
    EXPECT_NEAR(model_->latent_scale(), 1.5305f, 1e-6);
    EXPECT_EQ(model_->text_encoders().size(), 3u);
    EXPECT_TRUE(model_->absent_text_encoders().empty());
}

// get_cond: CLIP-L and CLIP-G side by side, padded to 48, then T5's 77
// tokens; CLIP-L's pooled output then CLIP-G's projected one.
TEST_F(Sd3Pipeline, ConditioningIsTheReferencesJoin) {
    ASSERT_NE(model_, nullptr);
    for (const auto& [prompt, key] : {std::pair<std::string, std::string>{job().prompt, ""}, {"", "uncond."}}) {
        auto cond = encode_prompt(*model_, prompt, 0);
        ASSERT_TRUE(cond.ok()) << cond.error().message;
        EXPECT_EQ(cond->tokens, 154) << key;
        EXPECT_EQ(cond->width, 48) << key;
        EXPECT_LT(relative_error(cond->hidden, fixture_tensor(*io_, key + "context").values), 1e-4) << key;
        EXPECT_LT(relative_error(cond->pooled, fixture_tensor(*io_, key + "pooled").values), 1e-4) << key;
    }
}

TEST_F(Sd3Pipeline, ScheduleIsTheFlowTableShiftedBy3) {
    ASSERT_NE(model_, nullptr);
    const auto schedule = model_->noise_schedule(32, 32, 4, std::nullopt);
    auto sigmas = get_sigmas(SchedulerKind::Discrete, 4, *schedule);
    ASSERT_TRUE(sigmas.ok());
    const auto want = fixture_tensor(*io_, "sigmas");
    ASSERT_EQ(sigmas->size(), want.values.size());
    for (size_t i = 0; i < want.values.size(); ++i) EXPECT_NEAR((*sigmas)[i], want.values[i], 1e-6) << i;
}

TEST_F(Sd3Pipeline, TextToImageMatchesTheReferenceJob) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r = job();
    r.cfg_scale = 4.5f;
    auto images = generate(*model_, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    EXPECT_LE(difference_from_reference(images->front().image, *io_, "image"), 1)
        << "largest pixel difference from the reference";
}

// A diffusers StableDiffusion3Pipeline folder of the same model: the MMDiT in
// SD3Transformer2DModel's names (training/make_sd3_diffusers_fixture.py,
// transcribed from diffusers' convert_sd3_to_diffusers.py: q, k, v split,
// the final and last context modulations in (scale, shift)), the VAE in
// diffusers' names, CLIP-L, CLIG-G and T5 in text_encoder/, _2/ and _3/,
// the tokenizers in tokenizer/, _2/ and _3/: the reference job's image.
TEST_F(Sd3Pipeline, DiffusersFolderGivesTheReferenceImage) {
    test::TempDir dir;
    const std::string root = "stable-diffusion-3.5-large/";
    dir.write(root + "model_index.json",
              R"({"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"],
                  "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
                  "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                  "text_encoder_3": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
                  "tokenizer_2": ["transformers", "CLIPTokenizer"], "tokenizer_3": ["transformers", "T5TokenizerFast"],
                  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]})");
    dir.write(root + "transformer/diffusion_pytorch_model.safetensors",
              test::read_bytes(golden_path("pipeline/sd3_tiny/diffusers_transformer.safetensors")));
    dir.write(root + "text_encoder/model.safetensors",
              test::read_bytes(golden_path("pipeline/flux_tiny/clip_l.safetensors")));
    dir.write(root + "text_encoder_2/model.safetensors",
              test::read_bytes(golden_path("pipeline/sd3_tiny/clip_g.safetensors")));
    dir.write(root + "text_encoder_3/model.safetensors",
              test::read_bytes(golden_path("pipeline/flux_tiny/t5xxl.safetensors")));
    auto release = io::ModelFile::open({golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors")});
    ASSERT_TRUE(release.ok()) << release.error().message;
    const io::NameMap map(io::ModelFamily::SD1);
    std::vector<test::SafetensorsEntry> vae;
    for (const io::TensorInfo& t : release->tensors()) {
        if (t.name.rfind("first_stage_model.", 0) != 0) continue;
        std::string folder;
        for (auto& d : test::to_diffusers(test::copy_entry(*release, t, t.name), map, &folder))
            vae.push_back(std::move(d));
    }
    ASSERT_FALSE(vae.empty());
    dir.write(root + "vae/diffusion_pytorch_model.safetensors", test::build_safetensors(vae));
    for (const char* tokenizer : {"tokenizer/", "tokenizer_2/"}) {
        for (const char* f : {"vocab.json", "merges.txt"}) {
            dir.write(root + tokenizer + f, test::read_bytes(std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer/" + f));
        }
    }
    dir.write(root + "tokenizer_3/tokenizer.json",
              test::read_bytes(golden_path("pipeline/flux_tiny/tokenizer_2/tokenizer.json")));

    ModelPaths paths;
    paths.model = {dir.file(root)};
    auto folder = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(folder.ok()) << folder.error().message;
    EXPECT_EQ((*folder)->family_label(), "SD3.5-Large");
    GenerationRequest r = job();
    r.cfg_scale = 4.5f;
    auto images = generate(**folder, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_, "image"), 1)
        << "largest pixel difference from the reference";
}

// Skip-layer guidance (SD3.5 Medium's recipe, sd-cli's options) drops a
// joint block in an extra pass: a different image, and the same one again.
TEST_F(Sd3Pipeline, SkipLayerGuidanceRunsItsPass) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r = job();
    r.cfg_scale = 4.5f;
    auto plain = generate(*model_, r);
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    r.slg.scale = 2.5f;
    r.slg.blocks = {0};
    r.slg.start = 0.0f;
    r.slg.end = 1.0f;
    auto guided = generate(*model_, r);
    ASSERT_TRUE(guided.ok()) << guided.error().message;
    EXPECT_NE(guided->front().image.pixels, plain->front().image.pixels);
    auto again = generate(*model_, r);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(again->front().image.pixels, guided->front().image.pixels);
}

// The position embedding covers 10 patches a side: 40 pixels of the tiny model.
TEST_F(Sd3Pipeline, ImagesLargerThanThePositionEmbeddingAreRefused) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r = job();
    r.width = 48;
    auto refused = generate(*model_, r);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(refused.error().message.find("at most 40 a side"), std::string::npos) << refused.error().message;
}

// A job without T5 (SD3 files ship without it): 77 zero rows in its place.
TEST(Sd3PipelineWithoutT5, ZerosStandForT5) {
    auto loaded = Model::load(release_parts(/*with_t5=*/false), test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    Model& model = **loaded;
    ASSERT_EQ(model.absent_text_encoders().size(), 1u);
    EXPECT_EQ(model.absent_text_encoders().front()->module, "t5xxl");
    auto io = io::ModelFile::open({golden_path("pipeline/sd3_tiny_txt2img.safetensors")});
    ASSERT_TRUE(io.ok());
    auto cond = encode_prompt(model, io->metadata_string("prompt", ""), 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    EXPECT_EQ(cond->tokens, 154);
    EXPECT_LT(relative_error(cond->hidden, fixture_tensor(*io, "no_t5.context").values), 1e-4);
    GenerationRequest r;
    r.prompt = io->metadata_string("prompt", "");
    r.width = r.height = 32;
    r.seed = 11;
    r.steps = 4;
    auto images = generate(model, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io, "no_t5.image"), 1);
}

// Parts that do not go together: each one clear error naming the part.
TEST(Sd3PipelineParts, MismatchedPartsAreRefused) {
    auto refusal = [](const ModelPaths& paths) {
        auto loaded = Model::load(paths, test::golden_model_options());
        EXPECT_FALSE(loaded.ok());
        return loaded.ok() ? Error{""} : loaded.error();
    };
    // FLUX.2's autoencoder (32 latent channels) or SD1's (4) with an SD3 DiT.
    ModelPaths flux2_ae = release_parts();
    flux2_ae.vae = golden_path("models/flux2_ae_tiny.safetensors");
    Error e = refusal(flux2_ae);
    EXPECT_EQ(e.kind, ErrorKind::BadFile);
    EXPECT_NE(e.message.find("the VAE gives 32-channel latents but the SD3.5-Large DiT takes 16"), std::string::npos)
        << e.message;
    ModelPaths sd1_vae = release_parts();
    sd1_vae.vae = golden_path("models/sd1_tiny.safetensors");
    e = refusal(sd1_vae);
    EXPECT_NE(e.message.find("4-channel latents"), std::string::npos) << e.message;
    // A CLIP-L given as CLIP-G: too wide together for the DiT's context, and
    // the pooled vector is not the DiT's.
    ModelPaths two_clip_l = release_parts();
    two_clip_l.clip_g = two_clip_l.clip_l;
    e = refusal(two_clip_l);
    EXPECT_EQ(e.kind, ErrorKind::BadFile);
    EXPECT_NE(e.message.find("features per token but the SD3.5-Large DiT's context_embedder takes 48"),
              std::string::npos)
        << e.message;
    // No CLIP-G at all.
    ModelPaths no_clip_g = release_parts();
    no_clip_g.clip_g.clear();
    e = refusal(no_clip_g);
    EXPECT_NE(e.message.find("no clip_g found (family SD3.5-Large); pass --clip_g"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace kiln::pipeline
