// ESRGAN's RRDBNet (models/nets/rrdbnet.h) and the tiled upscaler around it
// (pipeline/upscaler.h), against the PyTorch reference of
// training/reference/rrdbnet.py (fixtures by training/make_rrdbnet_fixtures.py):
// x4 in ESRGAN's names, x2 with Real-ESRGAN's pixel unshuffle, and the x4
// network again in BasicSR's names inside a .pth under "params_ema".
#include "models/nets/rrdbnet.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "image/png_metadata.h"
#include "pipeline/upscaler.h"

namespace kiln {
namespace {

using pipeline::Upscaler;

std::unique_ptr<Upscaler> load_golden(const std::string& name) {
    auto up = Upscaler::load(test::golden_path("models/" + name), 1);
    if (!up.ok()) {
        ADD_FAILURE() << up.error().message;
        return nullptr;
    }
    return std::move(up).value();
}

struct GoldenIo {
    std::vector<float> input;  // planar [3, 10, 12]
    std::vector<float> x4, x2;
};

GoldenIo golden_io() {
    auto file = io::ModelFile::open({test::golden_path("models/rrdbnet_io.safetensors")});
    EXPECT_TRUE(file.ok()) << file.error().message;
    return {test::fixture_tensor(*file, "input").values, test::fixture_tensor(*file, "x4_output").values,
            test::fixture_tensor(*file, "x2_output").values};
}

constexpr int kWidth = 12, kHeight = 10;

TEST(RrdbNet, ConfigurationComesFromTheWeights) {
    auto x4 = load_golden("rrdbnet_x4.safetensors");
    auto x2 = load_golden("rrdbnet_x2.safetensors");
    auto pth = load_golden("rrdbnet_x4_basicsr.pth");
    ASSERT_TRUE(x4 && x2 && pth);
    const models::RrdbNetConfig& c = x4->network().config();
    EXPECT_EQ(c.naming, models::RrdbNaming::Esrgan);
    EXPECT_EQ(c.prefix, "");
    EXPECT_EQ(c.features, 8);
    EXPECT_EQ(c.growth, 4);
    EXPECT_EQ(c.blocks, 2);
    EXPECT_EQ(c.upsamplers, 2);
    EXPECT_EQ(c.unshuffle, 1);
    EXPECT_EQ(x4->scale(), 4);
    EXPECT_EQ(x2->network().config().unshuffle, 2);
    EXPECT_EQ(x2->scale(), 2);
    EXPECT_EQ(pth->network().config().naming, models::RrdbNaming::BasicSr);
    EXPECT_EQ(pth->network().config().prefix, "params_ema.");
    EXPECT_EQ(pth->scale(), 4);
    EXPECT_EQ(x4->name(), "rrdbnet_x4");
}

// The golden input through `model`, untiled, against the reference's output.
void expect_matches_reference(const std::string& model, const std::vector<float>& input,
                              const std::vector<float>& expected) {
    auto up = load_golden(model);
    ASSERT_TRUE(up);
    auto out = up->upscale_planar(input, kWidth, kHeight, pipeline::kDefaultUpscaleTile);
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_EQ(out->size(), expected.size());
    EXPECT_LT(test::relative_error(*out, expected), 1e-5) << model;
}

TEST(RrdbNet, X4MatchesTheReference) {
    const GoldenIo io = golden_io();
    expect_matches_reference("rrdbnet_x4.safetensors", io.input, io.x4);
}

TEST(RrdbNet, X2WithPixelUnshuffleMatchesTheReference) {
    const GoldenIo io = golden_io();
    expect_matches_reference("rrdbnet_x2.safetensors", io.input, io.x2);
}

TEST(RrdbNet, BasicSrNamesInAPthGiveTheSameImageAsEsrganNames) {
    auto esrgan = load_golden("rrdbnet_x4.safetensors");
    auto basicsr = load_golden("rrdbnet_x4_basicsr.pth");
    ASSERT_TRUE(esrgan && basicsr);
    const GoldenIo io = golden_io();
    auto a = esrgan->upscale_planar(io.input, kWidth, kHeight, pipeline::kDefaultUpscaleTile);
    auto b = basicsr->upscale_planar(io.input, kWidth, kHeight, pipeline::kDefaultUpscaleTile);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);  // the same weights through the same graph
}

std::vector<float> random_image(int width, int height, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(3 * width * height));
    // Smooth content (as photos are) plus a little noise.
    for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < height; ++y) {
            for (int x = 0; x < width; ++x) {
                v[static_cast<size_t>((c * height + y) * width + x)] =
                    0.5f +
                    0.3f * std::sin(0.2f * static_cast<float>(x + 2 * c)) * std::cos(0.15f * static_cast<float>(y)) +
                    0.1f * (u(gen) - 0.5f);
            }
        }
    }
    return v;
}

