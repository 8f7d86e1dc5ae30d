// FLUX.2 [klein] through the pipeline on tiny random-weight parts in BFL's
// and ComfyUI's layouts (training/make_flux2_fixtures.py): the DiT by
// --diffusion-model, FLUX.2's autoencoder by --vae, a Qwen3 (28 layers of
// width 16, so 3 x 16 is the DiT's context) by --llm. The conditioning (512
// padded tokens, the padding masked in Qwen3, hidden_states 9, 18, 27 side
// by side) against training/reference/flux2.py; the schedule against BFL's;
// the family's defaults; a text-to-image job; and the parts that do not go
// together refused with one clear error each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "declared_network.h"
#include "golden.h"
#include "image/image.h"
#include "models/nets/llm_encoder.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/model.h"
#include "pipeline/schedulers.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "shared_model_suite.h"
#include "test_files.h"

namespace kiln {
namespace {

using pipeline::GenerationRequest;
using pipeline::Model;
using pipeline::ModelOptions;
using pipeline::ModelPaths;
using test::golden_path;

std::string model(const std::string& name) { return golden_path("models/" + name); }

ModelPaths klein_parts() {
    ModelPaths paths;
    paths.diffusion_model = model("flux2_tiny.safetensors");
    paths.vae = model("flux2_ae_tiny.safetensors");
    paths.llm = model("flux2_klein_qwen3_tiny.safetensors");
    paths.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
    return paths;
}

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// Qwen3 over the fixture's 512 ids (23 real, then <|endoftext|>) with the
// padding masked, its hidden_states 9, 18 and 27 side by side, as the
// network builds it for the conditioner.
TEST(Flux2Conditioning, StackedLayersOfThePaddedPromptMatchTheReference) {
    const io::ModelFile weights = open_file(model("flux2_klein_qwen3_tiny.safetensors"));
    const io::ModelFile io = open_file(model("flux2_klein_qwen3_tiny_io.safetensors"));
    auto llm = test::declare_network<models::LlmEncoder>(weights, "model.", GGML_TYPE_F32, 0, 27);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    EXPECT_EQ((*llm)->declared_layers(), 27) << "the layers after hidden_states 27 are never loaded";
    auto compute = test::golden_cpu();
    ASSERT_TRUE(llm->weights().load(compute->weights_backend()).ok());

    const auto ids = test::fixture_tensor(io, "ids").values;
    const auto mask = test::fixture_tensor(io, "mask").values;
    std::vector<int32_t> tokens(ids.begin(), ids.end());
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::TextEncodeShape shape;
    shape.length = static_cast<int64_t>(tokens.size());
    shape.final_norm = false;
    shape.key_mask = mask.data();
    shape.hidden_states = {9, 18, 27};
    const models::TextEncoderTensors t = (*llm)->build(inputs, shape);
    session.set_input(t.tokens, tokens.data());
    ASSERT_TRUE(session.run(*compute, t.out).ok());
    const auto context = runtime::GraphSession::read(t.out);
    EXPECT_EQ(t.out->ne[0], 48);
    EXPECT_LT(test::relative_error(context, test::fixture_tensor(io, "context").values), 1e-4);

    // Without the padding mask the padded tokens' rows differ: the mask is
    // what the reference's attention_mask does.
    shape.key_mask = nullptr;
    runtime::GraphSession unmasked_session;
    test::SessionInputs unmasked(unmasked_session);
    const models::TextEncoderTensors u = (*llm)->build(unmasked, shape);
    unmasked_session.set_input(u.tokens, tokens.data());
    ASSERT_TRUE(unmasked_session.run(*compute, u.out).ok());
    EXPECT_GT(test::relative_error(runtime::GraphSession::read(u.out), test::fixture_tensor(io, "context").values),
              1e-3);
}

using Flux2Pipeline = test::SharedModelSuite<klein_parts>;

TEST_F(Flux2Pipeline, IsKleinWithItsDefaults) {
    EXPECT_EQ(model_->family_label(), "FLUX.2-klein");
    EXPECT_EQ(model_->prediction(), models::Prediction::Flow);
    EXPECT_EQ(model_->latent_channels(), 128);
    EXPECT_EQ(model_->size_stride(), 4);  // the tiny autoencoder's 2, its 2x2 patches, the DiT's 1
    EXPECT_EQ(model_->defaults().steps, 4);
    EXPECT_EQ(model_->defaults().cfg_scale, 1.0f);
    EXPECT_EQ(model_->defaults().sampler, "euler");
    ASSERT_EQ(model_->text_encoders().size(), 1u);
    EXPECT_EQ(model_->text_encoders().front().width(), 48);
    EXPECT_EQ(pipeline::context_length(*model_, nullptr), 512);
    // The prompt under the template, then <|endoftext|> to 512, the padding marked.
    const models::TextEncoderUse& use = *model_->text_encoders().front().use;
    const pipeline::LlmPrompt prompt = pipeline::llm_prompt(model_->llm_tokenizer(), use, "a red circle");
    models::TextEncoderUse unpadded = use;
    unpadded.max_length = 0;
    const size_t real = pipeline::llm_prompt(model_->llm_tokenizer(), unpadded, "a red circle").ids.size();
    ASSERT_EQ(prompt.ids.size(), 512u);
    ASSERT_EQ(prompt.real.size(), 512u);
    EXPECT_EQ(std::count(prompt.real.begin(), prompt.real.end(), 1.0f), static_cast<long>(real));
    EXPECT_EQ(prompt.ids.back(), model_->llm_tokenizer().token_id("<|endoftext|>"));
    EXPECT_EQ(pipeline::context_length(*model_, &use.chat_prefix), 512);
    const auto* llm = dynamic_cast<const models::LlmEncoder*>(model_->text_encoders().front().network);
    ASSERT_NE(llm, nullptr);
    EXPECT_EQ(llm->declared_layers(), 27);
    EXPECT_STREQ(model_->tokenizer_of(model_->text_encoders().front()).name(), "LLM");
    EXPECT_TRUE(model_->family().reference_images);
}

// BFL's get_schedule (linspace(1, 0, n + 1) shifted by compute_empirical_mu)
// is kiln's simple scheduler on the family's noise table, at 1024x1024 (4096
// tokens of the real autoencoder's 16x) and 4 and 50 steps.
TEST_F(Flux2Pipeline, SimpleScheduleIsBflsSchedule) {
    const io::ModelFile io = open_file(model("flux2_tiny_io.safetensors"));
    for (int steps : {4, 50}) {
        // The tiny autoencoder's stride is 4: a 256x256 image has 4096 tokens.
        const auto schedule = model_->noise_schedule(256, 256, steps, std::nullopt);
        auto sigmas = pipeline::get_sigmas(pipeline::SchedulerKind::Simple, steps, *schedule);
        ASSERT_TRUE(sigmas.ok()) << sigmas.error().message;
        const auto want = test::fixture_tensor(io, "schedule.steps" + std::to_string(steps) + "_seq4096").values;
        ASSERT_EQ(sigmas->size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*sigmas)[i], want[i], 2e-5) << steps << " steps, " << i;
    }
}

TEST_F(Flux2Pipeline, TextToImageRunsAndTheSameSeedGivesTheSameImage) {
    GenerationRequest r;
    r.prompt = "a red circle";
    r.width = r.height = 16;
    r.steps = 2;
    r.seed = 7;
    auto a = pipeline::generate(*model_, r);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_EQ(a->size(), 1u);
    EXPECT_EQ((*a)[0].image.width, 16);
    auto b = pipeline::generate(*model_, r);
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ((*a)[0].image.pixels, (*b)[0].image.pixels);
    r.seed = 8;
    auto c = pipeline::generate(*model_, r);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_NE((*a)[0].image.pixels, (*c)[0].image.pixels);
}

// Editing (-r): a reference image is encoded by FLUX.2's autoencoder and
// its tokens (time position 10) are attended to; two references differ
// from one.
TEST_F(Flux2Pipeline, ReferenceImagesAreAttendedTo) {
    GenerationRequest r;
    r.prompt = "a red circle";
    r.width = r.height = 16;
    r.steps = 2;
    r.seed = 7;
    auto plain = pipeline::generate(*model_, r);
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    image::Image ref = image::make_image(16, 24, 3);
    for (size_t i = 0; i < ref.pixels.size(); ++i) ref.pixels[i] = static_cast<uint8_t>((i * 37) % 256);
    r.ref_images.push_back(ref);
    auto one = pipeline::generate(*model_, r);
    ASSERT_TRUE(one.ok()) << one.error().message;
    EXPECT_NE((*one)[0].image.pixels, (*plain)[0].image.pixels);
    r.ref_images.push_back(ref);
    auto two = pipeline::generate(*model_, r);
    ASSERT_TRUE(two.ok()) << two.error().message;
    EXPECT_NE((*two)[0].image.pixels, (*one)[0].image.pixels);
}

// klein base is the same DiT under BFL's "klein-base" name: its own
// defaults (BFL's 50 steps, CFG 4 against the empty prompt), and a job with
// CFG runs.
TEST(Flux2PipelineBase, TheBaseFileNameGivesBasesDefaults) {
    test::TempDir dir;
    ModelPaths paths = klein_parts();
    paths.diffusion_model =
        dir.write("flux-2-klein-base-tiny.safetensors", test::read_bytes(model("flux2_tiny.safetensors")));
    auto loaded = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_EQ((*loaded)->family_label(), "FLUX.2-klein-base");
    EXPECT_EQ((*loaded)->defaults().steps, 50);
    EXPECT_EQ((*loaded)->defaults().cfg_scale, 4.0f);
    GenerationRequest r;
    r.prompt = "a red circle";
    r.width = r.height = 16;
    r.steps = 2;
    auto image = pipeline::generate(**loaded, r);
    ASSERT_TRUE(image.ok()) << image.error().message;
}

// Parts that do not go together: each one clear error naming the part.
TEST(Flux2PipelineParts, MismatchedPartsAreRefused) {
    ModelPaths flux1_ae = klein_parts();
    flux1_ae.vae = golden_path("pipeline/flux_tiny/ae.safetensors");
    auto refused = Model::load(flux1_ae, test::golden_model_options());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("bn.running_mean"), std::string::npos) << refused.error().message;

