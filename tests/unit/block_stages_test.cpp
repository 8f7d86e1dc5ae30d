// The BlockStage parts of an evaluation (models/network.h) that the DiTs
// build for a block-level step cache, on the tiny golden models: the Front
// stage's stream and residual, then the Rest stage on that stream gives the
// Whole evaluation's prediction exactly, and the Cached stage on the stream
// and the middle residual Rest gave reproduces it up to rounding. Flux,
// FLUX.2 and Z-Image through the pipeline's graph builder on their pipeline
// parts; SD3's MMDiT through it and, with three joint blocks (two of them
// cached, the pre-only last one after), as declared networks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "declared_network.h"
#include "flux_tiny.h"
#include "golden.h"
#include "models/nets/flux2_dit.h"
#include "models/nets/flux_dit.h"
#include "models/nets/mmdit.h"
#include "models/nets/z_image_dit.h"
#include "nn/graph_inputs.h"
#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "pipeline/session_inputs.h"
#include "runtime/device_budget.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

using models::BlockSplit;
using models::BlockStage;
using models::DiffusionShape;
using models::DiffusionTensors;
using pipeline::Model;
using pipeline::ModelPaths;
using pipeline::SessionInputs;
using test::golden_path;

// Values in [-1, 1) from a small LCG: the same for every stage's graph.
std::vector<float> pattern(int64_t count, uint32_t seed) {
    std::vector<float> v(static_cast<size_t>(count));
    uint32_t state = seed * 2654435761u + 12345u;
    for (float& f : v) {
        state = state * 1664525u + 1013904223u;
        f = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return v;
}

// Sets every per-evaluation input of one stage's graph: the same latent,
// sigma, text and vectors whatever the stage, and the stream and residual
// the stage reads.
void set_inputs(runtime::GraphSession& session, const DiffusionTensors& t, const std::vector<float>* stream,
                const std::vector<float>* residual) {
    auto fill = [&](ggml_tensor* tensor, uint32_t seed) {
        if (!tensor) return;
        const std::vector<float> v = pattern(ggml_nelements(tensor), seed);
        session.set_input(tensor, v.data());
    };
    fill(t.x, 1);
    fill(t.context, 2);
    fill(t.y, 3);
    for (size_t i = 0; i < t.refs.size(); ++i) fill(t.refs[i], 10 + static_cast<uint32_t>(i));
    if (t.timesteps) {
        const std::vector<float> sigma(static_cast<size_t>(ggml_nelements(t.timesteps)), 0.625f);
        session.set_input(t.timesteps, sigma.data());
    }
    if (t.guidance) {
        const std::vector<float> guidance(static_cast<size_t>(ggml_nelements(t.guidance)), 3.5f);
        session.set_input(t.guidance, guidance.data());
    }
    for (auto [tensor, values] : {std::pair{t.stream, stream}, std::pair{t.residual, residual}}) {
        if (!tensor) continue;
        ASSERT_NE(values, nullptr) << "the stage takes an input the test did not give";
        ASSERT_EQ(static_cast<int64_t>(values->size()), ggml_nelements(tensor));
        session.set_input(tensor, values->data());
    }
}

// One stage of one evaluation at `shape` (with its split): the graph's output.
using Evaluate = std::function<std::vector<float>(const DiffusionShape& shape, const std::vector<float>* stream,
                                                  const std::vector<float>* residual)>;

// Through the pipeline's graph builder and the model's executor.
Evaluate through_pipeline(Model& model) {
    return [&model](const DiffusionShape& shape, const std::vector<float>* stream, const std::vector<float>* residual) {
        auto g = pipeline::build_diffusion_graph(model, shape);
        EXPECT_TRUE(g.ok()) << g.error().message;
        if (!g.ok()) return std::vector<float>{};
        set_inputs(*g->session, *g, stream, residual);
        const Status ran = g->session->run(model.diffusion_compute(), g->out);
        EXPECT_TRUE(ran.ok()) << ran.error().message;
        return ran.ok() ? runtime::GraphSession::read(g->out) : std::vector<float>{};
    };
}


Evaluate through_network(const models::DiffusionNetwork& net, runtime::Compute& compute) {
    return [&net, &compute](const DiffusionShape& shape, const std::vector<float>* stream,
                            const std::vector<float>* residual) {
        runtime::DeviceLedger ledger(nullptr, std::nullopt);
        runtime::GraphSession session;
        SessionInputs inputs(session);
        auto t = net.build(inputs, shape);
        EXPECT_TRUE(t.ok()) << t.error().message;
        if (!t.ok()) return std::vector<float>{};
        set_inputs(session, *t, stream, residual);
        // Every input placed, as the pipeline's executor places them: a
        // stage leaves some out of its graph (Rest and Cached the latent's).
        Status ran = session.bind_inputs(compute.buffer_type(), ledger);
        if (ran.ok()) ran = session.run(compute, t->out);
        EXPECT_TRUE(ran.ok()) << ran.error().message;
        return ran.ok() ? runtime::GraphSession::read(t->out) : std::vector<float>{};
    };
}

bool all_zeros(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float f) { return f == 0.0f; });
}

