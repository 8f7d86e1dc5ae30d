// The Z-Image DiT against the PyTorch reference (training/reference/z_image.py),
// on the tiny random-weight model training/make_z_image_fixtures.py writes in
// both namings (single file: attention.qkv, x_embedder; original / diffusers:
// to_q, all_x_embedder.2-1): a batch of two whose captions (7 and 37 tokens)
// pad to different lengths (masked batch padding) over a latent whose 15
// image tokens pad to 32, layer by layer; a batch whose captions pad alike
// (no mask); one item with nothing to pad. Also the host tables, the config
// read from the weights, the plan's segments, and the errors for inputs that
// do not fit.
#include "models/nets/z_image_dit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "declared_network.h"
#include "golden.h"
#include "io/dtype.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

// BF16 weights widened to F32 against a float64 reference: float32 rounding
// and summation order (timestep embeddings are computed in float32 here).
constexpr double kTolerance = 1e-4;
// ggml's flash attention holds K, V (and the mask) in F16.
constexpr double kFlashTolerance = 5e-3;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// Zeroes the batch-padding slots of a block output (PyTorch order [B, L, dim],
// flattened): slots [first, first + Tp) of each item follow caption_valid
// [B, Tp]; the others are always compared.
std::vector<float> valid_only(std::vector<float> v, const test::FixtureTensor& valid, int64_t L, int64_t dim,
                              int64_t first) {
    const int64_t B = valid.shape[0], Tp = valid.shape[1];
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < Tp; ++i) {
            if (valid.values[static_cast<size_t>(b * Tp + i)] > 0) continue;
            for (int64_t d = 0; d < dim; ++d) v[static_cast<size_t>((b * L + first + i) * dim + d)] = 0.0f;
        }
    }
    return v;
}

struct ZImageFixture {
    io::ModelFile weights;
    io::ModelFile io;
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    explicit ZImageFixture(const std::string& model = "z_image_tiny.safetensors")
        : weights(open_file(model)), io(open_file("z_image_tiny_io.safetensors")) {}

