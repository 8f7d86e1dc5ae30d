// Convolutions across seams (nn::Seams, sd-cli's --circular): every path a
// convolution takes (the CPU unfold whole and in bands, with the group norm
// and SiLU or the 2x upsample folded in, and the device target's ggml ops
// whole and in bands) against PyTorch's Conv2d with padding_mode="circular",
// written out here loop by loop; and the VAE downsampler's one-sided pad.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "conv_cases.h"
#include "cpu_graph.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "nn/layers.h"

namespace kiln::nn {
namespace {

using Shape = test::ConvShape;
using test::random_values;

// PyTorch's Conv2d(padding_mode="circular") on the wrapped axes, zero
// padding on the others: x [N][C][H][W] of w x h, weight [OC][C][K][K].
std::vector<double> circular_convolution(const Shape& s, int64_t w, int64_t h, const std::vector<double>& x,
                                         const std::vector<float>& weight, const std::vector<float>& bias,
                                         Seams seams, int64_t& ow_count, int64_t& oh_count) {
    ow_count = (w + 2 * s.padding - s.kernel) / s.stride + 1;
    oh_count = (h + 2 * s.padding - s.kernel) / s.stride + 1;
    std::vector<double> y(static_cast<size_t>(s.n * s.out * oh_count * ow_count));
    auto wrap = [](int64_t i, int64_t size, bool seam) -> int64_t {
        if (i >= 0 && i < size) return i;
        return seam ? (i + size) % size : -1;
    };
    for (int64_t n = 0; n < s.n; ++n)
        for (int64_t oc = 0; oc < s.out; ++oc)
            for (int64_t oh = 0; oh < oh_count; ++oh)
                for (int64_t ow = 0; ow < ow_count; ++ow) {
                    double sum = bias[oc];
                    for (int64_t c = 0; c < s.in; ++c)
                        for (int kh = 0; kh < s.kernel; ++kh)
                            for (int kw = 0; kw < s.kernel; ++kw) {
                                const int64_t ih = wrap(oh * s.stride + kh - s.padding, h, seams.y);
                                const int64_t iw = wrap(ow * s.stride + kw - s.padding, w, seams.x);
                                if (ih < 0 || iw < 0) continue;
                                sum += x[((n * s.in + c) * h + ih) * w + iw] *
                                       weight[((oc * s.in + c) * s.kernel + kh) * s.kernel + kw];
                            }
                    y[((n * s.out + oc) * oh_count + oh) * ow_count + ow] = sum;
                }
    return y;
}

// What a convolution reads, made on the host: x itself, silu(group_norm(x))
// with one group per two channels, or x's nearest 2x upsample.
enum class Input { Plain, GroupNormSilu, Upsampled2x };

std::vector<double> host_input(const Shape& s, Input kind, const std::vector<float>& x, const std::vector<float>& gamma,
                               const std::vector<float>& beta, int groups) {
    std::vector<double> out;
    if (kind == Input::Upsampled2x) {
        out.resize(x.size() * 4);
        for (int64_t plane = 0; plane < s.n * s.in; ++plane)
            for (int64_t r = 0; r < 2 * s.h; ++r)
                for (int64_t c = 0; c < 2 * s.w; ++c)
                    out[(plane * 2 * s.h + r) * 2 * s.w + c] = x[(plane * s.h + r / 2) * s.w + c / 2];
        return out;
    }
    out.assign(x.begin(), x.end());
    if (kind == Input::Plain) return out;
    const int64_t per_group = s.in / groups, plane = s.w * s.h;
    for (int64_t n = 0; n < s.n; ++n)
        for (int64_t g = 0; g < groups; ++g) {
            double* first = out.data() + (n * s.in + g * per_group) * plane;
            const int64_t count = per_group * plane;
            double mean = 0, variance = 0;
            for (int64_t i = 0; i < count; ++i) mean += first[i];
            mean /= static_cast<double>(count);
            for (int64_t i = 0; i < count; ++i) variance += (first[i] - mean) * (first[i] - mean);
            variance /= static_cast<double>(count);
            for (int64_t i = 0; i < count; ++i) {
                const int64_t c = g * per_group + i / plane;
                const double v = (first[i] - mean) / std::sqrt(variance + 1e-5) * gamma[c] + beta[c];
                first[i] = v / (1.0 + std::exp(-v));
            }
        }
    return out;
}

struct Case {
    Shape shape;
    Input input;
    ComputeTarget::Place place;
    int64_t max_patch_bytes;  // small: in bands
};

// Worst difference between the case's convolution across `seams`, computed
// by nn on ggml's CPU backend, and the circular convolution above across
// `reference_seams`.
double worst_difference(const Case& c, Seams seams, Seams reference_seams) {
    const Shape& s = c.shape;
    ggml_init_params params{};
    params.mem_size = 8192 * ggml_tensor_overhead() + ggml_graph_overhead_custom(8192, false);
    params.no_alloc = true;
    ggml_context* weights_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    Conv2d layer;
    layer.weight = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, s.kernel, s.kernel, s.in, s.out);
    layer.bias = ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, s.out);
    layer.stride = s.stride;
    layer.padding = s.padding;
    Norm norm{ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, s.in), ggml_new_tensor_1d(weights_ctx, GGML_TYPE_F32, s.in)};
    ggml_tensor* x = ggml_new_tensor_4d(weights_ctx, GGML_TYPE_F32, s.w, s.h, s.in, s.n);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(weights_ctx, cpu);
    std::vector<std::vector<float>> values;
    unsigned seed = 1;
    for (ggml_tensor* t : {layer.weight, layer.bias, norm.weight, norm.bias, x}) {
        values.push_back(random_values(static_cast<size_t>(ggml_nelements(t)), seed++));
        ggml_backend_tensor_set(t, values.back().data(), 0, ggml_nbytes(t));
    }
    const int groups = static_cast<int>(s.in / 2);
    const ComputeTarget target(c.place, seams);
    ggml_tensor* y = nullptr;
    switch (c.input) {
        case Input::Plain:
            y = c.place == ComputeTarget::Cpu
                    ? conv2d_cpu_in_row_bands(ctx, layer, x, c.max_patch_bytes, seams)
                    : conv2d_device_in_row_bands(ctx, layer, x, c.max_patch_bytes, /*upsample_2x=*/false, seams);
            break;
        case Input::GroupNormSilu:
            y = conv2d_of_group_norm_silu(ctx, target, layer, norm, x, groups, 1e-5f, c.max_patch_bytes);
            break;
        case Input::Upsampled2x: y = conv2d_of_upsample_2x(ctx, target, layer, x, c.max_patch_bytes); break;
    }
    const test::CpuGraphResult got = test::compute_on_cpu(cpu, ctx, {y}, 8192);
    const int64_t scale = c.input == Input::Upsampled2x ? 2 : 1;
    int64_t ow = 0, oh = 0;
    const std::vector<double> want =
        circular_convolution(s, scale * s.w, scale * s.h, host_input(s, c.input, values[4], values[2], values[3], groups),
                             values[0], values[1], reference_seams, ow, oh);
    EXPECT_EQ(y->ne[0], ow);
    EXPECT_EQ(y->ne[1], oh);
    double worst = want.size() == got.outputs[0].size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < want.size() && i < got.outputs[0].size(); ++i)
        worst = std::max(worst, std::abs(want[i] - got.outputs[0][i]));
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_free(weights_ctx);
    return worst;
}