// Whole, then Front, Rest and Cached at `shape` split at `front` and `back`:
// the stream is ne [width, tokens, batch]; the prediction has `prediction`
// values.
void expect_stages_add_up(const Evaluate& evaluate, DiffusionShape shape, int front, int back, int64_t width,
                          int64_t tokens, int64_t prediction) {
    const size_t stream_values = static_cast<size_t>(width * tokens * shape.batch);
    shape.split = {BlockStage::Whole, front, back};
    const std::vector<float> whole = evaluate(shape, nullptr, nullptr);
    ASSERT_EQ(whole.size(), static_cast<size_t>(prediction));

    shape.split.stage = BlockStage::Front;
    const std::vector<float> front_out = evaluate(shape, nullptr, nullptr);
    ASSERT_EQ(front_out.size(), 2 * stream_values) << "Front: the stream, then its residual";
    const std::vector<float> stream(front_out.begin(), front_out.begin() + static_cast<std::ptrdiff_t>(stream_values));
    const std::vector<float> front_residual(front_out.begin() + static_cast<std::ptrdiff_t>(stream_values),
                                            front_out.end());
    EXPECT_FALSE(all_zeros(front_residual)) << "the front blocks changed nothing";

    shape.split.stage = BlockStage::Rest;
    const std::vector<float> rest = evaluate(shape, &stream, nullptr);
    ASSERT_EQ(rest.size(), whole.size() + stream_values) << "Rest: the prediction, then the middle residual";
    const std::vector<float> rest_prediction(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(whole.size()));
    const std::vector<float> middle(rest.begin() + static_cast<std::ptrdiff_t>(whole.size()), rest.end());
    EXPECT_EQ(rest_prediction, whole) << "Front then Rest is not the Whole evaluation";

    shape.split.stage = BlockStage::Cached;
    const std::vector<float> cached = evaluate(shape, &stream, &middle);
    ASSERT_EQ(cached.size(), whole.size());
    EXPECT_LT(test::relative_error(cached, whole), 1e-5) << "the back blocks on stream + middle residual";
}

// ---- Through the pipeline -----------------------------------------------------

std::unique_ptr<Model> load(const ModelPaths& paths) {
    auto loaded = Model::load(paths, test::golden_model_options());
    EXPECT_TRUE(loaded.ok()) << loaded.error().message;
    return loaded.ok() ? std::move(loaded).value() : nullptr;
}

