// Reference images as sd-cli prepares them (pipeline/reference_images.h):
// the auto-resize size worked by hand from sd-cli's formula, and its
// nearest-pixel resample.
#include "pipeline/reference_images.h"

#include <gtest/gtest.h>

namespace kiln::pipeline {
namespace {

TEST(ReferenceImages, AutoSizeIsSdClisFormula) {
    // A = 32 * 32 = 1024; width sqrt(1024 * 24 / 40 = 614) = 24.78 -> 32; height 41.3 -> 48.
    EXPECT_EQ(auto_reference_size(24, 40, 32, 32, 16).width, 32);
    EXPECT_EQ(auto_reference_size(24, 40, 32, 32, 16).height, 48);
    // A capped at 1024 * 1024; width sqrt(2097152) = 1448.2 -> 1456 (90.5 rounds up); height 724.1 -> 720.
    const ReferenceSize wide = auto_reference_size(1000, 500, 2048, 2048, 16);
    EXPECT_EQ(wide.width, 1456);
    EXPECT_EQ(wide.height, 720);
    // A square reference for a 512x768 output: sqrt(393216) = 627.1 -> 624 both ways.
    const ReferenceSize square = auto_reference_size(300, 300, 512, 768, 16);
    EXPECT_EQ(square.width, 624);
    EXPECT_EQ(square.height, 624);
    // Sides never round to nothing, nor past the largest image.
    EXPECT_EQ(auto_reference_size(4000, 16, 64, 64, 16).height, 16);
    EXPECT_LE(auto_reference_size(16384, 16, 4096, 4096, 16).width, image::kMaxDimension);
}

TEST(ReferenceImages, NearestResampleTakesPixelXTimesInOverOut) {
    image::Image src = image::make_image(3, 2, 1);
    for (int i = 0; i < 6; ++i) src.pixels[size_t(i)] = static_cast<uint8_t>(10 * (i + 1));  // rows 10 20 30 / 40 50 60
    const image::Image up = nearest_resized(src, 6, 4);
    // Columns 0..5 read 0,0,1,1,2,2; rows 0..3 read 0,0,1,1.
    const std::vector<uint8_t> expected = {10, 10, 20, 20, 30, 30, 10, 10, 20, 20, 30, 30,
                                           40, 40, 50, 50, 60, 60, 40, 40, 50, 50, 60, 60};
    EXPECT_EQ(up.pixels, expected);
    const image::Image down = nearest_resized(src, 2, 1);  // columns 0 and 1 (1 * 3 / 2), row 0
    EXPECT_EQ(down.pixels, (std::vector<uint8_t>{10, 20}));
}

}  // namespace
}  // namespace kiln::pipeline
