// Convolutions on the CPU in bands of output rows (nn::conv2d_cpu_in_row_bands,
// nn::concat_rows_cpu): the same numbers as the whole convolution for every
// band height, against a direct convolution written out here, and a compute
// buffer that holds one band's patches instead of all of them. The device
// target's bands (nn::conv2d_device_in_row_bands: ggml's own ops, computed
// here on ggml's CPU backend) likewise, with and without the 2x upsample.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "conv_cases.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "nn/concat_rows_cpu.h"
#include "nn/layers.h"

namespace kiln::nn {
namespace {

using Shape = test::ConvShape;
using test::random_values;

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

// The device target's convolution of random values (of their nearest 2x
// upsample when `upsample`), with at most `max_patch_bytes` of patches a
// band, computed on ggml's CPU backend.
struct DeviceResult {
    std::vector<float> y;
    size_t compute_bytes = 0;
    int im2cols = 0;
    int customs = 0;   // kiln's CPU ops: none on the device path
    int upscales = 0;  // each band upsamples its own rows
    int64_t ow = 0, oh = 0;
    std::vector<float> x, weight, bias;  // the values, the kernel as rounded to its type
};

DeviceResult run_device(const Shape& s, ggml_type kernel_type, bool upsample, int64_t max_patch_bytes) {
    ggml_init_params params{};
    params.mem_size = 8192 * ggml_tensor_overhead() + ggml_graph_overhead_custom(8192, false);
    params.no_alloc = true;
    ggml_context* weights_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    Conv2d layer;
    layer.weight = ggml_new_tensor_4d(weights_ctx, kernel_type, s.kernel, s.kernel, s.in, s.out);
    layer.bias = ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, s.out);
    layer.stride = s.stride;
    layer.padding = s.padding;
    ggml_tensor* x = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, s.w, s.h, s.in, s.n);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_buffer_t inputs = ggml_backend_alloc_ctx_tensors(weights_ctx, cpu);
    DeviceResult r;
    r.x = random_values(ggml_nelements(x), 1);
    r.weight = random_values(ggml_nelements(layer.weight), 2);
    r.bias = random_values(s.out, 3);
    ggml_backend_tensor_set(x, r.x.data(), 0, ggml_nbytes(x));
    if (kernel_type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> half(r.weight.size());
        ggml_fp32_to_fp16_row(r.weight.data(), half.data(), static_cast<int64_t>(half.size()));
        ggml_fp16_to_fp32_row(half.data(), r.weight.data(), static_cast<int64_t>(half.size()));
        ggml_backend_tensor_set(layer.weight, half.data(), 0, ggml_nbytes(layer.weight));
    } else {
        ggml_backend_tensor_set(layer.weight, r.weight.data(), 0, ggml_nbytes(layer.weight));
    }
    ggml_backend_tensor_set(layer.bias, r.bias.data(), 0, ggml_nbytes(layer.bias));

    ggml_tensor* y = conv2d_device_in_row_bands(ctx, layer, x, max_patch_bytes, upsample);
    ggml_cgraph* graph = ggml_new_graph_custom(ctx, 8192, false);
    ggml_build_forward_expand(graph, y);
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        r.im2cols += node->op == GGML_OP_IM2COL;
        r.customs += node->op == GGML_OP_CUSTOM;
        r.upscales += node->op == GGML_OP_UPSCALE;
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
    ggml_gallocr_free(allocator);
    ggml_backend_buffer_free(inputs);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_free(weights_ctx);
    return r;
}

// The input a direct convolution of `r` reads: x, or x upsampled.
std::vector<float> nearest_2x(const Shape& s, const std::vector<float>& x) {
    std::vector<float> up(x.size() * 4);
    for (int64_t plane = 0; plane < s.n * s.in; ++plane)
        for (int64_t h = 0; h < 2 * s.h; ++h)
            for (int64_t w = 0; w < 2 * s.w; ++w)
                up[(plane * 2 * s.h + h) * 2 * s.w + w] = x[(plane * s.h + h / 2) * s.w + w / 2];
    return up;
}