    test::DeclaredNetwork<models::ZImageDit> dit() {
        auto d = test::declare_network<models::ZImageDit>(weights, "", GGML_TYPE_F32);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name) {
        const auto v = test::fixture_tensor(io, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    models::ZImageTokens tokens(const models::ZImageDit& dit, const std::string& prefix) {
        const auto x = test::fixture_tensor(io, prefix + "x");
        const auto context = test::fixture_tensor(io, prefix + "context");
        std::vector<int64_t> lengths;
        for (float l : test::fixture_tensor(io, prefix + "caption_lengths").values)
            lengths.push_back(static_cast<int64_t>(l));
        auto t = models::z_image_tokens(dit.config(), x.shape[3], x.shape[2], context.shape[1], lengths);
        if (!t.ok()) throw std::runtime_error(t.error().message);
        return std::move(t).value();
    }

    // The fixture's inputs as the network takes them, the host tables made by
    // kiln (the mask only when the captions need it, unless `always_mask`).
    models::ZImageInputs inputs(const models::ZImageDit& dit, runtime::GraphSession& session, const std::string& prefix,
                                bool always_mask = false) {
        const models::ZImageConfig& cfg = dit.config();
        const models::ZImageTokens t = tokens(dit, prefix);
        models::ZImageInputs in;
        in.x = input(session, prefix + "x");
        in.timesteps = input(session, prefix + "sigma");
        in.context = input(session, prefix + "context");
        const auto rope = models::z_image_rope_table(cfg, t);
        in.rope = session.input(GGML_TYPE_F32, models::z_image_rope_shape(cfg, t), rope.data());
        const auto pad = models::z_image_caption_pad(t);
        in.cap_pad = session.input(GGML_TYPE_F32, models::z_image_caption_pad_shape(t), pad.data());
        if (t.needs_mask() || always_mask) {
            const auto mask = models::z_image_attention_mask(t);
            in.mask = session.input(GGML_TYPE_F32, models::z_image_attention_mask_shape(t), mask.data());
        }
        return in;
    }

    // Runs the case; checks `<prefix>out` and, when the fixture has them,
    // every `<prefix>block.<cut>` on its real slots; returns the number of
    // blocks compared. `worst` gets the largest relative error seen.
    int expect_matches(const std::string& prefix, const models::ZImageBuildOptions& options = {},
                       double tolerance = kTolerance, bool always_mask = false, double* worst = nullptr) {
        auto d = dit();
        runtime::GraphSession session;
        auto out = d->build(session.ctx(), inputs(*d, session, prefix, always_mask), options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        double max_error =
            test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, prefix + "out").values);
        EXPECT_LT(max_error, tolerance) << prefix << "out";
        int blocks = 0;
        const std::string block_prefix = prefix + "block.";
        for (const io::TensorInfo& ref : io.tensors()) {
            if (ref.name.rfind(block_prefix, 0) != 0) continue;
            const std::string block = ref.name.substr(block_prefix.size());
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            const auto expected = test::fixture_tensor(io, ref.name);
            const auto valid = test::fixture_tensor(io, prefix + "caption_valid");
            const int64_t L = expected.shape[1], dim = expected.shape[2], Tp = valid.shape[1];
            EXPECT_EQ(test::ggml_ne(expected.shape), std::vector<int64_t>(cut->ne, cut->ne + 3)) << block;
            std::vector<float> actual = runtime::GraphSession::read(cut), want = expected.values;
            if (block.rfind("noise_refiner.", 0) != 0) {  // caption slots: the last Tp
                actual = valid_only(actual, valid, L, dim, L - Tp);
                want = valid_only(want, valid, L, dim, L - Tp);
            }
            const double error = test::relative_error(actual, want);
            max_error = std::max(max_error, error);
            EXPECT_LT(error, tolerance) << prefix << block;
            ++blocks;
        }
        if (worst) *worst = max_error;
        return blocks;
    }
};

struct ZImageTiny : ::testing::Test, ZImageFixture {};
struct ZImageTinyDiffusers : ::testing::Test, ZImageFixture {
    ZImageTinyDiffusers() : ZImageFixture("z_image_tiny_diffusers.safetensors") {}
};

void expect_tiny_config(const models::ZImageConfig& c) {
    EXPECT_EQ(c.dim, 64);
    EXPECT_EQ(c.heads, 2);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.axes_dim, (std::vector<int>{8, 12, 12}));
    EXPECT_EQ(c.ffn_hidden, 170);
    EXPECT_EQ(c.in_channels, 64);
    EXPECT_EQ(c.out_channels, 64);
    EXPECT_EQ(c.latent_channels(), 16);
    EXPECT_EQ(c.cap_dim, 48);
    EXPECT_EQ(c.t_freq_dim, 256);
    EXPECT_EQ(c.t_mid, 64);
    EXPECT_EQ(c.t_embed_dim, 64);
    EXPECT_EQ(c.noise_refiner_layers, 1);
    EXPECT_EQ(c.context_refiner_layers, 1);
    EXPECT_EQ(c.layers, 2);
    EXPECT_FLOAT_EQ(c.theta, 256.0f);
}

TEST_F(ZImageTiny, ConfigIsReadFromTheWeights) {
    EXPECT_TRUE(models::ZImageDit::looks_like_z_image(weights, ""));
    auto d = test::declare_network<models::ZImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    expect_tiny_config((*d)->config());
    EXPECT_FALSE((*d)->config().diffusers_names);
    EXPECT_TRUE(d->weights().has("layers.0.attention.qkv.weight"));
}

TEST_F(ZImageTinyDiffusers, ConfigIsReadFromTheWeights) {
    EXPECT_TRUE(models::ZImageDit::looks_like_z_image(weights, ""));
    auto d = test::declare_network<models::ZImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    expect_tiny_config((*d)->config());
    EXPECT_TRUE((*d)->config().diffusers_names);
    EXPECT_TRUE(d->weights().has("all_final_layer.2-1.adaLN_modulation.1.weight"));
}

