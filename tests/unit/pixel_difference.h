// How far apart two images of the same size are, level by level (0-255),
// for tests that accept rounding but not more.
#pragma once

#include "image/image.h"

namespace kiln::test {

struct PixelDifference {
    double mean = 0;  // mean absolute difference over every channel value
    int max = 0;      // largest absolute difference
};

// a and b must hold the same number of channel values.
PixelDifference pixel_difference(const image::Image& a, const image::Image& b);

}  // namespace kiln::test
