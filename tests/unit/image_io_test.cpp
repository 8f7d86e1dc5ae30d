#include "image/image_io.h"

#include <gtest/gtest.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "image/image.h"
#include "image/png_metadata.h"
#include "pixel_difference.h"
#include "test_files.h"

namespace kiln::image {
namespace {

namespace fs = std::filesystem;
using test::pixel_difference;
using test::read_bytes;
using test::TempDir;

// ---- helpers ----------------------------------------------------------------

// A smooth picture (gradients plus a soft blob) that lossy codecs keep well.
Image gradient(int w, int h, int channels) {
    Image im = make_image(w, h, channels);
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            uint8_t* p = im.pixel(x, y);
            const double dx = x - w / 2.0, dy = y - h / 2.0;
            const double blob = 80.0 * std::exp(-(dx * dx + dy * dy) / (w * h / 8.0));
            const int v[4] = {x * 255 / (w - 1), y * 255 / (h - 1), static_cast<int>(60 + blob),
                              255 - (x + y) * 200 / (w + h)};
            for (int c = 0; c < channels; ++c) p[c] = static_cast<uint8_t>(channels == 1 ? v[0] : v[c]);
        }
    }
    return im;
}

// Random samples: only a lossless codec gets these back.
Image noise(int w, int h, int channels, unsigned seed = 1) {
    Image im = make_image(w, h, channels);
    std::mt19937 rng(seed);
    for (uint8_t& b : im.pixels) b = static_cast<uint8_t>(rng());
    return im;
}

void expect_error(const Result<Image>& r, const std::string& path, const std::string& fragment) {
    ASSERT_FALSE(r.ok()) << "expected an error containing: " << fragment;
    EXPECT_EQ(r.error().message.rfind(path + ": ", 0), 0u) << r.error().message;
    EXPECT_NE(r.error().message.find(fragment), std::string::npos) << r.error().message;
}

std::string write_or_die(const TempDir& dir, const std::string& name, const Image& im,
                         const ImageWriteOptions& options = {}) {
    const std::string path = dir.file(name);
    Status s = write_image(path, im, options);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return path;
}

// A PNG made directly with libpng, so the tests cover layouts kiln itself
// never writes: palettes, 1-bit grey, 16-bit samples, tRNS, interlacing,
// compressed text. `rows` are raw PNG rows (big-endian 16-bit, packed bits).
struct PngSpec {
    int width = 0, height = 0, bit_depth = 8, color_type = PNG_COLOR_TYPE_RGB;
    bool interlace = false;
    std::vector<png_color> palette;
    std::vector<png_byte> palette_alpha;  // tRNS for palettes
    bool has_trans_color = false;         // tRNS for grey/RGB
    png_color_16 trans_color{};
    std::vector<std::vector<uint8_t>> rows;
    std::vector<png_text> text;
};

void test_png_error(png_structp png, png_const_charp msg) {
    ADD_FAILURE() << "libpng (test writer): " << msg;
    png_longjmp(png, 1);
}

bool write_png_step(png_structp png, png_infop info, FILE* f, PngSpec* s, png_bytepp rows) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_init_io(png, f);
    png_set_IHDR(png, info, s->width, s->height, s->bit_depth, s->color_type,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (!s->palette.empty()) png_set_PLTE(png, info, s->palette.data(), static_cast<int>(s->palette.size()));
    if (!s->palette_alpha.empty()) {
        png_set_tRNS(png, info, s->palette_alpha.data(), static_cast<int>(s->palette_alpha.size()), nullptr);
    }
    if (s->has_trans_color) png_set_tRNS(png, info, nullptr, 0, &s->trans_color);
    if (!s->text.empty()) png_set_text(png, info, s->text.data(), static_cast<int>(s->text.size()));
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, nullptr);
    return true;
}

std::string write_png_spec(const TempDir& dir, const std::string& name, PngSpec spec) {
    const std::string path = dir.file(name);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return path;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, test_png_error, nullptr);
    png_infop info = png_create_info_struct(png);
    std::vector<png_bytep> rows;
    for (auto& r : spec.rows) rows.push_back(r.data());
    EXPECT_TRUE(write_png_step(png, info, f, &spec, rows.data()));
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    return path;
}

png_text make_text(int compression, const char* key, const char* text) {
    png_text t{};
    t.compression = compression;
    t.key = const_cast<char*>(key);
    t.text = const_cast<char*>(text);
    t.text_length = std::strlen(text);
    return t;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
    return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) | b[at + 3];
}

// Offset of the first chunk of `type` in a PNG file.
size_t find_chunk(const std::vector<uint8_t>& png, const char* type) {
    for (size_t pos = 8; pos + 8 <= png.size(); pos += 12 + be32(png, pos)) {
        if (std::memcmp(png.data() + pos + 4, type, 4) == 0) return pos;
    }
    return std::string::npos;
}

// ---- round trips ------------------------------------------------------------

TEST(ImageIo, PngRoundTripIsExactForEveryChannelCount) {
    TempDir dir;
    for (int channels : {3, 4, 1}) {
        const Image im = noise(37, 23, channels, static_cast<unsigned>(channels));
        const std::string path = write_or_die(dir, "n" + std::to_string(channels) + ".png", im);
        Result<Image> back = read_image(path);
        ASSERT_TRUE(back.ok()) << back.error().message;
        EXPECT_EQ(back->width, 37);
        EXPECT_EQ(back->height, 23);
        if (channels == 1) {
            // Grey files come back as RGB with the sample repeated.
            ASSERT_EQ(back->channels, 3);
            for (size_t i = 0; i < im.pixels.size(); ++i) {
                ASSERT_EQ(back->pixels[3 * i], im.pixels[i]);
                ASSERT_EQ(back->pixels[3 * i + 2], im.pixels[i]);
            }
        } else {
            EXPECT_EQ(back->channels, channels);
            EXPECT_EQ(back->pixels, im.pixels);
        }
    }
}

