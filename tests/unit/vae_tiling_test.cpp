// VAE tiling: the grid and blend rule on synthetic tile functions (exact
// answers), then decode and encode with the tiny golden SD1 model against the
// untiled VAE graph run directly.
#include "pipeline/vae_tiling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "golden.h"
#include "runtime/graph_session.h"

namespace kiln {
namespace {

using pipeline::TiledMap;
using pipeline::TilingStats;
using pipeline::VaeTiling;

// ---------------------------------------------------------------- grid + blend

TEST(VaeTiling, ValidateTilingNamesTheParameterAndRange) {
    EXPECT_TRUE(pipeline::validate_tiling(VaeTiling{}).ok());
    EXPECT_TRUE(pipeline::validate_tiling(VaeTiling{8, 0.0f}).ok());
    EXPECT_TRUE(pipeline::validate_tiling(VaeTiling{64, 0.99f}).ok());

    Status s = pipeline::validate_tiling(VaeTiling{7, 0.5f});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("tile size"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("at least 8"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("got 7"), std::string::npos) << s.error().message;

    for (float bad : {-0.1f, 1.0f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
        s = pipeline::validate_tiling(VaeTiling{32, bad});
        ASSERT_FALSE(s.ok()) << bad;
        EXPECT_NE(s.error().message.find("overlap"), std::string::npos) << s.error().message;
        EXPECT_NE(s.error().message.find("[0, 1)"), std::string::npos) << s.error().message;
    }
}

// --vae-relative-tile-size: sd-cli's get_tile_sizes, worked by hand.
TEST(VaeTiling, RelativeTileSidesAreSdClisShareOrTilesPerSide) {
    const VaeTiling half_overlap{32, 0.5f};
    EXPECT_EQ(pipeline::tile_side(half_overlap, 0.0f, 64), 32);   // absolute
    EXPECT_EQ(pipeline::tile_side(half_overlap, 0.0f, 20), 20);   // at most the side
    EXPECT_EQ(pipeline::tile_side(half_overlap, 0.5f, 64), 32);   // a share
    EXPECT_EQ(pipeline::tile_side(half_overlap, 1.0f, 64), 64);   // 1 is a share: the whole side
    EXPECT_EQ(pipeline::tile_side(half_overlap, 2.0f, 16), 11);   // 16 / (2 - 1 + 0.5) = 10.67
    EXPECT_EQ(pipeline::tile_side(VaeTiling{32, 0.25f}, 3.0f, 64), 26);  // 64 / (3 - 0.75 + 0.25) = 25.6
    EXPECT_EQ(pipeline::tile_side(VaeTiling{32, 0.9f}, 2.0f, 60), 40);   // overlap capped at 0.5: 60 / 1.5
    EXPECT_EQ(pipeline::tile_side(half_overlap, 0.01f, 64), 8);   // at least 8 ...
    EXPECT_EQ(pipeline::tile_side(half_overlap, 0.01f, 6), 6);    // ... unless the side is shorter
    EXPECT_TRUE(pipeline::validate_tiling(VaeTiling{32, 0.5f, 2.0f, 0.25f}).ok());
    for (float bad : {-1.0f, 1001.0f, std::numeric_limits<float>::quiet_NaN()}) {
        Status s = pipeline::validate_tiling(VaeTiling{32, 0.5f, bad, 0.0f});
        ASSERT_FALSE(s.ok()) << bad;
        EXPECT_NE(s.error().message.find("--vae-relative-tile-size"), std::string::npos) << s.error().message;
    }
}

TEST(VaeTiling, TileStartsFormARegularGridWithTheLastTileFlushWithTheEdge) {
    using V = std::vector<int64_t>;
    EXPECT_EQ(pipeline::tile_starts(40, 16, 0.5f), (V{0, 8, 16, 24}));
    EXPECT_EQ(pipeline::tile_starts(37, 16, 0.5f), (V{0, 8, 16, 21}));  // last tile moved back by 3
    EXPECT_EQ(pipeline::tile_starts(24, 16, 0.5f), (V{0, 8}));
    EXPECT_EQ(pipeline::tile_starts(17, 16, 0.5f), (V{0, 1}));
    EXPECT_EQ(pipeline::tile_starts(16, 16, 0.5f), (V{0}));
    EXPECT_EQ(pipeline::tile_starts(9, 16, 0.5f), (V{0}));
    EXPECT_EQ(pipeline::tile_starts(32, 16, 0.0f), (V{0, 16}));  // no overlap: tiles abut
    EXPECT_EQ(pipeline::tile_starts(40, 16, 0.0f), (V{0, 16, 24}));
    EXPECT_EQ(pipeline::tile_starts(40, 16, 0.75f), (V{0, 4, 8, 12, 16, 20, 24}));
    EXPECT_EQ(pipeline::tile_starts(13, 8, 0.3f), (V{0, 5}));  // floor(8 * 0.3) = 2 shared -> stride 6
}

// A pointwise map (nearest 2x upsampling with a per-channel affine change)
// has no receptive field, so any tiling must reproduce it up to rounding:
// this checks cropping, placement and weight normalisation on every geometry.
std::vector<float> pointwise_up2(const std::vector<float>& in, int64_t channels, int64_t w, int64_t h) {
    std::vector<float> out(static_cast<size_t>(2 * channels * 4 * w * h));
    for (int64_t o = 0; o < 2 * channels; ++o) {
        const int64_t c = o % channels;
        for (int64_t y = 0; y < 2 * h; ++y) {
            for (int64_t x = 0; x < 2 * w; ++x) {
                const float v = in[static_cast<size_t>((c * h + y / 2) * w + x / 2)];
                out[static_cast<size_t>((o * 2 * h + y) * 2 * w + x)] = v * static_cast<float>(o + 1) - 0.25f;
            }
        }
    }
    return out;
}

TEST(VaeTiling, RunTiledReproducesAPointwiseMapOnEveryGeometry) {
    struct Case {
        int64_t w, h;
        VaeTiling tiling;
        int tiles_x, tiles_y;
    };
    const Case cases[] = {
        {40, 24, {16, 0.5f}, 4, 2},   // multiples of the stride
        {37, 21, {16, 0.5f}, 4, 2},   // not multiples: last tiles moved back
        {8, 40, {16, 0.5f}, 1, 4},    // a strip one tile wide
        {40, 8, {16, 0.5f}, 4, 1},    // and across
        {40, 24, {16, 0.75f}, 7, 3},  // three and more tiles meet at a pixel
        {40, 24, {16, 0.0f}, 3, 2},   // no overlap
        {12, 10, {32, 0.5f}, 1, 1},   // smaller than one tile
    };
    for (const Case& k : cases) {
        const int64_t channels = 3;
        std::vector<float> in(static_cast<size_t>(channels * k.w * k.h));
        for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
        TiledMap map;
        map.grid_w = k.w;
        map.grid_h = k.h;
        map.in_channels = channels;
        map.out_channels = 2 * channels;
        map.in_scale = 1;
        map.out_scale = 2;
        int calls = 0;
        TilingStats stats;
        auto out = pipeline::run_tiled(
            in, map, k.tiling,
            [&](const std::vector<float>& tile, int64_t w, int64_t h) -> Result<std::vector<float>> {
                ++calls;
                EXPECT_LE(w, k.tiling.tile);
                EXPECT_LE(h, k.tiling.tile);
                return pointwise_up2(tile, channels, w, h);
            },
            &stats);
        ASSERT_TRUE(out.ok()) << out.error().message;
        EXPECT_EQ(stats.tiles_x, k.tiles_x) << k.w << "x" << k.h;
        EXPECT_EQ(stats.tiles_y, k.tiles_y) << k.w << "x" << k.h;
        EXPECT_EQ(calls, stats.tiles());
        const std::vector<float> want = pointwise_up2(in, channels, k.w, k.h);
        ASSERT_EQ(out->size(), want.size());
        // Normalising by the weight sum rounds once or twice: a few ulps of the value.
        float max_diff = 0.0f;
        for (size_t i = 0; i < want.size(); ++i) {
            max_diff = std::max(max_diff, std::fabs((*out)[i] - want[i]) / (1.0f + std::fabs(want[i])));
        }
        EXPECT_LE(max_diff, 1e-6f) << k.w << "x" << k.h << " tile " << k.tiling.tile << " overlap " << k.tiling.overlap;
    }
}

TEST(VaeTiling, BlendWeightsRampLinearlyAcrossTheOverlap) {
    // Every tile outputs its own column index: the blend then shows the weights
    // themselves. 24 latent pixels, tiles of 16 at 0 and 8 share [8, 16); with
    // out_scale 2 that is output columns [16, 32), 16 pixels, where tile 1's
    // share must rise as (i + 0.5) / 16 and tile 0's fall to match.
    TiledMap map;
    map.grid_w = 24;
    map.grid_h = 16;
    map.in_channels = 1;
    map.out_channels = 1;
    map.in_scale = 1;
    map.out_scale = 2;
    std::vector<float> in(24 * 16, 0.0f);
    for (int64_t x = 0; x < 24; ++x) in[static_cast<size_t>(x)] = static_cast<float>(x);  // row 0 carries x
    auto out =
        pipeline::run_tiled(in, map, VaeTiling{16, 0.5f},
                            [](const std::vector<float>& tile, int64_t w, int64_t h) -> Result<std::vector<float>> {
                                const float index = tile[0] == 0.0f ? 0.0f : 1.0f;  // tile 1 starts at x = 8
                                return std::vector<float>(static_cast<size_t>(4 * w * h), index);
                            });
    ASSERT_TRUE(out.ok()) << out.error().message;
    for (int64_t y : {0, 17, 31}) {
        const float* row = out->data() + y * 48;
        for (int64_t x = 0; x < 16; ++x) EXPECT_FLOAT_EQ(row[x], 0.0f) << x;
        for (int64_t i = 0; i < 16; ++i) {
            EXPECT_NEAR(row[16 + i], (static_cast<float>(i) + 0.5f) / 16.0f, 1e-6f) << "overlap pixel " << i;
        }
        for (int64_t x = 32; x < 48; ++x) EXPECT_FLOAT_EQ(row[x], 1.0f) << x;
    }
}

TEST(VaeTiling, RunTiledRejectsBadSizesAndPassesTileErrorsOn) {
    TiledMap map;
    map.grid_w = 20;
    map.grid_h = 20;
    map.in_channels = 1;
    map.out_channels = 1;
    auto identity = [](const std::vector<float>& t, int64_t, int64_t) -> Result<std::vector<float>> { return t; };
    auto r = pipeline::run_tiled(std::vector<float>(399), map, VaeTiling{16, 0.5f}, identity);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("399"), std::string::npos) << r.error().message;

    auto wrong = [](const std::vector<float>&, int64_t, int64_t) -> Result<std::vector<float>> {
        return std::vector<float>(3);
    };
    r = pipeline::run_tiled(std::vector<float>(400), map, VaeTiling{16, 0.5f}, wrong);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("tile's output"), std::string::npos) << r.error().message;

    int calls = 0;
    auto failing = [&](const std::vector<float>&, int64_t, int64_t) -> Result<std::vector<float>> {
        ++calls;
        return Error{"out of memory"};
    };
    r = pipeline::run_tiled(std::vector<float>(400), map, VaeTiling{16, 0.5f}, failing);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, "out of memory");
    EXPECT_EQ(calls, 1);  // stops at the first failure

