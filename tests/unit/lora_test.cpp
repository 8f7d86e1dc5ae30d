// LoRA, LoHa, LoKr and LyCORIS's Tucker cores, full differences and DoRA
// (pipeline/loras.h) on the tiny SD1 model, against the
// PyTorch reference (training/make_lora_fixtures.py: the model's UNet and
// CLIP in float64 with W + strength * delta), in both application modes and
// in every naming the fixture writes; the prompt syntax; and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <cstring>

#include "golden.h"
#include "pipeline/generate.h"
#include "pipeline/graphs.h"
#include "pipeline/lora_file.h"
#include "pipeline/lora_targets.h"
#include "pipeline/loras.h"

namespace kiln::pipeline {
namespace {

using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr float kStrength = 0.8f;  // the fixture's

// `type` F32: the references compute with the stored weights widened.
std::unique_ptr<Model> load_model(const ModelPaths& paths, LoraApplyMode mode, std::optional<ggml_type> type,
                                  const std::string& lora_dir) {
    ModelOptions options;
    options.weight_type = type;
    options.threads = 1;
    options.lora_dir = lora_dir;
    options.lora_apply_mode = mode;
    auto model = Model::load(paths, options);
    EXPECT_TRUE(model.ok()) << model.error().message;
    return model.ok() ? std::move(model).value() : nullptr;
}

// The tiny SD1 model.
std::unique_ptr<Model> load(LoraApplyMode mode, std::optional<ggml_type> type = GGML_TYPE_F32,
                            const std::string& lora_dir = golden_path("lora")) {
    ModelPaths paths;
    paths.model = {golden_path("models/sd1_tiny.safetensors")};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return load_model(paths, mode, type, lora_dir);
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
    models::DiffusionShape shape{16, 16, 2, 77};
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
                          Case{"sd1_lokr", "lokr", false}, Case{"sd1_lycoris", "lycoris", false}}) {
        SCOPED_TRACE(c.file);
        Status applied = apply_loras(*model, {{c.file, kStrength}});
        ASSERT_TRUE(applied.ok()) << applied.error().message;
        EXPECT_LT(
            relative_error(unet_out(*model), fixture_tensor(adapters_io(), std::string("unet.out.") + c.kind).values),
            1e-4);
        const std::vector<float> clip = clip_out(*model);
        EXPECT_LT(relative_error(clip, fixture_tensor(adapters_io(), std::string("clip.out.") + c.kind).values), 1e-4);
        if (!c.changes_clip) {
            EXPECT_LT(relative_error(clip, fixture_tensor(model_io(), "clip.out.skip1").values), 1e-4);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, LoraGolden, ::testing::Values(LoraApplyMode::Immediately, LoraApplyMode::AtRuntime),
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

// auto: quantized weights stay as they are, the LoRA beside them; float
// weights (the convolutions --type leaves in F16) are merged.
TEST(Lora, AutoLeavesQuantizedWeightsAndMergesFloatOnes) {
    auto model = load(LoraApplyMode::Auto, GGML_TYPE_Q8_0);
    ASSERT_TRUE(model);
    ASSERT_TRUE(apply_loras(*model, {{"sd1_lora_kohya", kStrength}}).ok());
    int beside = 0, merged = 0;
    for (const auto& [weight, patch] : model->diffusion_weights().patches()) {
        const bool quantized = weight->type == GGML_TYPE_Q8_0;
        EXPECT_EQ(patch.replacement == nullptr, quantized) << weight->name;
        beside += quantized;
        merged += !quantized;
    }
    EXPECT_EQ(beside, 5);  // attention and feed-forward matrices
    EXPECT_EQ(merged, 3);  // the 1x1 projections and the 3x3 convolution
    EXPECT_LT(relative_error(unet_out(*model), fixture_tensor(adapters_io(), "unet.out.lora").values), 2e-2);
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
    EXPECT_EQ(plain->unclosed, "<lora:unclosed");  // validate_request warns about it
    EXPECT_EQ(p->unclosed, "");
}

// --lora-model-dir keeps to the folder's real path, as kiln serve's
// --model-dir does: a symlink in it may point inside, not out.
TEST(LoraTags, AFileASymlinkLeadsOutOfTheFolderToIsRefused) {
    test::TempDir outside, dir;
    const std::string secret = outside.write("secret.safetensors", std::string("x"));
    const std::string inside = dir.write("inside.safetensors", std::string("x"));
    std::filesystem::create_symlink(secret, dir.file("escape.safetensors"));
    std::filesystem::create_symlink(inside, dir.file("alias.safetensors"));
    EXPECT_EQ(find_lora_file(dir.path(), "inside").value(), dir.path() + "/inside.safetensors");
    EXPECT_EQ(find_lora_file(dir.path(), "alias").value(), dir.path() + "/alias.safetensors");
    auto escape = find_lora_file(dir.path(), "escape");
    ASSERT_FALSE(escape.ok());
    EXPECT_EQ(escape.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(escape.error().message.find("leads out of --lora-model-dir"), std::string::npos)
        << escape.error().message;
}

TEST(LoraTags, MalformedTagsAreInvalidRequests) {
    for (const char* prompt :
         {"<lora::1>", "<lora:x:abc>", "<lora:x:1:2>", "<lora:../x:1>", "<lora:/etc/x>", "<lora:x:inf>"}) {
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
              test::build_safetensors(
                  {{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8)},
                   {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", "F32", {4, 2}, test::f32_bytes(8)}}));
    auto other = apply_loras(*model, {{"other", 1.0f}});
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.error().kind, ErrorKind::BadFile);
    EXPECT_NE(other.error().message.find("none of its 1 layers"), std::string::npos) << other.error().message;

    // A real layer name with factors of the wrong size.
    dir.write("wrong.safetensors",
              test::build_safetensors(
                  {{"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight",
                    "F32",
                    {2, 7},
                    test::f32_bytes(14)},
                   {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight",
                    "F32",
                    {32, 2},
                    test::f32_bytes(64)}}));
    auto wrong = apply_loras(*model, {{"wrong", 1.0f}});
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.error().kind, ErrorKind::BadFile);
    EXPECT_NE(wrong.error().message.find("32x7"), std::string::npos) << wrong.error().message;

    // Half an adapter, an alpha that is not a number, no adapter at all.
    dir.write("half.safetensors",
              test::build_safetensors({{"lora_unet_x.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8)}}));
    dir.write("alpha.safetensors", test::build_safetensors({{"a.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8)},
                                                            {"a.lora_up.weight", "F32", {4, 2}, test::f32_bytes(8)},
                                                            {"a.alpha", "F32", {2}, test::f32_bytes(2)}}));
    dir.write("none.safetensors", test::build_safetensors({{"weight", "F32", {2}, test::f32_bytes(2)}}));
    dir.write("text.safetensors", std::string("not a model"));
    // A Tucker core that does not chain with its down ([3, 3, ...] for rank 2), one whose
    // factor would be 2^30 values, a full diff mixed with LoRA factors, a 2-D bias change.
    dir.write("tucker.safetensors",
              test::build_safetensors({{"a.lora_down.weight", "F32", {2, 4, 1, 1}, test::f32_bytes(8)},
                                       {"a.lora_up.weight", "F32", {4, 2, 1, 1}, test::f32_bytes(8)},
                                       {"a.lora_mid.weight", "F32", {3, 3, 1, 1}, test::f32_bytes(9)}}));
    dir.write("huge.safetensors", test::build_safetensors({{"a.hada_w1_a", "F32", {1, 32768}, test::f32_bytes(32768)},
                                                           {"a.hada_w1_b", "F32", {1, 32768}, test::f32_bytes(32768)},
                                                           {"a.hada_t1", "F32", {1, 1, 1, 1}, test::f32_bytes(1)},
                                                           {"a.hada_w2_a", "F32", {1, 32768}, test::f32_bytes(32768)},
                                                           {"a.hada_w2_b", "F32", {1, 32768}, test::f32_bytes(32768)},
                                                           {"a.hada_t2", "F32", {1, 1, 1, 1}, test::f32_bytes(1)}}));
    dir.write("mixed.safetensors", test::build_safetensors({{"a.lora_down.weight", "F32", {2, 4}, test::f32_bytes(8)},
                                                            {"a.diff", "F32", {4, 4}, test::f32_bytes(16)}}));
    dir.write("bias.safetensors", test::build_safetensors({{"a.diff_b", "F32", {4, 2}, test::f32_bytes(8)}}));
    for (const char* name : {"half", "alpha", "none", "text", "tucker", "huge", "mixed", "bias"}) {
        auto r = apply_loras(*model, {{name, 1.0f}});
        ASSERT_FALSE(r.ok()) << name;
        EXPECT_EQ(r.error().kind, ErrorKind::BadFile) << name;
        EXPECT_NE(r.error().message.find(name), std::string::npos) << r.error().message;
    }
    // After every failure the model is its base and serves the next job.
    EXPECT_EQ(unet_out(*model), base);
}

// A strength or alpha whose product overflows float, or a factor that is
// not a number, is refused before any job runs: the strength as an invalid
// request, the file as a bad file, each named.
TEST(Lora, FactorsBeyondFloatAreRefusedBeforeTheJob) {
    test::TempDir dir;
    auto model = load(LoraApplyMode::Auto, GGML_TYPE_F32, dir.path());
    ASSERT_TRUE(model);
    const std::vector<float> base = unet_out(*model);
    const std::string layer = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    auto adapter = [&](float alpha, float first_value) {
        std::vector<uint8_t> down = test::f32_bytes(64);
        std::memcpy(down.data(), &first_value, sizeof first_value);
        std::vector<uint8_t> alpha_bytes(4);
        std::memcpy(alpha_bytes.data(), &alpha, sizeof alpha);
        return test::build_safetensors({{layer + ".lora_down.weight", "F32", {2, 32}, down},
                                        {layer + ".lora_up.weight", "F32", {32, 2}, test::f32_bytes(64)},
                                        {layer + ".alpha", "F32", {}, alpha_bytes}});
    };
    dir.write("fine.safetensors", adapter(2.0f, 0.0f));
    dir.write("alpha.safetensors", adapter(3e38f, 0.0f));
    dir.write("infinite.safetensors", adapter(2.0f, std::numeric_limits<float>::infinity()));
    ASSERT_TRUE(apply_loras(*model, {{"fine", 1.0f}}).ok());

    auto strength = apply_loras(*model, {{"fine", 1e30f}});
    ASSERT_FALSE(strength.ok());
    EXPECT_EQ(strength.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(strength.error().message.find("LoRA fine"), std::string::npos) << strength.error().message;
    auto alpha = apply_loras(*model, {{"alpha", 1.0f}});
    ASSERT_FALSE(alpha.ok());
    EXPECT_EQ(alpha.error().kind, ErrorKind::BadFile);
    EXPECT_NE(alpha.error().message.find("alpha/rank 1.5e+38"), std::string::npos) << alpha.error().message;
    auto infinite = apply_loras(*model, {{"infinite", 1.0f}});
    ASSERT_FALSE(infinite.ok());
    EXPECT_EQ(infinite.error().kind, ErrorKind::BadFile);
    EXPECT_NE(infinite.error().message.find("lora_down.weight' holds a value that is not a finite number"),
              std::string::npos)
        << infinite.error().message;
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

namespace kiln::pipeline {
namespace {

// `command` is "" (generate) or "plan".
std::string kiln_tiny(const std::string& args, const std::string& command = "") {
    return std::string(KILN_BIN) + " " + command + " -t 1 -m " + golden_path("models/sd1_tiny.safetensors") +
           " --tokenizer " + KILN_FIXTURES_DIR + "/tiny_tokenizer --lora-model-dir " + golden_path("lora") + " " + args;
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The sd-cli command line: the tag changes the image and stays in its
// parameters text (as A1111 keeps it); kiln plan takes the same prompt.
TEST(LoraCli, ATagInThePromptChangesTheImageAndIsRecorded) {
    test::TempDir dir;
    const std::string plain = dir.file("plain.png"), with = dir.file("with.png");
    auto a = test::run_command(kiln_tiny("-p \"a red circle\" -W 32 -H 32 --steps 2 -o " + plain));
    ASSERT_EQ(a.exit_code, 0) << a.err;
    auto b =
        test::run_command(kiln_tiny("-p \"<lora:sd1_lora_kohya:0.8> a red circle\" -W 32 -H 32 --steps 2 -o " + with));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_NE(b.out.find("LoRA sd1_lora_kohya (strength 0.8): 10 layers applied"), std::string::npos) << b.out;
    EXPECT_NE(test::read_bytes(plain), test::read_bytes(with));
    auto meta = test::run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + with);
    EXPECT_EQ(meta.out.rfind("<lora:sd1_lora_kohya:0.8> a red circle\n", 0), 0u) << meta.out;
    auto plan = test::run_command(kiln_tiny("-p \"<lora:sd1_lora_kohya:0.8> x\" -W 32 -H 32", "plan"));
    EXPECT_EQ(plan.exit_code, 0) << plan.err;
}

// DoRA magnitudes that fit neither axis of their weight are a bad file,
// named with the layer, and no image is written.
TEST(LoraCli, DoraMagnitudesOfNeitherAxisAreABadFile) {
    test::TempDir dir;
    auto kohya = io::ModelFile::open({golden_path("lora/sd1_lora_kohya.safetensors")});
    ASSERT_TRUE(kohya.ok());
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : kohya->tensors()) entries.push_back(test::copy_entry(*kohya, t, t.name));
    const std::string layer = "lora_unet_down_blocks_0_attentions_0_proj_in";
    entries.push_back({layer + ".dora_scale", "F32", {2, 1}, test::f32_bytes(2, 1.0f)});
    dir.write("loras/dora.safetensors", test::build_safetensors(entries));
    const std::string out = dir.file("a.png");
    auto r = test::run_command(std::string(KILN_BIN) + " -t 1 -m " + golden_path("models/sd1_tiny.safetensors") +
                               " --tokenizer " + KILN_FIXTURES_DIR + "/tiny_tokenizer --lora-model-dir " +
                               dir.file("loras") + " -p \"<lora:dora:1> x\" -W 32 -H 32 --steps 1 -o " + out);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("adapter '" + layer + "': dora_scale has 2 values; its weight has 32 rows"), std::string::npos)
        << r.err;
    EXPECT_FALSE(exists(out));
}

TEST(LoraCli, BadLorasExitWithOneMessageAndNoImage) {
    test::TempDir dir;
    struct Bad {
        std::string args;
        int exit_code;
        std::string says;
    };
    for (const Bad& bad :
         {Bad{"-p \"<lora:missing:1> x\"", 2, "missing"}, Bad{"-p \"<lora:sd1_lora_kohya:lots> x\"", 2, "lots"},
          Bad{"-p x --lora-apply-mode sometimes", 2, "sometimes"}}) {
        const std::string out = dir.file("out.png");
        auto r = test::run_command(kiln_tiny(bad.args + " -W 32 -H 32 --steps 1 -o " + out));
        EXPECT_EQ(r.exit_code, bad.exit_code) << bad.args << "\n" << r.err;
        EXPECT_NE(r.err.find(bad.says), std::string::npos) << r.err;
        EXPECT_FALSE(exists(out)) << bad.args;
    }
}

}  // namespace
}  // namespace kiln::pipeline

namespace kiln::pipeline {
namespace {

std::unique_ptr<Model> load_parts(const ModelPaths& paths, LoraApplyMode mode, const std::string& lora_dir = "") {
    return load_model(paths, mode, GGML_TYPE_F32, lora_dir);
}

ModelPaths sdxl_paths() {
    ModelPaths p;
    p.model = {golden_path("models/sdxl_tiny.safetensors")};
    p.vae = golden_path("models/sd1_tiny.safetensors");
    p.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return p;
}
ModelPaths flux_paths() {
    ModelPaths p;
    const std::string dir = golden_path("pipeline/flux_tiny/");
    p.diffusion_model = dir + "flux_dit.safetensors";
    p.vae = dir + "ae.safetensors";
    p.clip_l = dir + "clip_l.safetensors";
    p.t5xxl = dir + "t5xxl.safetensors";
    p.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return p;
}
ModelPaths z_image_paths() {
    ModelPaths p;
    p.diffusion_model = golden_path("pipeline/z_image_tiny/z_image_turbo_dit.safetensors");
    p.vae = golden_path("pipeline/flux_tiny/ae.safetensors");
    p.llm = golden_path("pipeline/z_image_tiny/qwen3.safetensors");
    return p;
}
ModelPaths klein_paths() {
    ModelPaths p;
    p.diffusion_model = golden_path("models/flux2_tiny.safetensors");
    p.vae = golden_path("models/flux2_ae_tiny.safetensors");
    p.llm = golden_path("models/flux2_klein_qwen3_tiny.safetensors");
    p.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
    return p;
}
ModelPaths qwen_image_paths() {
    ModelPaths p;
    const std::string dir = golden_path("pipeline/qwen_image_tiny/");
    p.diffusion_model = dir + "qwen_image_dit.safetensors";
    p.vae = dir + "qwen_image_vae.safetensors";
    p.llm = dir + "qwen_2.5_vl.safetensors";
    p.tokenizer = "llm=" + dir + "tokenizer";
    return p;
}

struct Expected {
    const char* key;      // a layer name as adapter files write it
    const char* weight;   // the model's tensor it means
    int64_t first, rows;  // the rows it changes (-1: all of them)
};

void expect_targets(Model& model, const std::vector<Expected>& expected) {
    LoraTargets targets(model, /*high_noise_expert=*/false);
    for (const Expected& e : expected) {
        SCOPED_TRACE(e.key);
        const std::vector<const LoraTarget*> found = targets.find(e.key);
        ASSERT_EQ(found.size(), 1u);
        const LoraTarget* t = found.front();
        EXPECT_EQ(t->name.substr(0, t->name.find(' ')), e.weight);
        EXPECT_EQ(t->first_row, e.first);
        if (e.rows >= 0) EXPECT_EQ(t->rows, e.rows);
    }
}

// The names each family's LoRAs use in the wild, written out by hand from
// kohya's sd-scripts, diffusers/PEFT, ComfyUI and ai-toolkit conventions.
// A ControlNet in bare names (input_blocks.*, as ComfyUI keeps them) is no
// LoRA target: the UNet's bare and kohya names still find the UNet's weights.
TEST(LoraTargetsOfEveryFamily, ControlNetWeightsAreNoTargets) {
    auto control = io::ModelFile::open({golden_path("models/controlnet_sd1_tiny.safetensors")});
    ASSERT_TRUE(control.ok());
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : control->tensors()) {
        entries.push_back(test::copy_entry(*control, t, t.name.substr(std::string("control_model.").size())));
    }
    test::TempDir dir;
    ModelPaths paths;
    paths.model = {golden_path("models/sd1_tiny.safetensors")};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    paths.control_net = dir.write("bare.safetensors", test::build_safetensors(entries, {{"kiln.unet.heads", "2"}}));
    auto model = load_parts(paths, LoraApplyMode::Auto);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->has_control_net());
    const char* unet_weight = "model.diffusion_model.input_blocks.1.1.proj_in.weight";
    expect_targets(*model, {{"input_blocks.1.1.proj_in", unet_weight, 0, -1},
                            {"lora_unet_input_blocks_1_1_proj_in", unet_weight, 0, -1}});
}

TEST(LoraTargetsOfEveryFamily, KohyaDiffusersAndCheckpointNamesFindTheirWeights) {
    auto sdxl = load_parts(sdxl_paths(), LoraApplyMode::Auto);
    ASSERT_TRUE(sdxl);
    const std::string u = "model.diffusion_model.";
    const std::string q = u + "input_blocks.3.1.transformer_blocks.1.attn1.to_q.weight";
    const std::string in_proj = "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight";
    expect_targets(
        *sdxl, {
                   {"lora_unet_input_blocks_3_1_transformer_blocks_1_attn1_to_q", q.c_str(), 0, 32},
                   {"lora_unet_down_blocks_1_attentions_0_transformer_blocks_1_attn1_to_q", q.c_str(), 0, 32},
                   {"unet.down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q", q.c_str(), 0, 32},
                   {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj",
                    "conditioner.embedders.0.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight", 0, 32},
                   {"lora_te2_text_model_encoder_layers_0_self_attn_k_proj", in_proj.c_str(), 32, 32},
                   {"text_encoder_2.text_model.encoder.layers.0.self_attn.v_proj", in_proj.c_str(), 64, 32},
               });

    auto flux = load_parts(flux_paths(), LoraApplyMode::Auto);
    ASSERT_TRUE(flux);
    expect_targets(
        *flux,
        {
            {"lora_unet_double_blocks_0_img_attn_qkv", "double_blocks.0.img_attn.qkv.weight", 0, 192},
            {"diffusion_model.double_blocks.0.img_attn.qkv", "double_blocks.0.img_attn.qkv.weight", 0, 192},
            {"transformer.transformer_blocks.0.attn.to_k", "double_blocks.0.img_attn.qkv.weight", 64, 64},
            {"lora_transformer_transformer_blocks_1_attn_add_v_proj", "double_blocks.1.txt_attn.qkv.weight", 128, 64},
            {"transformer.single_transformer_blocks.1.attn.to_v", "single_blocks.1.linear1.weight", 128, 64},
            {"lora_transformer_single_transformer_blocks_1_proj_mlp", "single_blocks.1.linear1.weight", 192, 128},
            {"transformer.single_transformer_blocks.0.proj_out", "single_blocks.0.linear2.weight", 0, 64},
            {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj",
             "text_model.encoder.layers.0.self_attn.q_proj.weight", 0, 32},
        });

    auto z = load_parts(z_image_paths(), LoraApplyMode::Auto);
    ASSERT_TRUE(z);
    expect_targets(*z,
                   {
                       {"diffusion_model.layers.0.attention.to_q", "layers.0.attention.qkv.weight", 0, 64},
                       {"transformer.layers.1.attention.to_v", "layers.1.attention.qkv.weight", 128, 64},
                       {"diffusion_model.layers.1.attention.to_out.0", "layers.1.attention.out.weight", 0, 64},
                       {"lora_unet_noise_refiner_0_feed_forward_w1", "noise_refiner.0.feed_forward.w1.weight", 0, -1},
                       {"diffusion_model.layers.0.attention.qkv", "layers.0.attention.qkv.weight", 0, 192},
                   });

    // FLUX.2 [klein] in BFL's names: diffusers' Flux2Transformer2DModel
    // names (PEFT's, ai-toolkit's) find the double blocks' q, k and v rows
    // and the single blocks' fused projection whole.
    auto klein = load_parts(klein_paths(), LoraApplyMode::Auto);
    ASSERT_TRUE(klein);
    expect_targets(
        *klein,
        {
            {"transformer.transformer_blocks.0.attn.to_k", "double_blocks.0.img_attn.qkv.weight", 64, 64},
            {"lora_transformer_transformer_blocks_1_attn_add_v_proj", "double_blocks.1.txt_attn.qkv.weight", 128, 64},
            {"transformer.transformer_blocks.0.ff_context.linear_in", "double_blocks.0.txt_mlp.0.weight", 0, -1},
            {"transformer.single_transformer_blocks.1.attn.to_qkv_mlp_proj", "single_blocks.1.linear1.weight", 0, 576},
            {"transformer.single_transformer_blocks.0.attn.to_out", "single_blocks.0.linear2.weight", 0, -1},
            {"diffusion_model.double_blocks.1.img_attn.qkv", "double_blocks.1.img_attn.qkv.weight", 0, 192},
        });

    // Qwen-Image's DiT is in diffusers' names: PEFT's (transformer.), ComfyUI's
    // (diffusion_model., as the Lightning LoRAs) and kohya's find its own weights.
    auto qwen = load_parts(qwen_image_paths(), LoraApplyMode::Auto);
    ASSERT_TRUE(qwen);
    expect_targets(*qwen,
                   {
                       {"transformer.transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_q.weight", 0, 64},
                       {"diffusion_model.transformer_blocks.1.attn.add_k_proj",
                        "transformer_blocks.1.attn.add_k_proj.weight", 0, 64},
                       {"lora_unet_transformer_blocks_0_img_mlp_net_0_proj",
                        "transformer_blocks.0.img_mlp.net.0.proj.weight", 0, -1},
                       {"transformer.transformer_blocks.1.txt_mod.1", "transformer_blocks.1.txt_mod.1.weight", 0, -1},
                   });
}

}  // namespace
}  // namespace kiln::pipeline

namespace kiln::pipeline {
namespace {

// Seeded values in [-0.5, 0.5) as F32 bytes.
std::vector<uint8_t> small_values(int64_t count, uint32_t seed) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) {
        seed = seed * 1664525u + 1013904223u;
        x = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
}

// A fused projection's LoRA written two ways: per part in diffusers' split
// names (each part's own down and up), and as one kohya layer on the fused
// weight (the downs stacked, the ups block-diagonal). Both are the same
// change, so both must give the same image; each part's rows are where
// kiln must put them for that to hold.
struct SplitLayer {
    std::string split_key;  // a part, "transformer.transformer_blocks.0.attn.to_k"
    int64_t first, rows;    // its rows in the fused weight
};
void write_split_and_fused(const test::TempDir& dir, const std::string& fused_key, int64_t fused_rows, int64_t in,
                           const std::vector<SplitLayer>& parts) {
    const int64_t r = 2;
    std::vector<test::SafetensorsEntry> split;
    std::vector<float> down, up(static_cast<size_t>(fused_rows * r * static_cast<int64_t>(parts.size())), 0.0f);
    const int64_t rank = r * static_cast<int64_t>(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
        const SplitLayer& p = parts[i];
        auto a = small_values(r * in, 100 + static_cast<uint32_t>(i));
        auto b = small_values(p.rows * r, 200 + static_cast<uint32_t>(i));
        split.push_back({p.split_key + ".lora_A.weight", "F32", {r, in}, a});
        split.push_back({p.split_key + ".lora_B.weight", "F32", {p.rows, r}, b});
        const auto* av = reinterpret_cast<const float*>(a.data());
        const auto* bv = reinterpret_cast<const float*>(b.data());
        down.insert(down.end(), av, av + r * in);
        for (int64_t row = 0; row < p.rows; ++row)
            for (int64_t k = 0; k < r; ++k)
                up[static_cast<size_t>((p.first + row) * rank + static_cast<int64_t>(i) * r + k)] = bv[row * r + k];
    }
    dir.write("split.safetensors", test::build_safetensors(split));
    auto bytes = [](const std::vector<float>& v) {
        const auto* p = reinterpret_cast<const uint8_t*>(v.data());
        return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
    };
    dir.write("fused.safetensors",
              test::build_safetensors({{fused_key + ".lora_down.weight", "F32", {rank, in}, bytes(down)},
                                       {fused_key + ".lora_up.weight", "F32", {fused_rows, rank}, bytes(up)}}));
}

int max_level_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    int worst = a.size() == b.size() ? 0 : 256;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
    return worst;
}

std::vector<uint8_t> image_with(const ModelPaths& paths, LoraApplyMode mode, const std::string& dir,
                                const std::string& tag) {
    auto model = load_parts(paths, mode, dir);
    if (!model) return {};
    GenerationRequest r;
    r.prompt = tag + "a red cat";
    r.width = r.height = 32;
    r.steps = 2;
    r.seed = 3;
    auto images = generate(*model, r);
    EXPECT_TRUE(images.ok()) << images.error().message;
    return images.ok() ? images->front().image.pixels : std::vector<uint8_t>{};
}

void expect_split_equals_fused(const ModelPaths& paths, const test::TempDir& dir) {
    const auto none = image_with(paths, LoraApplyMode::AtRuntime, dir.path(), "");
    const auto split = image_with(paths, LoraApplyMode::AtRuntime, dir.path(), "<lora:split:1> ");
    const auto fused = image_with(paths, LoraApplyMode::AtRuntime, dir.path(), "<lora:fused:1> ");
    const auto merged = image_with(paths, LoraApplyMode::Immediately, dir.path(), "<lora:split:1> ");
    ASSERT_FALSE(none.empty());
    EXPECT_GT(max_level_difference(none, split), 2) << "the LoRA should change the image";
    EXPECT_LE(max_level_difference(split, fused), 1);
    EXPECT_LE(max_level_difference(split, merged), 1);
}

// One model and one fused layer's change written both ways.
struct FusedCase {
    const char* name;
    ModelPaths paths;
    const char* fused_key;
    int64_t rows, in;
    std::vector<SplitLayer> parts;
};
void expect_each_split_equals_fused(const std::vector<FusedCase>& cases) {
    for (const FusedCase& f : cases) {
        SCOPED_TRACE(f.name);
        test::TempDir dir;
        write_split_and_fused(dir, f.fused_key, f.rows, f.in, f.parts);
        expect_split_equals_fused(f.paths, dir);
    }
}

// The DiTs' fused layers: Flux's single-block linear1 (q, k, v, then the
// MLP's rows), FLUX.2's double-block qkv, Z-Image's qkv; on the original
// files, or (diffusers_transformers) on diffusers' transformers, which keep
// the parts as weights of their own.
std::vector<FusedCase> dit_fused_cases(bool diffusers_transformers) {
    ModelPaths flux = flux_paths(), klein = klein_paths(), z = z_image_paths();
    if (diffusers_transformers) {
        flux.diffusion_model = golden_path("pipeline/flux_tiny/diffusers_transformer.safetensors");
        klein.diffusion_model = golden_path("models/flux2_tiny_diffusers_transformer.safetensors");
        z.diffusion_model = golden_path("pipeline/z_image_tiny/diffusers_transformer.safetensors");
    }
    return {
        {"Flux",
         flux,
         "lora_unet_single_blocks_1_linear1",
         320,
         64,
         {{"transformer.single_transformer_blocks.1.attn.to_k", 64, 64},
          {"transformer.single_transformer_blocks.1.proj_mlp", 192, 128}}},
        {"FLUX.2 [klein]",
         klein,
         "diffusion_model.double_blocks.1.img_attn.qkv",
         192,
         64,
         {{"transformer.transformer_blocks.1.attn.to_q", 0, 64},
          {"transformer.transformer_blocks.1.attn.to_v", 128, 64}}},
        {"Z-Image",
         z,
         "diffusion_model.layers.1.attention.qkv",
         192,
         64,
         {{"diffusion_model.layers.1.attention.to_q", 0, 64}, {"diffusion_model.layers.1.attention.to_v", 128, 64}}},
    };
}

// The DiTs' fused layers, and the q/k/v of SDXL's second encoder's fused in_proj.
TEST(LoraOfEveryFamily, SplitProjectionsLandOnTheirRowsOfTheFusedWeights) {
    std::vector<FusedCase> cases = dit_fused_cases(false);
    cases.push_back({"SDXL",
                     sdxl_paths(),
                     "conditioner.embedders.1.model.transformer.resblocks.1.attn.in_proj",
                     96,
                     32,
                     {{"lora_te2_text_model_encoder_layers_1_self_attn_k_proj", 32, 32},
                      {"text_encoder_2.text_model.encoder.layers.1.self_attn.v_proj", 64, 32}}});
    expect_each_split_equals_fused(cases);
}

// The other way round: DiTs in diffusers' names (a diffusers folder's
// transformer/) keep q, k, v (and a Flux single block's MLP) as weights of
// their own, and a LoRA in the original names (kohya's lora_unet_*_qkv,
// ComfyUI's diffusion_model.*) changes each with its rows of the fused
// layer's change: the same image as the same change written per part.
TEST(LoraOfEveryFamily, FusedLayersLandOnTheSplitWeightsOfADiffusersDit) {
    const std::vector<FusedCase> cases = dit_fused_cases(true);
    auto model = load_parts(cases.front().paths, LoraApplyMode::Auto);
    ASSERT_TRUE(model);
    const LoraTargets targets(*model, /*high_noise_expert=*/false);
    const auto found = targets.find("lora_unet_single_blocks_1_linear1");
    ASSERT_EQ(found.size(), 4u);
    const char* names[] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
    const int64_t first_rows[] = {0, 64, 128, 192};
    for (size_t i = 0; i < found.size(); ++i) {
        EXPECT_EQ(found[i]->name.rfind("single_transformer_blocks.1." + std::string(names[i]) + ".weight", 0), 0u)
            << found[i]->name;
        EXPECT_EQ(found[i]->layer_first_row, first_rows[i]);
        EXPECT_EQ(found[i]->layer_rows, 320);
    }
    expect_each_split_equals_fused(cases);
}

// A LoHa on Flux's fused linear1 (its factors cannot be cut by rows, so
// its change is made dense and each split weight takes its rows): the
// diffusers transformer gives the BFL file's image.
TEST(LoraOfEveryFamily, AFusedLohaLandsOnTheSplitWeights) {
    const int64_t rows = 320, in = 64, r = 2;
    test::TempDir dir;
    dir.write("loha.safetensors",
              test::build_safetensors(
                  {{"lora_unet_single_blocks_1_linear1.hada_w1_a", "F32", {rows, r}, small_values(rows * r, 11)},
                   {"lora_unet_single_blocks_1_linear1.hada_w1_b", "F32", {r, in}, small_values(r * in, 12)},
                   {"lora_unet_single_blocks_1_linear1.hada_w2_a", "F32", {rows, r}, small_values(rows * r, 13)},
                   {"lora_unet_single_blocks_1_linear1.hada_w2_b", "F32", {r, in}, small_values(r * in, 14)}}));
    const std::vector<FusedCase> original = dit_fused_cases(false), diffusers = dit_fused_cases(true);
    const auto none = image_with(original.front().paths, LoraApplyMode::AtRuntime, dir.path(), "");
    const auto reference = image_with(original.front().paths, LoraApplyMode::AtRuntime, dir.path(), "<lora:loha:4> ");
    ASSERT_FALSE(none.empty());
    EXPECT_GT(max_level_difference(none, reference), 2) << "the LoHa should change the image";
    for (const LoraApplyMode mode : {LoraApplyMode::AtRuntime, LoraApplyMode::Immediately}) {
        EXPECT_LE(
            max_level_difference(reference, image_with(diffusers.front().paths, mode, dir.path(), "<lora:loha:4> ")),
            1);
    }
}

// The final adaLN's rows are (shift, scale) in BFL's files and (scale,
// shift) in diffusers' norm_out.linear: one change, written in each naming
// with its rows in that naming's order, gives one image on either DiT.
TEST(LoraOfEveryFamily, FinalModulationHalvesFollowEachNaming) {
    const int64_t rows = 128, in = 64, r = 2;  // 2 x the width 64
    const auto down = small_values(r * in, 7);
    const auto up_bytes = small_values(rows * r, 8);
    const auto* up = reinterpret_cast<const float*>(up_bytes.data());
    std::vector<float> swapped(static_cast<size_t>(rows * r));
    for (int64_t row = 0; row < rows; ++row)
        for (int64_t k = 0; k < r; ++k)
            swapped[static_cast<size_t>(((row + rows / 2) % rows) * r + k)] = up[row * r + k];
    const auto* sw = reinterpret_cast<const uint8_t*>(swapped.data());
    test::TempDir dir;
    dir.write("bfl.safetensors",
              test::build_safetensors(
                  {{"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", "F32", {r, in}, down},
                   {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", "F32", {rows, r}, up_bytes}}));
    dir.write("diffusers.safetensors",
              test::build_safetensors({{"transformer.norm_out.linear.lora_A.weight", "F32", {r, in}, down},
                                       {"transformer.norm_out.linear.lora_B.weight",
                                        "F32",
                                        {rows, r},
                                        std::vector<uint8_t>(sw, sw + swapped.size() * sizeof(float))}}));
    ModelPaths diffusers_dit = flux_paths();
    diffusers_dit.diffusion_model = golden_path("pipeline/flux_tiny/diffusers_transformer.safetensors");
    const auto none = image_with(flux_paths(), LoraApplyMode::AtRuntime, dir.path(), "");
    const auto reference = image_with(flux_paths(), LoraApplyMode::AtRuntime, dir.path(), "<lora:bfl:1> ");
    ASSERT_FALSE(none.empty());
    EXPECT_GT(max_level_difference(none, reference), 2) << "the LoRA should change the image";
    EXPECT_LE(max_level_difference(
                  reference, image_with(flux_paths(), LoraApplyMode::AtRuntime, dir.path(), "<lora:diffusers:1> ")),
              1);
    for (const LoraApplyMode mode : {LoraApplyMode::AtRuntime, LoraApplyMode::Immediately}) {
        for (const char* tag : {"<lora:bfl:1> ", "<lora:diffusers:1> "}) {
            SCOPED_TRACE(tag);
            EXPECT_LE(max_level_difference(reference, image_with(diffusers_dit, mode, dir.path(), tag)), 1);
        }
    }
}

}  // namespace
}  // namespace kiln::pipeline
