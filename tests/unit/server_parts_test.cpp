// The server's small parts on their own: base64 against RFC 4648's test
// vectors, A1111's sampler and scheduler names, and the C API's in-memory
// image encode and decode that the server sends and receives images with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "a1111_names.h"
#include "a1111_resize.h"
#include "image/image_io.h"
#include "kiln.h"
#include "request_fields.h"
#include "util/base64.h"

namespace kiln::server {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

TEST(ServerBase64, Rfc4648TestVectors) {
    const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                           {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                           {"foobar", "Zm9vYmFy"}};
    for (const auto& [plain, encoded] : vectors) {
        EXPECT_EQ(base64_encode(bytes_of(plain)), encoded);
        auto decoded = base64_decode(encoded);
        ASSERT_TRUE(decoded) << encoded;
        EXPECT_EQ(*decoded, bytes_of(plain));
    }
}

TEST(ServerBase64, DataUrlsUnpaddedAndWhitespaceDecodeOthersDoNot) {
    EXPECT_EQ(*base64_decode("data:image/png;base64,Zm9vYmE="), bytes_of("fooba"));
    EXPECT_EQ(*base64_decode("Zm9vYmE"), bytes_of("fooba"));
    EXPECT_EQ(*base64_decode("Zm9v\nYmFy"), bytes_of("foobar"));
    EXPECT_FALSE(base64_decode("Zm9v!mFy"));
    EXPECT_FALSE(base64_decode("Zm9vY"));       // one character of a group
    EXPECT_FALSE(base64_decode("Zg==Zm9v"));    // data after padding
    EXPECT_FALSE(base64_decode("data:text/plain,Zm9v"));  // not base64
}

TEST(ServerNames, A1111SamplersAndSchedulersMapToKilns) {
    EXPECT_EQ(resolve_sampler("Euler a")->sampler, "euler_a");
    EXPECT_EQ(resolve_sampler("k_dpmpp_2m")->sampler, "dpm++2m");
    EXPECT_EQ(resolve_sampler("dpm++2m")->sampler, "dpm++2m");
    auto with_schedule = resolve_sampler("DPM++ 2M Karras");
    ASSERT_TRUE(with_schedule);
    EXPECT_EQ(with_schedule->sampler, "dpm++2m");
    EXPECT_EQ(with_schedule->scheduler, "karras");
    EXPECT_EQ(resolve_sampler("DDIM")->sampler, "ddim_trailing");
    EXPECT_FALSE(resolve_sampler("UniPC"));
    EXPECT_FALSE(resolve_sampler("Karras"));
    EXPECT_EQ(*resolve_scheduler("Align Your Steps"), "ays");
    EXPECT_EQ(*resolve_scheduler("automatic"), "");
    EXPECT_EQ(*resolve_scheduler("sgm_uniform"), "sgm_uniform");
    EXPECT_FALSE(resolve_scheduler("beta"));
    // Every sampler the server lists is one kiln accepts.
    for (const SamplerName& s : sampler_names()) {
        EXPECT_EQ(kiln_check_value(KILN_VALUE_SAMPLER, s.kiln, nullptr), KILN_OK) << s.kiln;
        EXPECT_EQ(a1111_sampler_label(s.kiln), s.a1111);
    }
    for (const SchedulerName& s : scheduler_names()) {
        if (*s.kiln) EXPECT_EQ(kiln_check_value(KILN_VALUE_SCHEDULER, s.kiln, nullptr), KILN_OK) << s.kiln;
    }
}

TEST(ServerImages, EncodeThenDecodeKeepsPixelsParametersAndAlpha) {
    std::vector<uint8_t> pixels(5 * 3 * 4);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
    char parameters[] = "a red circle\nSteps: 3";
    kiln_image image{5, 3, 4, pixels.data(), parameters};
    uint8_t* bytes = nullptr;
    size_t size = 0;
    ASSERT_EQ(kiln_image_encode(&image, "png", &bytes, &size, nullptr), KILN_OK);
    // An independent decoder (src/image) reads the same pixels and the parameters chunk.
    auto decoded = image::decode_image(bytes, size, "png");
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->pixels, pixels);
    EXPECT_NE(std::string(reinterpret_cast<char*>(bytes), size).find("a red circle\nSteps: 3"), std::string::npos);

    kiln_image* back = nullptr;
    ASSERT_EQ(kiln_image_decode(bytes, size, "upload", 0, &back, nullptr), KILN_OK);
    EXPECT_EQ(back->channels, 4u);
    EXPECT_EQ(std::vector<uint8_t>(back->data, back->data + pixels.size()), pixels);
    kiln_images_free(back, 1);
    kiln_free_bytes(bytes);

    char* error = nullptr;
    EXPECT_EQ(kiln_image_encode(&image, "gif", &bytes, &size, &error), KILN_ERROR_INVALID_REQUEST);
    EXPECT_STREQ(error, "unknown image format 'gif' (valid: png, jpeg, webp)");
    kiln_free_string(error);
}