    r = pipeline::run_tiled(std::vector<float>(400), map, VaeTiling{4, 0.5f}, identity);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("tile size"), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------- the tiny SD1 model

class VaeTilingModel : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        pipeline::ModelPaths paths;
        paths.model = {test::golden_path("models/sd1_tiny.safetensors")};
        paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
        pipeline::ModelOptions options;
        options.threads = 1;  // ctest runs tests in parallel
        auto loaded = pipeline::Model::load(paths, options);
        if (!loaded.ok()) {
            load_error_ = new std::string(loaded.error().message);
            return;
        }
        model_ = std::move(loaded).value().release();
    }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
        delete load_error_;
        load_error_ = nullptr;
    }
    void SetUp() override {
        ASSERT_NE(model_, nullptr) << (load_error_ ? *load_error_ : "");
        ASSERT_EQ(model_->vae().format().downscale, 2);
        ASSERT_EQ(model_->vae().format().latent_channels, 4);
    }

    static pipeline::Model& model() { return *model_; }

    // The untiled VAE graphs, run directly (not through vae_tiling).
    static std::vector<float> decode_whole(const std::vector<float>& z, int64_t w, int64_t h) {
        runtime::GraphSession session;
        ggml_tensor* in = session.input(GGML_TYPE_F32, {w, h, 4, 1}, z.data());
        ggml_tensor* out = model().vae().decode(session.ctx(), in, nn::ComputeTarget::Cpu);
        Status s = session.run(model().vae_compute(), out);
        EXPECT_TRUE(s.ok()) << s.error().message;
        return runtime::GraphSession::read(out);
    }
    static std::vector<float> encode_whole(const std::vector<float>& image, int64_t w, int64_t h) {
        runtime::GraphSession session;
        ggml_tensor* in = session.input(GGML_TYPE_F32, {w, h, 3, 1}, image.data());
        ggml_tensor* out = model().vae().encode(session.ctx(), in, nn::ComputeTarget::Cpu, models::LatentEncoding::Mean);
        Status s = session.run(model().vae_compute(), out);
        EXPECT_TRUE(s.ok()) << s.error().message;
        return runtime::GraphSession::read(out);
    }

  private:
    static pipeline::Model* model_;
    static std::string* load_error_;
};

