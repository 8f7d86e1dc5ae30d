// A whole Qwen-Image text-to-image job on the tiny random Qwen-Image of
// training/make_qwen_image_pipeline_fixtures.py (the DiT in diffusers'
// names, BF16; a tiny Qwen2 in HF names, Qwen2.5-VL's text model; Wan 2.1's
// tiny VAE in the original names; Qwen's byte-level BPE tokenizer) against
// the PyTorch references run end to end: Qwen's chat template after
// Qwen-Image's system turn, encoded whole, hidden_states[-1] with the system
// turn's rows dropped; the flow schedule with shift 3; the DiT at sigma; cfg
// 2.5 against the empty prompt; Euler; the decode with Wan's per-channel
// normalisation. Then sd-cli's command line from its docs/qwen_image.md, and
// the parts that do not go together, each refused with one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <tuple>

#include "golden.h"
#include "image/image_io.h"
#include "models/families/qwen_image.h"
#include "models/nets/qwen_image_dit.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
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
constexpr const char* kChatPrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
constexpr const char* kChatSuffix = "<|im_end|>\n<|im_start|>assistant\n";
constexpr int kWidth = 64, kHeight = 48;  // the VAE's 8x: a latent 8 wide and 6 high
constexpr int64_t kLlmWidth = 48;

std::string part(const std::string& name) { return golden_path("pipeline/qwen_image_tiny/" + name); }
std::string templated(const std::string& prompt) { return kChatPrefix + prompt + kChatSuffix; }
std::vector<float> as_floats(const std::vector<int32_t>& ids) { return {ids.begin(), ids.end()}; }

// The parts as a user passes them: --diffusion-model, --llm, --vae and
// --tokenizer llm=DIR.
ModelPaths parts() {
    ModelPaths paths;
    paths.diffusion_model = part("qwen_image_dit.safetensors");
    paths.llm = part("qwen_2.5_vl.safetensors");
    paths.vae = part("qwen_image_vae.safetensors");
    paths.tokenizer = "llm=" + part("tokenizer");
    return paths;
}

io::ModelFile* open_job() {
    auto io = io::ModelFile::open({golden_path("pipeline/qwen_image_tiny_txt2img.safetensors")});
    EXPECT_TRUE(io.ok()) << io.error().message;
    return io.ok() ? new io::ModelFile(std::move(io).value()) : nullptr;
}

// The job; cfg and the negative prompt are the family's defaults (2.5, "").
GenerationRequest tiny_job() {
    GenerationRequest r;
    r.prompt = kPrompt;
    r.width = kWidth;
    r.height = kHeight;
    r.seed = 11;
    r.steps = 3;
    r.rng = RngKind::Cuda;
    return r;
}

class QwenImagePipeline : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto loaded = Model::load(parts(), test::golden_model_options());
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        io_ = open_job();
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

    static int64_t dropped() { return static_cast<int64_t>(fixture_tensor(*io_, "llm.dropped").values.at(0)); }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* QwenImagePipeline::model_ = nullptr;
io::ModelFile* QwenImagePipeline::io_ = nullptr;

TEST_F(QwenImagePipeline, IsQwenImageWithItsDefaults) {
    EXPECT_EQ(model_->family_label(), "Qwen-Image");
    EXPECT_NE(dynamic_cast<const models::QwenImageDit*>(&model_->diffusion()), nullptr);
    EXPECT_EQ(model_->prediction(), Prediction::Flow);
    EXPECT_EQ(model_->size_stride(), 16);  // the VAE's 8 times the patch 2
    EXPECT_EQ(model_->latent_channels(), 16);
    EXPECT_EQ(model_->defaults().sampler, "euler");
    EXPECT_EQ(model_->defaults().scheduler, "discrete");
    EXPECT_EQ(model_->defaults().cfg_scale, 2.5f);
    EXPECT_EQ(model_->defaults().steps, 20);
    EXPECT_EQ(model_->defaults().width, 1024);
    EXPECT_EQ(model_->defaults().height, 1024);
    ASSERT_EQ(model_->text_encoders().size(), 1u);
    EXPECT_EQ(model_->text_encoders().front().width(), kLlmWidth);
    // The DiT's context is the prompt and the template's suffix: the system turn is dropped.
    const std::string prompt = kPrompt;
    EXPECT_EQ(context_length(*model_, &prompt), fixture_tensor(*io_, "llm.hidden").shape[1]);
}

