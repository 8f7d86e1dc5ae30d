// kiln's CLIP text encoder, UNet and VAE against the PyTorch reference
// modules in training/reference, on the tiny random-weight models that
// training/make_model_fixtures.py writes: final outputs and every block.
#include <gtest/gtest.h>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/clip_text.h"
#include "models/nets/unet.h"
#include "models/nets/vae.h"
#include "runtime/graph_session.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::ggml_ne;
using test::golden_path;
using test::relative_error;

// The fixtures store F16 weights and float64 reference outputs; kiln loads
// the weights as F32 (--type f32) and computes in float32, so differences
// come from float32 rounding and summation order: around 1e-5 of the scale.
constexpr double kTolerance = 1e-4;

struct GoldenModel {
    io::ModelFile weights;
    io::ModelFile io;
};

GoldenModel open_golden(const std::string& name) {
    auto weights = io::ModelFile::open({golden_path("models/" + name + ".safetensors")});
    auto io = io::ModelFile::open({golden_path("models/" + name + "_io.safetensors")});
    if (!weights.ok()) throw std::runtime_error(weights.error().message);
    if (!io.ok()) throw std::runtime_error(io.error().message);
    return GoldenModel{std::move(weights).value(), std::move(io).value()};
}

std::unique_ptr<runtime::Compute> cpu() { return test::golden_cpu(); }

class ModelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGolden, ClipTextEncoderMatchesReference) {
    GoldenModel m = open_golden(GetParam());
    const bool sd2 = GetParam().rfind("sd2", 0) == 0;
    auto clip = test::declare_network<models::ClipTextEncoder>(
        m.weights, sd2 ? "cond_stage_model.model." : "cond_stage_model.transformer.", GGML_TYPE_F32);
    ASSERT_TRUE(clip.ok()) << clip.error().message;
    auto compute = cpu();
    ASSERT_TRUE(clip->weights().load(compute->weights_backend()).ok());
    const auto tokens = fixture_tensor(m.io, "clip.tokens");
    std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
    for (int skip : {1, 2}) {
        runtime::GraphSession session;
        ggml_tensor* t = session.input(GGML_TYPE_I32, ggml_ne(tokens.shape), ids.data());
        ggml_tensor* out = (*clip)->build(session.ctx(), t, skip);
        ASSERT_TRUE(session.run(*compute, out).ok());
        const auto expected = fixture_tensor(m.io, "clip.out.skip" + std::to_string(skip));
        EXPECT_LT(relative_error(runtime::GraphSession::read(out), expected.values), kTolerance)
            << "clip_skip " << skip;
    }
}

TEST_P(ModelGolden, UnetMatchesReferenceBlockByBlock) {
    GoldenModel m = open_golden(GetParam());
    auto unet = test::declare_network<models::Unet>(m.weights, "model.diffusion_model.", GGML_TYPE_F32);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    auto compute = cpu();
    auto status = unet->weights().load(compute->weights_backend());
    ASSERT_TRUE(status.ok()) << status.error().message;
    const auto x = fixture_tensor(m.io, "unet.x");
    const auto t = fixture_tensor(m.io, "unet.t");
    const auto context = fixture_tensor(m.io, "unet.context");
    for (bool flash : {false, true}) {
        runtime::GraphSession session;
        ggml_tensor* out =
            (*unet)->build(session.ctx(), session.input(GGML_TYPE_F32, ggml_ne(x.shape), x.values.data()),
                           session.input(GGML_TYPE_F32, ggml_ne(t.shape), t.values.data()),
                           session.input(GGML_TYPE_F32, ggml_ne(context.shape), context.values.data()), flash);
        ASSERT_TRUE(session.run(*compute, out, /*keep_cuts=*/true).ok());
        // Flash attention keeps K/V in F16: a looser bound.
        const double tolerance = flash ? 5e-3 : kTolerance;
        EXPECT_LT(relative_error(runtime::GraphSession::read(out), fixture_tensor(m.io, "unet.out").values), tolerance)
            << (flash ? "flash" : "plain");
        if (flash) continue;
        int blocks = 0;
        for (const io::TensorInfo& ref : m.io.tensors()) {
            if (ref.name.rfind("unet.block.", 0) != 0) continue;
            const std::string block = ref.name.substr(11);
            ggml_tensor* cut = session.find("cut:" + block);
            ASSERT_NE(cut, nullptr) << block;
            EXPECT_LT(relative_error(runtime::GraphSession::read(cut), fixture_tensor(m.io, ref.name).values),
                      kTolerance)
                << block;
            ++blocks;
        }
        EXPECT_GT(blocks, 5);
    }
}