// kiln_image_resize is src/image's Lanczos resize behind the C API: the
// same pixels, and an invalid size is a request error.
TEST(ServerImages, ResizeIsTheLanczosResizeAndRefusesBadSizes) {
    std::vector<uint8_t> pixels(6 * 4 * 3);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 11);
    char parameters[] = "kept out";
    kiln_image image{6, 4, 3, pixels.data(), parameters};
    kiln_image* out = nullptr;
    ASSERT_EQ(kiln_image_resize(&image, 9, 5, &out, nullptr), KILN_OK);
    image::Image in = image::make_image(6, 4, 3, 0);
    in.pixels = pixels;
    auto expected = image::resize_image(in, 9, 5, image::ResizeFilter::Lanczos3);
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(out->width, 9u);
    EXPECT_EQ(out->height, 5u);
    EXPECT_EQ(std::vector<uint8_t>(out->data, out->data + 9 * 5 * 3), expected->pixels);
    EXPECT_EQ(out->parameters, nullptr);
    kiln_images_free(out, 1);

    char* error = nullptr;
    EXPECT_EQ(kiln_image_resize(&image, 0, 5, &out, &error), KILN_ERROR_INVALID_REQUEST);
    EXPECT_EQ(out, nullptr);
    ASSERT_NE(error, nullptr);
    kiln_free_string(error);
}

// A1111's resize modes against training/reference/a1111_resize.py, A1111's
// resize_image() with PIL (tests/golden/a1111_resize/): byte for byte, as
// kiln resizes with PIL's fixed-point resampling (src/image/image.cpp).
TEST(ServerImages, A1111ResizeModesMatchA1111) {
    const std::string dir = std::string(KILN_GOLDEN_DIR) + "/a1111_resize/";
    auto load = [](const std::string& path) {
        kiln_image* image = nullptr;
        char* error = nullptr;
        EXPECT_EQ(kiln_image_load(path.c_str(), &image, &error), KILN_OK) << (error ? error : "");
        kiln_free_string(error);
        return share_image(image);
    };
    const SharedImage input = load(dir + "input.png");
    ASSERT_TRUE(input);
    struct Case {
        int mode, width, height;
    } cases[] = {{1, 32, 32}, {1, 24, 40}, {1, 64, 24}, {2, 32, 32}, {2, 64, 24}, {0, 32, 32}};
    for (const Case& c : cases) {
        const std::string name = "mode" + std::to_string(c.mode) + "_" + std::to_string(c.width) + "x" +
                                 std::to_string(c.height);
        SCOPED_TRACE(name);
        const SharedImage expected = load(dir + name + ".png");
        ASSERT_TRUE(expected);
        const SharedImage got = a1111_resize(input, c.mode, c.width, c.height, "init_images[0]");
        ASSERT_EQ(got->width, expected->width);
        ASSERT_EQ(got->height, expected->height);
        ASSERT_EQ(got->channels, expected->channels);
        EXPECT_TRUE(std::equal(got->data, got->data + size_t(got->width) * got->height * got->channels,
                               expected->data));
    }
    // Mode 2's bands are the edge blend: a uniform image stays uniform.
    SharedImage grey = blank_image(10, 4, 3);
    std::memset(grey->data, 90, 10 * 4 * 3);
    const SharedImage filled = a1111_resize(grey, 2, 8, 8, "mask");
    for (size_t i = 0; i < 8 * 8 * 3; ++i) ASSERT_EQ(filled->data[i], 90) << i;
}

// Mode 3 encodes the image at its own size: its sides are cut to multiples
// of 8, keeping the top-left pixels.
TEST(ServerImages, LatentUpscaleCutsTheInitImageToMultiplesOf8) {
    SharedImage image = blank_image(21, 17, 3);
    for (size_t i = 0; i < 21 * 17 * 3; ++i) image->data[i] = uint8_t(i % 253);
    const SharedImage cut = cut_to_multiples_of_8(image, "init_images[0]");
    ASSERT_EQ(cut->width, 16u);
    ASSERT_EQ(cut->height, 16u);
    for (size_t y = 0; y < 16; ++y)
        for (size_t i = 0; i < 16 * 3; ++i) ASSERT_EQ(cut->data[y * 16 * 3 + i], image->data[y * 21 * 3 + i]);
    EXPECT_EQ(cut_to_multiples_of_8(cut, "x").get(), cut.get());  // already whole: not copied
    try {
        cut_to_multiples_of_8(blank_image(7, 40, 3), "init_images[0]");
        ADD_FAILURE() << "a 7-pixel-wide image was accepted";
    } catch (const RequestError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.field, "init_images[0]");
    }
}

TEST(ServerImages, DecodeRefusesNonImagesAndImagesOverThePixelLimit) {
    char* error = nullptr;
    kiln_image* image = nullptr;
    const std::string text = "hello world";
    EXPECT_EQ(kiln_image_decode(text.data(), text.size(), "init_image", 0, &image, &error), KILN_ERROR_BAD_FILE);
    EXPECT_EQ(image, nullptr);
    EXPECT_EQ(std::string(error).rfind("init_image: ", 0), 0u) << error;
    kiln_free_string(error);

    std::vector<uint8_t> pixels(64 * 64 * 3, 128);
    kiln_image big{64, 64, 3, pixels.data(), nullptr};
    uint8_t* bytes = nullptr;
    size_t size = 0;
    ASSERT_EQ(kiln_image_encode(&big, "webp", &bytes, &size, nullptr), KILN_OK);
    error = nullptr;
    EXPECT_EQ(kiln_image_decode(bytes, size, "mask", 64 * 63, &image, &error), KILN_ERROR_BAD_FILE);
    EXPECT_NE(std::string(error).find("mask"), std::string::npos) << error;
    kiln_free_string(error);
    ASSERT_EQ(kiln_image_decode(bytes, size, "mask", 64 * 64, &image, nullptr), KILN_OK);
    EXPECT_EQ(image->width, 64u);
    EXPECT_EQ(image->channels, 3u);
    kiln_images_free(image, 1);
    kiln_free_bytes(bytes);
}

}  // namespace
}  // namespace kiln::server