TEST_F(QwenImagePipeline, TokenizerHasTheTemplatesSpecials) {
    const text::LlmTokenizer& tok = model_->llm_tokenizer();
    EXPECT_EQ(tok.size(), 286);
    EXPECT_EQ(tok.pre_tokenizer(), text::LlmPreTokenizer::Qwen2);
    for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
        const int32_t id = tok.token_id(special);
        EXPECT_GE(id, 283) << special;
        EXPECT_TRUE(tok.is_added(id)) << special;
        EXPECT_EQ(tok.encode(special), std::vector<int32_t>{id}) << special;
    }
}

// The ids are the reference tokenizer's of the whole templated prompt; the
// dropped count is the system turn's own token count (34 under Qwen's real
// tokenizer: diffusers' prompt_template_encode_start_idx).
TEST_F(QwenImagePipeline, TokensAreTheTemplatedPromptAndTheSystemTurnIsDropped) {
    const text::LlmTokenizer& tok = model_->llm_tokenizer();
    const TextEncoder& te = model_->text_encoders().front();
    ASSERT_NE(te.use, nullptr);
    EXPECT_TRUE(te.use->drop_prefix);
    for (const auto& [prompt, tokens_key, dropped_key] :
         {std::tuple{std::string(kPrompt), "llm.tokens", "llm.dropped"},
          std::tuple{std::string(""), "llm.uncond_tokens", "llm.uncond_dropped"}}) {
        const auto want = fixture_tensor(*io_, tokens_key).values;
        EXPECT_EQ(as_floats(tok.encode(templated(prompt))), want) << prompt;
        const LlmPrompt p = llm_prompt(tok, *te.use, prompt);
        EXPECT_EQ(as_floats(p.ids), want) << prompt;
        EXPECT_EQ(p.weights, std::vector<float>(p.ids.size(), 1.0f)) << prompt;
        EXPECT_EQ(static_cast<float>(p.dropped), fixture_tensor(*io_, dropped_key).values.at(0)) << prompt;
        EXPECT_EQ(p.dropped, static_cast<int64_t>(tok.encode(kChatPrefix).size())) << prompt;
    }
}

TEST_F(QwenImagePipeline, ConditioningIsTheFinalNormedLastLayerLessTheSystemTurn) {
    for (const auto& [prompt, key] :
         {std::pair{std::string(kPrompt), "llm.hidden"}, std::pair{std::string(""), "llm.uncond_hidden"}}) {
        auto c = encode_prompt(*model_, prompt, 0);
        ASSERT_TRUE(c.ok()) << c.error().message;
        const auto hidden = fixture_tensor(*io_, key);  // [1, n - dropped, 48]
        ASSERT_EQ(hidden.shape.size(), 3u);
        EXPECT_EQ(c->tokens, hidden.shape[1]) << prompt;
        EXPECT_EQ(c->width, kLlmWidth);
        ASSERT_EQ(c->hidden.size(), hidden.values.size()) << prompt;
        EXPECT_LT(relative_error(c->hidden, hidden.values), 1e-4) << prompt;
        EXPECT_TRUE(c->pooled.empty());
        EXPECT_TRUE(c->token_valid.empty());  // no padding: every token is attended to
    }
    // The prompt's rows come after the system turn's: the whole template is encoded, then cut.
    const auto n = static_cast<int64_t>(fixture_tensor(*io_, "llm.tokens").values.size());
    EXPECT_EQ(fixture_tensor(*io_, "llm.hidden").shape[1], n - dropped());
}

