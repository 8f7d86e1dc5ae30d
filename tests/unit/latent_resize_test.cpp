// The hires fix's latent upscalers (pipeline/latent_resize.h) against
// PyTorch's F.interpolate, whose outputs for these inputs are written out
// here (torch 1.13, align_corners=False, no antialiasing).
#include "pipeline/latent_resize.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln {
namespace {

using pipeline::LatentResize;
using pipeline::resize_latent;

TEST(LatentResize, BilinearMatchesTorch) {
    // x = arange(12).view(1, 1, 3, 4) to 5x6. Bilinear is linear, so each
    // output is 4 * ys + xs at torch's source coordinates (clamped at the
    // edges): xs = 0, 0.5, 7/6, 11/6, 2.5, 3 and ys = 0, 0.4, 1, 1.6, 2.
    std::vector<float> x(12);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    const std::vector<float> out = resize_latent(x, 1, 4, 3, 6, 5, LatentResize::Bilinear);
    const double xs[] = {0, 0.5, 7.0 / 6, 11.0 / 6, 2.5, 3};
    const double ys[] = {0, 0.4, 1, 1.6, 2};
    ASSERT_EQ(out.size(), 30u);
    for (int y = 0; y < 5; ++y) {
        for (int i = 0; i < 6; ++i) EXPECT_NEAR(out[static_cast<size_t>(y * 6 + i)], 4 * ys[y] + xs[i], 1e-5);
    }
    // [[0, 1], [2, 3]] to 3x4: torch gives rows 0 0.25 0.75 1 / 1 1.25 1.75 2 / 2 2.25 2.75 3.
    const std::vector<float> small = resize_latent({0, 1, 2, 3}, 1, 2, 2, 4, 3, LatentResize::Bilinear);
    EXPECT_EQ(small, (std::vector<float>{0, 0.25f, 0.75f, 1, 1, 1.25f, 1.75f, 2, 2, 2.25f, 2.75f, 3}));
}

TEST(LatentResize, NearestMatchesTorchAndChannelsStayApart) {
    // Two channels of [[0, 1], [2, 3]] (+10 for the second) to 3x4: torch's
    // nearest gives 0 0 1 1 / 0 0 1 1 / 2 2 3 3.
    const std::vector<float> out = resize_latent({0, 1, 2, 3, 10, 11, 12, 13}, 2, 2, 2, 4, 3, LatentResize::Nearest);
    EXPECT_EQ(out,
              (std::vector<float>{0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 10, 10, 11, 11, 10, 10, 11, 11, 12, 12, 13, 13}));
}

TEST(LatentResize, NearestAndNearestExactPickTorchsPixels) {
    // arange(12).view(1, 1, 3, 4) to 5x6, as torch gives it.
    std::vector<float> x(12);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    EXPECT_EQ(resize_latent(x, 1, 4, 3, 6, 5, LatentResize::Nearest),
              (std::vector<float>{0, 0, 1, 2, 2, 3, 0, 0, 1, 2, 2, 3, 4,  4,  5,
                                  6, 6, 7, 4, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10, 11}));
    EXPECT_EQ(resize_latent(x, 1, 4, 3, 6, 5, LatentResize::NearestExact),
              (std::vector<float>{0, 1, 1, 2, 3, 3, 0,  1,  1,  2, 3, 3, 4,  5,  5,
                                  6, 7, 7, 8, 9, 9, 10, 11, 11, 8, 9, 9, 10, 11, 11}));
}

TEST(LatentResize, SameSizeIsACopy) {
    const std::vector<float> x = {0.5f, -1, 2, 7, 3, 1};
    EXPECT_EQ(resize_latent(x, 1, 3, 2, 3, 2, LatentResize::Bilinear), x);
    EXPECT_EQ(resize_latent(x, 2, 3, 1, 3, 1, LatentResize::Nearest), x);
    EXPECT_EQ(resize_latent(x, 1, 2, 3, 2, 3, LatentResize::NearestExact), x);
}

}  // namespace
}  // namespace kiln