TEST(ImageIo, JpegRoundTripIsClose) {
    TempDir dir;
    const Image im = gradient(64, 48, 3);
    const std::string path = write_or_die(dir, "g.jpg", im);
    Result<Image> back = read_image(path);
    ASSERT_TRUE(back.ok()) << back.error().message;
    ASSERT_EQ(back->channels, 3);
    ASSERT_EQ(back->width, 64);
    ASSERT_EQ(back->height, 48);
    const test::PixelDifference d = pixel_difference(im, *back);
    EXPECT_LT(d.mean, 2.0);
    EXPECT_LT(d.max, 24);

    // Lower quality, smaller file, still close.
    ImageWriteOptions low;
    low.quality = 30;
    const std::string low_path = write_or_die(dir, "g30.JPEG", im, low);
    EXPECT_LT(read_bytes(low_path).size(), read_bytes(path).size());
    Result<Image> low_back = read_image(low_path);
    ASSERT_TRUE(low_back.ok()) << low_back.error().message;
    EXPECT_LT(pixel_difference(im, *low_back).mean, 6.0);
}

TEST(ImageIo, JpegWritesGreyAndDropsAlpha) {
    TempDir dir;
    const Image grey = gradient(32, 32, 1);
    Result<Image> back = read_image(write_or_die(dir, "grey.jpeg", grey));
    ASSERT_TRUE(back.ok()) << back.error().message;
    ASSERT_EQ(back->channels, 3);
    Result<Image> back_grey = convert_channels(*back, 1);
    ASSERT_TRUE(back_grey.ok());
    EXPECT_LT(pixel_difference(grey, *back_grey).mean, 2.0);

    const Image rgba = gradient(32, 32, 4);
    Result<Image> back_rgb = read_image(write_or_die(dir, "rgba.jpg", rgba));
    ASSERT_TRUE(back_rgb.ok()) << back_rgb.error().message;
    ASSERT_EQ(back_rgb->channels, 3);
    EXPECT_LT(pixel_difference(*convert_channels(rgba, 3), *back_rgb).mean, 2.0);
}

TEST(ImageIo, WebPLossyIsCloseAndLosslessIsExact) {
    TempDir dir;
    const Image im = gradient(64, 48, 3);
    Result<Image> lossy = read_image(write_or_die(dir, "g.webp", im));
    ASSERT_TRUE(lossy.ok()) << lossy.error().message;
    ASSERT_EQ(lossy->channels, 3);
    EXPECT_LT(pixel_difference(im, *lossy).mean, 3.0);
    EXPECT_LT(pixel_difference(im, *lossy).max, 40);

    ImageWriteOptions lossless;
    lossless.lossless = true;
    for (int channels : {3, 4}) {
        Image n = noise(29, 17, channels, 7);
        if (channels == 4) n.pixel(3, 3)[3] = 0;  // colour under zero alpha must survive too
        Result<Image> back = read_image(write_or_die(dir, "n" + std::to_string(channels) + ".webp", n, lossless));
        ASSERT_TRUE(back.ok()) << back.error().message;
        EXPECT_EQ(back->channels, channels);
        EXPECT_EQ(back->pixels, n.pixels);
    }

    // Lossy RGBA keeps alpha exactly (libwebp codes alpha losslessly).
    const Image rgba = gradient(40, 40, 4);
    Result<Image> back = read_image(write_or_die(dir, "rgba.webp", rgba));
    ASSERT_TRUE(back.ok()) << back.error().message;
    ASSERT_EQ(back->channels, 4);
    for (size_t i = 3; i < rgba.pixels.size(); i += 4) ASSERT_EQ(back->pixels[i], rgba.pixels[i]);

    // Grey is written as RGB.
    const Image grey = gradient(16, 16, 1);
    Result<Image> back_grey = read_image(write_or_die(dir, "grey.webp", grey, lossless));
    ASSERT_TRUE(back_grey.ok()) << back_grey.error().message;
    EXPECT_EQ(convert_channels(*back_grey, 1)->pixels, grey.pixels);
}

TEST(ImageIo, FormatIsChosenByContentNotName) {
    TempDir dir;
    const Image im = noise(8, 8, 3);
    const std::string png = write_or_die(dir, "real.png", im);
    const std::string renamed = dir.file("actually_png.jpg");
    fs::rename(png, renamed);
    Result<Image> back = read_image(renamed);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->pixels, im.pixels);
    const auto bytes = read_bytes(renamed);
    EXPECT_EQ(detect_image_format(bytes.data(), bytes.size()), ImageFormat::Png);
}

TEST(ImageIo, WriteReplacesAnExistingFileAndLeavesNoPartFile) {
    TempDir dir;
    const std::string path = dir.write("out.png", std::string("old contents"));
    const Image im = noise(5, 5, 3);
    ASSERT_TRUE(write_image(path, im).ok());
    EXPECT_FALSE(fs::exists(path + ".part"));
    Result<Image> back = read_image(path);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->pixels, im.pixels);
}

// ---- PNG layouts kiln does not write ------------------------------------------

