// The graph planner: segments at cut markers, what each reads, layout
// hashing and the plan cache.
#include "runtime/graph_plan.h"

#include <gtest/gtest.h>

#include "io/model_file.h"
#include "nn/layers.h"
#include "runtime/graph_session.h"
#include "runtime/module_weights.h"

namespace kiln {
namespace {

constexpr const char* kPrefix = "cond_stage_model.transformer.text_model.final_layer_norm.";

struct Fixture {
    io::ModelFile file = io::ModelFile::open({KILN_DEFAULT_MODEL}).value();
    runtime::ModuleWeights weights{file, kPrefix, std::nullopt};
    ggml_tensor* scale = weights.require("weight", {128});
};

// x -> x*w (cut "scaled") -> + x (cut "sum") -> *2: three segments.
ggml_tensor* build(runtime::GraphSession& s, const Fixture& f, int64_t rows, bool stray_leaf = false) {
    const std::vector<float> data(static_cast<size_t>(128 * rows), 1.0f);
    ggml_tensor* x = s.input(GGML_TYPE_F32, {128, rows}, data.data(), "x");
    ggml_tensor* a = nn::mark_cut(ggml_mul(s.ctx(), x, f.scale), "scaled");
    ggml_tensor* b = nn::mark_cut(ggml_add(s.ctx(), a, x), "sum");
    if (stray_leaf) b = ggml_add(s.ctx(), b, ggml_new_tensor_2d(s.ctx(), GGML_TYPE_F32, 128, rows));
    return ggml_scale(s.ctx(), b, 2.0f);
}

TEST(GraphPlan, SegmentsEndAtCutMarkers) {
    Fixture f;
    runtime::GraphSession s;
    ggml_cgraph* graph = s.graph(build(s, f, 3));
    const runtime::GraphPlan plan = runtime::build_graph_plan(graph, f.weights);
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    ASSERT_EQ(plan.segments.size(), 3u);
    EXPECT_EQ(plan.segments[0].name, "scaled");
    EXPECT_EQ(plan.segments[1].name, "sum");
    EXPECT_EQ(plan.segments[2].name, "output");
    EXPECT_EQ(plan.segments[0].begin, 0);
    EXPECT_EQ(plan.segments[2].end, plan.n_nodes);
    // The weight is read by the first segment only.
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    ASSERT_EQ(plan.segments[0].weights.size(), 1u);
    EXPECT_EQ(leafs[plan.segments[0].weights[0]], f.scale);
    EXPECT_TRUE(plan.segments[1].weights.empty());
    // "sum" reads "scaled": the activation a later segment needs.
    const int scaled = plan.segments[0].end - 1, sum = plan.segments[1].end - 1;
    EXPECT_NE(std::find(plan.reads[sum].begin(), plan.reads[sum].end(), scaled), plan.reads[sum].end());
}

TEST(GraphPlan, EqualLayoutsHashAlikeOtherShapesDoNot) {
    Fixture f;
    runtime::GraphSession a, b, c;
    const uint64_t ha = runtime::graph_layout_hash(a.graph(build(a, f, 3)));
    const uint64_t hb = runtime::graph_layout_hash(b.graph(build(b, f, 3)));
    const uint64_t hc = runtime::graph_layout_hash(c.graph(build(c, f, 4)));
    EXPECT_EQ(ha, hb);
    EXPECT_NE(ha, hc);
}

TEST(GraphPlan, CacheBuildsOncePerLayout) {
    Fixture f;
    runtime::PlanCache cache(2);
    for (int run = 0; run < 3; ++run) {
        runtime::GraphSession s;
        cache.get(s.graph(build(s, f, 3)), f.weights);
    }
    EXPECT_EQ(cache.builds(), 1);
    EXPECT_EQ(cache.hits(), 2);
    runtime::GraphSession other;
    cache.get(other.graph(build(other, f, 5)), f.weights);
    EXPECT_EQ(cache.builds(), 2);
}

TEST(GraphPlan, ALeafThatIsNeitherWeightNorInputRunsWhole) {
    Fixture f;
    runtime::GraphSession s;
    const runtime::GraphPlan plan = runtime::build_graph_plan(s.graph(build(s, f, 3, /*stray_leaf=*/true)), f.weights);
    EXPECT_FALSE(plan.valid);
    EXPECT_NE(plan.invalid_reason.find("is neither a weight nor an input"), std::string::npos) << plan.invalid_reason;
}

}  // namespace
}  // namespace kiln
