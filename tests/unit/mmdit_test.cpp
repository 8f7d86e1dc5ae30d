// SD3's MMDiT against the PyTorch reference (training/reference/mmdit.py,
// written from Stability's sd3.5 mmditx.py), on the tiny random-weight
// models training/make_sd3_fixtures.py writes with Stability's tensor names:
// SD3.5 Large's (QK norm), SD3.5 Medium's MMDiT-X (attn2) and SD3 Medium's
// (no QK norm, Stability's fixed head width), block by block, with a block
// dropped (skip-layer guidance) and on a grid whose position-embedding crop
// is off-centre. Also the config read from the weights, the segments the
// memory system sees, the conditioning join of sd3_infer.get_cond, the
// MMDiT-X in diffusers' names, and the errors for inputs and files that do
// not fit.
#include "models/nets/mmdit.h"

#include <gtest/gtest.h>

#include "declared_network.h"
#include "golden.h"
#include "io/gguf_writer.h"
#include "pipeline/conditioner.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

// F32 weights against a float64 reference: float32 rounding and summation order.
constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// The position embedding's rows for a latent x, made by kiln.
ggml_tensor* positions(runtime::GraphSession& session, const models::MmditConfig& c, const ggml_tensor* x) {
    const std::vector<int32_t> rows = models::mmdit_positions(c, x->ne[0] / c.patch, x->ne[1] / c.patch);
    return session.input(GGML_TYPE_I32, {static_cast<int64_t>(rows.size())}, rows.data());
}

struct MmditGolden : ::testing::TestWithParam<const char*> {
    io::ModelFile weights = open_file(std::string(GetParam()) + ".safetensors");
    io::ModelFile io = open_file(std::string(GetParam()) + "_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::Mmdit> dit() {
        auto d = test::declare_network<models::Mmdit>(weights, "", GGML_TYPE_F32);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name, int64_t batch = 0) {
        auto v = test::fixture_tensor(io, name);
        if (batch > 0) {  // the first `batch` items (a 1-item run of a 2-item fixture)
            v.values.resize(v.values.size() / static_cast<size_t>(v.shape[0]) * static_cast<size_t>(batch));
            v.shape[0] = batch;
        }
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    // The relative error of one unconstrained run of x against `out_name`.
    double relative_error_of_run(const std::string& x_name, const std::string& out_name) {
        auto d = dit();
        runtime::GraphSession session;
        models::MmditInputs in{input(session, x_name), input(session, "sigma"), input(session, "y"),
                               input(session, "context")};
        in.positions = positions(session, d->config(), in.x);
        auto out = d->build(session.ctx(), in, {});
        if (!out.ok() || !session.run(*compute, *out).ok()) return 1e9;
        return test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, out_name).values);
    }

    // Runs one case; checks `out_name` and, with `blocks`, every
    // block.<cut> of the fixture; returns the number of blocks compared.
    int expect_matches(const std::string& x_name, const std::string& out_name, const models::MmditBuildOptions& options,
                       bool blocks) {
        auto d = dit();
        runtime::GraphSession session;
        models::MmditInputs in;
        in.x = input(session, x_name);
        const int64_t B = in.x->ne[3];
        // The tall case is the second batch item's conditioning on a 1-item batch.
        const bool second = B == 1;
        auto item = [&](const std::string& name) {
            auto v = test::fixture_tensor(io, name);
            const size_t per_item = v.values.size() / static_cast<size_t>(v.shape[0]);
            std::vector<float> one(v.values.begin() + (second ? static_cast<long>(per_item) : 0),
                                   v.values.begin() + (second ? 2 : 1) * static_cast<long>(per_item));
            v.shape[0] = 1;
            return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), one.data());
        };
        in.timesteps = second ? item("sigma") : input(session, "sigma");
        in.y = second ? item("y") : input(session, "y");
        in.context = second ? item("context") : input(session, "context");
        in.positions = positions(session, d->config(), in.x);
        auto out = d->build(session.ctx(), in, options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, out_name).values),
                  kTolerance)
            << out_name;
        int compared = 0;
        for (const io::TensorInfo& ref : io.tensors()) {
            if (!blocks || ref.name.rfind("block.", 0) != 0) continue;
            const std::string block = ref.name.substr(6);
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                      kTolerance)
                << block;
            ++compared;
        }
        return compared;
    }
};

TEST_P(MmditGolden, MatchesReferenceBlockByBlock) {
    const int depth = static_cast<int>(dit()->config().depth);
    EXPECT_EQ(expect_matches("x", "out", {}, true), depth);
}