TEST(ImageIo, ReadsGreyPngsAsRgb) {
    TempDir dir;
    PngSpec grey8;
    grey8.width = 3, grey8.height = 1, grey8.color_type = PNG_COLOR_TYPE_GRAY;
    grey8.rows = {{0, 100, 255}};
    Result<Image> a = read_image(write_png_spec(dir, "g8.png", grey8));
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->channels, 3);
    EXPECT_EQ(a->pixels, (std::vector<uint8_t>{0, 0, 0, 100, 100, 100, 255, 255, 255}));

    PngSpec grey1;
    grey1.width = 8, grey1.height = 1, grey1.bit_depth = 1, grey1.color_type = PNG_COLOR_TYPE_GRAY;
    grey1.rows = {{0xB0}};  // 1 0 1 1 0 0 0 0
    Result<Image> b = read_image(write_png_spec(dir, "g1.png", grey1));
    ASSERT_TRUE(b.ok()) << b.error().message;
    ASSERT_EQ(b->channels, 3);
    const uint8_t expected[8] = {255, 0, 255, 255, 0, 0, 0, 0};
    for (int x = 0; x < 8; ++x) EXPECT_EQ(b->pixel(x, 0)[1], expected[x]) << x;

    PngSpec grey_alpha;
    grey_alpha.width = 2, grey_alpha.height = 1, grey_alpha.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
    grey_alpha.rows = {{10, 20, 30, 40}};
    Result<Image> c = read_image(write_png_spec(dir, "ga.png", grey_alpha));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->channels, 4);
    EXPECT_EQ(c->pixels, (std::vector<uint8_t>{10, 10, 10, 20, 30, 30, 30, 40}));
}

TEST(ImageIo, ReadsPalettePngsWithAndWithoutTransparency) {
    TempDir dir;
    PngSpec pal;
    pal.width = 4, pal.height = 1, pal.bit_depth = 4, pal.color_type = PNG_COLOR_TYPE_PALETTE;
    pal.palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}};
    pal.rows = {{0x01, 0x22}};  // indices 0 1 2 2
    Result<Image> opaque = read_image(write_png_spec(dir, "pal.png", pal));
    ASSERT_TRUE(opaque.ok()) << opaque.error().message;
    EXPECT_EQ(opaque->channels, 3);
    EXPECT_EQ(opaque->pixels, (std::vector<uint8_t>{255, 0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 255}));

    pal.palette_alpha = {255, 128};  // entry 2 has no alpha: opaque
    Result<Image> alpha = read_image(write_png_spec(dir, "pal_trns.png", pal));
    ASSERT_TRUE(alpha.ok()) << alpha.error().message;
    EXPECT_EQ(alpha->channels, 4);
    EXPECT_EQ(alpha->pixels, (std::vector<uint8_t>{255, 0, 0, 255, 0, 255, 0, 128, 0, 0, 255, 255, 0, 0, 255, 255}));
}

TEST(ImageIo, Reads16BitPngsRoundedTo8Bits) {
    TempDir dir;
    const uint16_t samples[6] = {0x0000, 0x1234, 0x8080, 0x80FF, 0xFEFF, 0xFFFF};
    PngSpec rgb16;
    rgb16.width = 2, rgb16.height = 1, rgb16.bit_depth = 16, rgb16.color_type = PNG_COLOR_TYPE_RGB;
    rgb16.rows.resize(1);
    for (uint16_t s : samples) {
        rgb16.rows[0].push_back(static_cast<uint8_t>(s >> 8));
        rgb16.rows[0].push_back(static_cast<uint8_t>(s));
    }
    Result<Image> im = read_image(write_png_spec(dir, "rgb16.png", rgb16));
    ASSERT_TRUE(im.ok()) << im.error().message;
    ASSERT_EQ(im->channels, 3);
    for (int i = 0; i < 6; ++i) {
        const int exact = static_cast<int>(std::lround(samples[i] * 255.0 / 65535.0));
        EXPECT_EQ(im->pixels[i], exact) << "sample " << samples[i];
    }

    // 16-bit grey with a transparent colour key becomes RGBA.
    PngSpec grey16;
    grey16.width = 2, grey16.height = 1, grey16.bit_depth = 16, grey16.color_type = PNG_COLOR_TYPE_GRAY;
    grey16.rows = {{0x12, 0x34, 0xFF, 0xFF}};
    grey16.has_trans_color = true;
    grey16.trans_color.gray = 0x1234;
    Result<Image> keyed = read_image(write_png_spec(dir, "grey16.png", grey16));
    ASSERT_TRUE(keyed.ok()) << keyed.error().message;
    ASSERT_EQ(keyed->channels, 4);
    EXPECT_EQ(keyed->pixel(0, 0)[3], 0);
    EXPECT_EQ(keyed->pixel(1, 0)[0], 255);
    EXPECT_EQ(keyed->pixel(1, 0)[3], 255);
}

TEST(ImageIo, ReadsInterlacedPngs) {
    TempDir dir;
    const Image im = noise(13, 11, 3, 3);
    PngSpec spec;
    spec.width = 13, spec.height = 11, spec.interlace = true;
    for (int y = 0; y < 11; ++y) spec.rows.emplace_back(im.pixel(0, y), im.pixel(0, y) + im.row_bytes());
    Result<Image> back = read_image(write_png_spec(dir, "adam7.png", spec));
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->pixels, im.pixels);
}

// ---- bad input ----------------------------------------------------------------

TEST(ImageIoErrors, MissingEmptyDirectoryAndUnknownFiles) {
    TempDir dir;
    const std::string missing = dir.file("nope.png");
    expect_error(read_image(missing), missing, "no such file or folder");

    const std::string empty = dir.write("empty.png", std::string());
    expect_error(read_image(empty), empty, "empty");

    const std::string folder = dir.file("folder.png");
    fs::create_directory(folder);
    expect_error(read_image(folder), folder, "is a folder, not a file");

    std::vector<uint8_t> random(4096);
    std::mt19937 rng(5);
    for (uint8_t& b : random) b = static_cast<uint8_t>(rng());
    random[0] = 0x00;  // no accidental signature
    const std::string junk = dir.write("junk.png", random);
    expect_error(read_image(junk), junk, "not a PNG, JPEG or WebP image");

    const std::string gif = dir.write("anim.gif", std::string("GIF89a\x01\x00\x01\x00\x00\x00\x00;", 14));
    expect_error(read_image(gif), gif, "GIF");
}