pipeline::Model* VaeTilingModel::model_ = nullptr;
std::string* VaeTilingModel::load_error_ = nullptr;

// Deterministic standard-normal-ish values (sum of uniforms, no <random>
// distributions, whose output differs between standard libraries).
std::vector<float> noise(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed;
    for (float& x : v) {
        float sum = 0.0f;
        for (int k = 0; k < 4; ++k) {
            s = s * 1664525u + 1013904223u;
            sum += static_cast<float>(s >> 8) / static_cast<float>(1u << 24);
        }
        x = (sum - 2.0f) * 1.7320508f;  // 4 uniforms: variance 1/3 -> scale to 1
    }
    return v;
}

// A smooth picture in [-1, 1] with some texture, planar [3, h, w].
std::vector<float> test_image(int64_t w, int64_t h) {
    std::vector<float> img(static_cast<size_t>(3 * w * h));
    const std::vector<float> grain = noise(img.size(), 7);
    for (int64_t c = 0; c < 3; ++c) {
        for (int64_t y = 0; y < h; ++y) {
            for (int64_t x = 0; x < w; ++x) {
                const size_t i = static_cast<size_t>((c * h + y) * w + x);
                const float v = 0.6f * std::sin(0.11f * static_cast<float>(x) + 0.7f * static_cast<float>(c)) *
                                    std::cos(0.07f * static_cast<float>(y)) +
                                0.1f * grain[i];
                img[i] = std::clamp(v, -1.0f, 1.0f);
            }
        }
    }
    return img;
}

