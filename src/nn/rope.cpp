#include "nn/rope.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace kiln::nn {

ggml_tensor* rope_pairs(ggml_context* ctx, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin) {
    const int64_t D = x->ne[0], H = x->ne[1], L = x->ne[2], B = x->ne[3];
    ggml_tensor* pairs = ggml_reshape_4d(ctx, x, 2, D / 2, H, L * B);
    auto element = [&](int i) {  // element i of every pair: ne [1, D/2, H, L*B]
        return ggml_view_4d(ctx, pairs, 1, D / 2, H, L * B, pairs->nb[1], pairs->nb[2], pairs->nb[3], i * pairs->nb[0]);
    };
    ggml_tensor* swapped = ggml_reshape_4d(ctx, ggml_concat(ctx, element(1), element(0), 0), D, H, L, B);
    ggml_tensor* out = ggml_add(ctx, ggml_mul(ctx, x, cos), ggml_mul(ctx, swapped, sin));
    return ggml_reshape_3d(ctx, out, D * H, L, B);
}

Result<std::vector<int>> parse_rope_axes(const std::string& key, const std::string& text, const std::string& example) {
    std::vector<int> axes;
    std::stringstream in(text);
    std::string part;
    while (std::getline(in, part, ',')) {
        char* end = nullptr;
        const long v = std::strtol(part.c_str(), &end, 10);
        if (part.empty() || *end != '\0' || v <= 0 || v > 4096 || v % 2 != 0) {
            return Error::bad_file("metadata " + key + " is '" + text + "', expected " + example);
        }
        axes.push_back(static_cast<int>(v));
    }
    if (axes.empty()) return Error::bad_file("metadata " + key + " is empty");
    return axes;
}

double periodic_frequency(double omega, int64_t period) {
    if (period <= 0) return omega;
    constexpr double kTurn = 6.283185307179586;  // 2 pi
    const double p = static_cast<double>(period);
    return kTurn * std::round(omega * p / kTurn) / p;
}

std::vector<float> rope_axes_table(const std::vector<int64_t>& positions, const std::vector<int>& axes_dim,
                                   float theta, const std::vector<int64_t>& periods) {
    const auto axes = static_cast<int64_t>(axes_dim.size());
    int64_t D = 0;
    for (int dim : axes_dim) D += dim;
    const int64_t n = axes > 0 ? static_cast<int64_t>(positions.size()) / axes : 0;
    std::vector<float> table(static_cast<size_t>(2 * D * n));
    float* cos_plane = table.data();
    float* sin_plane = table.data() + D * n;
    for (int64_t t = 0; t < n; ++t) {
        int64_t d = 0;
        for (int64_t axis = 0; axis < axes; ++axis) {
            const int dim = axes_dim[static_cast<size_t>(axis)];
            const double pos = static_cast<double>(positions[static_cast<size_t>(t * axes + axis)]);
            const int64_t period = periods.empty() ? 0 : periods[static_cast<size_t>(t * axes + axis)];
            for (int j = 0; j < dim / 2; ++j, d += 2) {
                const double omega = periodic_frequency(std::pow(static_cast<double>(theta), -2.0 * j / dim), period);
                const double angle = pos * omega;
                const float cs = static_cast<float>(std::cos(angle)), sn = static_cast<float>(std::sin(angle));
                cos_plane[t * D + d] = cs;
                cos_plane[t * D + d + 1] = cs;
                sin_plane[t * D + d] = -sn;
                sin_plane[t * D + d + 1] = sn;
            }
        }
    }
    return table;
}

}  // namespace kiln::nn
