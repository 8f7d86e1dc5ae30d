// Whole Z-Image text-to-image jobs on the tiny random Z-Image of
// training/make_z_image_pipeline_fixtures.py (the DiT in the single-file
// names, a tiny Qwen3 with its GPT-2 byte-level BPE tokenizer beside it, in
// safetensors and as a GGUF carrying the tokenizer, Flux's tiny autoencoder)
// against the PyTorch references run end to end: Qwen's chat template and
// tokenizer, Qwen3's hidden_states[-2], the flow schedule with shift 3, the
// DiT at sigma, Euler, the decode; Turbo (cfg 1) and Base (cfg 5 against the
// empty prompt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "golden.h"
#include "image/image_io.h"
#include "models/nets/llm_encoder.h"
#include "models/nets/z_image_dit.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/graphs.h"
#include "pipeline/prompt_weights.h"
#include "pipeline/request.h"
#include "pipeline/schedulers.h"
#include "test_files.h"
#include "text/llm_tokenizer.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr const char* kPrompt = "a red cat on a blue square";
constexpr const char* kChatPrefix = "<|im_start|>user\n";
constexpr const char* kChatSuffix = "<|im_end|>\n<|im_start|>assistant\n";

std::string part(const std::string& name) { return golden_path("pipeline/z_image_tiny/" + name); }
std::string flux_ae() { return golden_path("pipeline/flux_tiny/ae.safetensors"); }
std::string templated(const std::string& prompt) { return kChatPrefix + prompt + kChatSuffix; }

std::vector<float> as_floats(const std::vector<int32_t>& ids) { return {ids.begin(), ids.end()}; }

// The released parts: the DiT by --diffusion-model, Flux's ae by --vae, the
// Qwen3 by --llm with its tokenizer/ folder beside it (no --tokenizer).
ModelPaths turbo_parts() {
    ModelPaths paths;
    paths.diffusion_model = part("z_image_turbo_dit.safetensors");
    paths.vae = flux_ae();
    paths.llm = part("qwen3.safetensors");
    return paths;
}

ModelPaths base_parts() {
    ModelPaths paths = turbo_parts();
    paths.diffusion_model = part("z_image_base_dit.safetensors");
    return paths;
}

io::ModelFile* open_job(const std::string& name) {
    auto io = io::ModelFile::open({golden_path("pipeline/" + name)});
    EXPECT_TRUE(io.ok()) << io.error().message;
    return io.ok() ? new io::ModelFile(std::move(io).value()) : nullptr;
}

GenerationRequest tiny_job() {
    GenerationRequest r;
    r.prompt = kPrompt;
    r.width = r.height = 32;
    r.seed = 11;
    r.steps = 4;
    r.rng = RngKind::Cuda;
    return r;
}

class ZImagePipeline : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = Model::load(turbo_parts(), test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        io_ = open_job("z_image_tiny_txt2img.safetensors");
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        model_ = nullptr;
        io_ = nullptr;
    }
    void SetUp() override {
        ASSERT_NE(model_, nullptr);
        ASSERT_NE(io_, nullptr);
    }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* ZImagePipeline::model_ = nullptr;
io::ModelFile* ZImagePipeline::io_ = nullptr;

TEST_F(ZImagePipeline, IsZImageTurboWithItsDefaults) {
    EXPECT_EQ(model_->family_label(), "Z-Image-Turbo");
    EXPECT_NE(dynamic_cast<const models::ZImageDit*>(&model_->diffusion()), nullptr);
    EXPECT_EQ(model_->prediction(), Prediction::Flow);
    EXPECT_EQ(model_->size_stride(), 4);  // the tiny ae's 2 times the patch 2
    EXPECT_EQ(model_->latent_channels(), 16);
    EXPECT_EQ(model_->defaults().sampler, "euler");
    EXPECT_EQ(model_->defaults().cfg_scale, 1.0f);
    EXPECT_EQ(model_->defaults().steps, 8);
    EXPECT_EQ(model_->defaults().width, 1024);
    EXPECT_EQ(model_->defaults().height, 1024);
    ASSERT_EQ(model_->text_encoders().size(), 1u);
    EXPECT_EQ(model_->text_encoders().front().width(), 64);
}

