// A convolution of a group norm + SiLU, or of a nearest 2x upsample, with
// that input folded into the CPU unfold (nn::conv2d_of_group_norm_silu,
// nn::conv2d_of_upsample_2x): the unfused graph's numbers bit for bit, for
// odd sizes, a width the SiLU's vector kernel does not divide, uneven
// channel groups and several threads, with a compute buffer that never
// holds the input the fold spares.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cpu_graph.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "nn/layers.h"

namespace kiln::nn {
namespace {

struct Computed {
    std::vector<float> y;
    size_t compute_bytes = 0;
};

std::vector<float> random_values(size_t count, unsigned seed, float scale, float offset) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(count);
    for (float& v : values) v = uniform(rng) * scale + offset;
    return values;
}

// Builds `make(ctx, layer, norm, x)` over random weights and input x ne
// [w, h, in, n] and computes it on ggml's CPU backend.
Computed compute(int64_t w, int64_t h, int64_t in, int64_t out, int64_t n, int threads,
                 const std::function<ggml_tensor*(ggml_context*, const Conv2d&, const Norm&, ggml_tensor*)>& make) {
    ggml_init_params params{};
    params.mem_size = 8192 * ggml_tensor_overhead() + ggml_graph_overhead_custom(8192, false);
    params.no_alloc = true;
    ggml_context* weights_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    Conv2d layer;
    layer.weight = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, 3, 3, in, out);
    layer.bias = ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, out);
    layer.padding = 1;
    Norm norm{ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, in), ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, in)};
    ggml_tensor* x = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, w, h, in, n);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(weights_ctx, cpu);
    unsigned seed = 1;
    for (ggml_tensor* t : {layer.weight, layer.bias, norm.weight, norm.bias, x}) {
        // The input off zero and spread, so the normalisation matters.
        const bool input = t == x;
        const auto v = random_values(ggml_nelements(t), seed++, input ? 3.0f : 1.0f, input ? 2.0f : 0.0f);
        ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
    }
    test::CpuGraphResult graph = test::compute_on_cpu(cpu, ctx, {make(ctx, layer, norm, x)}, 8192);
    Computed r{std::move(graph.outputs[0]), graph.compute_bytes};
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_free(weights_ctx);
    return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The folds' limit, so that these small inputs are folded (and banded).
constexpr int64_t kSmallLimit = 4096;

TEST(ConvFolds, GroupNormSiluFoldedIntoTheUnfoldGivesTheUnfusedBits) {
    struct Case {
        int64_t w, h, in, out, n;
        int groups;
    } cases[] = {
        {37, 11, 8, 5, 1, 4},    // a width of 37: the SiLU's vector kernel leaves a scalar tail in every row
        {16, 9, 12, 6, 2, 5},    // 5 groups of 12 channels: ggml's ceil split (3, 3, 3, 3, 0)
        {24, 20, 32, 8, 1, 32},  // one channel a group
    };
    for (const Case& c : cases) {
        for (int threads : {1, 3}) {
            SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h) + "x" + std::to_string(c.in) + ", " +
                         std::to_string(c.groups) + " groups, " + std::to_string(threads) + " threads");
            const Computed fused =
                compute(c.w, c.h, c.in, c.out, c.n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
                    return conv2d_of_group_norm_silu(ctx, ComputeTarget::Cpu, layer, norm, x, c.groups, 1e-6f,
                                                     kSmallLimit);
                });
            const Computed unfused =
                compute(c.w, c.h, c.in, c.out, c.n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
                    return conv2d_cpu_in_row_bands(
                        ctx, layer, ggml_silu_inplace(ctx, group_norm(ctx, norm, x, c.groups, 1e-6f)), kSmallLimit);
                });
            EXPECT_TRUE(same_bits(fused.y, unfused.y));
            // The unfused graph holds the normalised input; the fused one does not.
            EXPECT_LT(fused.compute_bytes + size_t(c.w * c.h * c.in * c.n * 4) / 2, unfused.compute_bytes);
        }
    }
}

// A residual block's r + conv(silu(group_norm(x))): folded, each band is
// added into r in place, the same bits as ggml_add of the whole convolution,
// and neither the convolution's output nor the sum is a tensor of its own.
// Added into x itself, the bands would change rows the next band's unfold
// still reads: that is computed the unfused way.
TEST(ConvFolds, BandsAddedIntoTheResidualGiveTheAddsBits) {
    for (int threads : {1, 3}) {
        SCOPED_TRACE(std::to_string(threads) + " threads");
        const int64_t w = 61, h = 47, c = 8, n = 2;
        const auto residual = [](ggml_context* ctx, ggml_tensor* x) { return ggml_scale(ctx, x, 0.5f); };
        const Computed fused = compute(w, h, c, c, n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
            return conv2d_of_group_norm_silu(ctx, ComputeTarget::Cpu, layer, norm, x, 4, 1e-6f, kSmallLimit,
                                             residual(ctx, x));
        });
        const Computed unfused = compute(w, h, c, c, n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
            return ggml_add(ctx, residual(ctx, x),
                            conv2d_of_group_norm_silu(ctx, ComputeTarget::Cpu, layer, norm, x, 4, 1e-6f, kSmallLimit));
        });
        const Computed into_x = compute(w, h, c, c, n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
            return conv2d_of_group_norm_silu(ctx, ComputeTarget::Cpu, layer, norm, x, 4, 1e-6f, kSmallLimit, x);
        });
        const Computed into_x_unfused =
            compute(w, h, c, c, n, threads, [&](auto* ctx, auto& layer, auto& norm, auto* x) {
                return ggml_add(ctx, x,
                                conv2d_of_group_norm_silu(ctx, ComputeTarget::Cpu, layer, norm, x, 4, 1e-6f,
                                                          kSmallLimit));
            });
        EXPECT_TRUE(same_bits(into_x.y, into_x_unfused.y));
        ASSERT_EQ(fused.y.size(), size_t(w * h * c * n));
        EXPECT_TRUE(same_bits(fused.y, unfused.y));
        // The unfused graph holds the convolution's output beside r (the sum
        // goes into one of them).
        EXPECT_LE(fused.compute_bytes + size_t(w * h * c * n * 4), unfused.compute_bytes);
    }
}

TEST(ConvFolds, UpsampleFoldedIntoTheUnfoldGivesTheUnfusedBits) {
    for (int threads : {1, 3}) {
        SCOPED_TRACE(std::to_string(threads) + " threads");
        const int64_t w = 13, h = 7, in = 6, out = 4, n = 2;
        const Computed fused = compute(w, h, in, out, n, threads, [&](auto* ctx, auto& layer, auto&, auto* x) {
            return conv2d_of_upsample_2x(ctx, ComputeTarget::Cpu, layer, x, kSmallLimit);
        });
        const Computed unfused = compute(w, h, in, out, n, threads, [&](auto* ctx, auto& layer, auto&, auto* x) {
            return conv2d_cpu_in_row_bands(ctx, layer, upsample_nearest_2x(ctx, x), kSmallLimit);
        });
        ASSERT_EQ(fused.y.size(), size_t(2 * w * 2 * h * out * n));
        EXPECT_TRUE(same_bits(fused.y, unfused.y));
        // The unfused graph holds the upsample, four times the input.
        EXPECT_LT(fused.compute_bytes + size_t(4 * w * h * in * n * 4) / 2, unfused.compute_bytes);
    }
}

}  // namespace
}  // namespace kiln::nn
