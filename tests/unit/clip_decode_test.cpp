// pipeline/clip_decode on the tiny Wan of training/make_wan_pipeline_fixtures.py
// (Wan 2.1's tiny VAE): a clip decoded in spatial tiles, each tile its own
// chunk loop through the causal history, blended as image tiles are. One
// tile is the whole decode bit for bit; with two, a pixel only one covers is
// that tile's own decode; a job with --vae-tiling makes the reference's clip.
#include "pipeline/clip_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "golden.h"
#include "pipeline/generate.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

class ClipDecode : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        load(test::wan_tiny_parts(), test::golden_model_options(), "wan_tiny_t2v.safetensors");
    }
};

TEST_F(ClipDecode, EachTileIsItsOwnChunkLoopAndOneTileIsTheWholeDecode) {
    const int64_t w = 16, h = 12, frames = 3, channels = model_->latent_channels();
    std::mt19937 gen(5);
    std::normal_distribution<float> normal;
    std::vector<float> latent(static_cast<size_t>(channels * frames * h * w));
    for (float& v : latent) v = normal(gen);
    auto whole = decode_clip_planes(*model_, latent, w, h, frames, std::nullopt, [](int) {});
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    ASSERT_EQ(whole->size(), static_cast<size_t>(9 * 3 * 8 * h * 8 * w));  // 1 + 4 (3 - 1) frames

    TilingStats stats;
    auto one = decode_clip_planes(
        *model_, latent, w, h, frames, VaeTiling{16, 0.5f}, [](int) {}, &stats);
    ASSERT_TRUE(one.ok()) << one.error().message;
    EXPECT_EQ(stats.tiles(), 1);
    EXPECT_EQ(*one, *whole);

    // Two tiles across (latent columns 0-11 and 4-15), one down: where only
    // one tile covers a pixel the result is that tile's own decode, its
    // chunks through its own history; between them, a blend of the two.
    std::vector<int> reported;
    auto tiled = decode_clip_planes(
        *model_, latent, w, h, frames, VaeTiling{12, 0.5f}, [&](int done) { reported.push_back(done); }, &stats);
    ASSERT_TRUE(tiled.ok()) << tiled.error().message;
    EXPECT_EQ(stats.tiles(), 2);
    ASSERT_EQ(tiled->size(), whole->size());
    auto tile_alone = [&](int64_t first_column) {
        std::vector<float> crop;
        for (int64_t plane = 0; plane < channels * frames; ++plane)
            for (int64_t y = 0; y < h; ++y) {
                const auto row = latent.begin() + (plane * h + y) * w + first_column;
                crop.insert(crop.end(), row, row + 12);
            }
        auto out = decode_clip_planes(*model_, crop, 12, h, frames, std::nullopt, [](int) {});
        EXPECT_TRUE(out.ok());
        return out.ok() ? *out : std::vector<float>{};
    };
    const std::vector<float> left = tile_alone(0), right = tile_alone(4);
    const int64_t W = 8 * w, H = 8 * h, TW = 8 * 12;
    int64_t mismatches = 0, blended = 0;
    for (int64_t plane = 0; plane < 9 * 3; ++plane) {
        for (int64_t y = 0; y < H; ++y) {
            for (int64_t x = 0; x < W; ++x) {
                const float got = (*tiled)[static_cast<size_t>((plane * H + y) * W + x)];
                if (x < 32) {
                    mismatches += got != left[static_cast<size_t>((plane * H + y) * TW + x)];
                } else if (x >= 96) {
                    mismatches += got != right[static_cast<size_t>((plane * H + y) * TW + x - 32)];
                } else {
                    blended += got != (*whole)[static_cast<size_t>((plane * H + y) * W + x)];
                }
            }
        }
    }
    EXPECT_EQ(mismatches, 0) << "a pixel one tile covers is not that tile's own decode";
    EXPECT_GT(blended, 0) << "two tiles of a causal VAE do not give the whole decode's bits";
    // Progress rises to the clip's frames, over both tiles.
    ASSERT_FALSE(reported.empty());
    EXPECT_TRUE(std::is_sorted(reported.begin(), reported.end()));
    EXPECT_EQ(reported.back(), 9);
}

// --vae-tiling on a clip whose latent fits one tile: the reference's frames.
TEST_F(ClipDecode, AJobWithVaeTilingMakesTheReferenceClip) {
    GenerationRequest r;
    r.prompt = test::kWanTinyPrompt;
    r.width = test::kWanTinyWidth;
    r.height = test::kWanTinyHeight;
    r.video_frames = test::kWanTinyFrames;
    r.seed = 11;
    r.steps = 3;
    r.vae_tiling = VaeTiling{8, 0.5f};
    auto clips = generate(*model_, r);
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    for (int f = 0; f < test::kWanTinyFrames; ++f)
        EXPECT_LE(test::difference_from_reference(clips->front().frames[f], *io_, "video", f), 1) << "frame " << f;
}

}  // namespace
}  // namespace kiln::pipeline
