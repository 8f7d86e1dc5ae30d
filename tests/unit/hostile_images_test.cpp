// Image files that claim more pixels than kiln will decode: refused from the
// header, before a pixel is allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "golden.h"
#include "image/image_io.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::run_command;
using test::TempDir;

uint32_t crc32(const uint8_t* data, size_t n) {
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
        crc ^= data[i];
        for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    for (int i = 3; i >= 0; --i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& body) {
    put_be32(out, static_cast<uint32_t>(body.size()));
    const size_t start = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), body.begin(), body.end());
    put_be32(out, crc32(out.data() + start, out.size() - start));
}

// A greyscale PNG whose header says width x height, followed by `idat_bytes`
// of (never decoded) image data: a decompression bomb's shape, 270 KB on disk.
std::vector<uint8_t> bomb_png(uint32_t width, uint32_t height, size_t idat_bytes) {
    std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    std::vector<uint8_t> ihdr;
    put_be32(ihdr, width);
    put_be32(ihdr, height);
    ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});  // 8-bit grey, deflate, no filter, no interlace
    put_chunk(png, "IHDR", ihdr);
    put_chunk(png, "IDAT", std::vector<uint8_t>(idat_bytes, 0));
    put_chunk(png, "IEND", {});
    return png;
}

TEST(HostileImages, PixelCountIsCheckedFromTheHeader) {
    const std::vector<uint8_t> bomb = bomb_png(16384, 16384, 270000);
    auto r = image::decode_image(bomb.data(), bomb.size(), "bomb.png");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              "bomb.png: image is 16384x16384 = 268435456 pixels, more than the limit of 67108864 "
              "(--max-image-pixels); checked from the header, nothing was decoded");
    r = image::decode_image(bomb.data(), bomb.size(), "bomb.png", 1000);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("more than the limit of 1000"), std::string::npos) << r.error().message;
}

TEST(HostileImages, KilnRefusesABombAsInitImageOrMask) {
    TempDir dir;
    const std::string bomb = dir.write("bomb.png", bomb_png(16384, 16384, 270000));
    const std::string init = dir.file("init.png");
    ASSERT_TRUE(image::write_image(init, image::make_image(32, 32, 3, 128)).ok());
    const std::string out = dir.file("out.png");
    const std::string kiln = std::string(KILN_BIN) + " -t 1 -m " + test::golden_path("models/sd1_tiny.safetensors") +
                             " --tokenizer " + KILN_FIXTURES_DIR + "/tiny_tokenizer -p x -W 32 -H 32 --steps 1 -o " +
                             out + " ";
    struct Case {
        std::string args;
        std::string message;
    };
    for (const Case& c : std::vector<Case>{
             {"-i " + bomb, bomb + ": image is 16384x16384 = 268435456 pixels, more than the limit of 67108864"},
             {"-i " + init + " --mask " + bomb, bomb + ": image is 16384x16384"},
             {"-i " + init + " --max-image-pixels 1000", init +
                                                             ": image is 32x32 = 1024 pixels, more than the limit of "
                                                             "1000"}}) {
        auto r = run_command(kiln + c.args);
        EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(std::ifstream(out).good());
    }
    auto r = run_command(kiln + "--max-image-pixels 0");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--max-image-pixels: expected an integer from 1 to 268435456, got 0"), std::string::npos)
        << r.err;
}

// kiln with the tiny golden SD1 model, writing `out`; the caller appends the flags.
std::string tiny_kiln(const std::string& command, const std::string& out) {
    return std::string(KILN_BIN) + command + " -t 1 -m " + test::golden_path("models/sd1_tiny.safetensors") +
           " --tokenizer " + KILN_FIXTURES_DIR + "/tiny_tokenizer -p x --steps 1 -o " + out + " ";
}

// kiln and kiln plan with `flags` both end with one error line holding
// `message`, exit 1 (out of memory), and write no `out`.
void expect_out_of_memory_in_generate_and_plan(const std::string& flags, const std::string& out,
                                               const std::string& message) {
    for (const std::string& command : {std::string(""), std::string(" plan")}) {
        auto r = run_command(tiny_kiln(command, out) + flags);
        EXPECT_EQ(r.exit_code, 1) << command << ": " << r.err;
        EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(std::ifstream(out).good());
    }
}

// Within --max-image-pixels (4096x4096 of 8192x8192) but beyond what RAM's
// books leave: one out-of-memory error from the header, before decoding
// (the bomb's image data is not even valid deflate).
TEST(HostileImages, ABombWithinThePixelLimitButBeyondTheRamBudgetIsOutOfMemory) {
    TempDir dir;
    const std::string bomb = dir.write("bomb.png", bomb_png(4096, 4096, 270000));
    const std::string out = dir.file("out.png");
    const std::string message = bomb +
                                ": out of memory: decoding this 4096x4096 image takes 64.00 MiB of RAM, but the "
                                "budget on CPU leaves 32.00 MiB; checked from the header, nothing was decoded";
    expect_out_of_memory_in_generate_and_plan("--max-vram cpu=32M -i " + bomb, out, message);
    // Its own bytes, without a budget, are a corrupt file as before.
    auto r = run_command(tiny_kiln("", out) + "-i " + bomb);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(bomb + ": corrupt PNG"), std::string::npos) << r.err;
}

// A 1024x1024 RGB init image holds 3 MiB of pixels, and the job 15 bytes a
// pixel more (the VAE input's RGB copy and float planes): 18 MiB, counted in
// RAM's books. kiln plan shows them; under a 16 MiB RAM budget both plan and
// generation refuse the job before anything runs.
TEST(HostileImages, AJobsImagesAreCountedInRamsBooks) {
    TempDir dir;
    const std::string init = dir.file("init.png");
    ASSERT_TRUE(image::write_image(init, image::make_image(1024, 1024, 3, 128)).ok());
    const std::string out = dir.file("out.png");
    auto plan = run_command(tiny_kiln(" plan", out) + "-i " + init);
    EXPECT_NE(plan.out.find("job: 1024x1024, CFG batch of two\nimages: 18.00 MiB in RAM (CPU's books)\n"),
              std::string::npos)
        << plan.out << plan.err;
    const std::string message =
        "out of memory: the job's decoded images (init image, mask, references): 18.00 MiB on CPU, but the budget "
        "leaves 16.00 MiB";
    expect_out_of_memory_in_generate_and_plan("--max-vram cpu=16M -i " + init, out, message);
}

}  // namespace
}  // namespace kiln