TEST(ConvRowBandsOnDevice, EveryBandHeightGivesTheWholeConvolutionsNumbers) {
    const Shape shapes[] = {
        {24, 19, 8, 6, 2, 3, 1, 1},  // SD's 3x3 convolution, CFG's batch of two, odd height
        {23, 17, 5, 4, 1, 3, 2, 1},  // the UNet's stride-2 downsample
        {16, 13, 3, 5, 1, 3, 2, 0},  // the VAE's downsample (padded before, none here)
        {12, 11, 4, 3, 1, 5, 1, 2},  // larger kernel and padding
        {15, 9, 4, 3, 2, 3, 1, 0},   // no padding, odd sizes
        {9, 7, 3, 4, 1, 4, 2, 1},    // an even kernel with stride 2: bands' halos overlap unevenly
    };
    for (const Shape& s : shapes) {
        for (ggml_type type : {GGML_TYPE_F32, GGML_TYPE_F16}) {
            for (bool upsample : {false, true}) {
                const std::string what = std::string(ggml_type_name(type)) + (upsample ? " upsampled " : " ") +
                                         std::to_string(s.w) + "x" + std::to_string(s.h) + " k" +
                                         std::to_string(s.kernel) + " s" + std::to_string(s.stride) + " p" +
                                         std::to_string(s.padding);
                const DeviceResult whole = run_device(s, type, upsample, int64_t{1} << 40);
                EXPECT_EQ(whole.im2cols, 1) << what;
                EXPECT_EQ(whole.customs, 0) << what;
                // The whole convolution against PyTorch's, loop by loop (an
                // F16 kernel takes its operand rounded to F16).
                Shape direct = s;
                if (upsample) direct.w *= 2, direct.h *= 2;
                const std::vector<double> want = direct_convolution(direct, upsample ? nearest_2x(s, whole.x) : whole.x,
                                                                    whole.weight, whole.bias, whole.ow, whole.oh);
                ASSERT_EQ(want.size(), whole.y.size()) << what;
                double worst = 0;
                for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(want[i] - whole.y[i]));
                EXPECT_LT(worst, type == GGML_TYPE_F16 ? 3e-2 : 2e-4) << what;
                const int64_t row_bytes = s.in * s.kernel * s.kernel * whole.ow * s.n * 4;
                for (int64_t band_rows : {int64_t{1}, int64_t{2}, int64_t{3}, whole.oh - 1}) {
                    const DeviceResult banded = run_device(s, type, upsample, band_rows * row_bytes);
                    EXPECT_EQ(banded.im2cols, (whole.oh + band_rows - 1) / band_rows) << what << ", " << band_rows;
                    EXPECT_EQ(banded.customs, 0) << what;
                    if (upsample) EXPECT_EQ(banded.upscales, banded.im2cols) << what;
                    ASSERT_EQ(banded.y.size(), whole.y.size()) << what;
                    EXPECT_EQ(std::memcmp(banded.y.data(), whole.y.data(), whole.y.size() * sizeof(float)), 0)
                        << what << ", " << band_rows << " rows a band";
                }
            }
        }
    }
}

// An F16 kernel whose whole unfold is over 64 MiB in F32 takes F16 patches
// (the patches first in the product); its bands do too, with the same numbers.
TEST(ConvRowBandsOnDevice, LargeF16UnfoldInBandsGivesTheWholeConvolutionsNumbers) {
    const Shape s{192, 160, 64, 4, 1, 3, 1, 1};  // 67.5 MiB of F32 patches whole
    const DeviceResult whole = run_device(s, GGML_TYPE_F16, false, int64_t{1} << 40);
    const DeviceResult banded = run_device(s, GGML_TYPE_F16, false, 4ll << 20);
    EXPECT_EQ(whole.im2cols, 1);
    EXPECT_EQ(banded.im2cols, 9);  // 2 bytes a patch value: 4 MiB is 18 rows
    ASSERT_EQ(banded.y.size(), whole.y.size());
    EXPECT_EQ(std::memcmp(banded.y.data(), whole.y.data(), whole.y.size() * sizeof(float)), 0);
    EXPECT_LT(banded.compute_bytes * 4, whole.compute_bytes);
}

// A VAE decoder's top-level upsampler in small: the compute buffer holds
// the output and one band's patches and upsampled rows, not the upsample
// and all the patches.
TEST(ConvRowBandsOnDevice, ComputeBufferHoldsOneBandsPatches) {
    const Shape s{64, 48, 32, 16, 1, 3, 1, 1};
    const int64_t whole_patches = s.in * 9 * 4 * s.w * s.h * 4;  // 13.5 MiB
    const DeviceResult whole = run_device(s, GGML_TYPE_F32, true, int64_t{1} << 40);
    const DeviceResult banded = run_device(s, GGML_TYPE_F32, true, whole_patches / 16);
    EXPECT_EQ(banded.im2cols, 16);
    EXPECT_GE(whole.compute_bytes, size_t(whole_patches));
    const int64_t output = s.out * 4 * s.w * s.h * 4;
    EXPECT_LE(banded.compute_bytes, size_t(whole_patches / 8 + output + output / 4)) << whole.compute_bytes;
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
