// The FLUX.2 DiT against the PyTorch reference (training/reference/flux2.py,
// written from BFL's flux2 model.py), on the tiny random-weight model
// training/make_flux2_fixtures.py writes with BFL's tensor names: block by
// block, with one and two reference latents, and its RoPE table over four
// unequal axes. Also the config read from the weights, the segments the
// memory system sees, and the errors for weights that are not a FLUX.2 DiT.
#include "models/nets/flux2_dit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "declared_network.h"
#include "golden.h"
#include "io/gguf_writer.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

// F32 weights against a float64 reference: float32 rounding and summation
// order (timestep embeddings and RoPE angles are float32 here).
constexpr double kTolerance = 1e-4;

io::ModelFile open_file_at(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

io::ModelFile open_file(const std::string& name) { return open_file_at(test::golden_path("models/" + name)); }

struct Flux2Tiny : ::testing::Test {
    io::ModelFile weights = open_file("flux2_tiny.safetensors");
    io::ModelFile io = open_file("flux2_tiny_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::Flux2Dit> dit() {
        auto d = test::declare_network<models::Flux2Dit>(weights, "", GGML_TYPE_F32);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name) {
        const auto v = test::fixture_tensor(io, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    // The fixture's inputs as the network takes them, the RoPE table made by kiln.
    models::Flux2Inputs inputs(const models::Flux2Dit& d, runtime::GraphSession& session,
                               const std::vector<std::string>& refs) {
        models::Flux2Inputs in;
        in.x = input(session, "x");
        in.timesteps = input(session, "timesteps");
        in.context = input(session, "context");
        std::vector<models::Flux2Grid> grids;
        for (const std::string& r : refs) {
            in.refs.push_back(input(session, r));
            grids.push_back({in.refs.back()->ne[0], in.refs.back()->ne[1]});
        }
        const int64_t T = in.context->ne[1];
        const models::Flux2Grid grid{in.x->ne[0], in.x->ne[1]};
        const auto rope = models::flux2_rope_table(d.config(), T, grid, grids);
        in.rope = session.input(GGML_TYPE_F32, models::flux2_rope_shape(d.config(), T, grid, grids), rope.data());
        return in;
    }

    // Runs the case; checks `<prefix>out` and every `<prefix>block.<cut>`;
    // returns the number of blocks compared.
    int expect_matches(const std::string& prefix, const std::vector<std::string>& refs,
                       const models::Flux2BuildOptions& options = {}) {
        auto d = dit();
        runtime::GraphSession session;
        auto out = d->build(session.ctx(), inputs(*d, session, refs), options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        EXPECT_LT(
            test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, prefix + "out").values),
            kTolerance)
            << prefix << "out";
        int blocks = 0;
        const std::string block_prefix = prefix + "block.";
        for (const io::TensorInfo& ref : io.tensors()) {
            if (ref.name.rfind(block_prefix, 0) != 0) continue;
            const std::string block = ref.name.substr(block_prefix.size());
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                      kTolerance)
                << prefix << block;
            ++blocks;
        }
        return blocks;
    }
};

TEST_F(Flux2Tiny, ConfigIsReadFromTheWeights) {
    auto d = test::declare_network<models::Flux2Dit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const models::Flux2Config& c = (*d)->config();
    EXPECT_EQ(c.channels, 128);
    EXPECT_EQ(c.hidden, 64);
    EXPECT_EQ(c.heads, 2);
    EXPECT_EQ(c.mlp_hidden, 192);
    EXPECT_EQ(c.context_dim, 48);
    EXPECT_EQ(c.double_blocks, 2);
    EXPECT_EQ(c.single_blocks, 2);
    EXPECT_FALSE(c.guidance_embed);
    EXPECT_EQ(c.axes_dim, (std::vector<int>{4, 10, 10, 8}));
    EXPECT_FLOAT_EQ(c.theta, 2000.0f);
    const models::DiffusionCapabilities& can = (*d)->capabilities();
    EXPECT_EQ(can.in_channels, 128);
    EXPECT_EQ(can.size_stride, 1);
    EXPECT_EQ(can.vector_width, 0);
    EXPECT_FALSE(can.guidance);
    EXPECT_TRUE(can.reference_images);
}

// The four-axis table against the reference's cos and sin of every pair,
// with two references (t = 10 and 20).
TEST_F(Flux2Tiny, RopeTableIsTheReferencesFourAxes) {
    auto d = test::declare_network<models::Flux2Dit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    for (const std::string prefix : {"", "ref2."}) {
        const auto cos = test::fixture_tensor(io, prefix + "rope.cos");
        const auto sin = test::fixture_tensor(io, prefix + "rope.sin");
        std::vector<models::Flux2Grid> refs;
        if (!prefix.empty()) refs = {{4, 2}, {2, 3}};
        const auto table = models::flux2_rope_table((*d)->config(), 7, {5, 3}, refs);
        const int64_t D = (*d)->config().head_dim(), n = cos.shape[0];
        ASSERT_EQ(table.size(), static_cast<size_t>(2 * D * n)) << prefix;
        double worst = 0;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t j = 0; j < D / 2; ++j) {
                const size_t at = static_cast<size_t>(t * D + 2 * j), ref = static_cast<size_t>(t * D / 2 + j);
                worst = std::max({worst, std::fabs(double(table[at]) - cos.values[ref]),
                                  std::fabs(double(table[at + 1]) - cos.values[ref]),
                                  std::fabs(double(table[D * n + at]) + sin.values[ref]),
                                  std::fabs(double(table[D * n + at + 1]) - sin.values[ref])});
            }
        }
        EXPECT_LT(worst, 1e-6) << prefix;
    }
}