// What the DiT takes is decided once, from its capabilities: Z-Image's DiT
// takes no skip list, so skip-layer guidance is refused before any graph
// (as for a UNet), and no distilled guidance is set.
TEST_F(ZImagePipeline, CapabilitiesDecideWhatARequestMayAsk) {
    const models::DiffusionCapabilities& can = model_->diffusion().capabilities();
    EXPECT_FALSE(can.skip_layers);
    EXPECT_FALSE(can.guidance);
    EXPECT_FALSE(can.control_residuals);
    GenerationRequest r;
    r.width = r.height = 64;
    r.slg.scale = 2.5f;
    auto refused = validate_request(*model_, r);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(refused.error().message.find("Z-Image-Turbo's DiT does not"), std::string::npos)
        << refused.error().message;
    r.slg.scale = 0.0f;
    r.guidance = 4.0f;
    auto planned = validate_request(*model_, r);
    ASSERT_TRUE(planned.ok()) << planned.error().message;
    EXPECT_EQ(planned->guidance, 0.0f);
}

// The tokenizer/ folder beside qwen3.safetensors is found without
// --tokenizer: its 256 byte characters and 27 merges, then the 3 specials.
TEST_F(ZImagePipeline, TokenizerBesideTheLlmIsFound) {
    const text::LlmTokenizer& tok = model_->llm_tokenizer();
    EXPECT_EQ(tok.size(), 286);
    EXPECT_EQ(tok.pre_tokenizer(), text::LlmPreTokenizer::Qwen2);
    for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        const int32_t id = tok.token_id(special);
        EXPECT_GE(id, 283) << special;
        EXPECT_TRUE(tok.is_added(id)) << special;
    }
}

TEST_F(ZImagePipeline, TokensAreTheTemplatedPrompt) {
    const auto want = fixture_tensor(*io_, "llm.tokens");
    EXPECT_EQ(as_floats(model_->llm_tokenizer().encode(templated(kPrompt))), want.values);
    const TextEncoder& te = model_->text_encoders().front();
    ASSERT_NE(te.use, nullptr);
    const LlmPrompt p = llm_prompt(model_->llm_tokenizer(), *te.use, kPrompt);
    EXPECT_EQ(as_floats(p.ids), want.values);
    EXPECT_EQ(p.weights, std::vector<float>(p.ids.size(), 1.0f));
}