TEST(ImageIoErrors, TruncatedFilesOfEachFormat) {
    TempDir dir;
    const Image im = gradient(48, 40, 3);
    ImageWriteOptions options;
    options.text[kParametersKeyword] = "a prompt\nSteps: 20, Sampler: Euler a, CFG scale: 7";
    for (const char* name : {"t.png", "t.jpg", "t.webp"}) {
        const auto full = read_bytes(write_or_die(dir, name, im, options));
        ASSERT_GT(full.size(), 200u);
        for (size_t keep : {size_t(16), size_t(60), full.size() / 2, full.size() - 1}) {
            SCOPED_TRACE(std::string(name) + " cut to " + std::to_string(keep) + " bytes");
            const std::string cut =
                dir.write(std::string("cut_") + std::to_string(keep) + "_" + name,
                          std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(keep)));
            expect_error(read_image(cut), cut, "truncated");
        }
    }
}

TEST(ImageIoErrors, CorruptPngJpegAndWebP) {
    TempDir dir;
    const Image im = gradient(64, 64, 3);

    auto png = read_bytes(write_or_die(dir, "c.png", im));
    const size_t idat = find_chunk(png, "IDAT");
    ASSERT_NE(idat, std::string::npos);
    png[idat + 8 + 10] ^= 0x55;
    const std::string bad_png = dir.write("bad.png", png);
    expect_error(read_image(bad_png), bad_png, "corrupt PNG");

    // Garbage after a valid signature.
    std::vector<uint8_t> sig_then_junk = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    for (int i = 0; i < 64; ++i) sig_then_junk.push_back(static_cast<uint8_t>(i * 37));
    const std::string junk_png = dir.write("junk.png", sig_then_junk);
    expect_error(read_image(junk_png), junk_png, "PNG");

    // JPEG: scramble the middle of the entropy-coded data.
    auto jpg = read_bytes(write_or_die(dir, "c.jpg", im));
    std::mt19937 rng(11);
    for (size_t i = jpg.size() / 2; i < jpg.size() / 2 + 64; ++i) jpg[i] = static_cast<uint8_t>(rng());
    const std::string bad_jpg = dir.write("bad.jpg", jpg);
    expect_error(read_image(bad_jpg), bad_jpg, "corrupt JPEG");

    // A JPEG that is only a start-of-image marker and junk.
    const std::string junk_jpg = dir.write("junk.jpg", std::string("\xff\xd8\xff\x00garbage-garbage-garbage", 27));
    expect_error(read_image(junk_jpg), junk_jpg, "JPEG");

    auto webp = read_bytes(write_or_die(dir, "c.webp", im));
    for (size_t i = 40; i < webp.size(); ++i) webp[i] = static_cast<uint8_t>(rng());
    const std::string bad_webp = dir.write("bad.webp", webp);
    expect_error(read_image(bad_webp), bad_webp, "WebP");
}

TEST(ImageIoErrors, OversizedImagesAreRejectedBeforeDecoding) {
    TempDir dir;
    // PNG: IHDR rewritten to 20000x10, with a matching CRC.
    auto png = read_bytes(write_or_die(dir, "small.png", noise(4, 4, 3)));
    const size_t ihdr = find_chunk(png, "IHDR");
    ASSERT_EQ(ihdr, 8u);
    const uint8_t size[8] = {0, 0, 0x4E, 0x20, 0, 0, 0, 10};
    std::memcpy(png.data() + ihdr + 8, size, 8);
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, png.data() + ihdr + 4, 4 + 13));
    for (int i = 0; i < 4; ++i) png[ihdr + 8 + 13 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
    const std::string big_png = dir.write("big.png", png);
    expect_error(read_image(big_png), big_png, "20000x10 pixels, larger than the 16384x16384 limit");

    // JPEG: the frame header's height and width set to 30000.
    auto jpg = read_bytes(write_or_die(dir, "small.jpg", noise(8, 8, 3)));
    size_t sof = std::string::npos;
    for (size_t i = 2; i + 9 < jpg.size(); ++i) {
        if (jpg[i] == 0xFF && (jpg[i + 1] == 0xC0 || jpg[i + 1] == 0xC2)) {
            sof = i;
            break;
        }
    }
    ASSERT_NE(sof, std::string::npos);
    jpg[sof + 5] = 0x75, jpg[sof + 6] = 0x30;  // height 30000
    jpg[sof + 7] = 0x75, jpg[sof + 8] = 0x30;  // width 30000
    const std::string big_jpg = dir.write("big.jpg", jpg);
    expect_error(read_image(big_jpg), big_jpg, "30000x30000 pixels, larger than the 16384x16384 limit");
}

TEST(ImageIoErrors, UnknownExtensionOnWriteNamesTheValidOnes) {
    TempDir dir;
    const Image im = noise(4, 4, 3);
    for (const char* name : {"out.bmp", "out.tiff", "no_extension", "dir.png/out"}) {
        const std::string path = dir.path() + "/" + name;
        Status s = write_image(path, im);
        ASSERT_FALSE(s.ok()) << name;
        EXPECT_EQ(s.error().message.rfind(path + ": ", 0), 0u) << s.error().message;
        EXPECT_NE(s.error().message.find(".png, .jpg, .jpeg or .webp"), std::string::npos) << s.error().message;
        EXPECT_FALSE(fs::exists(path));
        EXPECT_FALSE(fs::exists(path + ".part"));
    }
    Status bmp = write_image(dir.path() + "/x.BMP", im);
    ASSERT_FALSE(bmp.ok());
    EXPECT_NE(bmp.error().message.find("'.BMP'"), std::string::npos) << bmp.error().message;
    // Upper-case known extensions are fine.
    EXPECT_TRUE(write_image(dir.path() + "/x.PNG", im).ok());
    EXPECT_TRUE(write_image(dir.path() + "/x.WebP", im).ok());
}