TEST_F(Flux2Tiny, MatchesReferenceBlockByBlock) { EXPECT_EQ(expect_matches("", {}), 4); }

TEST_F(Flux2Tiny, ReferenceLatentsMatchReference) {
    // One reference latent (4x2) of another size than x (5x3): its tokens
    // are in every block's output and dropped from the velocity.
    EXPECT_EQ(expect_matches("ref1.", {"ref1.ref0"}), 4);
    // Two, told apart by their time axis alone.
    expect_matches("ref2.", {"ref1.ref0", "ref2.ref1"});
}

TEST_F(Flux2Tiny, EachBlockIsASegmentAndTheModulationIsMadeOnce) {
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
    // The shared modulation layers are read before the first block, once.
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    size_t weights = 0;
    for (size_t k = 0; k < plan.segments.size(); ++k) {
        for (int leaf : plan.segments[k].weights) {
            const std::string name = ggml_get_name(leafs[static_cast<size_t>(leaf)]);
            ++weights;
            if (name.rfind("double_blocks.", 0) == 0 || name.rfind("single_blocks.", 0) == 0) {
                const std::string block = name.substr(0, name.find('.', name.find('.') + 1));
                EXPECT_EQ(block, plan.segments[k].name) << name;
            }
        }
    }
    EXPECT_EQ(weights, d.weights().count());
}

// The DiT as a GGUF (kiln's -M convert, as city96's tools write BFL's names):
// the same network, and at Q8_0 the same output to quantization's rounding.
TEST_F(Flux2Tiny, GgufFilesGiveTheSameNetwork) {
    test::TempDir dir;
    for (const auto& [type, tolerance] :
         {std::pair<ggml_type, double>{GGML_TYPE_F32, kTolerance}, {GGML_TYPE_Q8_0, 2e-2}}) {
        io::GgufWriteOptions write;
        write.type = type;
        const std::string path = dir.file(std::string("flux2_tiny-") + ggml_type_name(type) + ".gguf");
        ASSERT_TRUE(io::write_gguf(weights, path, write).ok());
        const io::ModelFile gguf = open_file_at(path);
        auto d = test::declare_network<models::Flux2Dit>(gguf, "", std::nullopt);
        ASSERT_TRUE(d.ok()) << d.error().message;
        EXPECT_EQ((*d)->config().axes_dim, (std::vector<int>{4, 10, 10, 8})) << "the metadata travels";
        ASSERT_TRUE(d->weights().load(compute->weights_backend()).ok());
        runtime::GraphSession session;
        auto out = (*d)->build(session.ctx(), inputs(**d, session, {}), {});
        ASSERT_TRUE(out.ok()) << out.error().message;
        ASSERT_TRUE(session.run(*compute, *out).ok());
        EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, "out").values),
                  tolerance)
            << ggml_type_name(type);
    }
}