// Tiles of 64 input pixels over 144x112 (3x2 tiles overlapping by at least
// 16) against one tile over everything: close, not equal (the network sees
// further than the overlap, so the seams are real).
void expect_tiled_close_to_untiled(const std::string& model) {
    auto up = load_golden(model);
    ASSERT_TRUE(up);
    const int w = 144, h = 112;
    const std::vector<float> img = random_image(w, h, 7);
    auto whole = up->upscale_planar(img, w, h, 4096);
    auto tiled = up->upscale_planar(img, w, h, 64);
    ASSERT_TRUE(whole.ok() && tiled.ok());
    ASSERT_EQ(whole->size(), static_cast<size_t>(3 * w * h * up->scale() * up->scale()));
    ASSERT_EQ(tiled->size(), whole->size());
    double sum = 0;
    for (size_t i = 0; i < whole->size(); ++i) sum += std::fabs((*whole)[i] - (*tiled)[i]);
    const double mean = sum / static_cast<double>(whole->size());
    EXPECT_GT(mean, 0.0) << "the tiled run should really be tiled";
    // Measured: mean 5e-4 (x4) and 1.7e-3 (x2); the worst pixel, at a seam,
    // 2.4% and 5.8% of the image's range.
    EXPECT_LT(mean, 2.5e-3) << model;
    EXPECT_LT(test::relative_error(*tiled, *whole), 0.08) << model;
}

TEST(RrdbNet, TiledUpscaleMatchesUntiledClosely) {
    expect_tiled_close_to_untiled("rrdbnet_x4.safetensors");
    expect_tiled_close_to_untiled("rrdbnet_x2.safetensors");
}

TEST(RrdbNet, OddSizesUnderPixelUnshuffleArePaddedWithTheEdgeAndCropped) {
    auto up = load_golden("rrdbnet_x2.safetensors");
    ASSERT_TRUE(up);
    const int w = 11, h = 9;
    const std::vector<float> img = random_image(w, h, 3);
    auto out = up->upscale_planar(img, w, h, pipeline::kDefaultUpscaleTile);
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_EQ(out->size(), static_cast<size_t>(3 * 22 * 18));
    // The same picture padded by hand to 12x10 with its last column and row
    // repeated: its upscale, cropped to 22x18, is the odd-sized result.
    std::vector<float> padded(static_cast<size_t>(3 * 12 * 10));
    for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < 10; ++y) {
            for (int x = 0; x < 12; ++x) {
                padded[static_cast<size_t>((c * 10 + y) * 12 + x)] =
                    img[static_cast<size_t>((c * h + std::min(y, h - 1)) * w + std::min(x, w - 1))];
            }
        }
    }
    auto full = up->upscale_planar(padded, 12, 10, pipeline::kDefaultUpscaleTile);
    ASSERT_TRUE(full.ok());
    for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < 18; ++y) {
            for (int x = 0; x < 22; ++x) {
                ASSERT_EQ((*out)[static_cast<size_t>((c * 18 + y) * 22 + x)],
                          (*full)[static_cast<size_t>((c * 20 + y) * 24 + x)])
                    << c << " " << x << " " << y;
            }
        }
    }
}

TEST(RrdbNet, EightBitUpscaleRepeatsAndKeepsTheSize) {
    auto up = load_golden("rrdbnet_x2.safetensors");
    ASSERT_TRUE(up);
    image::Image img = image::make_image(10, 6, 3, 128);
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i * 37) % 256);
    auto once = up->upscale(img, pipeline::kDefaultUpscaleTile, 1);
    auto twice = up->upscale(img, pipeline::kDefaultUpscaleTile, 2);
    ASSERT_TRUE(once.ok() && twice.ok());
    EXPECT_EQ(once->width, 20);
    EXPECT_EQ(once->height, 12);
    EXPECT_EQ(twice->width, 40);
    EXPECT_EQ(twice->height, 24);
    auto again = up->upscale(*once, pipeline::kDefaultUpscaleTile, 1);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->pixels, twice->pixels);

    auto bad_tile = up->upscale(img, 8, 1);
    ASSERT_FALSE(bad_tile.ok());
    EXPECT_EQ(bad_tile.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(bad_tile.error().message.find("--upscale-tile-size"), std::string::npos);
    auto bad_repeats = up->upscale(img, pipeline::kDefaultUpscaleTile, 0);
    ASSERT_FALSE(bad_repeats.ok());
    EXPECT_EQ(bad_repeats.error().kind, ErrorKind::InvalidRequest);
    auto too_big = up->upscale(image::make_image(9000, 2, 3), pipeline::kDefaultUpscaleTile, 1);
    ASSERT_FALSE(too_big.ok());
    EXPECT_EQ(too_big.error().kind, ErrorKind::InvalidRequest);
}

// A safetensors file of `names`, each a small F32 convolution weight of `shape`.
std::string write_model(const test::TempDir& dir, const std::vector<std::pair<std::string, std::vector<int64_t>>>& t) {
    std::vector<test::SafetensorsEntry> entries;
    for (const auto& [name, shape] : t) {
        size_t n = 1;
        for (int64_t d : shape) n *= static_cast<size_t>(d);
        entries.push_back({name, "F32", shape, test::f32_bytes(n)});
    }
    return dir.write("model.safetensors", test::build_safetensors(entries));
}

