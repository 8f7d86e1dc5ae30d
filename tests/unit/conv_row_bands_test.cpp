// Convolutions on the CPU in bands of output rows (nn::conv2d_cpu_in_row_bands,
// nn::concat_rows_cpu): the same numbers as the whole convolution for every
// band height, against a direct convolution written out here, and a compute
// buffer that holds one band's patches instead of all of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "nn/concat_rows_cpu.h"
#include "nn/layers.h"

namespace kiln::nn {
namespace {

struct Shape {
    int64_t w, h, in, out, n;
    int kernel, stride, padding;
};

std::vector<float> random_values(size_t count, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(count);
    for (float& v : values) v = uniform(rng);
    return values;
}

// PyTorch's Conv2d, loop by loop in double: x [N][C][H][W], weight [OC][C][KH][KW].
std::vector<double> direct_convolution(const Shape& s, const std::vector<float>& x, const std::vector<float>& weight,
                                       const std::vector<float>& bias, int64_t ow_count, int64_t oh_count) {
    std::vector<double> y(static_cast<size_t>(s.n * s.out * oh_count * ow_count));
    for (int64_t n = 0; n < s.n; ++n)
        for (int64_t oc = 0; oc < s.out; ++oc)
            for (int64_t oh = 0; oh < oh_count; ++oh)
                for (int64_t ow = 0; ow < ow_count; ++ow) {
                    double sum = bias[oc];
                    for (int64_t c = 0; c < s.in; ++c)
                        for (int kh = 0; kh < s.kernel; ++kh)
                            for (int kw = 0; kw < s.kernel; ++kw) {
                                const int64_t ih = oh * s.stride + kh - s.padding, iw = ow * s.stride + kw - s.padding;
                                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                                sum += double(x[((n * s.in + c) * s.h + ih) * s.w + iw]) *
                                       weight[((oc * s.in + c) * s.kernel + kh) * s.kernel + kw];
                            }
                    y[((n * s.out + oc) * oh_count + oh) * ow_count + ow] = sum;
                }
    return y;
}

struct Result {
    std::vector<float> y;
    size_t compute_bytes = 0;  // the graph allocator's buffer: every intermediate tensor
    int unfolds = 0;           // custom nodes that are not joins
    int joins = 0;
    int64_t ow = 0, oh = 0;
};

// The banded convolution of random values with at most `max_patch_bytes` of
// patches at once, computed on ggml's CPU backend.
Result run_banded(const Shape& s, int64_t max_patch_bytes, int threads) {
    ggml_init_params params{};
    params.mem_size = 4096 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* weights_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    Conv2d layer;
    layer.weight = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, s.kernel, s.kernel, s.in, s.out);
    layer.bias = ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, s.out);
    layer.stride = s.stride;
    layer.padding = s.padding;
    ggml_tensor* x = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, s.w, s.h, s.in, s.n);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_t inputs = ggml_backend_alloc_ctx_tensors(weights_ctx, cpu);
    const std::vector<float> xv = random_values(ggml_nelements(x), 1), wv = random_values(ggml_nelements(layer.weight), 2),
                             bv = random_values(s.out, 3);
    ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
    ggml_backend_tensor_set(layer.weight, wv.data(), 0, ggml_nbytes(layer.weight));
    ggml_backend_tensor_set(layer.bias, bv.data(), 0, ggml_nbytes(layer.bias));

    ggml_tensor* y = conv2d_cpu_in_row_bands(ctx, layer, x, max_patch_bytes);
    ggml_cgraph* graph = ggml_new_graph_custom(ctx, 4096, false);
    ggml_build_forward_expand(graph, y);
    Result r;
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        if (node->op != GGML_OP_CUSTOM) continue;
        (node->src[0] == x ? r.unfolds : r.joins)++;
    }
    ggml_gallocr_t allocator = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    EXPECT_TRUE(ggml_gallocr_alloc_graph(allocator, graph));
    r.compute_bytes = ggml_gallocr_get_buffer_size(allocator, 0);
    EXPECT_EQ(ggml_backend_graph_compute(cpu, graph), GGML_STATUS_SUCCESS);
    EXPECT_EQ(y->ne[2], s.out);
    EXPECT_EQ(y->ne[3], s.n);
    r.ow = y->ne[0];
    r.oh = y->ne[1];
    r.y.resize(static_cast<size_t>(ggml_nelements(y)));
    ggml_backend_tensor_get(y, r.y.data(), 0, ggml_nbytes(y));

    const std::vector<double> want = direct_convolution(s, xv, wv, bv, r.ow, r.oh);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(want[i] - r.y[i]));
    EXPECT_LT(worst, 2e-4) << "against the direct convolution, limit " << max_patch_bytes;

    ggml_gallocr_free(allocator);
    ggml_backend_buffer_free(inputs);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_free(weights_ctx);
    return r;
}

