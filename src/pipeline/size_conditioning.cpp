#include "pipeline/size_conditioning.h"

#include <cmath>

namespace kiln::pipeline {

void append_sinusoidal_embedding(double value, int dim, std::vector<float>& out) {
    const int half = dim / 2;
    const size_t first = out.size();
    out.resize(first + static_cast<size_t>(dim), 0.0f);  // the odd tail stays 0
    for (int i = 0; i < half; ++i) {
        const double arg = value * std::exp(-std::log(10000.0) * i / half);
        out[first + i] = static_cast<float>(std::cos(arg));
        out[first + half + i] = static_cast<float>(std::sin(arg));
    }
}

std::vector<float> sdxl_conditioning_vector(const std::vector<float>& pooled, const SizeConditioning& size, int dim) {
    std::vector<float> y(pooled);
    y.reserve(pooled.size() + 6 * static_cast<size_t>(dim));
    for (double v : {size.original_height, size.original_width, size.crop_top, size.crop_left, size.target_height,
                     size.target_width}) {
        append_sinusoidal_embedding(v, dim, y);
    }
    return y;
}

}  // namespace kiln::pipeline