TEST(ConvSeams, EveryPathWrapsAsPyTorchsCircularPadding) {
    const Shape shapes[] = {
        {12, 9, 4, 3, 2, 3, 1, 1},  // SD's 3x3 convolution, CFG's batch of two, odd height
        {11, 10, 4, 3, 1, 3, 2, 1},  // the UNet's stride-2 downsample
        {8, 7, 4, 2, 1, 5, 1, 2},   // wider padding
    };
    const int64_t whole = int64_t{1} << 40, banded = 1024;
    for (const Shape& s : shapes) {
        for (Input input : {Input::Plain, Input::GroupNormSilu, Input::Upsampled2x}) {
            for (ComputeTarget::Place place : {ComputeTarget::Cpu, ComputeTarget::Device}) {
                for (int64_t limit : {whole, banded}) {
                    for (Seams seams : {Seams{true, false}, Seams{false, true}, Seams{true, true}, Seams{}}) {
                        const std::string what = std::to_string(s.w) + "x" + std::to_string(s.h) + " k" +
                                                 std::to_string(s.kernel) + " s" + std::to_string(s.stride) +
                                                 " input " + std::to_string(static_cast<int>(input)) +
                                                 (place == ComputeTarget::Cpu ? " cpu" : " device") +
                                                 (limit == whole ? " whole" : " banded") + " seams " +
                                                 std::to_string(seams.x) + std::to_string(seams.y);
                        EXPECT_LT(worst_difference(Case{s, input, place, limit}, seams, seams), 2e-4) << what;
                    }
                }
            }
        }
    }
}