struct Diff {
    double mean_abs = 0.0;
    float max_abs = 0.0f;
};

Diff diff(const std::vector<float>& a, const std::vector<float>& b) {
    Diff d;
    EXPECT_EQ(a.size(), b.size());
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        const float e = std::fabs(a[i] - b[i]);
        d.mean_abs += e;
        d.max_abs = std::max(d.max_abs, e);
    }
    d.mean_abs /= static_cast<double>(std::max<size_t>(n, 1));
    return d;
}

// Seams: the error field e = tiled - untiled changes gradually under a blend
// and jumps at a hard tile edge. Average |e(p + 1) - e(p)| over every line
// across `axis` (0: steps between columns, 1: between rows) and channel, and
// return the worst position's average over the median one: about 1 with no
// seam, several times that where tiles abut.
double seam_ratio(const std::vector<float>& tiled, const std::vector<float>& whole, int64_t channels, int64_t w,
                  int64_t h, int axis) {
    const int64_t positions = axis == 0 ? w - 1 : h - 1;
    std::vector<double> step(static_cast<size_t>(positions), 0.0);
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < h; ++y) {
            for (int64_t x = 0; x < w; ++x) {
                const int64_t p = axis == 0 ? x : y;
                if (p + 1 >= (axis == 0 ? w : h)) continue;
                const size_t i = static_cast<size_t>((c * h + y) * w + x);
                const size_t j = i + static_cast<size_t>(axis == 0 ? 1 : w);
                step[static_cast<size_t>(p)] += std::fabs((tiled[j] - whole[j]) - (tiled[i] - whole[i]));
            }
        }
    }
    std::vector<double> sorted = step;
    std::sort(sorted.begin(), sorted.end());
    return sorted.back() / std::max(sorted[sorted.size() / 2], 1e-12);
}

