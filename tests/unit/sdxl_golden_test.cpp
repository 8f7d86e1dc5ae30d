// SDXL's networks against the PyTorch references in training/reference, on
// the tiny random-weight checkpoint training/make_sdxl_fixtures.py writes with
// SDXL's tensor names: CLIP-L's and bigG's penultimate hidden states without
// the final norm, bigG's pooled output through text_projection, the UNet with
// label_emb block by block, and the size-conditioning vector.
#include <gtest/gtest.h>

#include <cmath>

#include "declared_network.h"
#include "golden.h"
#include "io/dtype.h"
#include "models/nets/clip_text.h"
#include "models/nets/unet.h"
#include "pipeline/size_conditioning.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

// F16 weights widened to F32 against a float64 reference: float32 rounding
// and summation order, around 1e-5 of the scale (as for SD1 and SD2).
constexpr double kTolerance = 1e-4;
const char* const kClipL = "conditioner.embedders.0.transformer.";
const char* const kClipG = "conditioner.embedders.1.model.";
const char* const kUnet = "model.diffusion_model.";

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

struct SdxlTiny : ::testing::Test {
    io::ModelFile weights = open_file("sdxl_tiny.safetensors");
    io::ModelFile io = open_file("sdxl_tiny_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::ClipTextEncoder> clip(const std::string& prefix) {
        auto enc = test::declare_network<models::ClipTextEncoder>(weights, prefix, GGML_TYPE_F32);
        if (!enc.ok()) throw std::runtime_error(enc.error().message);
        auto status = enc->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(enc).value();
    }

    // Runs encode() on the fixture's tokens; returns {hidden, pooled} values.
    std::pair<std::vector<float>, std::vector<float>> encode(const models::ClipTextEncoder& enc,
                                                             const std::string& tokens_name,
                                                             const models::ClipTextOptions& options) {
        const auto tokens = test::fixture_tensor(io, tokens_name);
        std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
        runtime::GraphSession session;
        ggml_tensor* t = session.input(GGML_TYPE_I32, test::ggml_ne(tokens.shape), ids.data());
        models::ClipTextOutput out = enc.encode(session.ctx(), t, options);
        EXPECT_NE(out.hidden, nullptr);
        // The hidden states without the norm are a cut marker, which stays
        // readable with keep_cuts; the pooled output is the graph's result.
        ggml_tensor* result = out.pooled ? out.pooled : out.hidden;
        if (!session.run(*compute, result, /*keep_cuts=*/true).ok()) throw std::runtime_error("encode failed");
        return {runtime::GraphSession::read(out.hidden),
                out.pooled ? runtime::GraphSession::read(out.pooled) : std::vector<float>{}};
    }

    // The UNet on the fixture's x, t, context and y.
    Result<ggml_tensor*> build_unet(const models::Unet& unet, runtime::GraphSession& session) {
        auto in_session = [&](const char* name) {
            const auto v = test::fixture_tensor(io, name);
            return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
        };
        models::UnetInputs in;
        in.x = in_session("unet.x");
        in.timesteps = in_session("unet.t");
        in.context = in_session("unet.context");
        in.y = in_session("unet.y");
        return unet.build(session.ctx(), in, models::UnetBuildOptions{});
    }
};

models::ClipTextOptions sdxl_options(bool pooled) {
    models::ClipTextOptions o;
    o.layer_from_end = 2;
    o.final_norm = false;
    o.pooled = pooled;
    return o;
}

TEST_F(SdxlTiny, ClipLPenultimateWithoutFinalNorm) {
    auto enc = clip(kClipL);
    EXPECT_EQ(enc->config().naming, models::ClipTextConfig::Naming::HuggingFace);
    EXPECT_EQ(enc->config().projection, 0);
    const auto [hidden, none] = encode(*enc, "clip_l.tokens", sdxl_options(false));
    EXPECT_TRUE(none.empty());
    EXPECT_LT(test::relative_error(hidden, test::fixture_tensor(io, "clip_l.penultimate").values), kTolerance);
    // CLIP-L pads with EOS: the pooled position is the first of many EOS.
    const auto [hidden2, pooled] = encode(*enc, "clip_l.tokens", sdxl_options(true));
    EXPECT_EQ(hidden2, hidden);
    ASSERT_EQ(pooled.size(), 2u * 32);
    EXPECT_LT(test::relative_error(pooled, test::fixture_tensor(io, "clip_l.pooled").values), kTolerance);
}

