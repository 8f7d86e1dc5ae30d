// nn/attention: taking the scores a head and a block of queries at a time
// (AttentionOptions::scores_block_bytes) gives the numbers of the one-tensor
// product, and actually cuts the graph into blocks; a mask of -inf on some
// keys is attention over the other keys alone.
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <cmath>
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

constexpr int64_t kDim = 2 * 16;

// Attention on ggml's CPU backend of q [kDim, n_q, batch], k and v
// [kDim, n_k, batch], with `mask` ([n_k, n_q, 1, batch]) unless it is empty.
Result attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& mask, int64_t n_q, int64_t n_k, int64_t batch, AttentionOptions options) {
    ggml_init_params params{};
    params.mem_size = 4096 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kDim, n_q, batch);
    ggml_tensor* tk = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kDim, n_k, batch);
    ggml_tensor* tv = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kDim, n_k, batch);
    if (!mask.empty()) options.mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n_k, n_q, 1, batch);
    ggml_tensor* out = attention(ctx, tq, tk, tv, options);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    ggml_backend_tensor_set(tq, q.data(), 0, ggml_nbytes(tq));
    ggml_backend_tensor_set(tk, k.data(), 0, ggml_nbytes(tk));
    ggml_backend_tensor_set(tv, v.data(), 0, ggml_nbytes(tv));
    if (options.mask) ggml_backend_tensor_set(options.mask, mask.data(), 0, ggml_nbytes(options.mask));
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

std::vector<float> random_values(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(n);
    for (float& x : values) x = normal(rng);
    return values;
}

// Attention of fixed random q, k, v (a batch of 2).
Result run_attention(int64_t n_q, int64_t n_k, int heads, int64_t scores_block_bytes) {
    const int64_t batch = 2;
    std::mt19937 rng(11);
    const auto q = random_values(static_cast<size_t>(kDim * n_q * batch), rng);
    const auto k = random_values(static_cast<size_t>(kDim * n_k * batch), rng);
    const auto v = random_values(static_cast<size_t>(kDim * n_k * batch), rng);
    AttentionOptions options;
    options.heads = heads;
    options.scores_block_bytes = scores_block_bytes;
    return attend(q, k, v, {}, n_q, n_k, batch, options);
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

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    return worst;
}

TEST(Attention, MaskedKeysAreKeysLeftOut) {
    // Two batch entries with different keys masked (-inf): the same numbers
    // as attention over the kept keys alone, entry by entry.
    const std::vector<std::vector<bool>> keep = {{true, true, false, true, false, true, true, true, false, true},
                                                 {true, false, false, false, true, true, true, true, true, true}};
    const int64_t n_q = 12, n_k = 10, batch = 2;
    std::mt19937 rng(5);
    const auto q = random_values(static_cast<size_t>(kDim * n_q * batch), rng);
    const auto k = random_values(static_cast<size_t>(kDim * n_k * batch), rng);
    const auto v = random_values(static_cast<size_t>(kDim * n_k * batch), rng);
    std::vector<float> mask(static_cast<size_t>(n_k * n_q * batch), 0.0f);  // ne [n_k, n_q, 1, batch]
    AttentionOptions options;
    options.heads = 2;
    std::vector<float> subset;
    for (int64_t b = 0; b < batch; ++b) {
        std::vector<float> kb, vb;
        for (int64_t j = 0; j < n_k; ++j) {
            if (!keep[static_cast<size_t>(b)][static_cast<size_t>(j)]) {
                for (int64_t i = 0; i < n_q; ++i) mask[static_cast<size_t>((b * n_q + i) * n_k + j)] = -INFINITY;
                continue;
            }
            kb.insert(kb.end(), k.begin() + (b * n_k + j) * kDim, k.begin() + (b * n_k + j + 1) * kDim);
            vb.insert(vb.end(), v.begin() + (b * n_k + j) * kDim, v.begin() + (b * n_k + j + 1) * kDim);
        }
        const std::vector<float> qb(q.begin() + b * n_q * kDim, q.begin() + (b + 1) * n_q * kDim);
        const auto part = attend(qb, kb, vb, {}, n_q, static_cast<int64_t>(kb.size()) / kDim, 1, options).values;
        subset.insert(subset.end(), part.begin(), part.end());
    }
    EXPECT_LT(max_difference(attend(q, k, v, mask, n_q, n_k, batch, options).values, subset), 1e-6);
    // In blocks of 3 query rows, each with its own rows of its entry's mask.
    AttentionOptions blocks = options;
    blocks.scores_block_bytes = 3 * n_k * 4;
    const Result in_blocks = attend(q, k, v, mask, n_q, n_k, batch, blocks);
    EXPECT_GT(in_blocks.products, 2 * 2 * 2);
    EXPECT_LT(max_difference(in_blocks.values, subset), 1e-6);
    // Flash attention takes the mask, K and V in F16.
    AttentionOptions flash = options;
    flash.flash = true;
    EXPECT_LT(max_difference(attend(q, k, v, mask, n_q, n_k, batch, flash).values, subset), 1e-2);
}

}  // namespace
}  // namespace kiln::nn