double stddev(const std::vector<float>& v) {
    double m = 0.0, m2 = 0.0;
    for (float x : v) {
        m += x;
        m2 += static_cast<double>(x) * x;
    }
    m /= static_cast<double>(v.size());
    return std::sqrt(m2 / static_cast<double>(v.size()) - m * m);
}

// Planar [channels, ch, cw] window at (x0, y0) of planar [channels, h, w].
std::vector<float> crop(const std::vector<float>& v, int64_t channels, int64_t w, int64_t h, int64_t x0, int64_t y0,
                        int64_t cw, int64_t chh) {
    std::vector<float> out(static_cast<size_t>(channels * cw * chh));
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < chh; ++y) {
            for (int64_t x = 0; x < cw; ++x) {
                out[static_cast<size_t>((c * chh + y) * cw + x)] =
                    v[static_cast<size_t>((c * h + y0 + y) * w + x0 + x)];
            }
        }
    }
    return out;
}

TEST_F(VaeTilingModel, OneTileLatentIsTheUntiledDecode) {
    for (const auto& [w, h, tile] : {std::tuple<int64_t, int64_t, int>{16, 16, 16}, {12, 10, 32}}) {
        const std::vector<float> z = noise(static_cast<size_t>(4 * w * h), 1);
        TilingStats stats;
        auto tiled = pipeline::decode_tiled(model(), z, w, h, VaeTiling{tile, 0.5f}, &stats);
        ASSERT_TRUE(tiled.ok()) << tiled.error().message;
        EXPECT_EQ(stats.tiles(), 1);
        const std::vector<float> whole = decode_whole(z, w, h);
        ASSERT_EQ(tiled->size(), static_cast<size_t>(3 * 2 * w * 2 * h));
        EXPECT_EQ(*tiled, whole);  // bit for bit: weight 1, divided by 1
    }
}