// Flux.1-dev's tiny parts (flux_pipeline_test.cpp): 2 double and 2 single blocks.
TEST(BlockStages, FluxStagesAddUpToTheWholeEvaluation) {
    auto model = load(test::flux_tiny_parts());
    ASSERT_TRUE(model);
    const auto* dit = dynamic_cast<const models::FluxDit*>(&model->diffusion());
    ASSERT_NE(dit, nullptr);
    const models::FluxConfig& c = dit->config();
    EXPECT_EQ(model->diffusion().capabilities().cache_blocks, 4);
    DiffusionShape shape{8, 8, 2, 6};
    const int64_t patches = (8 / c.patch) * (8 / c.patch);
    expect_stages_add_up(through_pipeline(*model), shape, 1, 1, c.hidden, 6 + patches, 8 * 8 * c.latent_channels * 2);
}

// FLUX.2 [klein]'s tiny parts (flux2_pipeline_test.cpp): 2 double and 2
// single blocks, here with a reference latent's tokens after the image's.
TEST(BlockStages, Flux2StagesAddUpToTheWholeEvaluation) {
    ModelPaths paths;
    paths.diffusion_model = golden_path("models/flux2_tiny.safetensors");
    paths.vae = golden_path("models/flux2_ae_tiny.safetensors");
    paths.llm = golden_path("models/flux2_klein_qwen3_tiny.safetensors");
    paths.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
    auto model = load(paths);
    ASSERT_TRUE(model);
    const auto* dit = dynamic_cast<const models::Flux2Dit*>(&model->diffusion());
    ASSERT_NE(dit, nullptr);
    const models::Flux2Config& c = dit->config();
    EXPECT_EQ(model->diffusion().capabilities().cache_blocks, 4);
    DiffusionShape shape{4, 4, 2, 6};
    shape.refs = {{2, 3}};
    expect_stages_add_up(through_pipeline(*model), shape, 1, 1, c.hidden, 6 + 4 * 4 + 2 * 3, 4 * 4 * c.channels * 2);
}

// Z-Image Turbo's tiny parts (z_image_pipeline_test.cpp): the refiners are
// the embeddings; its 2 main layers are the blocks.
TEST(BlockStages, ZImageStagesAddUpToTheWholeEvaluation) {
    ModelPaths paths;
    paths.diffusion_model = golden_path("pipeline/z_image_tiny/z_image_turbo_dit.safetensors");
    paths.vae = golden_path("pipeline/flux_tiny/ae.safetensors");
    paths.llm = golden_path("pipeline/z_image_tiny/qwen3.safetensors");
    auto model = load(paths);
    ASSERT_TRUE(model);
    const auto* dit = dynamic_cast<const models::ZImageDit*>(&model->diffusion());
    ASSERT_NE(dit, nullptr);
    const models::ZImageConfig& c = dit->config();
    EXPECT_EQ(model->diffusion().capabilities().cache_blocks, 2);
    DiffusionShape shape{8, 8, 2, 5};
    const int64_t slots = models::z_image_padded((8 / c.patch) * (8 / c.patch)) + models::z_image_padded(5);
    expect_stages_add_up(through_pipeline(*model), shape, 1, 0, c.dim, slots, 8 * 8 * c.latent_channels() * 2);
}