// sd-cli's --flow-shift 3 and the family's own shift are the same table.
TEST_F(QwenImagePipeline, ScheduleIsTheFlowTableShiftedBy3) {
    const auto want = fixture_tensor(*io_, "sigmas");
    for (const std::optional<float>& shift : {std::optional<float>(), std::optional<float>(3.0f)}) {
        const auto schedule = model_->noise_schedule(kWidth, kHeight, 3, shift);
        EXPECT_TRUE(schedule->flow());
        auto sigmas = get_sigmas(SchedulerKind::Discrete, 3, *schedule);
        ASSERT_TRUE(sigmas.ok()) << sigmas.error().message;
        ASSERT_EQ(sigmas->size(), want.values.size());
        for (size_t i = 0; i < want.values.size(); ++i) EXPECT_NEAR((*sigmas)[i], want.values[i], 1e-6) << i;
    }
    // No resolution shift: the same table at the default size.
    auto small = get_sigmas(SchedulerKind::Discrete, 3, *model_->noise_schedule(kWidth, kHeight, 3, std::nullopt));
    auto large = get_sigmas(SchedulerKind::Discrete, 3, *model_->noise_schedule(1024, 1024, 3, std::nullopt));
    ASSERT_TRUE(small.ok() && large.ok());
    EXPECT_EQ(*large, *small);
}

TEST_F(QwenImagePipeline, TextToImageMatchesTheReferenceJob) {
    auto images = generate(*model_, tiny_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    const image::Image& img = images->front().image;
    ASSERT_EQ(img.width, kWidth);
    ASSERT_EQ(img.height, kHeight);
    EXPECT_LE(difference_from_reference(img, *io_), 1) << "largest pixel difference from the reference";
}

// The noise, the guided velocity of the first step and the final latent.
TEST_F(QwenImagePipeline, SamplingMatchesTheReferenceStepByStep) {
    const auto noise = fixture_tensor(*io_, "noise");
    EXPECT_EQ(make_rng(RngKind::Cuda, 11)->randn(noise.values.size()), noise.values);
    auto rng = make_rng(RngKind::Cuda, 11);

    Conditioning cond, uncond;
    for (auto [c, key] : {std::pair{&cond, "llm.hidden"}, std::pair{&uncond, "llm.uncond_hidden"}}) {
        const auto hidden = fixture_tensor(*io_, key);
        c->hidden = hidden.values;
        c->tokens = hidden.shape[1];
        c->width = kLlmWidth;
    }
    const auto schedule = model_->noise_schedule(kWidth, kHeight, 3, std::nullopt);
    SamplingRun run;
    run.latent_w = kWidth / 8;
    run.latent_h = kHeight / 8;
    run.cfg_scale = 2.5f;
    run.sampler = SamplerKind::Euler;
    run.sigmas = fixture_tensor(*io_, "sigmas").values;
    run.schedule = schedule.get();
    std::vector<float> x = noise.values;
    for (float& v : x) v *= run.sigmas.front();
    // One step to 0: the guided velocity at sigma 1 is (x - D) / sigma.
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

// The kiln binary with sd-cli's flags and other parts.
class QwenImagePipelineCli : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        io_ = open_job();
    }
    static void TearDownTestSuite() {
        delete dir_;
        delete io_;
        dir_ = nullptr;
        io_ = nullptr;
    }

    // sd-cli's docs/qwen_image.md command line on the tiny parts (the
    // tokenizer/ folder beside the LLM), at the job's size, steps and seed.
    // `verbose`: sd-cli's -v, left out where the test reads stderr's lines.
    static std::string sd_cli_line(const std::string& dit, const std::string& vae, const std::string& llm,
                                   bool verbose = true) {
        std::string cmd = std::string(KILN_BIN);
        if (!dit.empty()) cmd += " --diffusion-model " + dit;
        if (!vae.empty()) cmd += " --vae " + vae;
        if (!llm.empty()) cmd += " --llm " + llm;
        return cmd + " -p '" + kPrompt + "' --cfg-scale 2.5 --sampling-method euler" + (verbose ? " -v" : "") +
               " --offload-to-cpu -H " + std::to_string(kHeight) + " -W " + std::to_string(kWidth) +
               " --diffusion-fa --flow-shift 3 --steps 3 -s 11 -t 1 ";
    }

    static test::TempDir* dir_;
    static io::ModelFile* io_;
};
test::TempDir* QwenImagePipelineCli::dir_ = nullptr;
io::ModelFile* QwenImagePipelineCli::io_ = nullptr;