// The tiny VAE has random weights, two group norms per resnet and a mid-block
// attention over all pixels, and about 19 3x3 convolutions (a receptive field
// of roughly +-15 latent pixels): a 16-pixel tile does not see what the whole
// latent sees, so tiled and untiled differ well beyond rounding. Measured on
// this 40x24 latent (decoded std 0.62): one 16x16 tile decoded alone is off by
// 0.19 on average (0.08 in its centre); the blended result by 0.087 (max 0.66);
// abutting tiles without overlap by 0.125 (max 1.80); tiles of 32 by 0.018.
// The bounds below leave ~35% headroom over those for other BLAS builds.
TEST_F(VaeTilingModel, LargeLatentDecodesCloseToUntiledWithoutSeams) {
    const int64_t w = 40, h = 24, W = 80, H = 48;
    const std::vector<float> z = noise(static_cast<size_t>(4 * w * h), 2);
    const std::vector<float> whole = decode_whole(z, w, h);
    TilingStats stats;
    auto tiled = pipeline::decode_tiled(model(), z, w, h, VaeTiling{16, 0.5f}, &stats);
    ASSERT_TRUE(tiled.ok()) << tiled.error().message;
    EXPECT_EQ(stats.tiles_x, 4);
    EXPECT_EQ(stats.tiles_y, 2);

    // The top-left 8x8 latent pixels belong to tile (0, 0) alone: there the
    // result is that tile's own decode, exactly.
    const std::vector<float> tile00 = decode_whole(crop(z, 4, w, h, 0, 0, 16, 16), 16, 16);
    for (int64_t c = 0; c < 3; ++c) {
        for (int64_t y = 0; y < 16; ++y) {
            for (int64_t x = 0; x < 16; ++x) {
                ASSERT_EQ((*tiled)[static_cast<size_t>((c * H + y) * W + x)],
                          tile00[static_cast<size_t>((c * 32 + y) * 32 + x)])
                    << c << " " << y << " " << x;
            }
        }
    }

    // What one interior tile gets wrong on its own: the blend must do better.
    const std::vector<float> tile10 = decode_whole(crop(z, 4, w, h, 8, 0, 16, 16), 16, 16);
    const Diff lone = diff(tile10, crop(whole, 3, W, H, 16, 0, 32, 32));
    const Diff d = diff(*tiled, whole);
    EXPECT_LT(d.mean_abs, 0.12) << "decoded std " << stddev(whole);
    EXPECT_LT(d.mean_abs, 0.6 * lone.mean_abs);
    EXPECT_LT(d.max_abs, 0.9f);

    // Overlap 0: tiles at x = 0, 16, 24 (the last moved back to the edge), so a
    // hard edge at latent x = 16; in y the two tiles at 0 and 8 still blend.
    TilingStats hard_stats;
    auto hard = pipeline::decode_tiled(model(), z, w, h, VaeTiling{16, 0.0f}, &hard_stats);
    ASSERT_TRUE(hard.ok()) << hard.error().message;
    EXPECT_EQ(hard_stats.tiles(), 3 * 2);
    const Diff dh = diff(*hard, whole);
    EXPECT_LT(d.mean_abs, dh.mean_abs);
    EXPECT_LT(d.max_abs, dh.max_abs);
    const double seam_x = seam_ratio(*tiled, whole, 3, W, H, 0), seam_y = seam_ratio(*tiled, whole, 3, W, H, 1);
    const double hard_x = seam_ratio(*hard, whole, 3, W, H, 0);
    EXPECT_LT(seam_x, 2.0);
    EXPECT_LT(seam_y, 2.0);
    EXPECT_GT(hard_x, 3.0);  // the metric does see a seam

    // Larger tiles converge on the untiled decode.
    auto big = pipeline::decode_tiled(model(), z, w, h, VaeTiling{32, 0.5f});
    ASSERT_TRUE(big.ok()) << big.error().message;
    const Diff db = diff(*big, whole);
    EXPECT_LT(db.mean_abs, 0.5 * d.mean_abs);

    std::printf(
        "decode 40x24, std %.3f: lone tile mean %.4f; tile 16/0.5 mean %.4f max %.4f seams %.2f %.2f; "
        "16/0 mean %.4f max %.4f seam x %.2f; 32/0.5 mean %.4f max %.4f\n",
        stddev(whole), lone.mean_abs, d.mean_abs, d.max_abs, seam_x, seam_y, dh.mean_abs, dh.max_abs, hard_x,
        db.mean_abs, db.max_abs);
}

