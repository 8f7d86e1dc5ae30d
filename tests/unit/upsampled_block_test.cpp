// A decoder's upsampler and the residual block after it computed in bands
// on the CPU (nn::upsampled_block_start_cpu), against the same block built
// from whole tensors: the upsample, its convolution, the group norm and
// SiLU, the block's first convolution and its 1x1 shortcut. The statistics
// come from one pass in double instead of ggml's two, so the numbers agree
// to float rounding, not bit for bit; the compute buffer never holds the
// upsampler's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_graph.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "nn/upsampled_block_cpu.h"

namespace kiln::nn {
namespace {

struct Case {
    int64_t w, h, in, mid, out, n;  // y ne [w, h, in, n]; the upsampler makes `mid` channels, the block `out`
    int groups;
    int64_t max_patch_bytes;  // the fused build's bands
};

struct Computed {
    std::vector<float> h, residual;
    size_t compute_bytes = 0;
};

Computed compute(const Case& c, int threads, bool fused) {
    ggml_init_params params{};
    params.mem_size = 32768 * ggml_tensor_overhead() + ggml_graph_overhead_custom(32768, false);
    params.no_alloc = true;
    ggml_context* weights_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    auto conv = [&](int64_t k, int64_t in, int64_t out) {
        Conv2d layer;
        layer.weight = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, k, k, in, out);
        layer.bias = ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, out);
        layer.padding = k / 2;
        return layer;
    };
    const Conv2d upsample = conv(3, c.in, c.mid), conv1 = conv(3, c.mid, c.out), shortcut = conv(1, c.mid, c.out);
    const Norm norm{ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, c.mid),
                    ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, c.mid)};
    ggml_tensor* y = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, c.w, c.h, c.in, c.n);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(weights_ctx, cpu);
    unsigned seed = 1;
    for (ggml_tensor* t : {upsample.weight, upsample.bias, conv1.weight, conv1.bias, shortcut.weight, shortcut.bias,
                           norm.weight, norm.bias, y}) {
        std::mt19937 rng(seed++);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        std::vector<float> values(static_cast<size_t>(ggml_nelements(t)));
        // The input off zero and spread, so the normalisation matters.
        for (float& v : values) v = t == y ? 3.0f * uniform(rng) + 2.0f : uniform(rng);
        ggml_backend_tensor_set(t, values.data(), 0, ggml_nbytes(t));
    }
    ggml_tensor* h = nullptr;
    ggml_tensor* residual = nullptr;
    if (fused) {
        auto start = upsampled_block_start_cpu(ctx, upsample, y, norm, c.groups, 1e-6f, conv1, shortcut,
                                               c.max_patch_bytes);
        EXPECT_TRUE(start.has_value());
        if (start) {
            h = start->h;
            residual = start->residual;
        }
    } else {
        ggml_tensor* x = conv2d(ctx, ComputeTarget::Cpu, upsample, upsample_nearest_2x(ctx, y));
        h = conv2d(ctx, ComputeTarget::Cpu, conv1, ggml_silu(ctx, group_norm(ctx, norm, x, c.groups, 1e-6f)));
        residual = conv2d(ctx, ComputeTarget::Cpu, shortcut, x);
    }
    Computed r;
    if (h && residual) {
        test::CpuGraphResult graph = test::compute_on_cpu(cpu, ctx, {residual, h}, 32768);
        r = {std::move(graph.outputs[1]), std::move(graph.outputs[0]), graph.compute_bytes};
    }
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_free(weights_ctx);
    return r;
}

// The largest difference relative to the largest value.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double largest = 0, difference = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(b[i])));
        difference = std::max(difference, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    return largest > 0 ? difference / largest : difference;
}

TEST(UpsampledBlock, BandsGiveTheWholeBlocksNumbers) {
    const Case cases[] = {
        {9, 7, 6, 8, 5, 1, 4, 1},         // one row a band (the smallest limit): 14 bands of a 14-row x
        {13, 5, 4, 12, 6, 2, 5, 20000},   // uneven groups (5 of 12 channels), two images, bands of a few rows
        {8, 6, 3, 8, 4, 1, 2, 1 << 30},   // one band: the slab is the whole of x
    };
    for (const Case& c : cases) {
        for (int threads : {1, 3}) {
            SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h) + ", limit " +
                         std::to_string(c.max_patch_bytes) + ", " + std::to_string(threads) + " threads");
            const Computed fused = compute(c, threads, true);
            const Computed whole = compute(c, threads, false);
            const size_t outputs = static_cast<size_t>(4 * c.w * c.h * c.out * c.n);
            ASSERT_EQ(fused.h.size(), outputs);
            ASSERT_EQ(fused.residual.size(), outputs);
            EXPECT_LT(relative_difference(fused.h, whole.h), 1e-5);
            EXPECT_LT(relative_difference(fused.residual, whole.residual), 1e-5);
            // The whole graph holds x, the upsampler's output; bands do not
            // (one band's slab is all of x).
            const size_t x_bytes = static_cast<size_t>(4 * c.w * c.h * c.mid * c.n) * sizeof(float);
            if (c.max_patch_bytes < (1 << 30)) EXPECT_LT(fused.compute_bytes + x_bytes / 2, whole.compute_bytes);
        }
    }
}

// A misfit (a shortcut that is not 1x1) is left to the caller.
TEST(UpsampledBlock, OtherShapesAreLeftToTheCaller) {
    ggml_init_params params{16 * ggml_tensor_overhead(), nullptr, true};
    ggml_context* ctx = ggml_init(params);
    Conv2d up{ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 3, 4, 8), nullptr, 1, 1};
    Conv2d conv1{ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 3, 8, 4), nullptr, 1, 1};
    Conv2d shortcut{ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 3, 8, 4), nullptr, 1, 1};
    Norm norm{ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8), ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8)};
    ggml_tensor* y = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 4, 4, 4, 1);
    EXPECT_FALSE(upsampled_block_start_cpu(ctx, up, y, norm, 4, 1e-6f, conv1, shortcut, 1 << 20).has_value());
    ggml_free(ctx);
}

}  // namespace
}  // namespace kiln::nn