TEST_F(ZImageTiny, MatchesReferenceLayerByLayerWithPadding) {
    // Captions of 7 and 37 tokens (slots 32 and 64: the first item's last 32
    // are masked), 15 image tokens and 17 x_pad_tokens.
    double worst = 0;
    EXPECT_EQ(expect_matches("batch.", {}, kTolerance, false, &worst), 4);
    RecordProperty("batch_max_relative_error", std::to_string(worst));
    std::printf("[ measured ] batch. max relative error %.3g\n", worst);
}

TEST_F(ZImageTiny, MatchesReferenceWhenCaptionsPadAlike) {
    // Captions of 5 and 20 tokens both fill 32 slots: no mask, cap_pad_token
    // in slots 5..31 and 20..31. An all-zero mask changes nothing.
    double worst = 0;
    EXPECT_EQ(expect_matches("even.", {}, kTolerance, false, &worst), 4);
    std::printf("[ measured ] even. max relative error %.3g\n", worst);
    EXPECT_EQ(expect_matches("even.", {}, kTolerance, true), 4);
}

TEST_F(ZImageTiny, MatchesReferenceWithNothingToPad) {
    double worst = 0;
    EXPECT_EQ(expect_matches("exact.", {}, kTolerance, false, &worst), 0);
    std::printf("[ measured ] exact. max relative error %.3g\n", worst);
}

TEST_F(ZImageTinyDiffusers, MatchesReferenceInDiffusersNames) { EXPECT_EQ(expect_matches("batch."), 4); }

TEST_F(ZImageTiny, FlashAttentionStaysClose) {
    models::ZImageBuildOptions flash;
    flash.flash_attention = true;
    double worst = 0;
    EXPECT_EQ(expect_matches("batch.", flash, kFlashTolerance, false, &worst), 4);
    std::printf("[ measured ] batch. with flash attention: max relative error %.3g\n", worst);
}

TEST_F(ZImageTiny, HostTablesMatchReference) {
    auto d = test::declare_network<models::ZImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const models::ZImageTokens t = tokens(**d, "batch.");
    EXPECT_EQ(t.grid_w, 5);
    EXPECT_EQ(t.grid_h, 3);
    EXPECT_EQ(t.image_slots(), 32);
    EXPECT_EQ(t.caption_slots(), 64);
    EXPECT_TRUE(t.needs_mask());
    EXPECT_FALSE(tokens(**d, "even.").needs_mask());

    const auto cos = test::fixture_tensor(io, "batch.rope.cos");  // [B, S, 16]
    const auto sin = test::fixture_tensor(io, "batch.rope.sin");
    const int64_t B = 2, S = 96, D = 32;
    ASSERT_EQ(cos.shape, (std::vector<int64_t>{B, S, D / 2}));
    EXPECT_EQ(models::z_image_rope_shape((*d)->config(), t), (std::vector<int64_t>{D, S, B, 2}));
    const auto table = models::z_image_rope_table((*d)->config(), t);
    ASSERT_EQ(table.size(), static_cast<size_t>(2 * D * S * B));
    double worst = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t s = 0; s < S; ++s) {
            const float* row = table.data() + (b * S + s) * D;
            const float* signed_sin = row + D * S * B;
            for (int64_t j = 0; j < D / 2; ++j) {
                const float c = cos.values[(b * S + s) * 16 + j], sn = sin.values[(b * S + s) * 16 + j];
                for (double e :
                     {row[2 * j] - c, row[2 * j + 1] - c, signed_sin[2 * j] + sn, signed_sin[2 * j + 1] - sn})
                    worst = std::max(worst, std::fabs(e));
            }
        }
    }
    EXPECT_LT(worst, 1e-6);

    const auto mask = test::fixture_tensor(io, "batch.mask");  // [B, S]
    EXPECT_EQ(models::z_image_attention_mask_shape(t), (std::vector<int64_t>{S, B}));
    EXPECT_EQ(models::z_image_attention_mask(t), mask.values);

    EXPECT_EQ(models::z_image_caption_pad_shape(t), (std::vector<int64_t>{64, B}));
    const auto pad = models::z_image_caption_pad(t);
    ASSERT_EQ(pad.size(), 128u);
    for (int64_t i = 0; i < 64; ++i) {
        EXPECT_EQ(pad[static_cast<size_t>(i)], i < 7 ? 0.0f : 1.0f) << i;
        EXPECT_EQ(pad[static_cast<size_t>(64 + i)], i < 37 ? 0.0f : 1.0f) << i;
    }
}