// Encoding has the same non-locality (measured, latent std 0.47: one 16x16
// tile alone off by 0.199 on average, blended 0.131 (max 1.04), abutting
// 0.159 (max 2.06), tiles of 32 0.034). The latent's error field is noisier
// than the image's and the hard seam smaller against it (ratio 3.1 vs 5.1).
TEST_F(VaeTilingModel, LargeImageEncodesCloseToUntiledWithoutSeams) {
    const int64_t W = 80, H = 48, w = 40, h = 24;
    const std::vector<float> img = test_image(W, H);
    const std::vector<float> whole = encode_whole(img, W, H);
    TilingStats stats;
    auto tiled = pipeline::encode_tiled(model(), img, W, H, VaeTiling{16, 0.5f}, &stats);
    ASSERT_TRUE(tiled.ok()) << tiled.error().message;
    EXPECT_EQ(stats.tiles_x, 4);
    EXPECT_EQ(stats.tiles_y, 2);
    ASSERT_EQ(tiled->size(), static_cast<size_t>(4 * w * h));

    const std::vector<float> tile00 = encode_whole(crop(img, 3, W, H, 0, 0, 32, 32), 32, 32);
    for (int64_t c = 0; c < 4; ++c) {
        for (int64_t y = 0; y < 8; ++y) {
            for (int64_t x = 0; x < 8; ++x) {
                ASSERT_EQ((*tiled)[static_cast<size_t>((c * h + y) * w + x)],
                          tile00[static_cast<size_t>((c * 16 + y) * 16 + x)])
                    << c << " " << y << " " << x;
            }
        }
    }
    const std::vector<float> tile10 = encode_whole(crop(img, 3, W, H, 16, 0, 32, 32), 32, 32);
    const Diff lone = diff(tile10, crop(whole, 4, w, h, 8, 0, 16, 16));
    const Diff d = diff(*tiled, whole);
    EXPECT_LT(d.mean_abs, 0.18) << "latent std " << stddev(whole);
    EXPECT_LT(d.mean_abs, 0.8 * lone.mean_abs);
    EXPECT_LT(d.max_abs, 1.4f);

    auto hard = pipeline::encode_tiled(model(), img, W, H, VaeTiling{16, 0.0f});
    ASSERT_TRUE(hard.ok()) << hard.error().message;
    const Diff dh = diff(*hard, whole);
    EXPECT_LT(d.mean_abs, dh.mean_abs);
    EXPECT_LT(d.max_abs, dh.max_abs);
    const double seam_x = seam_ratio(*tiled, whole, 4, w, h, 0), seam_y = seam_ratio(*tiled, whole, 4, w, h, 1);
    const double hard_x = seam_ratio(*hard, whole, 4, w, h, 0);
    EXPECT_LT(seam_x, 2.0);
    EXPECT_LT(seam_y, 2.0);
    EXPECT_GT(hard_x, 2.5);

    auto big = pipeline::encode_tiled(model(), img, W, H, VaeTiling{32, 0.5f});
    ASSERT_TRUE(big.ok()) << big.error().message;
    const Diff db = diff(*big, whole);
    EXPECT_LT(db.mean_abs, 0.5 * d.mean_abs);

    std::printf(
        "encode 80x48, latent std %.3f: lone tile mean %.4f; tile 16/0.5 mean %.4f max %.4f seams %.2f %.2f; "
        "16/0 mean %.4f max %.4f seam x %.2f; 32/0.5 mean %.4f max %.4f\n",
        stddev(whole), lone.mean_abs, d.mean_abs, d.max_abs, seam_x, seam_y, dh.mean_abs, dh.max_abs, hard_x,
        db.mean_abs, db.max_abs);
}