    // FLUX.2's autoencoder with a FLUX.1 DiT: its 32-channel latent is not Flux's.
    ModelPaths flux1;
    const std::string flux_part = golden_path("pipeline/flux_tiny/");
    flux1.diffusion_model = flux_part + "flux_dit.safetensors";
    flux1.clip_l = flux_part + "clip_l.safetensors";
    flux1.t5xxl = flux_part + "t5xxl.safetensors";
    flux1.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    flux1.vae = model("flux2_ae_tiny.safetensors");
    auto flux2_ae = Model::load(flux1, test::golden_model_options());
    ASSERT_FALSE(flux2_ae.ok());
    EXPECT_EQ(flux2_ae.error().kind, ErrorKind::BadFile);
    EXPECT_NE(flux2_ae.error().message.find("the VAE has 32 latent channels but the Flux.1-dev DiT takes 16"),
              std::string::npos)
        << flux2_ae.error().message;

    ModelPaths no_llm = klein_parts();
    no_llm.llm.clear();
    auto missing = Model::load(no_llm, test::golden_model_options());
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find("pass --llm"), std::string::npos) << missing.error().message;

    // Qwen3's real tokenizer (151669 ids) with the tiny Qwen3's 300-row table.
    ModelPaths big_tokenizer = klein_parts();
    big_tokenizer.tokenizer = "llm=" + std::string(KILN_FIXTURES_DIR) + "/../../third_party/llm-tokenizer-qwen3";
    auto too_many = Model::load(big_tokenizer, test::golden_model_options());
    ASSERT_FALSE(too_many.ok());
    EXPECT_EQ(too_many.error().kind, ErrorKind::BadFile);
    EXPECT_NE(too_many.error().message.find("the LLM tokenizer has 151669 tokens but the llm text encoder only 300"),
              std::string::npos)
        << too_many.error().message;

    // Z-Image's tiny Qwen3 (3 layers of width 64) cannot give hidden_states 27.
    ModelPaths small_llm = klein_parts();
    small_llm.llm = golden_path("pipeline/z_image_tiny/qwen3.safetensors");
    auto short_llm = Model::load(small_llm, test::golden_model_options());
    ASSERT_FALSE(short_llm.ok());
    EXPECT_NE(short_llm.error().message.find("the first 27 layers are read, but the file has 3"), std::string::npos)
        << short_llm.error().message;
}

}  // namespace
}  // namespace kiln