TEST(ZImageTokens, AreChecked) {
    models::ZImageConfig c;
    EXPECT_TRUE(models::z_image_tokens(c, 128, 64, 37, {7, 37}).ok());
    auto expect_error = [&](int64_t w, int64_t h, int64_t txt, std::vector<int64_t> lengths, const std::string& msg) {
        auto r = models::z_image_tokens(c, w, h, txt, std::move(lengths));
        ASSERT_FALSE(r.ok()) << msg;
        EXPECT_EQ(r.error().kind, ErrorKind::InvalidRequest);
        EXPECT_EQ(r.error().message, msg);
    };
    expect_error(127, 64, 37, {7}, "Z-Image: latent size 127x64 is not a positive multiple of 2");
    expect_error(0, 64, 37, {7}, "Z-Image: latent size 0x64 is not a positive multiple of 2");
    expect_error(128, 64, 37, {}, "Z-Image: no caption lengths (one per batch item)");
    expect_error(128, 64, 37, {38}, "Z-Image: caption length 38 is outside 1..37 (the context's tokens)");
    expect_error(128, 64, 37, {7, 0}, "Z-Image: caption length 0 is outside 1..37 (the context's tokens)");
    EXPECT_EQ(models::z_image_padded(1), 32);
    EXPECT_EQ(models::z_image_padded(32), 32);
    EXPECT_EQ(models::z_image_padded(33), 64);
}

TEST_F(ZImageTiny, EachLayerIsASegmentWithItsOwnWeights) {
    // What the memory system streams: a layer's weights (its adaLN included)
    // are read by that layer's segment only; the image embedders by the first
    // noise refiner's, the caption embedder by the first context refiner's.
    auto d = dit();
    runtime::GraphSession session;
    auto out = d->build(session.ctx(), inputs(*d, session, "batch."), {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    ggml_cgraph* graph = session.graph(*out);
    const runtime::GraphPlan plan = runtime::build_graph_plan(graph, d.weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    std::vector<std::string> names;
    for (const runtime::PlanSegment& segment : plan.segments) names.push_back(segment.name);
    EXPECT_EQ(names,
              (std::vector<std::string>{"noise_refiner.0", "context_refiner.0", "layers.0", "layers.1", "output"}));
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    size_t weights = 0;
    for (const runtime::PlanSegment& segment : plan.segments) {
        for (int leaf : segment.weights) {
            const std::string name = ggml_get_name(leafs[static_cast<size_t>(leaf)]);
            ++weights;
            std::string expected;
            if (name.rfind("noise_refiner.", 0) == 0 || name.rfind("context_refiner.", 0) == 0 ||
                name.rfind("layers.", 0) == 0) {
                expected = name.substr(0, name.find('.', name.find('.') + 1));
            } else if (name.rfind("final_layer.", 0) == 0) {
                expected = "output";
            } else if (name.rfind("cap_", 0) == 0) {
                expected = "context_refiner.0";
            } else {
                expected = "noise_refiner.0";  // x_embedder, t_embedder, x_pad_token
            }
            EXPECT_EQ(segment.name, expected) << name;
        }
    }
    EXPECT_EQ(weights, d.weights().count());
}

TEST_F(ZImageTiny, InputsAreAContract) {
    auto d = dit();
    runtime::GraphSession session;
    ggml_context* ctx = session.ctx();
    const models::ZImageInputs good = inputs(*d, session, "batch.");
    ASSERT_TRUE(d->build(ctx, good, {}).ok());
    auto expect_error = [&](const models::ZImageInputs& in, const std::string& message) {
        auto r = d->build(ctx, in, {});
        ASSERT_FALSE(r.ok()) << message;
        EXPECT_EQ(r.error().message, message);
        EXPECT_EQ(r.error().kind, ErrorKind::InvalidRequest);
    };
    auto with = [&](auto change) {
        models::ZImageInputs in = good;
        change(in);
        return in;
    };
    expect_error(with([&](auto& in) { in.cap_pad = nullptr; }),
                 "Z-Image: x, timesteps, context, rope and cap_pad are required");
    expect_error(with([&](auto& in) { in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 10, 6, 4, 2); }),
                 "Z-Image: x has 4 channels, the network takes 16");
    expect_error(with([&](auto& in) { in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 9, 6, 16, 2); }),
                 "Z-Image: x size 9x6 is not a multiple of 2");
    expect_error(with([&](auto& in) { in.timesteps = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1); }),
                 "Z-Image: timesteps must be F32 ne [2]");
    expect_error(with([&](auto& in) { in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2560, 37, 2); }),
                 "Z-Image: context is 2560 wide, the network takes 48");
    expect_error(with([&](auto& in) { in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 48, 37, 1); }),
                 "Z-Image: context must be ne [48, tokens, 2]");
    // Tables made for other tokens: another latent size, another caption count.
    expect_error(with([&](auto& in) { in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 16, 16, 16, 2); }),
                 "Z-Image: rope is [32, 96, 2, 2], these tokens need F32 [32, 128, 2, 2] (z_image_rope_table)");
    expect_error(with([&](auto& in) { in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 48, 20, 2); }),
                 "Z-Image: rope is [32, 96, 2, 2], these tokens need F32 [32, 64, 2, 2] (z_image_rope_table)");
    expect_error(with([&](auto& in) { in.cap_pad = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 37, 2); }),
                 "Z-Image: cap_pad is [37, 2], these tokens need F32 [64, 2] (z_image_caption_pad)");
    expect_error(with([&](auto& in) { in.mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 2); }),
                 "Z-Image: mask is [64, 2], these tokens need F32 [96, 2] (z_image_attention_mask)");
}

