// The Flux.1 DiT and Chroma against the PyTorch reference
// (training/reference/flux.py), on the tiny random-weight models
// training/make_flux_fixtures.py writes with BFL's tensor names: dev-like
// (guidance_in) block by block, with one and two Kontext reference latents;
// schnell-like (no guidance_in, ComfyUI prefix); Chroma with and without its
// T5 padding mask. Also the host tables (RoPE, Chroma's index embedding), the
// config read from the weights, and the errors for inputs that do not fit.
#include "models/nets/flux_dit.h"

#include <gtest/gtest.h>

#include <cmath>

#include "declared_network.h"
#include "golden.h"
#include "io/dtype.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

// F16 weights widened to F32 against a float64 reference: float32 rounding
// and summation order (the fixtures' outputs agree to about 1e-6 of their
// scale; timestep embeddings are computed in float32 here).
constexpr double kTolerance = 1e-4;
// ggml's flash attention holds K, V (and the mask) in F16.
constexpr double kFlashTolerance = 5e-3;
// ComputeTarget::Device uses ggml_gelu, which on the CPU reads an F16 table.
constexpr double kDeviceGeluTolerance = 5e-3;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

struct FluxFixture {
    io::ModelFile weights;
    io::ModelFile io;
    std::string prefix;
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    FluxFixture(const std::string& model, std::string prefix_)
        : weights(open_file(model + ".safetensors")),
          io(open_file(model + "_io.safetensors")),
          prefix(std::move(prefix_)) {}

    test::DeclaredNetwork<models::FluxDit> dit() {
        auto d = test::declare_network<models::FluxDit>(weights, prefix, GGML_TYPE_F32);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name) {
        const auto v = test::fixture_tensor(io, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    struct Case {
        std::vector<std::string> refs;  // fixture names of the reference latents
        std::string txt_mask;           // fixture name of Chroma's [B, T] mask, or empty
        models::FluxBuildOptions options;
    };

    // The fixture's inputs as the network takes them, the host tables made by kiln.
    models::FluxInputs inputs(const models::FluxDit& dit, runtime::GraphSession& session, const Case& c) {
        const models::FluxConfig& cfg = dit.config();
        models::FluxInputs in;
        in.x = input(session, "x");
        in.timesteps = input(session, "timesteps");
        in.context = input(session, "context");
        if (io.find("guidance")) in.guidance = input(session, "guidance");
        if (io.find("y")) in.pooled = input(session, "y");
        std::vector<models::FluxTokenGrid> grids;
        for (const std::string& r : c.refs) {
            in.refs.push_back(input(session, r));
            grids.push_back({in.refs.back()->ne[0] / 2, in.refs.back()->ne[1] / 2});
        }
        const int64_t T = in.context->ne[1], B = in.x->ne[3];
        const models::FluxTokenGrid grid{in.x->ne[0] / 2, in.x->ne[1] / 2};
        const auto rope = models::flux_rope_table(cfg, T, grid, grids);
        in.rope = session.input(GGML_TYPE_F32, models::flux_rope_shape(cfg, T, grid, grids), rope.data());
        if (!c.txt_mask.empty()) {
            const auto valid = test::fixture_tensor(io, c.txt_mask).values;
            const int64_t image_tokens = models::flux_token_count(0, grid, grids);
            const auto mask = models::flux_attention_mask(valid, image_tokens, B);
            in.mask = session.input(GGML_TYPE_F32, models::flux_attention_mask_shape(T, image_tokens, B), mask.data());
        }
        if (cfg.chroma) {
            const auto index = models::chroma_index_table(cfg);
            in.chroma_index = session.input(GGML_TYPE_F32, models::chroma_index_shape(cfg), index.data());
        }
        return in;
    }

    // Runs the case; checks `<prefix>out` and, when the fixture has them,
    // every `<prefix>block.<cut>`; returns the number of blocks compared.
    int expect_matches(const std::string& prefix_, const Case& c, double tolerance = kTolerance) {
        auto d = dit();
        runtime::GraphSession session;
        auto out = d->build(session.ctx(), inputs(*d, session, c), c.options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        EXPECT_LT(
            test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, prefix_ + "out").values),
            tolerance)
            << prefix_ << "out";
        int blocks = 0;
        const std::string block_prefix = prefix_ + "block.";
        for (const io::TensorInfo& ref : io.tensors()) {
            if (ref.name.rfind(block_prefix, 0) != 0) continue;
            const std::string block = ref.name.substr(block_prefix.size());
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                      tolerance)
                << prefix_ << block;
            ++blocks;
        }
        return blocks;
    }
};