TEST(ConvRowBands, EveryBandHeightGivesTheWholeConvolutionsNumbers) {
    const Shape shapes[] = {
        {24, 19, 8, 6, 2, 3, 1, 1},  // SD's 3x3 convolution, CFG's batch of two, odd height
        {23, 17, 5, 4, 1, 3, 2, 1},  // the UNet's stride-2 downsample
        {16, 13, 3, 5, 1, 3, 2, 0},  // the VAE's downsample (padded before, none here)
        {12, 11, 4, 3, 1, 5, 1, 2},  // larger kernel and padding
        {20, 9, 6, 5, 2, 1, 1, 0},   // a 1x1 convolution (a large one goes in bands too)
    };
    for (const Shape& s : shapes) {
        const Result whole = run_banded(s, int64_t{1} << 40, 2);
        EXPECT_EQ(whole.unfolds, 1);
        EXPECT_EQ(whole.joins, 0);
        const int64_t row_bytes = s.in * s.kernel * s.kernel * whole.ow * s.n * 4;
        for (int64_t band_rows : {int64_t{1}, int64_t{2}, int64_t{3}, whole.oh - 1}) {
            for (int threads : {1, 3}) {
                const Result banded = run_banded(s, band_rows * row_bytes, threads);
                EXPECT_EQ(banded.unfolds, (whole.oh + band_rows - 1) / band_rows) << band_rows << " rows a band";
                EXPECT_GE(banded.joins, 1);
                // Each output element is the same dot product, whichever band it is in.
                ASSERT_EQ(banded.y.size(), whole.y.size());
                EXPECT_EQ(std::memcmp(banded.y.data(), whole.y.data(), whole.y.size() * sizeof(float)), 0)
                    << band_rows << " rows a band, " << threads << " threads";
            }
        }
    }
}

// A VAE decoder's top-level convolution in small: the compute buffer holds
// one band's patches, not the whole unfold.
TEST(ConvRowBands, ComputeBufferHoldsOneBandsPatches) {
    const Shape s{128, 96, 32, 16, 1, 3, 1, 1};
    const int64_t whole_patches = s.in * 9 * s.w * s.h * 4;  // 14 MiB
    const Result whole = run_banded(s, whole_patches, 2);
    const Result banded = run_banded(s, whole_patches / 8, 2);
    EXPECT_EQ(banded.unfolds, 8);
    EXPECT_GE(whole.compute_bytes, size_t(whole_patches));
    // One band's patches, its product and the output: each band goes into
    // the output as it is made, so the bands are never all held beside it.
    const int64_t output = s.out * s.w * s.h * 4;
    EXPECT_LE(banded.compute_bytes, size_t(whole_patches / 8 + output + 2 * output / 8)) << whole.compute_bytes;
    EXPECT_LT(banded.compute_bytes * 3, whole.compute_bytes);
}

// Many parts (more than one op could take as sources) are joined in order.
TEST(ConcatRows, ManyPartsJoinInOrder) {
    ggml_init_params params{};
    params.mem_size = 256 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    constexpr int kParts = 23;  // over two groups of the most sources a custom op takes
    std::vector<ggml_tensor*> parts;
    int64_t rows = 0;
    for (int i = 0; i < kParts; ++i) {
        parts.push_back(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 5, 1 + i % 3, 4, 2));
        rows += parts.back()->ne[1];
    }
    ggml_tensor* joined = concat_rows_cpu(ctx, parts);
    ASSERT_EQ(joined->ne[1], rows);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, joined);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    // Element (x, row r of part i, plane p) holds a value that names all three.
    for (int i = 0; i < kParts; ++i) {
        std::vector<float> v(static_cast<size_t>(ggml_nelements(parts[i])));
        for (size_t e = 0; e < v.size(); ++e) v[e] = float(i * 100000 + e);
        ggml_backend_tensor_set(parts[i], v.data(), 0, ggml_nbytes(parts[i]));
    }
    ASSERT_EQ(ggml_backend_graph_compute(cpu, graph), GGML_STATUS_SUCCESS);
    std::vector<float> got(static_cast<size_t>(ggml_nelements(joined)));
    ggml_backend_tensor_get(joined, got.data(), 0, ggml_nbytes(joined));
    for (int64_t plane = 0; plane < 8; ++plane) {
        int64_t row = 0;
        for (int i = 0; i < kParts; ++i) {
            for (int64_t r = 0; r < parts[i]->ne[1]; ++r, ++row) {
                for (int64_t x = 0; x < 5; ++x) {
                    const float want = float(i * 100000 + (plane * parts[i]->ne[1] + r) * 5 + x);
                    ASSERT_EQ(got[(plane * rows + row) * 5 + x], want) << "part " << i << " plane " << plane;
                }
            }
        }
    }
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
}

}  // namespace
}  // namespace kiln::nn