TEST_F(SdxlTiny, BigGPenultimateAndPooledThroughTextProjection) {
    auto enc = clip(kClipG);
    const models::ClipTextConfig& c = enc->config();
    EXPECT_EQ(c.naming, models::ClipTextConfig::Naming::OpenClip);
    EXPECT_FALSE(c.quick_gelu);
    EXPECT_EQ(c.layers, 3);
    EXPECT_EQ(c.projection, 48);
    const auto [hidden, pooled] = encode(*enc, "clip_g.tokens", sdxl_options(true));
    EXPECT_LT(test::relative_error(hidden, test::fixture_tensor(io, "clip_g.penultimate").values), kTolerance);
    ASSERT_EQ(pooled.size(), 2u * 48);
    EXPECT_LT(test::relative_error(pooled, test::fixture_tensor(io, "clip_g.pooled").values), kTolerance);

    // Pooling at the first EOS by id gives the same vector here.
    models::ClipTextOptions by_id = sdxl_options(true);
    by_id.pooled_token = 319;  // EOS of the 320-token vocabulary
    EXPECT_EQ(encode(*enc, "clip_g.tokens", by_id).second, pooled);

    // The defaults are SD2's: the last layer, final-normed; build() is that.
    const auto [last, no_pool] = encode(*enc, "clip_g.tokens", models::ClipTextOptions{});
    EXPECT_LT(test::relative_error(last, test::fixture_tensor(io, "clip_g.last_normed").values), kTolerance);
}

TEST_F(SdxlTiny, UnetConfigIsReadFromTheWeights) {
    auto unet = test::declare_network<models::Unet>(weights, kUnet, std::nullopt);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    const models::UnetConfig& c = (*unet)->config();
    EXPECT_EQ(c.adm_in_channels, 96);
    EXPECT_EQ(c.context_dim, 64);
    EXPECT_EQ(c.level_channels, (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(c.res_blocks, 1);
    EXPECT_EQ(c.input_depth, (std::vector<int>{0, 0, 2}));
    EXPECT_EQ(c.middle_depth, 1);
    EXPECT_EQ(c.output_depth, (std::vector<int>{2, 1, 0, 0}));
    EXPECT_TRUE(c.linear_projection);
    EXPECT_EQ(c.head_channels, 16);
    EXPECT_EQ(c.heads_at(32), 2);
}

TEST_F(SdxlTiny, UnetWithYMatchesReferenceBlockByBlock) {
    auto unet = test::declare_network<models::Unet>(weights, kUnet, GGML_TYPE_F32);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    auto status = unet->weights().load(compute->weights_backend());
    ASSERT_TRUE(status.ok()) << status.error().message;
    runtime::GraphSession session;
    auto out = build_unet(**unet, session);
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
    EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, "unet.out").values),
              kTolerance);
    int blocks = 0;
    for (const io::TensorInfo& ref : io.tensors()) {
        if (ref.name.rfind("unet.block.", 0) != 0) continue;
        const std::string block = ref.name.substr(11);
        ggml_tensor* cut = session.find("cut:" + block);
        ASSERT_NE(cut, nullptr) << block;
        EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                  kTolerance)
            << block;
        ++blocks;
    }
    EXPECT_EQ(blocks, 9);  // input_blocks.0-3, middle_block, output_blocks.0-3
}

TEST_F(SdxlTiny, UnetWithoutMiddleTransformerMatchesReference) {
    // SSD-1B's and Vega's middle block: resnets at middle_block.0 and .2, no
    // transformer at .1. The fixture's UNet without those tensors.
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : weights.tensors()) {
        if (t.name.rfind(std::string(kUnet), 0) != 0 || t.name.rfind(std::string(kUnet) + "middle_block.1.", 0) == 0)
            continue;
        const uint8_t* data = weights.data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    test::TempDir dir;
    const std::string path =
        dir.write("lean.safetensors", test::build_safetensors(entries, {{"kiln.unet.head_channels", "16"}}));
    auto file = io::ModelFile::open({path});
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto unet = test::declare_network<models::Unet>(*file, kUnet, GGML_TYPE_F32);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    EXPECT_EQ((*unet)->config().middle_depth, 0);
    ASSERT_TRUE(unet->weights().load(compute->weights_backend()).ok());
    runtime::GraphSession session;
    auto out = build_unet(**unet, session);
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_TRUE(session.run(*compute, *out).ok());
    EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out),
                                   test::fixture_tensor(io, "unet.out_no_middle_transformer").values),
              kTolerance);
}

