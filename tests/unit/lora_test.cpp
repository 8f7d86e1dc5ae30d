// LoRA, LoHa and LoKr (pipeline/loras.h) on the tiny SD1 model, against the
// PyTorch reference (training/make_lora_fixtures.py: the model's UNet and
// CLIP in float64 with W + strength * delta), in both application modes and
// in every naming the fixture writes; the prompt syntax; and bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "golden.h"
#include "pipeline/generate.h"
#include "pipeline/graphs.h"
#include "pipeline/lora_file.h"
#include "pipeline/loras.h"

namespace kiln::pipeline {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr float kStrength = 0.8f;  // the fixture's

std::unique_ptr<Model> load(LoraApplyMode mode, std::optional<ggml_type> type = GGML_TYPE_F32,
                            const std::string& lora_dir = golden_path("lora")) {
    ModelPaths paths;
    paths.model = {golden_path("models/sd1_tiny.safetensors")};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    ModelOptions options;
    options.weight_type = type;  // F32: the reference computes with the stored weights widened
    options.threads = 1;
    options.lora_dir = lora_dir;
    options.lora_apply_mode = mode;
    auto model = Model::load(paths, options);
    EXPECT_TRUE(model.ok()) << model.error().message;
    return model.ok() ? std::move(model).value() : nullptr;
}

const io::ModelFile& model_io() {
    static const io::ModelFile file = io::ModelFile::open({golden_path("models/sd1_tiny_io.safetensors")}).value();
    return file;
}
const io::ModelFile& adapters_io() {
    static const io::ModelFile file = io::ModelFile::open({golden_path("lora/sd1_adapters_io.safetensors")}).value();
    return file;
}

// The UNet on the model fixture's golden inputs, through the pipeline's graph builder.
std::vector<float> unet_out(Model& model) {
    const auto x = fixture_tensor(model_io(), "unet.x");
    const auto t = fixture_tensor(model_io(), "unet.t");
    const auto context = fixture_tensor(model_io(), "unet.context");
    DiffusionShape shape{16, 16, 2, 77};
    auto g = build_diffusion_graph(model, shape);
    EXPECT_TRUE(g.ok()) << g.error().message;
    if (!g.ok()) return {};
    g->session->set_input(g->x, x.values.data());
    g->session->set_input(g->timesteps, t.values.data());
    g->session->set_input(g->context, context.values.data());
    Status ran = g->session->run(model.diffusion_compute(), g->out);
    EXPECT_TRUE(ran.ok()) << ran.error().message;
    return runtime::GraphSession::read(g->out);
}

// CLIP's last layer, final-normed (clip skip 1), on the fixture's tokens.
std::vector<float> clip_out(Model& model) {
    const auto tokens = fixture_tensor(model_io(), "clip.tokens");
    const std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
    const TextEncoder& te = model.text_encoders().front();
    TextEncoderGraph g = build_text_encoder_graph(te, ids.data(), 77, 2, 1);
    Status ran = g.session->run(*te.executor, g.out);
    EXPECT_TRUE(ran.ok()) << ran.error().message;
    return runtime::GraphSession::read(g.out);
}

struct Case {
    const char* file;
    const char* kind;  // the fixture's golden suffix
    bool changes_clip;
};

class LoraGolden : public ::testing::TestWithParam<LoraApplyMode> {};

TEST_P(LoraGolden, EveryAdapterKindMatchesTheReference) {
    auto model = load(GetParam());
    ASSERT_TRUE(model);
    for (const Case& c : {Case{"sd1_lora_kohya", "lora", true}, Case{"sd1_loha", "loha", false},
                          Case{"sd1_lokr", "lokr", false}}) {
        SCOPED_TRACE(c.file);
        Status applied = apply_loras(*model, {{c.file, kStrength}});
        ASSERT_TRUE(applied.ok()) << applied.error().message;
        EXPECT_LT(relative_error(unet_out(*model), fixture_tensor(adapters_io(), std::string("unet.out.") + c.kind).values),
                  1e-4);
        const std::vector<float> clip = clip_out(*model);
        EXPECT_LT(relative_error(clip, fixture_tensor(adapters_io(), std::string("clip.out.") + c.kind).values), 1e-4);
        if (!c.changes_clip) {
            EXPECT_LT(relative_error(clip, fixture_tensor(model_io(), "clip.out.skip1").values), 1e-4);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, LoraGolden,
                         ::testing::Values(LoraApplyMode::Immediately, LoraApplyMode::AtRuntime),
                         [](const auto& info) { return std::string(lora_apply_mode_name(info.param)); });

// The same adapter under kohya's diffusers paths, kohya's ldm paths and
// PEFT's names (alpha folded into lora_B, exact: the factor is 1/2) gives
// the same bits.
TEST(Lora, EveryNamingGivesTheSameNumbers) {
    for (LoraApplyMode mode : {LoraApplyMode::AtRuntime, LoraApplyMode::Immediately}) {
        SCOPED_TRACE(lora_apply_mode_name(mode));
        auto model = load(mode);
        ASSERT_TRUE(model);
        std::vector<std::vector<float>> unet, clip;
        for (const char* file : {"sd1_lora_kohya", "sd1_lora_kohya_ldm", "sd1_lora_peft"}) {
            Status applied = apply_loras(*model, {{file, kStrength}});
            ASSERT_TRUE(applied.ok()) << file << ": " << applied.error().message;
            unet.push_back(unet_out(*model));
            clip.push_back(clip_out(*model));
        }
        EXPECT_EQ(unet[0], unet[1]);
        EXPECT_EQ(unet[0], unet[2]);
        EXPECT_EQ(clip[0], clip[1]);
        EXPECT_EQ(clip[0], clip[2]);
    }
}

// Strength 0 is no LoRA at all, and a LoRA leaves the base weights as they
// were: the job after it, without one, gives the bits of the job before.
TEST(Lora, StrengthZeroAndRemovalRestoreTheBaseBitForBit) {
    for (LoraApplyMode mode : {LoraApplyMode::Auto, LoraApplyMode::AtRuntime, LoraApplyMode::Immediately}) {
        SCOPED_TRACE(lora_apply_mode_name(mode));
        auto model = load(mode, std::nullopt);  // the file's F16 weights
        ASSERT_TRUE(model);
        const std::vector<float> base = unet_out(*model);
        ASSERT_TRUE(apply_loras(*model, {{"sd1_lora_kohya", 0.0f}}).ok());
        EXPECT_EQ(unet_out(*model), base);
        ASSERT_TRUE(apply_loras(*model, {{"sd1_lora_kohya", 1.0f}, {"sd1_loha", -0.5f}}).ok());
        EXPECT_NE(unet_out(*model), base);
        ASSERT_TRUE(apply_loras(*model, {}).ok());
        EXPECT_EQ(unet_out(*model), base);
    }
}

// Two LoRAs at once add their changes: against the reference's sum of the
// two goldens' differences from the base (each linear in the change only to
// first order, so checked on the merged weights' numbers by composition).
TEST(Lora, TwoAdaptersOnOneWeightBothApply) {
    auto model = load(LoraApplyMode::AtRuntime);
    ASSERT_TRUE(model);
    ASSERT_TRUE(apply_loras(*model, {{"sd1_lora_kohya", kStrength}}).ok());
    const std::vector<float> one = unet_out(*model);
    ASSERT_TRUE(apply_loras(*model, {{"sd1_lora_kohya", kStrength}, {"sd1_loha", kStrength}}).ok());
    const std::vector<float> both = unet_out(*model);
    auto merged = load(LoraApplyMode::Immediately);
    ASSERT_TRUE(apply_loras(*merged, {{"sd1_lora_kohya", kStrength}, {"sd1_loha", kStrength}}).ok());
    EXPECT_NE(one, both);
    EXPECT_LT(relative_error(both, unet_out(*merged)), 1e-5);
}

TEST(LoraTags, AreRemovedFromThePromptWithTheirWeights) {
    auto p = extract_lora_tags("a <lora:cat:0.7>red circle<lora:sub/dog> and <lyco:x:-1.5>, <lora:cat:0.1>");
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_EQ(p->prompt, "a red circle and , ");
    ASSERT_EQ(p->loras.size(), 3u);
    EXPECT_EQ(p->loras[0].name, "cat");
    EXPECT_FLOAT_EQ(p->loras[0].strength, 0.8f);  // repeated names add up, as A1111
    EXPECT_EQ(p->loras[1].name, "sub/dog");
    EXPECT_FLOAT_EQ(p->loras[1].strength, 1.0f);
    EXPECT_EQ(p->loras[2].name, "x");
    EXPECT_FLOAT_EQ(p->loras[2].strength, -1.5f);
    auto plain = extract_lora_tags("no tags <here> or <lora:unclosed");
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(plain->prompt, "no tags <here> or <lora:unclosed");
    EXPECT_TRUE(plain->loras.empty());
}

TEST(LoraTags, MalformedTagsAreInvalidRequests) {
    for (const char* prompt : {"<lora::1>", "<lora:x:abc>", "<lora:x:1:2>", "<lora:../x:1>", "<lora:/etc/x>",
                               "<lora:x:inf>"}) {
        auto p = extract_lora_tags(prompt);
        ASSERT_FALSE(p.ok()) << prompt;
        EXPECT_EQ(p.error().kind, ErrorKind::InvalidRequest) << prompt;
        EXPECT_NE(p.error().message.find("lora"), std::string::npos) << p.error().message;
    }
}

TEST(Lora, BadRequestsAndFilesAreCleanErrorsAndLeaveNoLora) {
    test::TempDir dir;
    auto model = load(LoraApplyMode::Auto, GGML_TYPE_F32, dir.path());
    ASSERT_TRUE(model);
    const std::vector<float> base = unet_out(*model);

    auto missing = apply_loras(*model, {{"nothing_here", 1.0f}});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(missing.error().message.find("nothing_here"), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find(dir.path()), std::string::npos) << missing.error().message;

    // Keys that name no weight of this model: a LoRA for another family.
    dir.write("other.safetensors",
              test::build_safetensors({{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", "F32", {2, 4},
                                        test::f32_bytes(8)},
                                       {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", "F32", {4, 2},
                                        test::f32_bytes(8)}}));
    auto other = apply_loras(*model, {{"other", 1.0f}});
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.error().kind, ErrorKind::BadFile);
    EXPECT_NE(other.error().message.find("none of its 1 layers"), std::string::npos) << other.error().message;

    // A real layer name with factors of the wrong size.
    dir.write("wrong.safetensors",
              test::build_safetensors(
                  {{"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight", "F32",
                    {2, 7}, test::f32_bytes(14)},
                   {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight", "F32",
                    {32, 2}, test::f32_bytes(64)}}));
    auto wrong = apply_loras(*model, {{"wrong", 1.0f}});
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.error().kind, ErrorKind::BadFile);
    EXPECT_NE(wrong.error().message.find("32x7"), std::string::npos) << wrong.error().message;

    // Half an adapter, an alpha that is not a number, no adapter at all.
    dir.write("half.safetensors", test::build_safetensors({{"lora_unet_x.lora_down.weight", "F32", {2, 4},
                                                            test::f32_bytes(8)}}));
    dir.write("alpha.safetensors",
              test::build_safetensors({{"a.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8)},
                                       {"a.lora_up.weight", "F32", {4, 2}, test::f32_bytes(8)},
                                       {"a.alpha", "F32", {2}, test::f32_bytes(2)}}));
    dir.write("none.safetensors", test::build_safetensors({{"weight", "F32", {2}, test::f32_bytes(2)}}));
    dir.write("text.safetensors", std::string("not a model"));
    for (const char* name : {"half", "alpha", "none", "text"}) {
        auto r = apply_loras(*model, {{name, 1.0f}});
        ASSERT_FALSE(r.ok()) << name;
        EXPECT_EQ(r.error().kind, ErrorKind::BadFile) << name;
        EXPECT_NE(r.error().message.find(name), std::string::npos) << r.error().message;
    }
    // After every failure the model is its base and serves the next job.
    EXPECT_EQ(unet_out(*model), base);
}

TEST(Lora, WithoutALoraFolderANamedLoraIsAnInvalidRequest) {
    auto model = load(LoraApplyMode::Auto, GGML_TYPE_F32, "");
    ASSERT_TRUE(model);
    auto r = apply_loras(*model, {{"sd1_lora_kohya", 1.0f}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(r.error().message.find("--lora-model-dir"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace kiln::pipeline