TEST_F(QwenImagePipelineCli, SdCliCommandLineWritesTheReferenceImage) {
    const std::string line = sd_cli_line(part("qwen_image_dit.safetensors"), part("qwen_image_vae.safetensors"),
                                         part("qwen_2.5_vl.safetensors"));
    const std::string out = dir_->file("qwen_image.png");
    auto ok = test::run_command(line + "-o " + out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_NE((ok.out + ok.err).find("Qwen-Image"), std::string::npos) << ok.out << ok.err;
    auto img = image::read_image(out);
    ASSERT_TRUE(img.ok()) << img.error().message;
    ASSERT_EQ(img->width, kWidth);
    ASSERT_EQ(img->height, kHeight);
    // As stored, the DiT's products take their activations rounded to BF16
    // and the LLM's to F16 (ggml-cpu's vec_dot types); cfg 2.5 magnifies
    // that rounding to a few levels in a pixel (3 when written).
    EXPECT_LE(difference_from_reference(*img, *io_), 4);

    // Computing in F32, as the reference does, gives its image.
    const std::string f32_out = dir_->file("qwen_image_f32.png");
    ok = test::run_command(line + "--type f32 -o " + f32_out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto f32_img = image::read_image(f32_out);
    ASSERT_TRUE(f32_img.ok()) << f32_img.error().message;
    EXPECT_LE(difference_from_reference(*f32_img, *io_), 1);
}

// Bad parts: one clear error line, exit code 1 or 2, no output file.
TEST_F(QwenImagePipelineCli, WrongOrMissingPartsAreOneClearError) {
    const std::string dit = part("qwen_image_dit.safetensors");
    const std::string vae = part("qwen_image_vae.safetensors");
    const std::string llm = part("qwen_2.5_vl.safetensors");
    struct Case {
        const char* what;
        std::string command;
        std::vector<std::string> says;
    };
    const std::vector<Case> cases = {
        // Z-Image's tiny Qwen3 is 64 wide; the tiny Qwen-Image DiT takes 48.
        {"a Qwen3 as --llm",
         sd_cli_line(dit, vae, golden_path("pipeline/z_image_tiny/qwen3.safetensors"), false),
         {"64 features", "takes 48"}},
        {"Flux's autoencoder as --vae",
         sd_cli_line(dit, golden_path("pipeline/flux_tiny/ae.safetensors"), llm, false),
         {"ae.safetensors", "not a Wan 2.1 VAE"}},
        {"no --llm", sd_cli_line(dit, vae, "", false), {"--llm"}},
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

// With Qwen's real vocabulary (llama.cpp's Qwen2 GGUF and Qwen3's
// tokenizer.json, the same byte-level BPE), the system turn kiln drops is
// diffusers' prompt_template_encode_start_idx: 34 tokens.
TEST(QwenImageTemplate, TheDroppedSystemTurnIsDiffusersThirtyFourTokens) {
    const std::string root = std::string(KILN_FIXTURES_DIR) + "/../../third_party/";
    const models::TextEncoderUse& use = models::qwen_image_family().conditioning.encoders.front();
    std::vector<int32_t> first;
    for (const std::string path : {root + "llama-vocab/ggml-vocab-qwen2.gguf", root + "llm-tokenizer-qwen3"}) {
        auto tokenizer = text::LlmTokenizer::load(path);
        ASSERT_TRUE(tokenizer.ok()) << path << ": " << tokenizer.error().message << " (scripts/setup.sh provisions it)";
        const LlmPrompt prompt = llm_prompt(*tokenizer, use, "a shop sign that says \"kiln\"");
        EXPECT_EQ(prompt.dropped, 34) << path;
        EXPECT_EQ(prompt.ids.front(), 151644) << path;  // <|im_start|>
        if (first.empty()) first = prompt.ids;
        EXPECT_EQ(prompt.ids, first) << path;
    }
}

}  // namespace
}  // namespace kiln::pipeline