TEST_F(ZImagePipeline, ConditioningIsQwen3sSecondToLastHiddenStates) {
    auto cond = encode_prompt(*model_, kPrompt, 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    const auto hidden = fixture_tensor(*io_, "llm.hidden");  // [1, n, 64]
    ASSERT_EQ(hidden.shape.size(), 3u);
    EXPECT_EQ(cond->tokens, hidden.shape[1]);
    EXPECT_EQ(cond->width, 64);
    EXPECT_LT(relative_error(cond->hidden, hidden.values), 1e-4);
    EXPECT_TRUE(cond->pooled.empty());
    EXPECT_TRUE(cond->token_valid.empty());  // every token of the template is attended to
}

// A1111 weights as sd-cli applies them to an LLM: the prompt's fragments
// tokenized one by one, each token's row scaled by its weight, the mean
// restored; the template at weight 1; BREAK dropped.
TEST_F(ZImagePipeline, PromptWeightsScaleTheirTokensAsSdCliDoes) {
    const text::LlmTokenizer& tok = model_->llm_tokenizer();
    const TextEncoder& te = model_->text_encoders().front();
    auto join = [&](std::initializer_list<std::string> parts) {
        std::vector<int32_t> ids;
        for (const std::string& part : parts) {
            const std::vector<int32_t> piece = tok.encode(part);
            ids.insert(ids.end(), piece.begin(), piece.end());
        }
        return ids;
    };
    const LlmPrompt weighted = llm_prompt(tok, *te.use, "a (red:1.5) cat on a blue square");
    EXPECT_EQ(weighted.ids, join({kChatPrefix, "a ", "red", " cat on a blue square", kChatSuffix}));
    const size_t red_start = join({kChatPrefix, "a "}).size(), red_end = red_start + tok.encode("red").size();
    for (size_t i = 0; i < weighted.weights.size(); ++i) {
        EXPECT_EQ(weighted.weights[i], i >= red_start && i < red_end ? 1.5f : 1.0f) << i;
    }
    EXPECT_EQ(llm_prompt(tok, *te.use, "a BREAK cat").ids, join({kChatPrefix, "a", "cat", kChatSuffix}));

    auto cond = encode_prompt(*model_, "a (red:1.5) cat on a blue square", 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    const auto n = static_cast<int64_t>(weighted.ids.size());
    TextEncoderGraph g = build_text_encoder_graph(te, weighted.ids.data(), n, 1, te.use->default_layer);
    ASSERT_TRUE(g.session->run(*te.executor, g.out).ok());
    std::vector<float> want = runtime::GraphSession::read(g.out);
    apply_token_weights(want.data(), static_cast<int>(n), static_cast<int>(te.width()), weighted.weights.data());
    EXPECT_EQ(cond->tokens, n);
    EXPECT_LT(relative_error(cond->hidden, want), 1e-6);
    auto plain = encode_prompt(*model_, "a red cat on a blue square", 0);
    ASSERT_TRUE(plain.ok());
    EXPECT_NE(plain->hidden, cond->hidden);
}

TEST_F(ZImagePipeline, ScheduleIsTheFlowTableShiftedBy3) {
    const auto schedule = model_->noise_schedule(32, 32, 20, std::nullopt);
    EXPECT_TRUE(schedule->flow());
    auto sigmas = get_sigmas(SchedulerKind::Discrete, 4, *schedule);
    ASSERT_TRUE(sigmas.ok()) << sigmas.error().message;
    const auto want = fixture_tensor(*io_, "sigmas");
    ASSERT_EQ(sigmas->size(), want.values.size());
    for (size_t i = 0; i < want.values.size(); ++i) EXPECT_NEAR((*sigmas)[i], want.values[i], 1e-6) << i;
    // No resolution shift: the same table at another size.
    auto large = get_sigmas(SchedulerKind::Discrete, 4, *model_->noise_schedule(1024, 1024, 4, std::nullopt));
    ASSERT_TRUE(large.ok());
    EXPECT_EQ(*large, *sigmas);
}

TEST_F(ZImagePipeline, TextToImageMatchesTheReferenceJob) {
    auto images = generate(*model_, tiny_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    const image::Image& img = images->front().image;
    ASSERT_EQ(img.width, 32);
    ASSERT_EQ(img.height, 32);
    EXPECT_LE(difference_from_reference(img, *io_), 1) << "largest pixel difference from the reference";
}

TEST_F(ZImagePipeline, SamplingMatchesTheReferenceStepByStep) {
    Conditioning cond;
    const auto hidden = fixture_tensor(*io_, "llm.hidden");
    cond.hidden = hidden.values;
    cond.tokens = hidden.shape[1];
    cond.width = 64;
    const auto schedule = model_->noise_schedule(32, 32, 20, std::nullopt);
    SamplingRun run;
    run.latent_w = run.latent_h = 16;
    run.cfg_scale = 1.0f;
    run.sampler = SamplerKind::Euler;
    run.sigmas = fixture_tensor(*io_, "sigmas").values;
    run.schedule = schedule.get();
    std::vector<float> x = fixture_tensor(*io_, "noise").values;
    for (float& v : x) v *= run.sigmas.front();
    auto rng = make_rng(RngKind::Cuda, 11);
    // One step to 0: the DiT's velocity at sigma 1 is (x - D) / sigma.
    SamplingRun one = run;
    one.sigmas = {run.sigmas[0], 0.0f};
    auto denoised = sample_latent(*model_, one, x, cond, nullptr, *rng);
    ASSERT_TRUE(denoised.ok()) << denoised.error().message;
    std::vector<float> velocity(x.size());
    for (size_t i = 0; i < x.size(); ++i) velocity[i] = (x[i] - (*denoised)[i]) / run.sigmas[0];
    EXPECT_LT(relative_error(velocity, fixture_tensor(*io_, "velocity0").values), 1e-4);
    auto latent = sample_latent(*model_, run, x, cond, nullptr, *rng);
    ASSERT_TRUE(latent.ok()) << latent.error().message;
    EXPECT_LT(relative_error(*latent, fixture_tensor(*io_, "latent").values), 1e-4);
}

// Z-Image Base: the same parts but a DiT whose file name does not say
// "turbo"; cfg 5 against the empty negative prompt, encoded under the same
// template at its own length.
class ZImagePipelineBase : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = Model::load(base_parts(), test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        io_ = open_job("z_image_base_txt2img.safetensors");
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        model_ = nullptr;
        io_ = nullptr;
    }
    void SetUp() override {
        ASSERT_NE(model_, nullptr);
        ASSERT_NE(io_, nullptr);
    }
    static Model* model_;
    static io::ModelFile* io_;
};
Model* ZImagePipelineBase::model_ = nullptr;
io::ModelFile* ZImagePipelineBase::io_ = nullptr;

TEST_F(ZImagePipelineBase, IsZImageBaseWithItsDefaults) {
    EXPECT_EQ(model_->family_label(), "Z-Image");
    EXPECT_EQ(model_->defaults().cfg_scale, 5.0f);
    EXPECT_EQ(model_->defaults().steps, 28);
    EXPECT_EQ(model_->defaults().sampler, "euler");
}

TEST_F(ZImagePipelineBase, NegativePromptIsTheEmptyPromptUnderTheTemplate) {
    const auto tokens = fixture_tensor(*io_, "llm.uncond_tokens");
    EXPECT_EQ(as_floats(model_->llm_tokenizer().encode(templated(""))), tokens.values);
    auto uncond = encode_prompt(*model_, "", 0);
    ASSERT_TRUE(uncond.ok()) << uncond.error().message;
    EXPECT_EQ(uncond->tokens, static_cast<int64_t>(tokens.values.size()));
    EXPECT_LT(relative_error(uncond->hidden, fixture_tensor(*io_, "llm.uncond_hidden").values), 1e-4);
    auto cond = encode_prompt(*model_, kPrompt, 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    EXPECT_LT(relative_error(cond->hidden, fixture_tensor(*io_, "llm.hidden").values), 1e-4);
}

TEST_F(ZImagePipelineBase, TextToImageWithCfgMatchesTheReferenceJob) {
    GenerationRequest r = tiny_job();  // cfg and the negative prompt: the defaults (5, "")
    auto images = generate(*model_, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 1)
        << "largest pixel difference from the reference";
    // The guided velocity and the latent, step by step.
    Conditioning cond, uncond;
    for (auto [c, key] : {std::pair{&cond, "llm.hidden"}, std::pair{&uncond, "llm.uncond_hidden"}}) {
        const auto hidden = fixture_tensor(*io_, key);
        c->hidden = hidden.values;
        c->tokens = hidden.shape[1];
        c->width = 64;
    }
    const auto schedule = model_->noise_schedule(32, 32, 20, std::nullopt);
    SamplingRun run;
    run.latent_w = run.latent_h = 16;
    run.cfg_scale = 5.0f;
    run.sampler = SamplerKind::Euler;
    run.sigmas = fixture_tensor(*io_, "sigmas").values;
    run.schedule = schedule.get();
    std::vector<float> x = fixture_tensor(*io_, "noise").values;
    for (float& v : x) v *= run.sigmas.front();
    auto rng = make_rng(RngKind::Cuda, 11);
    SamplingRun one = run;
    one.sigmas = {run.sigmas[0], 0.0f};
    auto denoised = sample_latent(*model_, one, x, cond, &uncond, *rng);
    ASSERT_TRUE(denoised.ok()) << denoised.error().message;
    std::vector<float> velocity(x.size());
    for (size_t i = 0; i < x.size(); ++i) velocity[i] = (x[i] - (*denoised)[i]) / run.sigmas[0];
    EXPECT_LT(relative_error(velocity, fixture_tensor(*io_, "velocity0").values), 1e-4);
    auto latent = sample_latent(*model_, run, x, cond, &uncond, *rng);
    ASSERT_TRUE(latent.ok()) << latent.error().message;
    EXPECT_LT(relative_error(*latent, fixture_tensor(*io_, "latent").values), 1e-4);
}

// The other forms users have, and what kiln says about wrong ones.
class ZImageInputs : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        // A Qwen3 with no tokenizer anywhere near it.
        dir_->write("lonely/qwen3.safetensors", test::read_bytes(part("qwen3.safetensors")));
        io_ = open_job("z_image_tiny_txt2img.safetensors");
    }
    static void TearDownTestSuite() {
        delete dir_;
        delete io_;
        io_ = nullptr;
    }

    static std::string kiln_base(const std::string& dit, const std::string& vae, const std::string& llm) {
        std::string cmd = std::string(KILN_BIN);
        if (!dit.empty()) cmd += " --diffusion-model " + dit;
        if (!vae.empty()) cmd += " --vae " + vae;
        if (!llm.empty()) cmd += " --llm " + llm;
        return cmd + " -p '" + kPrompt + "' -W 32 -H 32 --steps 4 -s 11 -t 1 ";
    }

    static test::TempDir* dir_;
    static io::ModelFile* io_;
};
test::TempDir* ZImageInputs::dir_ = nullptr;
io::ModelFile* ZImageInputs::io_ = nullptr;

// qwen3.gguf carries the tokenizer as convert_hf_to_gguf.py writes Qwen's
// (its table's rows past the tokenizer as unused [PAD<i>] tokens): the same
// ids and the same conditioning with no --tokenizer.
TEST_F(ZImageInputs, GgufLlmCarriesItsTokenizerAndGivesTheSameConditioning) {
    auto st = Model::load(turbo_parts(), test::golden_model_options());
    ASSERT_TRUE(st.ok()) << st.error().message;
    ModelPaths paths = turbo_parts();
    paths.llm = part("qwen3.gguf");
    auto gguf = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(gguf.ok()) << gguf.error().message;
    EXPECT_EQ((*gguf)->family_label(), "Z-Image-Turbo");
    EXPECT_EQ((*gguf)->llm_tokenizer().size(), 288);  // the [PAD<i>] rows included
    for (const std::string& prompt : {std::string(kPrompt), std::string("")}) {
        EXPECT_EQ((*gguf)->llm_tokenizer().encode(templated(prompt)), (*st)->llm_tokenizer().encode(templated(prompt)))
            << prompt;
    }
    EXPECT_EQ(as_floats((*gguf)->llm_tokenizer().encode(templated(kPrompt))),
              fixture_tensor(*io_, "llm.tokens").values);
    auto a = encode_prompt(**st, kPrompt, 0);
    auto b = encode_prompt(**gguf, kPrompt, 0);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_LT(relative_error(b->hidden, a->hidden), 1e-6);
    EXPECT_LT(relative_error(b->hidden, fixture_tensor(*io_, "llm.hidden").values), 1e-4);
}

// -M convert --tokenizer llm=PATH writes the tokenizer into the GGUF it
// makes (as llama.cpp's converter does): the converted LLM needs no
// --tokenizer and gives the same ids and conditioning.
TEST_F(ZImageInputs, ConvertedLlmCarriesTheTokenizer) {
    const std::string gguf = dir_->file("qwen3-q8_0.gguf");
    auto convert =
        test::run_command(std::string(KILN_BIN) + " -M convert -m " + dir_->file("lonely/qwen3.safetensors") +
                          " --tokenizer llm=" + part("tokenizer") + " --type f16 -o " + gguf);
    ASSERT_EQ(convert.exit_code, 0) << convert.err;
    ModelPaths paths = turbo_parts();
    paths.llm = gguf;
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ(as_floats((*model)->llm_tokenizer().encode(templated(kPrompt))),
              fixture_tensor(*io_, "llm.tokens").values);
    auto c = encode_prompt(**model, kPrompt, 0);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_LT(relative_error(c->hidden, fixture_tensor(*io_, "llm.hidden").values), 1e-4);

    auto both = test::run_command(std::string(KILN_BIN) + " -M convert -m " + part("qwen3.safetensors") +
                                  " --tokenizer llm=" + part("tokenizer") + ",t5xxl=" + part("tokenizer") + " -o " +
                                  dir_->file("never.gguf"));
    EXPECT_EQ(both.exit_code, 2) << both.err;
    EXPECT_NE(both.err.find("a GGUF carries one tokenizer"), std::string::npos) << both.err;
    EXPECT_FALSE(std::filesystem::exists(dir_->file("never.gguf")));
}

// --tokenizer llm=PATH for an LLM without one: the folder, or the GGUF.
TEST_F(ZImageInputs, TokenizerFlagServesALonelyLlm) {
    for (const std::string& tokenizer : {part("tokenizer"), part("qwen3.gguf"), part("tokenizer/vocab.json")}) {
        ModelPaths paths = turbo_parts();
        paths.llm = dir_->file("lonely/qwen3.safetensors");
        paths.tokenizer = "llm=" + tokenizer;
        auto model = Model::load(paths, test::golden_model_options());
        ASSERT_TRUE(model.ok()) << tokenizer << ": " << model.error().message;
        EXPECT_EQ(as_floats((*model)->llm_tokenizer().encode(templated(kPrompt))),
                  fixture_tensor(*io_, "llm.tokens").values)
            << tokenizer;
    }
    ModelPaths paths = turbo_parts();
    paths.llm = dir_->file("lonely/qwen3.safetensors");
    ModelOptions options;
    options.threads = 1;
    auto missing = Model::load(paths, options);
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().kind, ErrorKind::BadFile);
    EXPECT_NE(missing.error().message.find("--tokenizer llm=PATH"), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find("looked in"), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find("tokenizers/qwen3); "), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find("kiln pull --tokenizer qwen3"), std::string::npos)
        << missing.error().message;
}