TEST(ImageIoErrors, UnwritableDestinationLeavesNoFileAndNoPartFile) {
    TempDir dir;
    const Image im = noise(4, 4, 3);
    const std::string not_a_dir = dir.write("plain_file", std::string("x"));
    for (const std::string& path : {dir.path() + "/missing_dir/out.png", not_a_dir + "/out.jpg"}) {
        Status s = write_image(path, im);
        ASSERT_FALSE(s.ok()) << path;
        EXPECT_EQ(s.error().message.rfind(path + ": ", 0), 0u) << s.error().message;
        EXPECT_FALSE(fs::exists(path));
        EXPECT_FALSE(fs::exists(path + ".part"));
    }

    // The rename is what fails here (the target is a non-empty directory):
    // the complete .part file must be cleaned up.
    const std::string occupied = dir.file("occupied.png");
    fs::create_directories(occupied + "/inside");
    Status s = write_image(occupied, im);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("rename"), std::string::npos) << s.error().message;
    EXPECT_TRUE(fs::is_directory(occupied));
    EXPECT_FALSE(fs::exists(occupied + ".part"));

    if (geteuid() != 0) {  // root writes into read-only folders anyway
        const std::string ro = dir.file("ro");
        fs::create_directory(ro);
        ::chmod(ro.c_str(), 0555);
        Status denied = write_image(ro + "/out.png", im);
        EXPECT_FALSE(denied.ok());
        EXPECT_FALSE(fs::exists(ro + "/out.png.part"));
        ::chmod(ro.c_str(), 0755);
    }
}

TEST(ImageIoErrors, BadImagesAndOptionsAreRefusedBeforeAnyFileAppears) {
    TempDir dir;
    const std::string path = dir.file("out.png");
    Image wrong_size = noise(4, 4, 3);
    wrong_size.pixels.pop_back();
    Image two_channels = noise(4, 4, 3);
    two_channels.channels = 2;
    two_channels.pixels.resize(32);
    Image empty;
    for (const Image* im : {&wrong_size, &two_channels, &empty}) {
        Status s = write_image(path, *im);
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.error().message.rfind(path + ": ", 0), 0u) << s.error().message;
    }
    ImageWriteOptions bad_quality;
    bad_quality.quality = 0;
    EXPECT_FALSE(write_image(dir.file("q.jpg"), noise(4, 4, 3), bad_quality).ok());
    ImageWriteOptions bad_key;
    bad_key.text[" leading space"] = "x";
    Status key = write_image(path, noise(4, 4, 3), bad_key);
    ASSERT_FALSE(key.ok());
    EXPECT_NE(key.error().message.find("keyword"), std::string::npos) << key.error().message;
    ImageWriteOptions nul_value;
    nul_value.text["Comment"] = std::string("a\0b", 3);
    EXPECT_FALSE(write_image(path, noise(4, 4, 3), nul_value).ok());
    EXPECT_TRUE(fs::is_empty(dir.path()));
}

// ---- metadata -----------------------------------------------------------------

GenerationInfo sample_info() {
    GenerationInfo info;
    info.prompt = "a red circle on a white background, (masterpiece:1.2)";
    info.negative_prompt = "blurry, lowres";
    info.steps = 20;
    info.sampler = "Euler a";
    info.scheduler = "Karras";
    info.cfg_scale = 7.0f;
    info.seed = 42;
    info.width = 512;
    info.height = 768;
    info.model = "v1-5-pruned-emaonly";
    return info;
}

TEST(A1111Parameters, FormatsExactlyLikeA1111) {
    GenerationInfo info = sample_info();
    EXPECT_EQ(format_a1111_parameters(info),
              "a red circle on a white background, (masterpiece:1.2)\n"
              "Negative prompt: blurry, lowres\n"
              "Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 42, Size: 512x768, "
              "Model: v1-5-pruned-emaonly");

    // Extras: A1111's own keys go where A1111 puts them, others before
    // Version; values with ',', ':' or newlines are JSON-quoted.
    info.cfg_scale = 7.5f;
    info.negative_prompt.clear();
    info.extra = {{"Version", "kiln 0.1"},
                  {"Lora hashes", "detail: 7c6bad76eb54, style: 1e3f"},
                  {"Denoising strength", "0.75"},
                  {"Model hash", "6ce0161689"},
                  {"Hires upscaler", "Latent"},
                  {"Note", "say \"hi\"\nback\\slash"},
                  {"Tiling", "Tiling"}};
    EXPECT_EQ(format_a1111_parameters(info),
              "a red circle on a white background, (masterpiece:1.2)\n"
              "Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7.5, Seed: 42, Size: 512x768, "
              "Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.75, Tiling, "
              "Lora hashes: \"detail: 7c6bad76eb54, style: 1e3f\", Hires upscaler: Latent, "
              "Note: \"say \\\"hi\\\"\\nback\\\\slash\", Version: kiln 0.1");

    // Unset fields are left out; no prompt means no leading blank line.
    GenerationInfo minimal;
    minimal.steps = 4;
    minimal.cfg_scale = 1.0f;
    minimal.seed = 0;
    EXPECT_EQ(format_a1111_parameters(minimal), "Steps: 4, CFG scale: 1, Seed: 0");
}