// The reference tells the seams apart: a convolution across another seam,
// or none, is far from it, so the test above would see a path that ignored
// or swapped them.
TEST(ConvSeams, TheReferenceTellsSeamsApart) {
    const Case c{{12, 9, 4, 3, 1, 3, 1, 1}, Input::Plain, ComputeTarget::Cpu, int64_t{1} << 40};
    EXPECT_GT(worst_difference(c, Seams{}, Seams{true, true}), 0.1);
    EXPECT_GT(worst_difference(c, Seams{true, false}, Seams{false, true}), 0.1);
    EXPECT_GT(worst_difference(c, Seams{false, true}, Seams{true, true}), 0.1);
}

// The stride-2 downsampler of SD's and Wan's VAE encoders pads one column
// and one row: zeros, or across a seam the first column or row.
TEST(ConvSeams, TheDownsamplersPadReadsTheOtherEdgeAcrossASeam) {
    const Shape s{12, 9, 1, 1, 1, 3, 1, 1};
    ggml_init_params params{};
    params.mem_size = 64 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.w, s.h, 1, 1);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    std::vector<float> xv(static_cast<size_t>(s.w * s.h));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i);
    ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
    ggml_context* graph_ctx = ggml_init(params);
    ggml_tensor* padded = pad_right_and_bottom(graph_ctx, x, Seams{true, false});
    ggml_tensor* zero_padded = pad_right_and_bottom(graph_ctx, x, Seams{});
    ggml_tensor* both = pad_right_and_bottom(graph_ctx, x, Seams{true, true});
    const test::CpuGraphResult got = test::compute_on_cpu(cpu, graph_ctx, {padded, zero_padded, both}, 64);
    const int64_t W = s.w + 1, H = s.h + 1;
    for (int64_t r = 0; r < H; ++r) {
        for (int64_t c2 = 0; c2 < W; ++c2) {
            const size_t i = static_cast<size_t>(r * W + c2);
            const bool inside = r < s.h && c2 < s.w;
            const float own = inside ? xv[static_cast<size_t>(r * s.w + c2)] : 0.0f;
            // Across the left-right seam the new column is the first one; the new row stays zeros.
            const float seam_x = r < s.h ? xv[static_cast<size_t>(r * s.w + c2 % s.w)] : 0.0f;
            const float seam_xy = xv[static_cast<size_t>((r % s.h) * s.w + c2 % s.w)];
            EXPECT_EQ(got.outputs[0][i], seam_x) << r << "," << c2;
            EXPECT_EQ(got.outputs[1][i], own) << r << "," << c2;
            EXPECT_EQ(got.outputs[2][i], seam_xy) << r << "," << c2;
        }
    }
    ggml_free(graph_ctx);
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(cpu);
    ggml_free(ctx);
}

}  // namespace
}  // namespace kiln::nn
