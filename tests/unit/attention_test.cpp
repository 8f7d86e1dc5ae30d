// nn/attention: taking the scores a head and a block of queries at a time
// (AttentionOptions::scores_block_bytes) gives the numbers of the one-tensor
// product, and actually cuts the graph into blocks.
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace kiln::nn {
namespace {

struct Result {
    std::vector<float> values;
    int products = 0;  // GGML_OP_MUL_MAT nodes in the graph
};

// Attention of fixed random q, k, v ([dim, N, batch]) on ggml's CPU backend.
Result run_attention(int64_t n_q, int64_t n_k, int heads, int64_t scores_block_bytes) {
    const int64_t dim = 2 * 16, batch = 2;
    ggml_init_params params{};
    params.mem_size = 4096 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dim, n_q, batch);
    ggml_tensor* k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dim, n_k, batch);
    ggml_tensor* v = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dim, n_k, batch);
    AttentionOptions options;
    options.heads = heads;
    options.scores_block_bytes = scores_block_bytes;
    ggml_tensor* out = attention(ctx, q, k, v, options);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (ggml_tensor* t : {q, k, v}) {
        std::vector<float> values(static_cast<size_t>(ggml_nelements(t)));
        for (float& x : values) x = normal(rng);
        ggml_backend_tensor_set(t, values.data(), 0, ggml_nbytes(t));
    }
    EXPECT_EQ(ggml_backend_graph_compute(cpu, graph), GGML_STATUS_SUCCESS);
    Result r;
    r.values.resize(static_cast<size_t>(ggml_nelements(out)));
    ggml_backend_tensor_get(out, r.values.data(), 0, ggml_nbytes(out));
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) r.products += ggml_graph_node(graph, i)->op == GGML_OP_MUL_MAT;
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    return r;
}

TEST(Attention, ScoresInBlocksGiveTheSameNumbers) {
    const int64_t n_q = 100, n_k = 70;
    const Result whole = run_attention(n_q, n_k, 2, 0);
    EXPECT_EQ(whole.products, 2);
    // 30 query rows of 70 keys per block: 4 blocks per head (the last one of
    // 10 rows), for 2 heads x a batch of 2.
    const Result blocks = run_attention(n_q, n_k, 2, 30 * n_k * 4);
    EXPECT_EQ(blocks.products, 2 * 4 * 2 * 2);
    EXPECT_EQ(blocks.values, whole.values);
}

TEST(Attention, SmallScoresStayOneProduct) {
    // Scores under four blocks are not worth cutting.
    const Result r = run_attention(10, 10, 2, 10 * 10 * 2 * 2 * 4);
    EXPECT_EQ(r.products, 2);
}

TEST(Attention, TheNumberOfBlocksIsBounded) {
    // One query row per block would make 2000 blocks: the cap of 128 makes
    // blocks larger instead (32 per head and batch item, 4 of those).
    const Result r = run_attention(500, 40, 2, 40 * 4);
    EXPECT_EQ(r.products, 2 * 32 * 4);
}

}  // namespace
}  // namespace kiln::nn