TEST_F(Flux2Tiny, OtherNetworksAndBadShapesAreRefused) {
    const io::ModelFile flux1 = open_file("flux_tiny.safetensors");
    auto refused = test::declare_network<models::Flux2Dit>(flux1, "", std::nullopt);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::BadFile);
    EXPECT_NE(refused.error().message.find("not a FLUX.2 DiT"), std::string::npos) << refused.error().message;
    // Inputs that do not fit: nothing is built.
    auto d = dit();
    runtime::GraphSession session;
    models::Flux2Inputs in = inputs(*d, session, {});
    in.guidance = in.timesteps;
    auto with_guidance = d->build(session.ctx(), in, {});
    ASSERT_FALSE(with_guidance.ok());
    EXPECT_NE(with_guidance.error().message.find("no guidance_in"), std::string::npos);
    in = inputs(*d, session, {"ref1.ref0"});
    in.refs.clear();  // the RoPE table still counts the reference's tokens
    auto wrong_rope = d->build(session.ctx(), in, {});
    ASSERT_FALSE(wrong_rope.ok());
    EXPECT_NE(wrong_rope.error().message.find("rope"), std::string::npos);
}

// FLUX.2 [dev]'s guidance embedding on flux2_tiny's shape with guidance_in
// (training/make_flux2_dev_fixtures.py, F16 weights): vec = time_in(t) +
// guidance_in(g), both embedded at 1000 times their value as BFL's
// timestep_embedding does. Each prompt of the batch reads its own guidance:
// swapped, they give the reference's other output.
TEST(Flux2DevTiny, GuidanceEmbeddingMatchesTheReference) {
    const io::ModelFile weights = open_file("flux2_dev_tiny.safetensors");
    const io::ModelFile io = open_file("flux2_dev_tiny_io.safetensors");
    auto compute = test::golden_cpu();
    auto d = test::declare_network<models::Flux2Dit>(weights, "", GGML_TYPE_F32);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_TRUE((*d)->config().guidance_embed);
    EXPECT_TRUE((*d)->capabilities().guidance);
    EXPECT_EQ((*d)->config().context_dim, 48);
    ASSERT_TRUE(d->weights().load(compute->weights_backend()).ok());
    const std::vector<float> g = test::fixture_tensor(io, "guidance").values;
    ASSERT_EQ(g.size(), 2u);
    for (const auto& [name, guidance] :
         {std::pair<std::string, std::vector<float>>{"out", g}, {"out.guidance_swapped", {g[1], g[0]}}}) {
        runtime::GraphSession session;
        auto input = [&](const std::string& n) {
            const auto v = test::fixture_tensor(io, n);
            return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
        };
        models::Flux2Inputs in;
        in.x = input("x");
        in.timesteps = input("timesteps");
        in.context = input("context");
        in.guidance = session.input(GGML_TYPE_F32, {2}, guidance.data());
        const int64_t T = in.context->ne[1];
        const models::Flux2Grid grid{in.x->ne[0], in.x->ne[1]};
        const auto rope = models::flux2_rope_table((*d)->config(), T, grid, {});
        in.rope = session.input(GGML_TYPE_F32, models::flux2_rope_shape((*d)->config(), T, grid, {}), rope.data());
        auto out = (*d)->build(session.ctx(), in, {});
        ASSERT_TRUE(out.ok()) << out.error().message;
        ASSERT_TRUE(session.run(*compute, *out).ok());
        EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, name).values),
                  kTolerance)
            << name;
        if (name != "out") continue;
        in.guidance = nullptr;  // a network with guidance_in needs it
        auto refused = (*d)->build(session.ctx(), in, {});
        ASSERT_FALSE(refused.ok());
        EXPECT_NE(refused.error().message.find("needs guidance"), std::string::npos) << refused.error().message;
    }
}

}  // namespace
}  // namespace kiln
