#include "image/canny.h"

#include <gtest/gtest.h>

#include "image/image_io.h"

namespace kiln::image {
namespace {

// Against training/reference/canny.py, sd-cli's preprocess_canny written
// out in numpy float32 from stable-diffusion.cpp's preprocessing.hpp.
TEST(Canny, IsSdClisEdgeImage) {
    const std::string dir = std::string(KILN_GOLDEN_DIR) + "/canny/";
    Result<Image> input = read_image(dir + "input.png");
    Result<Image> expected = read_image(dir + "edges.png");
    ASSERT_TRUE(input.ok() && expected.ok());
    const Image edges = canny_edges(*input);
    ASSERT_EQ(edges.width, expected->width);
    ASSERT_EQ(edges.height, expected->height);
    ASSERT_EQ(edges.channels, 3);
    size_t differing = 0, white = 0;
    for (size_t i = 0; i < edges.pixels.size(); ++i) {
        differing += edges.pixels[i] != expected->pixels[i];
        white += edges.pixels[i] == 255;
    }
    EXPECT_EQ(differing, 0u);
    EXPECT_GT(white, 3u * 100);  // the shapes' edges are there
}

// A black image has no gradient (the blur's zero padding adds none); sd-cli's
// threshold is then 0, which every pixel meets: white inside the 3-pixel
// black border.
TEST(Canny, BlackImageIsSdClisWhiteWithABorder) {
    Image flat = make_image(12, 10, 3, 0);
    const Image edges = canny_edges(flat);
    for (int y = 0; y < 10; ++y) {
        for (int x = 0; x < 12; ++x) {
            const bool inside = x >= 3 && x <= 9 && y >= 3 && y <= 7;
            EXPECT_EQ(edges.pixel(x, y)[0], inside ? 255 : 0) << x << "," << y;
        }
    }
}

}  // namespace
}  // namespace kiln::image