struct FluxTiny : ::testing::Test, FluxFixture {
    FluxTiny() : FluxFixture("flux_tiny", "") {}
};
struct FluxSchnellTiny : ::testing::Test, FluxFixture {
    FluxSchnellTiny() : FluxFixture("flux_schnell_tiny", "model.diffusion_model.") {}
};
struct ChromaTiny : ::testing::Test, FluxFixture {
    ChromaTiny() : FluxFixture("chroma_tiny", "") {}
};

TEST_F(FluxTiny, ConfigIsReadFromTheWeights) {
    auto d = test::declare_network<models::FluxDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const models::FluxConfig& c = (*d)->config();
    EXPECT_EQ(c.hidden, 64);
    EXPECT_EQ(c.heads, 2);
    EXPECT_EQ(c.head_dim(), 32);
    EXPECT_EQ(c.axes_dim, (std::vector<int>{8, 12, 12}));
    EXPECT_EQ(c.mlp_hidden, 128);
    EXPECT_EQ(c.in_channels, 64);
    EXPECT_EQ(c.out_channels, 64);
    EXPECT_EQ(c.latent_channels, 16);
    EXPECT_EQ(c.velocity_channels(), 16);
    EXPECT_EQ(c.context_dim, 32);
    EXPECT_EQ(c.vec_dim, 24);
    EXPECT_EQ(c.double_blocks, 2);
    EXPECT_EQ(c.single_blocks, 2);
    EXPECT_TRUE(c.guidance_embed);
    EXPECT_FALSE(c.chroma);
    EXPECT_TRUE(c.qkv_bias);
}

TEST_F(FluxTiny, MatchesReferenceBlockByBlock) { EXPECT_EQ(expect_matches("", {}), 4); }

// Skip-layer guidance's pass: double block 1 and single block 1 (numbered
// 3 after the 2 double blocks) left out, against the reference's own skip.
TEST_F(FluxTiny, SkippedBlocksMatchReference) {
    Case skipped;
    skipped.options.skip_blocks = {1, 3, 99};  // past the last block: nothing
    EXPECT_EQ(expect_matches("skip.", skipped), 0);
}

TEST_F(FluxTiny, KontextReferenceLatentsMatchReference) {
    // One reference latent (4x6) of another size than x (8x8): its tokens
    // are in every block's output and dropped from the velocity.
    EXPECT_EQ(expect_matches("kontext.", {{"kontext.ref0"}, "", {}}), 4);
    // Two: the second placed beside the first (the header's rule).
    expect_matches("kontext2.", {{"kontext.ref0", "kontext.ref1"}, "", {}});
}