// An LLM without a tokenizer near it finds the one `kiln pull --tokenizer
// qwen3` puts in kiln's cache, the last place searched.
TEST_F(ZImageInputs, LonelyLlmFindsItsTokenizerInKilnsCache) {
    test::TempDir cache;
    for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        cache.write(std::string("tokenizers/qwen3/") + name, test::read_bytes(part(std::string("tokenizer/") + name)));
    }
    test::ScopedEnv env("KILN_CACHE", cache.path());
    ModelPaths paths = turbo_parts();
    paths.llm = dir_->file("lonely/qwen3.safetensors");
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ(as_floats((*model)->llm_tokenizer().encode(templated(kPrompt))),
              fixture_tensor(*io_, "llm.tokens").values);
}

// The CLI with sd-cli's flags writes the reference image; Base with its
// defaults (cfg 5, negative prompt "").
TEST_F(ZImageInputs, SdCliCommandLineWorks) {
    const std::string out = dir_->file("z_image.png");
    auto ok = test::run_command(kiln_base(part("z_image_turbo_dit.safetensors"), flux_ae(), part("qwen3.safetensors")) +
                                "-o " + out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto img = image::read_image(out);
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_LE(difference_from_reference(*img, *io_), 1);

    const std::string gguf_out = dir_->file("z_image_gguf.png");
    ok = test::run_command(kiln_base(part("z_image_turbo_dit.safetensors"), flux_ae(), part("qwen3.gguf")) + "-o " +
                           gguf_out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto gguf_img = image::read_image(gguf_out);
    ASSERT_TRUE(gguf_img.ok()) << gguf_img.error().message;
    EXPECT_LE(difference_from_reference(*gguf_img, *io_), 1);

    std::unique_ptr<io::ModelFile> base_io(open_job("z_image_base_txt2img.safetensors"));
    ASSERT_NE(base_io, nullptr);
    const std::string base_out = dir_->file("z_image_base.png");
    ok = test::run_command(kiln_base(part("z_image_base_dit.safetensors"), flux_ae(), part("qwen3.safetensors")) +
                           "-o " + base_out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto base_img = image::read_image(base_out);
    ASSERT_TRUE(base_img.ok()) << base_img.error().message;
    // The prompt's 37 tokens go through Qwen3's products on ggml-cpu's
    // vec_dot, with the activations rounded to F16 (runtime/blas_device.h);
    // cfg 5 magnifies that rounding to up to 3 levels in a pixel.
    EXPECT_LE(difference_from_reference(*base_img, *base_io), 3);
}

// The tensors of `path` renamed by `rename` ("" drops one).
std::vector<test::SafetensorsEntry> renamed_entries(const std::string& path,
                                                    const std::function<std::string(const std::string&)>& rename) {
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok());
    std::vector<test::SafetensorsEntry> out;
    for (const io::TensorInfo& t : file->tensors()) {
        const std::string name = rename(t.name);
        if (!name.empty()) out.push_back(test::copy_entry(*file, t, name));
    }
    return out;
}

std::string without_model_stem(const std::string& name) { return name.rfind("model.", 0) == 0 ? name.substr(6) : name; }

// A diffusers ZImagePipeline folder as Tongyi-MAI/Z-Image-Turbo holds it:
// transformer/ in the original (diffusers) names, text_encoder/ a bare
// Qwen3Model (no "model." stem), tokenizer/, vae/ in diffusers' names.
TEST_F(ZImageInputs, DiffusersFolderGivesTheReferenceImage) {
    const std::string root = "Z-Image-Turbo/";
    dir_->write(root + "model_index.json",
                R"({"_class_name": "ZImagePipeline", "transformer": ["diffusers", "ZImageTransformer2DModel"],
                    "text_encoder": ["transformers", "Qwen3Model"], "tokenizer": ["transformers", "Qwen2Tokenizer"],
                    "vae": ["diffusers", "AutoencoderKL"],
                    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]})");
    dir_->write(root + "transformer/diffusion_pytorch_model.safetensors",
                test::read_bytes(part("diffusers_transformer.safetensors")));
    dir_->write(root + "text_encoder/model.safetensors",
                test::build_safetensors(renamed_entries(part("qwen3.safetensors"), without_model_stem)));
    const io::NameMap map(io::ModelFamily::SD1);
    std::vector<test::SafetensorsEntry> vae;
    for (const auto& e : renamed_entries(flux_ae(), [](const std::string& n) { return "first_stage_model." + n; })) {
        std::string folder;
        for (auto& d : test::to_diffusers(e, map, &folder)) vae.push_back(std::move(d));
    }
    dir_->write(root + "vae/diffusion_pytorch_model.safetensors", test::build_safetensors(vae));
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        dir_->write(root + "tokenizer/" + f, test::read_bytes(part(std::string("tokenizer/") + f)));
    }
    ModelPaths paths;
    paths.model = {dir_->file(root)};
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Z-Image-Turbo");
    auto images = generate(**model, tiny_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 1);
}

