#include "pipeline/pixel_planes.h"

namespace kiln::pipeline {

Result<std::vector<float>> rgb_planes(const image::Image& source, int width, int height, PixelRange range) {
    auto rgb = image::convert_channels(source, 3);
    if (!rgb.ok()) return rgb.error();
    image::Image img = std::move(rgb).value();
    if (img.width != width || img.height != height) {
        auto resized = image::resize_image(img, width, height);
        if (!resized.ok()) return resized.error();
        img = std::move(resized).value();
    }
    const size_t plane = static_cast<size_t>(width) * height;
    std::vector<float> pixels(plane * 3);
    for (size_t i = 0; i < plane; ++i) {
        for (size_t ch = 0; ch < 3; ++ch) {
            const uint8_t v = img.pixels[i * 3 + ch];
            pixels[ch * plane + i] = range == PixelRange::Signed ? v / 127.5f - 1.0f : v / 255.0f;
        }
    }
    return pixels;
}

}  // namespace kiln::pipeline
