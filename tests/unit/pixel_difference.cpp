#include "pixel_difference.h"

#include <algorithm>
#include <cstdlib>

namespace kiln::test {

PixelDifference pixel_difference(const image::Image& a, const image::Image& b) {
    PixelDifference d;
    if (a.pixels.empty()) return d;
    for (size_t i = 0; i < a.pixels.size(); ++i) {
        const int e = std::abs(int(a.pixels[i]) - int(b.pixels[i]));
        d.mean += e;
        d.max = std::max(d.max, e);
    }
    d.mean /= static_cast<double>(a.pixels.size());
    return d;
}

}  // namespace kiln::test