TEST(A1111Parameters, ParsesAnA1111String) {
    const std::string text =
        "masterpiece, best quality, 1girl, <lora:add_detail:0.6>\n"
        "  sunset, (detailed sky:1.3)\n"
        "Negative prompt: (worst quality, low quality:1.4), easynegative\n"
        "extra line\n"
        "Steps: 28, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 3456789012, Size: 512x768, "
        "Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.52, Clip skip: 2, "
        "Hires upscale: 2, Hires upscaler: R-ESRGAN 4x+, Lora hashes: \"add_detail: 7c6bad76eb54\", "
        "TI hashes: \"easynegative: c74b4e810b03\", Version: v1.10.1\n";
    const GenerationInfo info = parse_a1111_parameters(text);
    EXPECT_EQ(info.prompt, "masterpiece, best quality, 1girl, <lora:add_detail:0.6>\nsunset, (detailed sky:1.3)");
    EXPECT_EQ(info.negative_prompt, "(worst quality, low quality:1.4), easynegative\nextra line");
    EXPECT_EQ(info.steps, 28);
    EXPECT_EQ(info.sampler, "DPM++ 2M");
    EXPECT_EQ(info.scheduler, "Karras");
    EXPECT_EQ(info.cfg_scale, 6.5f);
    EXPECT_EQ(info.seed, 3456789012);
    EXPECT_EQ(info.width, 512);
    EXPECT_EQ(info.height, 768);
    EXPECT_EQ(info.model, "v1-5-pruned-emaonly");
    const std::vector<std::pair<std::string, std::string>> extra = {{"Model hash", "6ce0161689"},
                                                                    {"Denoising strength", "0.52"},
                                                                    {"Clip skip", "2"},
                                                                    {"Hires upscale", "2"},
                                                                    {"Hires upscaler", "R-ESRGAN 4x+"},
                                                                    {"Lora hashes", "add_detail: 7c6bad76eb54"},
                                                                    {"TI hashes", "easynegative: c74b4e810b03"},
                                                                    {"Version", "v1.10.1"}};
    EXPECT_EQ(info.extra, extra);
}

TEST(A1111Parameters, RoundTripsThroughText) {
    GenerationInfo info = sample_info();
    info.prompt = "line one, with: colon\nline two";
    info.negative_prompt = "neg one\nneg two";
    info.cfg_scale = 0.1f;
    info.seed = 9007199254740993;
    info.model = "model, with comma";
    info.sampler = "DPM++ 2M SDE";
    info.extra = {{"Model hash", "abc"}, {"Unicode", "ünïcödé ✓ 🎨"}, {"Quote", "\"q\", \\ \t"}, {"Version", "v1"}};
    const std::string text = format_a1111_parameters(info);
    EXPECT_EQ(parse_a1111_parameters(text), info) << text;
    EXPECT_EQ(format_a1111_parameters(parse_a1111_parameters(text)), text);
}

TEST(A1111Parameters, TextThatIsNotA1111IsThePrompt) {
    GenerationInfo a = parse_a1111_parameters("just a prompt");
    EXPECT_EQ(a.prompt, "just a prompt");
    EXPECT_TRUE(a.extra.empty());
    // Fewer than three pairs on the last line: still prompt (A1111's rule).
    GenerationInfo b = parse_a1111_parameters("first\nStyle: noir, Mood: calm");
    EXPECT_EQ(b.prompt, "first\nStyle: noir, Mood: calm");
    EXPECT_EQ(b.steps, 0);
    // A value that does not parse as its field stays in extra.
    GenerationInfo c = parse_a1111_parameters("p\nSteps: 20abc, Seed: 5, Size: 64x, CFG scale: nan");
    EXPECT_EQ(c.seed, 5);
    EXPECT_EQ(c.steps, 0);
    EXPECT_EQ(c.width, 0);
    EXPECT_EQ(c.cfg_scale, 0.0f);
    EXPECT_EQ(c.extra, (std::vector<std::pair<std::string, std::string>>{
                           {"Steps", "20abc"}, {"Size", "64x"}, {"CFG scale", "nan"}}));
    EXPECT_EQ(parse_a1111_parameters(""), GenerationInfo{});
}

TEST(PngText, ParametersAndOtherTextRoundTripThroughAPng) {
    TempDir dir;
    ImageWriteOptions options;
    const std::string params = format_a1111_parameters(sample_info());
    options.text[kParametersKeyword] = params;
    options.text["Software"] = "kiln";
    options.text["Comment"] = "ünïcödé ✓";  // not ASCII: goes to iTXt
    const std::string path = write_or_die(dir, "meta.png", noise(8, 8, 3), options);

    const auto bytes = read_bytes(path);
    EXPECT_NE(find_chunk(bytes, "tEXt"), std::string::npos);
    EXPECT_NE(find_chunk(bytes, "iTXt"), std::string::npos);
    EXPECT_LT(find_chunk(bytes, "tEXt"), find_chunk(bytes, "IDAT"));  // found without reading the pixels

    Result<std::map<std::string, std::string>> text = read_png_text(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, options.text);
    EXPECT_EQ(parse_a1111_parameters(text->at(kParametersKeyword)), sample_info());
    Result<std::map<std::string, std::string>> via_any = read_image_text(path);
    ASSERT_TRUE(via_any.ok());
    EXPECT_EQ(*via_any, options.text);
    ASSERT_TRUE(read_image(path).ok());  // the pixels still read
}