TEST_F(SdxlTiny, UnetYIsAContract) {
    auto xl = test::declare_network<models::Unet>(weights, kUnet, std::nullopt);
    ASSERT_TRUE(xl.ok()) << xl.error().message;
    runtime::GraphSession session;
    ggml_context* ctx = session.ctx();
    models::UnetInputs in;
    in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 8, 8, 4, 2);
    in.timesteps = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 2);
    in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 77, 2);
    auto missing = (*xl)->build(ctx, in, {});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().message, "UNet: this network has label_emb and needs y (ne [96, batch])");
    in.y = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 95, 2);
    auto narrow = (*xl)->build(ctx, in, {});
    ASSERT_FALSE(narrow.ok());
    EXPECT_EQ(narrow.error().message, "UNet: y must be ne [96, 2]");
    in.y = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 96, 2);
    in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2048, 77, 2);
    auto wide = (*xl)->build(ctx, in, {});
    ASSERT_FALSE(wide.ok());
    EXPECT_EQ(wide.error().message, "UNet: context is 2048 wide, the network takes 64");

    // An SD1 UNet has no label_emb: y is refused, and the SD1 call builds.
    auto sd1_file = open_file("sd1_tiny.safetensors");
    auto sd1 = test::declare_network<models::Unet>(sd1_file, kUnet, std::nullopt);
    ASSERT_TRUE(sd1.ok()) << sd1.error().message;
    EXPECT_EQ((*sd1)->config().adm_in_channels, 0);
    models::UnetInputs sd1_in;
    sd1_in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 16, 16, 4, 2);
    sd1_in.timesteps = in.timesteps;
    sd1_in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 77, 2);
    sd1_in.y = in.y;
    auto refused = (*sd1)->build(ctx, sd1_in, {});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().message, "UNet: this network has no label_emb; y must be null");
    auto odd = sd1_in;
    odd.y = nullptr;
    odd.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 15, 16, 4, 2);
    auto bad_size = (*sd1)->build(ctx, odd, {});
    ASSERT_FALSE(bad_size.ok());
    EXPECT_EQ(bad_size.error().message, "UNet: latent size 15x16 is not a multiple of 2");
}

TEST_F(SdxlTiny, SizeConditioningMatchesSgm) {
    // SDXL's widths: pooled 1280 + 6 x 256 = 2816.
    const auto pooled = test::fixture_tensor(io, "cond.pooled_1280");
    const auto sizes = test::fixture_tensor(io, "cond.sizes");
    const auto expected = test::fixture_tensor(io, "cond.vector_2816");
    ASSERT_EQ(expected.shape, (std::vector<int64_t>{2, 2816}));
    for (int b = 0; b < 2; ++b) {
        const float* s = sizes.values.data() + 6 * b;
        pipeline::SizeConditioning size{s[0], s[1], s[2], s[3], s[4], s[5]};
        std::vector<float> row(pooled.values.begin() + 1280 * b, pooled.values.begin() + 1280 * (b + 1));
        const std::vector<float> y = pipeline::sdxl_conditioning_vector(row, size);
        ASSERT_EQ(y.size(), 2816u);
        double worst = 0;
        for (size_t i = 0; i < y.size(); ++i)
            worst = std::max(worst, std::fabs(double(y[i]) - expected.values[2816 * b + i]));
        EXPECT_LT(worst, 1e-6) << "prompt " << b;
    }
}

TEST_F(SdxlTiny, ConditioningChainsFromPooledToY) {
    // The fixture's y is the reference's pooled bigG output with 8-wide size
    // embeddings: kiln's pooled output through kiln's function gives it.
    auto enc = clip(kClipG);
    const auto pooled = encode(*enc, "clip_g.tokens", sdxl_options(true)).second;
    const auto sizes = test::fixture_tensor(io, "cond.sizes");
    const auto expected = test::fixture_tensor(io, "unet.y");
    std::vector<float> y;
    for (int b = 0; b < 2; ++b) {
        const float* s = sizes.values.data() + 6 * b;
        std::vector<float> row(pooled.begin() + 48 * b, pooled.begin() + 48 * (b + 1));
        const auto part = pipeline::sdxl_conditioning_vector(row, {s[0], s[1], s[2], s[3], s[4], s[5]}, 8);
        y.insert(y.end(), part.begin(), part.end());
    }
    EXPECT_LT(test::relative_error(y, expected.values), kTolerance);
}

TEST(SizeConditioning, SinusoidLayoutIsCosThenSin) {
    std::vector<float> e;
    pipeline::append_sinusoidal_embedding(2.0, 5, e);  // half 2: f = 1, 0.01; odd tail 0
    ASSERT_EQ(e.size(), 5u);
    EXPECT_FLOAT_EQ(e[0], std::cos(2.0f));
    EXPECT_FLOAT_EQ(e[1], std::cos(0.02f));
    EXPECT_FLOAT_EQ(e[2], std::sin(2.0f));
    EXPECT_FLOAT_EQ(e[3], std::sin(0.02f));
    EXPECT_EQ(e[4], 0.0f);
}

}  // namespace
}  // namespace kiln