// SD3.5's tiny release file (sd3_pipeline_test.cpp): 2 joint blocks, the
// last pre-only, so one block is cached and the pre-only one runs with the
// final layer. (A cache refuses Fn=1 Bn=0 here, leaving no block to cache;
// the stages still add up, the middle residual all zeros.)
TEST(BlockStages, Sd3PipelineMmditStagesAddUpToTheWholeEvaluation) {
    ModelPaths paths;
    paths.model = {golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors")};
    paths.clip_l = golden_path("pipeline/flux_tiny/clip_l.safetensors");
    paths.clip_g = golden_path("pipeline/sd3_tiny/clip_g.safetensors");
    paths.t5xxl = golden_path("pipeline/flux_tiny/t5xxl.safetensors");
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    auto model = load(paths);
    ASSERT_TRUE(model);
    const auto* dit = dynamic_cast<const models::Mmdit*>(&model->diffusion());
    ASSERT_NE(dit, nullptr);
    const models::MmditConfig& c = dit->config();
    ASSERT_EQ(c.depth, 2);
    EXPECT_EQ(model->diffusion().capabilities().cache_blocks, 1);
    DiffusionShape shape{8, 8, 2, 7};
    const int64_t patches = (8 / c.patch) * (8 / c.patch);
    expect_stages_add_up(through_pipeline(*model), shape, 1, 0, c.hidden, 7 + patches, 8 * 8 * c.channels * 2);
}

// ---- Declared MMDiTs of three joint blocks ----------------------------------------

class MmditBlockStages : public ::testing::TestWithParam<const char*> {};

// SD3.5 Large's and Medium's (MMDiT-X) tiny MMDiTs (mmdit_test.cpp): blocks 0
// and 1 keep the text stream and are cached; block 2 is pre-only.
TEST_P(MmditBlockStages, StagesAddUpToTheWholeEvaluation) {
    auto file = io::ModelFile::open({golden_path(std::string("models/") + GetParam() + ".safetensors")});
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto compute = test::golden_cpu();
    auto declared = test::declare_network<models::Mmdit>(*file, "", GGML_TYPE_F32);
    ASSERT_TRUE(declared.ok()) << declared.error().message;
    const test::DeclaredNetwork<models::Mmdit> d = std::move(declared).value();
    ASSERT_TRUE(d.weights().load(compute->weights_backend()).ok());
    const models::MmditConfig& c = d->config();
    ASSERT_EQ(c.depth, 3);
    EXPECT_EQ(d->capabilities().cache_blocks, 2);
    DiffusionShape shape{8, 8, 2, 7};
    const int64_t patches = (8 / c.patch) * (8 / c.patch);
    const Evaluate evaluate = through_network(*d, *compute);
    expect_stages_add_up(evaluate, shape, 1, 0, c.hidden, 7 + patches, 8 * 8 * c.channels * 2);
    // Skip-layer guidance's pass: a cached block left out, then the pre-only one.
    for (std::vector<int> skipped : {std::vector<int>{1}, std::vector<int>{2}}) {
        SCOPED_TRACE("skip_blocks " + std::to_string(skipped.front()));
        shape.skip_blocks = skipped;
        expect_stages_add_up(evaluate, shape, 1, 0, c.hidden, 7 + patches, 8 * 8 * c.channels * 2);
    }
}

INSTANTIATE_TEST_SUITE_P(Stability, MmditBlockStages, ::testing::Values("sd35_tiny", "sd35x_tiny"));

// A stage that reads the stream is refused without it, naming the shape it needs.
TEST(BlockStages, AStageWithoutItsStreamIsRefused) {
    auto file = io::ModelFile::open({golden_path("models/sd35_tiny.safetensors")});
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto declared = test::declare_network<models::Mmdit>(*file, "", std::nullopt);
    ASSERT_TRUE(declared.ok()) << declared.error().message;
    const test::DeclaredNetwork<models::Mmdit> d = std::move(declared).value();
    const models::MmditConfig& c = d->config();
    runtime::GraphSession session;
    SessionInputs inputs(session);
    DiffusionShape shape{8, 8, 1, 7};
    shape.split = {BlockStage::Whole, 1, 0};
    auto whole = d->build(inputs, shape);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    models::MmditInputs in{whole->x, whole->timesteps, whole->y, whole->context};
    const std::vector<int32_t> rows = models::mmdit_positions(c, 4, 4);
    in.positions = session.input(GGML_TYPE_I32, {16}, rows.data());
    models::MmditBuildOptions options;
    options.split = {BlockStage::Cached, 1, 0};
    in.stream = session.input(GGML_TYPE_F32, {c.hidden, 7 + 16, 1}, pattern(c.hidden * 23, 4).data());
    auto refused = d->build(session.ctx(), in, options);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("residual"), std::string::npos) << refused.error().message;
    in.residual = session.input(GGML_TYPE_F32, {c.hidden, 7 + 15, 1}, pattern(c.hidden * 22, 5).data());
    refused = d->build(session.ctx(), in, options);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("residual is"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace kiln
