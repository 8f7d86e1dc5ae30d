// runtime/graph_flops: exact FLOP counts of small graphs, and the same count
// for the two ways kiln computes convolutions and attention.
#include "runtime/graph_flops.h"

#include <gtest/gtest.h>

#include "nn/attention.h"
#include "nn/layers.h"

namespace kiln {
namespace {

using runtime::graph_flops;
using runtime::node_flops;

// A metadata-only ggml context: graphs are built, never computed.
class GraphFlops : public ::testing::Test {
  protected:
    void SetUp() override {
        ggml_init_params params{};
        params.mem_size = 4 * 1024 * 1024;
        params.no_alloc = true;
        ctx_ = ggml_init(params);
        ASSERT_NE(ctx_, nullptr);
    }
    void TearDown() override { ggml_free(ctx_); }

    ggml_tensor* tensor(ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2 = 1, int64_t ne3 = 1) {
        return ggml_new_tensor_4d(ctx_, type, ne0, ne1, ne2, ne3);
    }
    uint64_t flops_of(ggml_tensor* output) {
        ggml_cgraph* graph = ggml_new_graph(ctx_);
        ggml_build_forward_expand(graph, output);
        return graph_flops(graph);
    }

    ggml_context* ctx_ = nullptr;
};

TEST_F(GraphFlops, MatmulCountsTwoPerMultiplyAdd) {
    // [5 x 3] by [3 x 4]: 5 * 4 dot products of length 3.
    ggml_tensor* weights = tensor(GGML_TYPE_F32, 3, 4);
    ggml_tensor* activations = tensor(GGML_TYPE_F32, 3, 5);
    EXPECT_EQ(flops_of(ggml_mul_mat(ctx_, weights, activations)), 2u * 3 * 4 * 5);
}

TEST_F(GraphFlops, BatchedMatmulCountsEveryBatch) {
    ggml_tensor* a = tensor(GGML_TYPE_F32, 8, 6, 2, 3);
    ggml_tensor* b = tensor(GGML_TYPE_F32, 8, 5, 2, 3);
    EXPECT_EQ(flops_of(ggml_mul_mat(ctx_, a, b)), 2u * 8 * 6 * 5 * (2 * 3));
}

TEST_F(GraphFlops, BroadcastWeightsCountOncePerActivationBatch) {
    // A linear layer over a batch of 4: the 2-D weight serves every batch.
    ggml_tensor* weights = tensor(GGML_TYPE_F16, 8, 6);
    ggml_tensor* activations = tensor(GGML_TYPE_F32, 8, 5, 4);
    EXPECT_EQ(flops_of(ggml_mul_mat(ctx_, weights, activations)), 2u * 8 * 6 * 5 * 4);
}

TEST_F(GraphFlops, OnlyMatrixProductsAreCounted) {
    ggml_tensor* product = ggml_mul_mat(ctx_, tensor(GGML_TYPE_F32, 3, 4), tensor(GGML_TYPE_F32, 3, 5));  // [4, 5]
    ggml_tensor* second = ggml_mul_mat(ctx_, tensor(GGML_TYPE_F32, 4, 2), product);                       // [2, 5]
    ggml_tensor* out = ggml_soft_max(ctx_, ggml_add(ctx_, second, second));
    EXPECT_EQ(flops_of(out), 2u * 3 * 4 * 5 + 2u * 4 * 2 * 5);
    EXPECT_EQ(node_flops(out), 0u);
}

TEST_F(GraphFlops, DirectConvolution) {
    ggml_tensor* kernel = tensor(GGML_TYPE_F32, 3, 3, 2, 5);  // [KW, KH, IC, OC]
    ggml_tensor* input = tensor(GGML_TYPE_F32, 8, 8, 2, 1);
    ggml_tensor* out = ggml_conv_2d_direct(ctx_, kernel, input, 1, 1, 1, 1, 1, 1);  // [8, 8, 5, 1]
    EXPECT_EQ(flops_of(out), 2u * (3 * 3 * 2) * (8 * 8 * 5));
}

TEST_F(GraphFlops, KilnConvolutionsCountAsTheirMatrixProducts) {
    // nn::conv2d lowers to im2col + mul_mat (and a 1x1 kernel to a plain
    // product): the same work as a direct convolution.
    for (int kernel_size : {3, 1}) {
        nn::Conv2d conv;
        conv.weight = tensor(GGML_TYPE_F16, kernel_size, kernel_size, 4, 6);
        conv.padding = kernel_size / 2;
        ggml_tensor* input = tensor(GGML_TYPE_F32, 8, 8, 4, 2);
        const uint64_t expected = 2u * (kernel_size * kernel_size * 4) * (8 * 8 * 6 * 2);
        EXPECT_EQ(flops_of(nn::conv2d(ctx_, nn::ComputeTarget::Cpu, conv, input)), expected)
            << kernel_size << "x" << kernel_size;
    }
}

TEST_F(GraphFlops, FlashAttention) {
    const int64_t d = 16, n_q = 10, n_kv = 7, heads = 4, batch = 2;
    ggml_tensor* q = tensor(GGML_TYPE_F32, d, n_q, heads, batch);
    ggml_tensor* k = tensor(GGML_TYPE_F16, d, n_kv, heads, batch);
    ggml_tensor* v = tensor(GGML_TYPE_F16, d, n_kv, heads, batch);
    ggml_tensor* out = ggml_flash_attn_ext(ctx_, q, k, v, nullptr, 0.25f, 0.0f, 0.0f);
    EXPECT_EQ(flops_of(out), 2u * 2 * d * n_q * n_kv * heads * batch);
}

TEST_F(GraphFlops, AttentionCountsTheSameWithOrWithoutFlash) {
    const int64_t dim = 32, n_q = 12, n_kv = 9, batch = 2;
    const int heads = 4;
    ggml_tensor* q = tensor(GGML_TYPE_F32, dim, n_q, batch);
    ggml_tensor* k = tensor(GGML_TYPE_F32, dim, n_kv, batch);
    ggml_tensor* v = tensor(GGML_TYPE_F32, dim, n_kv, batch);
    const uint64_t expected = 2u * 2 * dim * n_q * n_kv * batch;  // heads * head_dim = dim
    nn::AttentionOptions options;
    options.heads = heads;
    EXPECT_EQ(flops_of(nn::attention(ctx_, q, k, v, options)), expected);
    options.flash = true;
    EXPECT_EQ(flops_of(nn::attention(ctx_, q, k, v, options)), expected);
}

}  // namespace
}  // namespace kiln