// ComfyUI's text encoder file (text_encoders/qwen_3_4b.safetensors) inside an
// all-in-one checkpoint, and an HF LLM split into shards with its index, as
// Qwen's repositories hold it: the reference conditioning.
TEST_F(ZImageInputs, AllInOneFileAndShardedLlmGiveTheReferenceConditioning) {
    std::vector<test::SafetensorsEntry> all = renamed_entries(
        part("z_image_turbo_dit.safetensors"), [](const std::string& n) { return "model.diffusion_model." + n; });
    for (auto& e : renamed_entries(part("qwen3.safetensors"),
                                   [](const std::string& n) { return "text_encoders.qwen3_4b.transformer." + n; })) {
        all.push_back(std::move(e));
    }
    for (auto& e : renamed_entries(flux_ae(), [](const std::string& n) { return "vae." + n; })) {
        all.push_back(std::move(e));
    }
    dir_->write("aio/z_image_turbo_aio.safetensors",
                test::build_safetensors(all, {{"kiln.z_image.axes_dim", "8,12,12"}}));
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        dir_->write(std::string("aio/tokenizer/") + f, test::read_bytes(part(std::string("tokenizer/") + f)));
    }
    ModelPaths aio;
    aio.model = {dir_->file("aio/z_image_turbo_aio.safetensors")};
    auto model = Model::load(aio, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Z-Image-Turbo");
    auto c = encode_prompt(**model, kPrompt, 0);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_LT(relative_error(c->hidden, fixture_tensor(*io_, "llm.hidden").values), 1e-4);

    // Layers 0-1 and the rest in two shards; the index names the shard of each tensor.
    const auto llm = renamed_entries(part("qwen3.safetensors"), [](const std::string& n) { return n; });
    std::vector<test::SafetensorsEntry> first, second;
    std::string index = R"({"metadata": {}, "weight_map": {)";
    for (const auto& e : llm) {
        const bool early = e.name.find("layers.0.") != std::string::npos || e.name.find("embed") != std::string::npos;
        (early ? first : second).push_back(e);
        index += std::string(index.back() == '{' ? "" : ", ") + "\"" + e.name + "\": \"model-0000" +
                 (early ? "1" : "2") + "-of-00002.safetensors\"";
    }
    dir_->write("sharded/model-00001-of-00002.safetensors", test::build_safetensors(first));
    dir_->write("sharded/model-00002-of-00002.safetensors", test::build_safetensors(second));
    dir_->write("sharded/model.safetensors.index.json", index + "}}");
    ModelPaths sharded = turbo_parts();
    sharded.llm = dir_->file("sharded/model-00001-of-00002.safetensors");
    sharded.tokenizer = "llm=" + part("tokenizer");
    model = Model::load(sharded, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    c = encode_prompt(**model, kPrompt, 0);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_LT(relative_error(c->hidden, fixture_tensor(*io_, "llm.hidden").values), 1e-4);
}

// -M convert --type q8_0 of the DiT, as users quantize it: the image stays
// within a few levels of the reference.
TEST_F(ZImageInputs, QuantizedGgufDitRuns) {
    const std::string dit = dir_->file("z_image_turbo-Q8_0.gguf");
    auto convert = test::run_command(std::string(KILN_BIN) + " -M convert -m " + part("z_image_turbo_dit.safetensors") +
                                     " --type q8_0 -o " + dit);
    ASSERT_EQ(convert.exit_code, 0) << convert.err;
    ModelPaths paths = turbo_parts();
    paths.diffusion_model = dit;
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Z-Image-Turbo");
    auto images = generate(**model, tiny_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_), 8);
}