TEST(PngText, ReadsCompressedAndLatin1Chunks) {
    TempDir dir;
    PngSpec spec;
    spec.width = 1, spec.height = 1, spec.rows = {{1, 2, 3}};
    std::string long_text(5000, 'z');
    spec.text = {make_text(PNG_TEXT_COMPRESSION_zTXt, "parameters", long_text.c_str()),
                 make_text(PNG_ITXT_COMPRESSION_zTXt, "Title", "compressed iTXt ✓"),
                 make_text(PNG_TEXT_COMPRESSION_NONE, "Author", "J\xF6rg")};  // Latin-1 "Jörg"
    const std::string path = write_png_spec(dir, "z.png", spec);
    Result<std::map<std::string, std::string>> text = read_png_text(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(text->at("parameters"), long_text);
    EXPECT_EQ(text->at("Title"), "compressed iTXt ✓");
    EXPECT_EQ(text->at("Author"), "J\xC3\xB6rg");
}

TEST(PngText, DamagedTextChunksAreErrors) {
    TempDir dir;
    ImageWriteOptions options;
    options.text[kParametersKeyword] = "prompt\nSteps: 1, Seed: 2, Size: 8x8";
    auto bytes = read_bytes(write_or_die(dir, "m.png", noise(8, 8, 3), options));
    const size_t text = find_chunk(bytes, "tEXt");
    ASSERT_NE(text, std::string::npos);
    auto crc_broken = bytes;
    crc_broken[text + 8 + 12] ^= 1;
    const std::string bad = dir.write("bad.png", crc_broken);
    Result<std::map<std::string, std::string>> r = read_png_text(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("CRC"), std::string::npos) << r.error().message;

    const std::string cut = dir.write("cut.png", std::vector<uint8_t>(bytes.begin(), bytes.begin() + text + 10));
    Result<std::map<std::string, std::string>> rc = read_png_text(cut);
    ASSERT_FALSE(rc.ok());
    EXPECT_NE(rc.error().message.find("truncated"), std::string::npos) << rc.error().message;

    const std::string jpg = write_or_die(dir, "x.jpg", noise(8, 8, 3));
    EXPECT_FALSE(read_png_text(jpg).ok());
    EXPECT_FALSE(read_png_text(dir.file("missing.png")).ok());
}

TEST(ExifText, JpegAndWebPCarryParametersInUserComment) {
    TempDir dir;
    ImageWriteOptions options;
    GenerationInfo info = sample_info();
    info.prompt = "un chat sur la plage, 海辺の猫, 🐈";
    options.text[kParametersKeyword] = format_a1111_parameters(info);
    options.text["Software"] = "kiln";  // no place for it in EXIF: dropped
    for (const char* name : {"m.jpg", "m.webp"}) {
        SCOPED_TRACE(name);
        const std::string path = write_or_die(dir, name, gradient(32, 32, 3), options);
        Result<std::map<std::string, std::string>> text = read_image_text(path);
        ASSERT_TRUE(text.ok()) << text.error().message;
        EXPECT_EQ(text->size(), 1u);
        EXPECT_EQ(parse_a1111_parameters(text->at(kParametersKeyword)), info);
        Result<Image> pixels = read_image(path);
        ASSERT_TRUE(pixels.ok()) << pixels.error().message;
        EXPECT_EQ(pixels->width, 32);
    }
    // Without metadata: an empty map, not an error.
    Result<std::map<std::string, std::string>> none = read_image_text(write_or_die(dir, "plain.jpg", noise(4, 4, 3)));
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
}

TEST(ExifText, UserCommentEncodings) {
    const std::vector<uint8_t> block = make_exif_user_comment("héllo ✓");
    EXPECT_EQ(parse_exif_user_comment(block.data(), block.size()), "héllo ✓");

    // A little-endian block with UTF-16LE text, and one with the ASCII prefix.
    auto le_block = [](const std::string& prefix, const std::vector<uint8_t>& body) {
        std::vector<uint8_t> b = {'I', 'I', 42, 0, 8, 0, 0, 0};
        auto u16 = [&](uint32_t v) { b.push_back(uint8_t(v)), b.push_back(uint8_t(v >> 8)); };
        auto u32 = [&](uint32_t v) { u16(v & 0xFFFF), u16(v >> 16); };
        u16(1), u16(0x8769), u16(4), u32(1), u32(26), u32(0);
        u16(1), u16(0x9286), u16(7), u32(static_cast<uint32_t>(8 + body.size())), u32(44), u32(0);
        b.insert(b.end(), prefix.begin(), prefix.end());
        b.insert(b.end(), body.begin(), body.end());
        return b;
    };
    const auto utf16 = le_block(std::string("UNICODE\0", 8), {'h', 0, 'i', 0, 0xAC, 0x20});
    EXPECT_EQ(parse_exif_user_comment(utf16.data(), utf16.size()), "hi€");
    const auto ascii = le_block(std::string("ASCII\0\0\0", 8), {'o', 'k', 0});
    EXPECT_EQ(parse_exif_user_comment(ascii.data(), ascii.size()), "ok");

    // Malformed blocks: nothing, never a crash.
    for (size_t keep = 0; keep < block.size(); ++keep) {
        EXPECT_EQ(parse_exif_user_comment(block.data(), keep), std::nullopt) << keep;
    }
    std::vector<uint8_t> bad_offset = block;
    bad_offset[26 + 2 + 8] = 0xF0;  // UserComment's value offset (big-endian) far past the end
    EXPECT_EQ(parse_exif_user_comment(bad_offset.data(), bad_offset.size()), std::nullopt);
}

// ---- pixels -------------------------------------------------------------------

TEST(ImagePixels, ConvertChannels) {
    Image rgb = make_image(2, 1, 3);
    const uint8_t px[6] = {255, 0, 0, 10, 200, 30};
    std::memcpy(rgb.pixels.data(), px, 6);
    Result<Image> grey = convert_channels(rgb, 1);
    ASSERT_TRUE(grey.ok());
    EXPECT_EQ(grey->pixels, (std::vector<uint8_t>{76, 124}));  // 0.299*255; 2.99+117.4+3.42
    Result<Image> rgba = convert_channels(*grey, 4);
    ASSERT_TRUE(rgba.ok());
    EXPECT_EQ(rgba->pixels, (std::vector<uint8_t>{76, 76, 76, 255, 124, 124, 124, 255}));
    Result<Image> back = convert_channels(*rgba, 3);
    EXPECT_EQ(back->pixels, (std::vector<uint8_t>{76, 76, 76, 124, 124, 124}));
    EXPECT_FALSE(convert_channels(rgb, 2).ok());
}

TEST(ImagePixels, ResizeKeepsFlatColourAndCopiesAtTheSameSize) {
    for (ResizeFilter filter : {ResizeFilter::Bilinear, ResizeFilter::Lanczos3}) {
        for (int channels : {1, 3, 4}) {  // RGBA opaque: PIL's premultiplied round trip is exact at alpha 255
            Image flat = make_image(37, 23, channels);
            const auto value = [&](size_t i) {
                return channels == 4 && i % 4 == 3 ? 255 : int(40 + 50 * (i % channels));
            };
            for (size_t i = 0; i < flat.pixels.size(); ++i) flat.pixels[i] = static_cast<uint8_t>(value(i));
            for (auto [w, h] : {std::pair{10, 7}, std::pair{100, 64}, std::pair{37, 5}, std::pair{3, 90}}) {
                Result<Image> r = resize_image(flat, w, h, filter);
                ASSERT_TRUE(r.ok()) << r.error().message;
                ASSERT_EQ(r->width, w);
                ASSERT_EQ(r->height, h);
                for (size_t i = 0; i < r->pixels.size(); ++i) ASSERT_EQ(r->pixels[i], value(i)) << w << "x" << h;
            }
        }
    }
    const Image n = noise(9, 9, 3);
    EXPECT_EQ(resize_image(n, 9, 9)->pixels, n.pixels);
}

// Byte for byte PIL's Image.resize (Pillow 9.4), as training/reference/
// a1111_resize.py wrote it: A1111 resizes init images, masks and hires
// inputs with it.
TEST(ImagePixels, ResizeIsPilsResize) {
    const std::string dir = std::string(KILN_GOLDEN_DIR) + "/a1111_resize/";
    Result<Image> rgb = read_image(dir + "input.png");
    Result<Image> rgba = read_image(dir + "input_rgba.png");
    ASSERT_TRUE(rgb.ok() && rgba.ok());
    struct Case {
        const Image& input;
        int channels, width, height;
        ResizeFilter filter;
        const char* expected;
    } cases[] = {
        {*rgb, 3, 17, 50, ResizeFilter::Lanczos3, "pil_lanczos_17x50.png"},
        {*rgb, 3, 100, 9, ResizeFilter::Bilinear, "pil_bilinear_100x9.png"},
        {*rgb, 3, 41, 23, ResizeFilter::Bicubic, "pil_bicubic_41x23.png"},
        {*rgb, 1, 7, 5, ResizeFilter::Lanczos3, "pil_grey_lanczos_7x5.png"},
        {*rgba, 4, 30, 61, ResizeFilter::Lanczos3, "pil_rgba_lanczos_30x61.png"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.expected);
        Result<Image> input = convert_channels(c.input, c.channels);  // grey: PIL's convert("L")
        Result<Image> file = read_image(dir + c.expected);
        ASSERT_TRUE(input.ok() && file.ok());
        Result<Image> expected = convert_channels(*file, c.channels);  // read_image gives grey as RGB
        ASSERT_TRUE(expected.ok());
        Result<Image> got = resize_image(*input, c.width, c.height, c.filter);
        ASSERT_TRUE(got.ok()) << got.error().message;
        EXPECT_EQ(got->pixels, expected->pixels);
    }
}

TEST(ImagePixels, ResizeBilinearValuesAndAreaAwareShrinking) {
    Image ramp = make_image(2, 1, 1);
    ramp.pixels = {0, 255};
    Result<Image> up = resize_image(ramp, 4, 1, ResizeFilter::Bilinear);
    ASSERT_TRUE(up.ok());
    EXPECT_EQ(up->pixels, (std::vector<uint8_t>{0, 64, 191, 255}));

    // A one-pixel checkerboard shrunk 8x is flat grey, not a sample of
    // either colour (which point-sampling would give).
    Image checker = make_image(64, 64, 1);
    for (int y = 0; y < 64; ++y) {
        for (int x = 0; x < 64; ++x) checker.pixel(x, y)[0] = ((x + y) & 1) ? 255 : 0;
    }
    for (ResizeFilter filter : {ResizeFilter::Bilinear, ResizeFilter::Lanczos3}) {
        Result<Image> small = resize_image(checker, 8, 8, filter);
        ASSERT_TRUE(small.ok());
        for (uint8_t v : small->pixels) EXPECT_NEAR(v, 128, 12);
    }
}

TEST(ImagePixels, ResizeDoesNotBleedColourFromTransparentPixels) {
    Image im = make_image(2, 1, 4);
    im.pixels = {0, 0, 255, 255, /* transparent red: */ 255, 0, 0, 0};
    for (ResizeFilter filter : {ResizeFilter::Bilinear, ResizeFilter::Lanczos3}) {
        Result<Image> one = resize_image(im, 1, 1, filter);
        ASSERT_TRUE(one.ok());
        EXPECT_EQ(one->pixels[0], 0);
        EXPECT_EQ(one->pixels[2], 255);
        EXPECT_NEAR(one->pixels[3], 128, 1);
    }
}

TEST(ImagePixels, ResizeRejectsBadSizes) {
    const Image im = noise(4, 4, 3);
    EXPECT_FALSE(resize_image(im, 0, 4).ok());
    EXPECT_FALSE(resize_image(im, 4, kMaxDimension + 1).ok());
    Image broken = im;
    broken.pixels.resize(3);
    EXPECT_FALSE(resize_image(broken, 2, 2).ok());
}

}  // namespace
}  // namespace kiln::image