TEST_F(FluxTiny, EachBlockIsASegmentWithItsOwnWeights) {
    // What the memory system streams: a block's weights (its modulation
    // included) are read by that block's segment only.
    auto d = dit();
    runtime::GraphSession session;
    auto out = d->build(session.ctx(), inputs(*d, session, {}), {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    ggml_cgraph* graph = session.graph(*out);
    const runtime::GraphPlan plan = runtime::build_graph_plan(graph, d.weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    std::vector<std::string> names;
    for (const runtime::PlanSegment& segment : plan.segments) names.push_back(segment.name);
    EXPECT_EQ(names, (std::vector<std::string>{"double_blocks.0", "double_blocks.1", "single_blocks.0",
                                               "single_blocks.1", "output"}));
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    size_t weights = 0;
    for (size_t k = 0; k < plan.segments.size(); ++k) {
        for (int leaf : plan.segments[k].weights) {
            const std::string name = ggml_get_name(leafs[static_cast<size_t>(leaf)]);
            ++weights;
            if (name.rfind("double_blocks.", 0) == 0 || name.rfind("single_blocks.", 0) == 0) {
                const std::string block = name.substr(0, name.find('.', name.find('.') + 1));
                EXPECT_EQ(block, plan.segments[k].name) << name;
            } else if (name.rfind("final_layer.", 0) == 0) {
                EXPECT_EQ(plan.segments[k].name, "output") << name;
            } else {
                EXPECT_EQ(k, 0u) << name;  // embedders: the first segment
            }
        }
    }
    EXPECT_EQ(weights, d.weights().count());
}

TEST_F(FluxTiny, FlashAttentionAndDeviceGeluStayClose) {
    Case flash;
    flash.options.flash_attention = true;
    EXPECT_EQ(expect_matches("", flash, kFlashTolerance), 4);
    Case device;
    device.options.target = nn::ComputeTarget::Device;
    EXPECT_EQ(expect_matches("", device, kDeviceGeluTolerance), 4);
}

TEST_F(FluxTiny, RopeTableMatchesReference) {
    auto d = test::declare_network<models::FluxDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    auto check = [&](const std::string& prefix_, const std::vector<models::FluxTokenGrid>& refs) {
        const auto cos = test::fixture_tensor(io, prefix_ + "rope.cos");
        const auto sin = test::fixture_tensor(io, prefix_ + "rope.sin");
        const std::vector<int64_t> shape = models::flux_rope_shape((*d)->config(), 7, {4, 4}, refs);
        ASSERT_EQ(shape, (std::vector<int64_t>{32, cos.shape[0], 2}));
        const auto table = models::flux_rope_table((*d)->config(), 7, {4, 4}, refs);
        ASSERT_EQ(table.size(), static_cast<size_t>(2 * 32 * cos.shape[0]));
        const int64_t n = cos.shape[0];
        double worst = 0;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t j = 0; j < 16; ++j) {
                const float c = cos.values[t * 16 + j], s = sin.values[t * 16 + j];
                const float* row = table.data() + t * 32;
                const float* signed_sin = table.data() + n * 32 + t * 32;
                for (double e : {row[2 * j] - c, row[2 * j + 1] - c, signed_sin[2 * j] + s, signed_sin[2 * j + 1] - s})
                    worst = std::max(worst, std::fabs(e));
            }
        }
        EXPECT_LT(worst, 1e-6) << prefix_;
    };
    check("", {});
    // Kontext: references 4x6 and 6x2 latents, 3x2 and 1x3 patches (w x h).
    check("kontext2.", {{3, 2}, {1, 3}});

    // --increase-ref-index: reference i has index i + 1 and starts at row and
    // column 0. Axis 0's first pair turns by the index itself (theta^0), the
    // other axes' first pairs by row and column.
    const std::vector<models::FluxTokenGrid> refs = {{3, 2}, {1, 3}};
    const auto plain = models::flux_rope_table((*d)->config(), 7, {4, 4}, refs);
    const auto numbered = models::flux_rope_table((*d)->config(), 7, {4, 4}, refs, true);
    ASSERT_EQ(plain.size(), numbered.size());
    const std::vector<int>& axes = (*d)->config().axes_dim;
    const int64_t D = 32, first_ref = 7 + 16, second_ref = first_ref + 6;
    // The first reference is the same either way (index 1, no offset) ...
    for (int64_t k = first_ref * D; k < second_ref * D; ++k) EXPECT_EQ(plain[k], numbered[k]) << k;
    // ... the second moves to index 2, column 0 (it sat right of the first, from column 3).
    EXPECT_NEAR(numbered[second_ref * D], std::cos(2.0), 1e-6);
    EXPECT_NEAR(plain[second_ref * D], std::cos(1.0), 1e-6);
    EXPECT_NEAR(numbered[second_ref * D + axes[0] + axes[1]], 1.0, 1e-6);
    EXPECT_NEAR(plain[second_ref * D + axes[0] + axes[1]], std::cos(3.0), 1e-6);
    EXPECT_NEAR(numbered[second_ref * D + axes[0]], 1.0, 1e-6);  // row 0 both ways
    EXPECT_NEAR(plain[second_ref * D + axes[0]], 1.0, 1e-6);
}

TEST_F(FluxSchnellTiny, MatchesReferenceWithoutGuidance) {
    auto d = test::declare_network<models::FluxDit>(weights, prefix, std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_FALSE((*d)->config().guidance_embed);
    EXPECT_EQ((*d)->config().vec_dim, 24);
    EXPECT_EQ(expect_matches("", {}), 4);
}

TEST_F(ChromaTiny, ConfigIsReadFromTheWeights) {
    auto d = test::declare_network<models::FluxDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const models::FluxConfig& c = (*d)->config();
    EXPECT_TRUE(c.chroma);
    EXPECT_FALSE(c.guidance_embed);
    EXPECT_EQ(c.vec_dim, 0);
    EXPECT_EQ(c.approximator_in, 64);
    EXPECT_EQ(c.approximator_hidden, 48);
    EXPECT_EQ(c.approximator_layers, 2);
    EXPECT_EQ(c.chroma_modulations(), 3 * 2 + 12 * 2 + 2);
    EXPECT_EQ(d->weights().has("final_layer.adaLN_modulation.1.weight"), false);
}

TEST_F(ChromaTiny, IndexTableMatchesReference) {
    auto d = test::declare_network<models::FluxDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const auto expected = test::fixture_tensor(io, "chroma.index");
    EXPECT_EQ(models::chroma_index_shape((*d)->config()), (std::vector<int64_t>{32, 32}));
    const auto table = models::chroma_index_table((*d)->config());
    ASSERT_EQ(table.size(), expected.values.size());
    double worst = 0;
    for (size_t i = 0; i < table.size(); ++i) worst = std::max(worst, std::fabs(double(table[i]) - expected.values[i]));
    EXPECT_LT(worst, 1e-6);
}

TEST_F(ChromaTiny, MatchesReferenceBlockByBlock) { EXPECT_EQ(expect_matches("", {}), 4); }

TEST_F(ChromaTiny, PaddingMaskMatchesReference) {
    EXPECT_EQ(expect_matches("masked.", {{}, "masked.txt_mask", {}}), 4);
    Case flash{{}, "masked.txt_mask", {}};
    flash.options.flash_attention = true;
    expect_matches("masked.", flash, kFlashTolerance);
}

TEST_F(ChromaTiny, NullGuidanceIsZeroGuidance) {
    auto d = dit();
    auto run = [&](bool zeros) {
        runtime::GraphSession session;
        models::FluxInputs in = inputs(*d, session, {});
        const float zero[2] = {0.0f, 0.0f};
        if (zeros) in.guidance = session.input(GGML_TYPE_F32, {2}, zero);
        auto out = d->build(session.ctx(), in, {});
        EXPECT_TRUE(out.ok()) << out.error().message;
        EXPECT_TRUE(session.run(*compute, *out).ok());
        return runtime::GraphSession::read(*out);
    };
    EXPECT_EQ(run(false), run(true));
}

TEST(FluxAttentionMask, RealTokensAndImageAttendPaddingDoesNot) {
    const auto mask = models::flux_attention_mask({1, 1, 0, 1, 0, 0}, 2, 2);
    EXPECT_EQ(models::flux_attention_mask_shape(3, 2, 2), (std::vector<int64_t>{5, 2}));
    ASSERT_EQ(mask.size(), 10u);
    const float inf = INFINITY;
    EXPECT_EQ(mask, (std::vector<float>{0, 0, -inf, 0, 0, 0, -inf, -inf, 0, 0}));
}

TEST_F(FluxTiny, InputsAreAContract) {
    auto d = dit();
    auto schnell_file = open_file("flux_schnell_tiny.safetensors");
    auto schnell = test::declare_network<models::FluxDit>(schnell_file, "model.diffusion_model.", std::nullopt);
    ASSERT_TRUE(schnell.ok()) << schnell.error().message;
    auto chroma_file = open_file("chroma_tiny.safetensors");
    auto chroma = test::declare_network<models::FluxDit>(chroma_file, "", std::nullopt);
    ASSERT_TRUE(chroma.ok()) << chroma.error().message;

    runtime::GraphSession session;
    ggml_context* ctx = session.ctx();
    const models::FluxInputs good = inputs(*d, session, {});
    ASSERT_TRUE(d->build(ctx, good, {}).ok());
    auto expect_error = [&](const models::FluxDit& net, const models::FluxInputs& in, const std::string& message) {
        auto r = net.build(ctx, in, {});
        ASSERT_FALSE(r.ok()) << message;
        EXPECT_EQ(r.error().message, message);
        EXPECT_EQ(r.error().kind, ErrorKind::InvalidRequest);
    };
    auto with = [&](auto change) {
        models::FluxInputs in = good;
        change(in);
        return in;
    };
    expect_error(*d, with([&](auto& in) { in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 8, 8, 4, 2); }),
                 "Flux: x has 4 channels, the network takes 16");
    expect_error(*d, with([&](auto& in) { in.x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 7, 8, 16, 2); }),
                 "Flux: x size 7x8 is not a multiple of 2");
    expect_error(*d, with([&](auto& in) { in.refs = {ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 4, 4, 16, 1)}; }),
                 "Flux: reference latent 0 has batch 1, x has 2");
    expect_error(*d, with([&](auto& in) { in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4096, 7, 2); }),
                 "Flux: context is 4096 wide, the network takes 32");
    expect_error(*d, with([&](auto& in) { in.context = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 32, 7, 1); }),
                 "Flux: context must be ne [32, tokens, 2]");
    expect_error(*d, with([&](auto& in) { in.timesteps = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1); }),
                 "Flux: timesteps must be ne [2]");
    expect_error(*d, with([&](auto& in) { in.guidance = nullptr; }),
                 "Flux: this network has guidance_in and needs guidance (ne [2])");
    expect_error(*d, with([&](auto& in) { in.pooled = nullptr; }), "Flux: this network needs pooled (ne [24, batch])");
    expect_error(*d, with([&](auto& in) { in.pooled = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 768, 2); }),
                 "Flux: pooled must be ne [24, 2]");
    expect_error(*d, with([&](auto& in) { in.rope = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 32, 22, 2); }),
                 "Flux: rope is [32, 22, 2], these tokens need F32 [32, 23, 2] (flux_rope_table)");
    // A reference latent adds tokens: the rope of x alone no longer fits.
    expect_error(*d, with([&](auto& in) { in.refs = {ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 4, 6, 16, 2)}; }),
                 "Flux: rope is [32, 23, 2], these tokens need F32 [32, 29, 2] (flux_rope_table)");
    expect_error(*d, with([&](auto& in) { in.mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 23, 1); }),
                 "Flux: mask is [23], expected F32 [23, 2]");
    expect_error(*d, with([&](auto& in) { in.chroma_index = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 32); }),
                 "Flux: chroma_index is for Chroma only; must be null");
    // schnell has no guidance_in; Chroma no vector_in and needs its index table.
    expect_error(**schnell, good, "Flux: this network has no guidance_in (schnell); guidance must be null");
    expect_error(**chroma, with([&](auto& in) { in.guidance = nullptr; }),
                 "Flux: this network (Chroma) has no vector_in; pooled must be null");
    expect_error(**chroma, with([&](auto& in) {
        in.guidance = nullptr;
        in.pooled = nullptr;
    }),
                 "Flux: Chroma needs chroma_index, F32 [32, 32] (chroma_index_table)");
}