TEST_P(MmditGolden, SkipLayerGuidanceDropsWholeBlocks) {
    models::MmditBuildOptions options;
    options.skip_blocks = {1};
    expect_matches("x", "slg.out", options, false);
}

// A 5 x 2 patch grid: the position embedding cropped at top 1, left 3 of 8 x 8.
TEST_P(MmditGolden, PositionEmbeddingIsCroppedAroundTheCentre) { expect_matches("tall.x", "tall.out", {}, false); }

// The DiT as a GGUF (kiln's -M convert, as city96's tools write
// Stability's names): the same network, and at Q8_0 the same output to
// quantization's rounding (a few percent through three blocks 32 wide).
TEST_P(MmditGolden, GgufFilesGiveTheSameNetwork) {
    test::TempDir dir;
    for (const auto& [type, tolerance] :
         {std::pair<ggml_type, double>{GGML_TYPE_F32, kTolerance}, {GGML_TYPE_Q8_0, 4e-2}}) {
        io::GgufWriteOptions write;
        write.type = type;
        const std::string path = dir.file(std::string(GetParam()) + "-" + ggml_type_name(type) + ".gguf");
        ASSERT_TRUE(io::write_gguf(weights, path, write).ok());
        auto gguf = io::ModelFile::open({path});
        ASSERT_TRUE(gguf.ok()) << gguf.error().message;
        weights = std::move(gguf).value();
        const double error = relative_error_of_run("x", "out");
        EXPECT_LT(error, tolerance) << ggml_type_name(type);
    }
}

INSTANTIATE_TEST_SUITE_P(Stability, MmditGolden, ::testing::Values("sd35_tiny", "sd35x_tiny", "sd3_tiny"));

// The DiT in diffusers' SD3Transformer2DModel names
// (training/make_sd3_diffusers_fixture.py, transcribed from diffusers'
// convert_sd3_to_diffusers.py): SD3.5 Medium's MMDiT-X, whose attn2 q, k
// and v are split and whose last block's context stream and final layer
// hold (scale, shift), is the same network block by block.
struct MmditDiffusers : MmditGolden {};

TEST_P(MmditDiffusers, DiffusersNamesGiveTheSameNetwork) {
    weights = open_file(std::string(GetParam()) + "_diffusers.safetensors");
    const int depth = static_cast<int>(dit()->config().depth);
    EXPECT_TRUE(dit()->config().diffusers_names);
    EXPECT_EQ(expect_matches("x", "out", {}, true), depth);
}

INSTANTIATE_TEST_SUITE_P(Stability, MmditDiffusers, ::testing::Values("sd35x_tiny"));

TEST(Mmdit, ConfigIsReadFromTheWeights) {
    struct Want {
        const char* file;
        int64_t hidden, heads, mlp;
        int depth;
        bool qk_norm;
        std::vector<bool> attn2;
    };
    for (const Want& w : {Want{"sd35_tiny", 32, 2, 128, 3, true, {false, false, false}},
                          Want{"sd35x_tiny", 32, 2, 128, 3, true, {true, true, false}},
                          Want{"sd3_tiny", 64, 1, 64, 2, false, {false, false}}}) {
        const io::ModelFile file = open_file(std::string(w.file) + ".safetensors");
        auto d = test::declare_network<models::Mmdit>(file, "", std::nullopt);
        ASSERT_TRUE(d.ok()) << d.error().message;
        const models::MmditConfig& c = (*d)->config();
        EXPECT_EQ(c.hidden, w.hidden) << w.file;
        EXPECT_EQ(c.heads, w.heads) << w.file;
        EXPECT_EQ(c.mlp_hidden, w.mlp) << w.file;
        EXPECT_EQ(c.depth, w.depth) << w.file;
        EXPECT_EQ(c.qk_norm, w.qk_norm) << w.file;
        EXPECT_EQ(c.x_self_attention, w.attn2) << w.file;
        EXPECT_EQ(c.channels, 16);
        EXPECT_EQ(c.patch, 2);
        EXPECT_EQ(c.context_dim, 48);
        EXPECT_EQ(c.pooled_dim, 40);
        EXPECT_EQ(c.pos_embed_max_size, 8);
        const models::DiffusionCapabilities& can = (*d)->capabilities();
        EXPECT_EQ(can.vector_width, 40);
        EXPECT_EQ(can.size_stride, 2);
        EXPECT_EQ(can.max_latent_side, 16);
        EXPECT_TRUE(can.skip_layers && can.joint_attention);
        EXPECT_FALSE(can.guidance || can.reference_images || can.text_mask);
    }
}

