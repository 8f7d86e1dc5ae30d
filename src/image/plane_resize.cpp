#include "image/plane_resize.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace kiln::image {
namespace {

constexpr double kA = -0.75;  // torch's cubic convolution coefficient

// One output sample's four taps along an axis: the first source index and the weights.
struct Taps {
    int first = 0;
    std::array<double, 4> weights{};
};

std::vector<Taps> axis_taps(int in_size, int out_size) {
    const double scale = static_cast<double>(in_size) / out_size;
    std::vector<Taps> taps(static_cast<size_t>(out_size));
    for (int o = 0; o < out_size; ++o) {
        const double source = (o + 0.5) * scale - 0.5;  // not clamped for cubic (torch)
        const double floor = std::floor(source);
        const double t = source - floor;
        auto near = [](double x) { return ((kA + 2) * x - (kA + 3)) * x * x + 1; };         // |x| <= 1
        auto far = [](double x) { return ((kA * x - 5 * kA) * x + 8 * kA) * x - 4 * kA; };  // 1 < |x| < 2
        taps[static_cast<size_t>(o)] = {static_cast<int>(floor) - 1, {far(t + 1), near(t), near(1 - t), far(2 - t)}};
    }
    return taps;
}

}  // namespace

std::vector<float> resize_planes_bicubic(const std::vector<float>& planes, int channels, int width, int height,
                                         int out_width, int out_height) {
    const std::vector<Taps> xs = axis_taps(width, out_width), ys = axis_taps(height, out_height);
    auto clamp = [](int i, int size) { return std::clamp(i, 0, size - 1); };
    std::vector<float> out(static_cast<size_t>(channels) * out_width * out_height);
    for (int c = 0; c < channels; ++c) {
        const float* src = planes.data() + static_cast<size_t>(c) * width * height;
        float* dst = out.data() + static_cast<size_t>(c) * out_width * out_height;
        for (int oy = 0; oy < out_height; ++oy) {
            const Taps& ty = ys[static_cast<size_t>(oy)];
            for (int ox = 0; ox < out_width; ++ox) {
                const Taps& tx = xs[static_cast<size_t>(ox)];
                double sum = 0.0;
                for (int j = 0; j < 4; ++j) {
                    const float* row = src + static_cast<size_t>(clamp(ty.first + j, height)) * width;
                    double across = 0.0;
                    for (int i = 0; i < 4; ++i) across += tx.weights[i] * row[clamp(tx.first + i, width)];
                    sum += ty.weights[j] * across;
                }
                dst[static_cast<size_t>(oy) * out_width + ox] = static_cast<float>(sum);
            }
        }
    }
    return out;
}

}  // namespace kiln::image