// Sizes that are not multiples of the tile or the stride (last tile moved
// back), and strips narrower than one tile (one tile across, several along).
// Measured (decode / encode mean error): 0.077 / 0.116, 0.087 / 0.192,
// 0.086 / 0.201, 0.075 / 0.207; seam ratios up to 1.70 / 2.08 (short lines
// give noisier per-position averages than the 40x24 case).
TEST_F(VaeTilingModel, HandlesOddSizesAndStrips) {
    struct Case {
        int64_t w, h;
        int tiles_x, tiles_y;
    };
    for (const Case& k : {Case{37, 21, 4, 2}, Case{8, 40, 1, 4}, Case{40, 8, 4, 1}, Case{9, 33, 1, 4}}) {
        SCOPED_TRACE(std::to_string(k.w) + "x" + std::to_string(k.h) + " latent");
        const std::vector<float> z = noise(static_cast<size_t>(4 * k.w * k.h), 3);
        const std::vector<float> whole = decode_whole(z, k.w, k.h);
        TilingStats stats;
        auto tiled = pipeline::decode_tiled(model(), z, k.w, k.h, VaeTiling{16, 0.5f}, &stats);
        ASSERT_TRUE(tiled.ok()) << tiled.error().message;
        EXPECT_EQ(stats.tiles_x, k.tiles_x);
        EXPECT_EQ(stats.tiles_y, k.tiles_y);
        ASSERT_EQ(tiled->size(), whole.size());
        const Diff d = diff(*tiled, whole);
        EXPECT_LT(d.mean_abs, 0.12);
        EXPECT_LT(seam_ratio(*tiled, whole, 3, 2 * k.w, 2 * k.h, 0), 2.5);
        EXPECT_LT(seam_ratio(*tiled, whole, 3, 2 * k.w, 2 * k.h, 1), 2.5);

        const std::vector<float> img = test_image(2 * k.w, 2 * k.h);
        const std::vector<float> ewhole = encode_whole(img, 2 * k.w, 2 * k.h);
        auto etiled = pipeline::encode_tiled(model(), img, 2 * k.w, 2 * k.h, VaeTiling{16, 0.5f}, &stats);
        ASSERT_TRUE(etiled.ok()) << etiled.error().message;
        EXPECT_EQ(stats.tiles_x, k.tiles_x);
        EXPECT_EQ(stats.tiles_y, k.tiles_y);
        ASSERT_EQ(etiled->size(), ewhole.size());
        const Diff e = diff(*etiled, ewhole);
        EXPECT_LT(e.mean_abs, 0.3);
        EXPECT_LT(seam_ratio(*etiled, ewhole, 4, k.w, k.h, 0), 2.75);
        EXPECT_LT(seam_ratio(*etiled, ewhole, 4, k.w, k.h, 1), 2.75);
    }
}

TEST_F(VaeTilingModel, RejectsBadInput) {
    const VaeTiling tiling{16, 0.5f};
    auto r = pipeline::decode_tiled(model(), std::vector<float>(4 * 20 * 20 - 1), 20, 20, tiling);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("1599 values"), std::string::npos) << r.error().message;
    r = pipeline::decode_tiled(model(), {}, 0, 20, tiling);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("0x20"), std::string::npos) << r.error().message;
    r = pipeline::decode_tiled(model(), std::vector<float>(4 * 20 * 20), 20, 20, VaeTiling{16, 1.0f});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("overlap"), std::string::npos) << r.error().message;

    r = pipeline::encode_tiled(model(), std::vector<float>(3 * 41 * 40), 41, 40, tiling);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("multiples of 2"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("41x40"), std::string::npos) << r.error().message;
    r = pipeline::encode_tiled(model(), std::vector<float>(3 * 40 * 40 + 1), 40, 40, tiling);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("4801 values"), std::string::npos) << r.error().message;
    r = pipeline::encode_tiled(model(), std::vector<float>(3 * 40 * 40), 40, 40, VaeTiling{7, 0.5f});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("tile size"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace kiln