// Zero inputs of a W x H latent (in latent pixels) and 7 text tokens.
models::MmditInputs zero_inputs(runtime::GraphSession& session, const models::MmditConfig& c, int64_t w, int64_t h) {
    auto zeros = [&](const std::vector<int64_t>& ne) {
        int64_t n = 1;
        for (int64_t d : ne) n *= d;
        const std::vector<float> values(static_cast<size_t>(n), 0.0f);
        return session.input(GGML_TYPE_F32, ne, values.data());
    };
    models::MmditInputs in{zeros({w, h, c.channels, 1}), zeros({1}), zeros({c.pooled_dim, 1}),
                           zeros({c.context_dim, 7, 1})};
    if (w / c.patch <= c.pos_embed_max_size) in.positions = positions(session, c, in.x);
    return in;
}

// The crop of an M x M table around the centre, row by row (the fixture's
// tall case: 2 x 5 patches of 8 x 8 from row 1, column 3).
TEST(Mmdit, PositionRowsAreTheCentredCrop) {
    models::MmditConfig c;
    c.pos_embed_max_size = 8;
    EXPECT_EQ(models::mmdit_positions(c, 2, 5), (std::vector<int32_t>{11, 12, 19, 20, 27, 28, 35, 36, 43, 44}));
    EXPECT_EQ(models::mmdit_positions(c, 8, 1), (std::vector<int32_t>{24, 25, 26, 27, 28, 29, 30, 31}));
}

TEST(Mmdit, EachJointBlockIsASegment) {
    const io::ModelFile file = open_file("sd35x_tiny.safetensors");
    auto d = test::declare_network<models::Mmdit>(file, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    runtime::GraphSession session;
    auto out = (*d)->build(session.ctx(), zero_inputs(session, (*d)->config(), 8, 6), {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    const runtime::GraphPlan plan = runtime::build_graph_plan(session.graph(*out), d->weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    std::vector<std::string> names;
    size_t weights = 0;
    for (const runtime::PlanSegment& segment : plan.segments) {
        names.push_back(segment.name);
        weights += segment.weights.size();
    }
    EXPECT_EQ(names, (std::vector<std::string>{"joint_blocks.0", "joint_blocks.1", "joint_blocks.2", "output"}));
    EXPECT_EQ(weights, d->weights().count());
}

TEST(Mmdit, InputsThatDoNotFitAndOtherNetworksAreRefused) {
    const io::ModelFile file = open_file("sd35_tiny.safetensors");
    auto d = test::declare_network<models::Mmdit>(file, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    runtime::GraphSession session;
    // 9 patches across: the position embedding covers 8.
    auto wide = (*d)->build(session.ctx(), zero_inputs(session, (*d)->config(), 18, 6), {});
    ASSERT_FALSE(wide.ok());
    EXPECT_NE(wide.error().message.find("at most 16 latent pixels"), std::string::npos) << wide.error().message;
    // Not a whole number of patches.
    EXPECT_FALSE((*d)->build(session.ctx(), zero_inputs(session, (*d)->config(), 7, 6), {}).ok());

    const io::ModelFile flux2 = open_file("flux2_tiny.safetensors");
    auto refused = test::declare_network<models::Mmdit>(flux2, "", std::nullopt);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("missing x_embedder.proj.weight"), std::string::npos)
        << refused.error().message;
}

// sd3_infer.get_cond's join, as the SD3 family's conditioning makes it: the
// CLIPs side by side padded to the context width, T5 after them, and 77
// zero rows for a missing T5; the pooled vectors one after the other.
TEST(Sd3Conditioning, JoinIsTheReferences) {
    const io::ModelFile io = open_file("sd3_join_io.safetensors");
    auto states = [&](const std::string& name, int group) {
        const auto v = test::fixture_tensor(io, name);
        return pipeline::EncoderStates{v.values, v.shape[2], v.shape[1], group};
    };
    std::vector<pipeline::EncoderStates> all = {states("l", 0), states("g", 0), states("t5", 1)};
    pipeline::Conditioning c;
    pipeline::join_encoder_states(all, 32, c);
    EXPECT_EQ(c.tokens, 11);
    EXPECT_EQ(c.width, 32);
    EXPECT_EQ(c.hidden, test::fixture_tensor(io, "context").values);

    std::vector<pipeline::EncoderStates> no_t5 = {states("l", 0), states("g", 0), {{}, 0, 77, 1}};
    pipeline::join_encoder_states(no_t5, 32, c);
    EXPECT_EQ(c.tokens, 83);
    EXPECT_EQ(c.hidden, test::fixture_tensor(io, "context_no_t5").values);
}

}  // namespace
}  // namespace kiln