TEST(ZImageDit, RefusesWhatIsNotAZImageDit) {
    auto sdxl = open_file("sdxl_tiny.safetensors");
    EXPECT_FALSE(models::ZImageDit::looks_like_z_image(sdxl, "model.diffusion_model."));
    auto r = test::declare_network<models::ZImageDit>(sdxl, "model.diffusion_model.", std::nullopt);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(r.error().message,
              "no Z-Image DiT under 'model.diffusion_model.' (x_embedder, cap_embedder, t_embedder, pad tokens, "
              "layers.0 or final_layer missing or malformed)");
    auto flux = open_file("flux_tiny.safetensors");
    EXPECT_FALSE(models::ZImageDit::looks_like_z_image(flux, ""));
    EXPECT_FALSE(test::declare_network<models::ZImageDit>(flux, "", std::nullopt).ok());
    // The tiny Z-Image under the wrong prefix is not one either.
    auto z = open_file("z_image_tiny.safetensors");
    EXPECT_FALSE(models::ZImageDit::looks_like_z_image(z, "model.diffusion_model."));
    EXPECT_FALSE(test::declare_network<models::ZImageDit>(z, "model.diffusion_model.", std::nullopt).ok());

    // Heads of 32 without the axes metadata: Z-Image defines RoPE axes for 128 only.
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : z.tensors()) {
        const uint8_t* data = z.data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    test::TempDir dir;
    auto bare = io::ModelFile::open({dir.write("bare.safetensors", test::build_safetensors(entries))});
    ASSERT_TRUE(bare.ok()) << bare.error().message;
    auto no_axes = test::declare_network<models::ZImageDit>(*bare, "", std::nullopt);
    ASSERT_FALSE(no_axes.ok());
    EXPECT_EQ(no_axes.error().message,
              "Z-Image DiT under '': heads of 32 need RoPE axes (Z-Image's are for 128); set metadata "
              "kiln.z_image.axes_dim");
    auto odd = io::ModelFile::open(
        {dir.write("odd.safetensors", test::build_safetensors(entries, {{"kiln.z_image.axes_dim", "8,12,10"}}))});
    ASSERT_TRUE(odd.ok()) << odd.error().message;
    auto bad_axes = test::declare_network<models::ZImageDit>(*odd, "", std::nullopt);
    ASSERT_FALSE(bad_axes.ok());
    EXPECT_EQ(bad_axes.error().message, "Z-Image DiT under '': RoPE axes must be three and sum to the head width 32");
}

}  // namespace
}  // namespace kiln