// An LLM given to a family without one is not silently dropped.
TEST_F(ZImageInputs, LlmForAFamilyWithoutOneWarns) {
    const std::string out = dir_->file("sd1.png");
    auto r = test::run_command(std::string(KILN_BIN) + " -m " + KILN_DEFAULT_MODEL + " --llm " + part("qwen3.gguf") +
                               " -p x --steps 1 -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE((r.out + r.err).find("(--llm): SD1.x takes no such part; the file is not used"), std::string::npos)
        << r.out << r.err;
}

// Bad parts: one clear error line, exit code 1 or 2, no output file.
TEST_F(ZImageInputs, WrongOrMissingPartsAreOneClearError) {
    const std::string dit = part("z_image_turbo_dit.safetensors");
    const std::string llm = part("qwen3.safetensors");
    struct Case {
        const char* what;
        std::string command;
        std::vector<std::string> says;
    };
    const std::vector<Case> cases = {
        {"no --llm", kiln_base(dit, flux_ae(), ""), {"--llm"}},
        // make_qwen3_fixtures.py's Qwen3 is 64 wide; make_z_image_fixtures.py's DiT takes 48.
        {"an LLM of the wrong width",
         kiln_base(golden_path("models/z_image_tiny.safetensors"), flux_ae(),
                   golden_path("models/qwen3_tiny.safetensors")),
         {"64 wide", "takes 48"}},
        {"a T5 as --llm", kiln_base(dit, flux_ae(), golden_path("models/t5_tiny.safetensors")), {"--llm"}},
        {"a GGUF LLM without its tokenizer",
         kiln_base(dit, flux_ae(), golden_path("models/qwen3_tiny.gguf")),
         {"--tokenizer llm=PATH"}},
        {"no --vae", kiln_base(dit, "", llm), {"--vae"}},
        {"an SD VAE",
         kiln_base(dit, golden_path("models/sd1_tiny.safetensors"), llm),
         {"4 latent channels", "takes 16"}},
    };
    const std::string out = dir_->file("bad.png");
    for (const Case& c : cases) {
        auto bad = test::run_command(c.command + "-o " + out);
        EXPECT_TRUE(bad.exit_code == 1 || bad.exit_code == 2) << c.what << ": exit " << bad.exit_code;
        EXPECT_FALSE(std::filesystem::exists(out)) << c.what;
        EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << c.what << ": " << bad.err;
        for (const std::string& s : c.says) EXPECT_NE(bad.err.find(s), std::string::npos) << c.what << ": " << bad.err;
        std::filesystem::remove(out);
    }
}

}  // namespace
}  // namespace kiln::pipeline
