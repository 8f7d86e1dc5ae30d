// nn/im2col_cpu: the CPU unfold gives exactly ggml_im2col's F32 patches for
// every geometry kiln's models use (and odd ones), on 1 and several threads.
#include "nn/im2col_cpu.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace kiln::nn {
namespace {

struct Case {
    int64_t iw, ih, ic, n;
    int k, stride, padding;
};

// The unfold of random values by both kernels, as computed on the CPU backend.
void expect_same_patches(const Case& c, int threads) {
    ggml_init_params params{};
    params.mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.iw, c.ih, c.ic, c.n);
    ggml_tensor* kernel = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.k, c.k, c.ic, 3);
    ggml_tensor* reference =
        ggml_im2col(ctx, kernel, x, c.stride, c.stride, c.padding, c.padding, 1, 1, true, GGML_TYPE_F32);
    ggml_tensor* ours = im2col_f32_cpu(ctx, kernel, x, c.stride, c.padding);
    ASSERT_NE(ours, nullptr);
    ASSERT_TRUE(ggml_are_same_shape(reference, ours));
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, reference);
    ggml_build_forward_expand(graph, ours);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    ASSERT_NE(buffer, nullptr);
    std::vector<float> values(static_cast<size_t>(ggml_nelements(x)));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : values) v = uniform(rng);
    ggml_backend_tensor_set(x, values.data(), 0, ggml_nbytes(x));
    ASSERT_EQ(ggml_backend_graph_compute(cpu, graph), GGML_STATUS_SUCCESS);
    std::vector<float> want(static_cast<size_t>(ggml_nelements(reference))), got(want.size());
    ggml_backend_tensor_get(reference, want.data(), 0, ggml_nbytes(reference));
    ggml_backend_tensor_get(ours, got.data(), 0, ggml_nbytes(ours));
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << c.iw << "x" << c.ih << "x" << c.ic << "x" << c.n << " kernel " << c.k << " stride " << c.stride
        << " padding " << c.padding << ", " << threads << " threads";
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
}

TEST(Im2colCpu, MatchesGgmlIm2colExactly) {
    const Case cases[] = {
        {8, 8, 4, 2, 3, 1, 1},    // SD's 3x3 convolution, CFG's batch of two
        {9, 7, 5, 1, 3, 2, 1},    // the UNet's stride-2 downsample, odd sizes
        {10, 10, 3, 1, 3, 2, 0},  // the VAE's downsample (padded before, no padding here)
        {6, 5, 3, 2, 1, 1, 0},    // 1x1
        {7, 9, 2, 3, 5, 1, 2},    // larger kernel and padding
        {3, 3, 2, 1, 3, 1, 1},    // as small as a 3x3 with padding gets
    };
    for (const Case& c : cases) {
        for (int threads : {1, 3}) expect_same_patches(c, threads);
    }
}

TEST(Im2colCpu, DeclinesWhatItCannotUnfold) {
    ggml_init_params params{};
    params.mem_size = 8 * ggml_tensor_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* kernel = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 3, 3, 4, 8);
    ggml_tensor* half = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 8, 8, 4, 1);
    EXPECT_EQ(im2col_f32_cpu(ctx, kernel, half, 1, 1), nullptr);  // F16 input: ggml_im2col's job
    ggml_tensor* x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 8, 8, 4, 1);
    ggml_tensor* strided = ggml_permute(ctx, x, 1, 0, 2, 3);  // elements not contiguous in a row
    EXPECT_EQ(im2col_f32_cpu(ctx, kernel, strided, 1, 1), nullptr);
    ggml_free(ctx);
}

}  // namespace
}  // namespace kiln::nn