TEST(FluxDit, RefusesWhatIsNotAFluxDit) {
    auto sdxl = open_file("sdxl_tiny.safetensors");
    auto r = test::declare_network<models::FluxDit>(sdxl, "model.diffusion_model.", std::nullopt);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(r.error().message,
              "no Flux DiT under 'model.diffusion_model.' (img_in, txt_in, final_layer.linear or double_blocks.0 "
              "missing or malformed)");
    // The tiny Flux under the wrong prefix is not one either.
    auto flux = open_file("flux_tiny.safetensors");
    EXPECT_FALSE(test::declare_network<models::FluxDit>(flux, "model.diffusion_model.", std::nullopt).ok());

    // Heads of 32 without the axes metadata: BFL defines RoPE axes for 128 only.
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : flux.tensors()) {
        const uint8_t* data = flux.data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    test::TempDir dir;
    auto bare = io::ModelFile::open({dir.write("bare.safetensors", test::build_safetensors(entries))});
    ASSERT_TRUE(bare.ok()) << bare.error().message;
    auto no_axes = test::declare_network<models::FluxDit>(*bare, "", std::nullopt);
    ASSERT_FALSE(no_axes.ok());
    EXPECT_EQ(no_axes.error().message,
              "Flux DiT under '': heads of 32 need RoPE axes (BFL's are for 128); set metadata kiln.flux.axes_dim");
    auto odd = io::ModelFile::open(
        {dir.write("odd.safetensors", test::build_safetensors(entries, {{"kiln.flux.axes_dim", "8,12,10"}}))});
    ASSERT_TRUE(odd.ok()) << odd.error().message;
    auto bad_axes = test::declare_network<models::FluxDit>(*odd, "", std::nullopt);
    ASSERT_FALSE(bad_axes.ok());
    EXPECT_EQ(bad_axes.error().message, "Flux DiT under '': RoPE axes must be three and sum to the head width 32");
}

}  // namespace
}  // namespace kiln