TEST(RrdbNet, BadFilesAreBadFileErrorsNamingTheTensor) {
    test::TempDir dir;
    // Not an upscaler at all.
    {
        auto up = Upscaler::load(write_model(dir, {{"encoder.conv_in.weight", {8, 3, 3, 3}}}), 1);
        ASSERT_FALSE(up.ok());
        EXPECT_EQ(up.error().kind, ErrorKind::BadFile);
        EXPECT_NE(up.error().message.find("conv_first.weight"), std::string::npos) << up.error().message;
        EXPECT_NE(up.error().message.find("model.0.weight"), std::string::npos) << up.error().message;
    }
    // A first convolution and nothing else.
    {
        auto up = Upscaler::load(write_model(dir, {{"conv_first.weight", {8, 3, 3, 3}}}), 1);
        ASSERT_FALSE(up.ok());
        EXPECT_EQ(up.error().kind, ErrorKind::BadFile);
        EXPECT_NE(up.error().message.find("body.0.rdb1.conv1.weight"), std::string::npos) << up.error().message;
    }
    // The golden x4 network less one dense convolution's bias.
    {
        auto golden = io::ModelFile::open({test::golden_path("models/rrdbnet_x4.safetensors")});
        ASSERT_TRUE(golden.ok());
        std::vector<test::SafetensorsEntry> entries;
        for (const io::TensorInfo& t : golden->tensors()) {
            if (t.name != "model.1.sub.1.RDB2.conv3.0.bias") entries.push_back(test::copy_entry(*golden, t, t.name));
        }
        auto up = Upscaler::load(dir.write("holed.safetensors", test::build_safetensors(entries)), 1);
        ASSERT_FALSE(up.ok());
        EXPECT_EQ(up.error().kind, ErrorKind::BadFile);
        EXPECT_NE(up.error().message.find("model.1.sub.1.RDB2.conv3.0.bias"), std::string::npos) << up.error().message;
    }
    // Input channels that are no pixel unshuffle of the output's.
    {
        auto golden = io::ModelFile::open({test::golden_path("models/rrdbnet_x4.safetensors")});
        ASSERT_TRUE(golden.ok());
        std::vector<test::SafetensorsEntry> entries;
        for (const io::TensorInfo& t : golden->tensors()) {
            test::SafetensorsEntry e = test::copy_entry(*golden, t, t.name);
            if (t.name == "model.0.weight") {
                e.shape = {8, 5, 3, 3};
                e.data = test::f32_bytes(8 * 5 * 9);
            }
            entries.push_back(e);
        }
        auto up = Upscaler::load(dir.write("channels.safetensors", test::build_safetensors(entries)), 1);
        ASSERT_FALSE(up.ok());
        EXPECT_EQ(up.error().kind, ErrorKind::BadFile);
        EXPECT_NE(up.error().message.find("conv_first takes 5 channels"), std::string::npos) << up.error().message;
    }
    // Not a model file.
    {
        auto up = Upscaler::load(dir.write("junk.safetensors", std::string("not a model")), 1);
        ASSERT_FALSE(up.ok());
        EXPECT_EQ(up.error().kind, ErrorKind::BadFile);
    }
    auto missing = Upscaler::load(dir.file("absent.pth"), 1);
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().kind, ErrorKind::BadFile);
}

TEST(RrdbNet, ACancelCheckStopsTheRunBetweenTiles) {
    auto up = load_golden("rrdbnet_x4.safetensors");
    ASSERT_TRUE(up);
    const std::vector<float> img = random_image(96, 64, 5);
    int asked = 0;
    up->set_cancel_check([&asked] { return ++asked == 3; });  // cancel before the third of 3x2 tiles
    auto out = up->upscale_planar(img, 96, 64, 48);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().kind, ErrorKind::Cancelled);
    EXPECT_EQ(asked, 3);
    up->set_cancel_check(nullptr);
    EXPECT_TRUE(up->upscale_planar(img, 96, 64, 48).ok());  // the upscaler serves the next run
}

TEST(RrdbNet, PostprocessKeysAreAddedToTheParametersText) {
    const std::string text =
        "a red circle\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 64x64, "
        "Model: kiln-tiny";
    const std::string out = pipeline::add_postprocess_upscale(text, "RealESRGAN_x4plus", 4);
    EXPECT_EQ(out.rfind("a red circle\nNegative prompt: blurry\nSteps: 20,", 0), 0u) << out;
    EXPECT_NE(out.find("Postprocess upscale by: 4, Postprocess upscaler: RealESRGAN_x4plus"), std::string::npos) << out;
    const image::GenerationInfo back = image::parse_a1111_parameters(out);
    EXPECT_EQ(back.seed, 42);
    EXPECT_EQ(back.width, 64);
}

}  // namespace
}  // namespace kiln