TEST_P(ModelGolden, VaeDecoderAndEncoderMatchReference) {
    GoldenModel m = open_golden(GetParam());
    auto vae = test::declare_network<models::Vae>(m.weights, "first_stage_model.", GGML_TYPE_F32);
    ASSERT_TRUE(vae.ok()) << vae.error().message;
    auto compute = cpu();
    ASSERT_TRUE(vae->weights().load(compute->weights_backend()).ok());

    // Each run reuses the scheduler's buffers, so a session's blocks are
    // checked before the next session runs.
    auto check_blocks = [&](runtime::GraphSession& session, const std::string& part) {
        int blocks = 0;
        for (const io::TensorInfo& ref : m.io.tensors()) {
            if (ref.name.rfind("vae.block." + part, 0) != 0) continue;
            const std::string block = ref.name.substr(10);
            ggml_tensor* cut = session.find("cut:" + block);
            ASSERT_NE(cut, nullptr) << block;
            EXPECT_LT(relative_error(runtime::GraphSession::read(cut), fixture_tensor(m.io, ref.name).values),
                      kTolerance)
                << block;
            ++blocks;
        }
        EXPECT_GE(blocks, 3) << part;
    };

    const auto z = fixture_tensor(m.io, "vae.z");
    runtime::GraphSession dec;
    ggml_tensor* image = (*vae)->build_decoder(dec.ctx(), dec.input(GGML_TYPE_F32, ggml_ne(z.shape), z.values.data()));
    ASSERT_TRUE(dec.run(*compute, image, true).ok());
    EXPECT_LT(relative_error(runtime::GraphSession::read(image), fixture_tensor(m.io, "vae.decoded").values),
              kTolerance);
    check_blocks(dec, "decoder.");

    // The upsampler's output made in bands and never whole, as the decoder
    // builds it on the CPU at 1024x1024 (nn/upsampled_block_cpu.h): the same
    // reference. Its cut after level 1 is then the upsampler's input. Only
    // before a block with a shortcut (sd1_tiny's; sd2_tiny's keeps its
    // channels, so the graph is the usual one).
    runtime::GraphSession banded;
    ggml_tensor* banded_image =
        (*vae)->build_decoder(banded.ctx(), banded.input(GGML_TYPE_F32, ggml_ne(z.shape), z.values.data()),
                              nn::ComputeTarget::Cpu, /*max_whole_upsample_bytes=*/0);
    ASSERT_TRUE(banded.run(*compute, banded_image, true).ok());
    ASSERT_NE(banded.find("cut:decoder.up.1"), nullptr);
    const bool shortcut = m.weights.find("first_stage_model.decoder.up.0.block.0.nin_shortcut.weight") != nullptr;
    EXPECT_EQ((shortcut ? 2 : 1) * banded.find("cut:decoder.up.1")->ne[0], dec.find("cut:decoder.up.1")->ne[0]);
    EXPECT_LT(relative_error(runtime::GraphSession::read(banded_image), fixture_tensor(m.io, "vae.decoded").values),
              kTolerance);

    const auto pixels = fixture_tensor(m.io, "vae.image");
    runtime::GraphSession enc;
    ggml_tensor* mean =
        (*vae)->build_encoder(enc.ctx(), enc.input(GGML_TYPE_F32, ggml_ne(pixels.shape), pixels.values.data()));
    ASSERT_TRUE(enc.run(*compute, mean, true).ok());
    EXPECT_LT(relative_error(runtime::GraphSession::read(mean), fixture_tensor(m.io, "vae.encoded_mean").values),
              kTolerance);
    check_blocks(enc, "encoder.");
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelGolden, ::testing::Values("sd1_tiny", "sd2_tiny"));

TEST(ModelConfig, ReadFromWeights) {
    GoldenModel m = open_golden("sd1_tiny");
    auto unet = test::declare_network<models::Unet>(m.weights, "model.diffusion_model.", std::nullopt);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    const models::UnetConfig& c = (*unet)->config();
    EXPECT_EQ(c.model_channels, 32);
    EXPECT_EQ(c.level_channels, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(c.res_blocks, 1);
    EXPECT_EQ(c.context_dim, 64);
    EXPECT_EQ(c.heads, 2);
    EXPECT_FALSE(c.linear_projection);
    auto inpaint = io::ModelFile::open({golden_path("models/sd1_inpaint_tiny.safetensors")});
    ASSERT_TRUE(inpaint.ok());
    auto unet9 = test::declare_network<models::Unet>(*inpaint, "model.diffusion_model.", std::nullopt);
    ASSERT_TRUE(unet9.ok()) << unet9.error().message;
    EXPECT_EQ((*unet9)->config().in_channels, 9);
}

TEST(ModelConfig, WrongShapeIsAnErrorNamingTheTensor) {
    // A UNet whose time embedding disagrees with its channel count.
    GoldenModel m = open_golden("sd1_tiny");
    auto clip = test::declare_network<models::ClipTextEncoder>(m.weights, "model.diffusion_model.", std::nullopt);
    ASSERT_FALSE(clip.ok());
    EXPECT_EQ(clip.error().message, "no CLIP text encoder under 'model.diffusion_model.' (no token embedding)");
}

}  // namespace
}  // namespace kiln
