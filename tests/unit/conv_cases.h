// What the convolution tests (conv_row_bands_test.cpp, conv_seams_test.cpp)
// share: a case's geometry and its random inputs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kiln::test {

// An input of w x h pixels, `in` channels and batch n, through a square
// kernel of `out` channels.
struct ConvShape {
    int64_t w, h, in, out, n;
    int kernel, stride, padding;
};

// Values in [-1, 1), the same for a seed on every run.
inline std::vector<float> random_values(size_t count, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(count);
    for (float& v : values) v = uniform(rng);
    return values;
}

}  // namespace kiln::test
