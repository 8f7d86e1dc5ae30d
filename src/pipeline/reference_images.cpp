#include "pipeline/reference_images.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::pipeline {
namespace {

int rounded_side(double side, int stride) {
    const auto multiple = static_cast<int64_t>(std::llround(side / stride)) * stride;
    return static_cast<int>(std::clamp<int64_t>(multiple, stride, image::kMaxDimension / stride * stride));
}

}  // namespace

ReferenceSize auto_reference_size(int ref_w, int ref_h, int out_w, int out_h, int stride) {
    const int64_t area = std::min<int64_t>(1024 * 1024, int64_t(out_w) * out_h);
    const double width = std::sqrt(static_cast<double>(area * ref_w / ref_h));
    const double height = width * ref_h / ref_w;
    return {rounded_side(width, stride), rounded_side(height, stride)};
}

image::Image nearest_resized(const image::Image& image, int width, int height) {
    image::Image out = image::make_image(width, height, image.channels);
    const size_t c = static_cast<size_t>(image.channels);
    for (int y = 0; y < height; ++y) {
        const int sy = static_cast<int>(int64_t(y) * image.height / height);
        for (int x = 0; x < width; ++x) {
            const int sx = static_cast<int>(int64_t(x) * image.width / width);
            std::memcpy(out.pixel(x, y), image.pixels.data() + (size_t(sy) * image.width + sx) * c, c);
        }
    }
    return out;
}

}  // namespace kiln::pipeline
