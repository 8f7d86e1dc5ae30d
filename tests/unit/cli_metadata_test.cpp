// `kiln -M metadata` as sd-cli's: the report of an image's chunks or
// segments in text or JSON, and `--disable-image-metadata` leaving images
// without their parameters.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "golden.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::kiln_with_sd1_tiny;
using test::run_command;
using test::TempDir;

std::string metadata(const std::string& args) { return std::string(KILN_BIN) + " -M metadata " + args; }

class CliMetadata : public ::testing::Test {
  protected:
    void SetUp() override {
        auto r = run_command(kiln_with_sd1_tiny("-p \"a red circle\" -W 32 -H 32 --steps 1 -s 3 -o " + png_));
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    TempDir dir_;
    const std::string png_ = dir_.file("out.png");
};

TEST_F(CliMetadata, TextReportListsTheParametersChunk) {
    auto r = run_command(metadata("--image " + png_));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string head = "File: " + png_ + "\nFormat: PNG\n\nChunk: tEXt\n  crc: ";
    EXPECT_EQ(r.out.rfind(head, 0), 0u) << r.out;
    EXPECT_NE(r.out.find("    keyword: parameters\n    text: a red circle\nSteps: 1,"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("IHDR"), std::string::npos) << "structural chunks only with --metadata-all";
}

TEST_F(CliMetadata, JsonReportWithEveryChunk) {
    auto r = run_command(metadata("-i " + png_ + " --metadata-format json --metadata-all"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(r.out);
    EXPECT_EQ(report["file"], png_);
    EXPECT_EQ(report["format"], "PNG");
    const auto& entries = report["entries"];
    ASSERT_GE(entries.size(), 4u);
    EXPECT_EQ(entries.front()["name"], "IHDR");
    EXPECT_EQ(entries.front()["data"]["width"], 32);
    EXPECT_EQ(entries.front()["critical"], true);
    EXPECT_EQ(entries.back()["name"], "IEND");
    bool parameters = false;
    for (const auto& e : entries) {
        EXPECT_FALSE(e.contains("metadata_like"));
        if (e["name"] == "tEXt" && e["data"]["keyword"] == "parameters") {
            parameters = e["data"]["text"].get<std::string>().rfind("a red circle\n", 0) == 0;
        }
    }
    EXPECT_TRUE(parameters) << r.out;
}

TEST_F(CliMetadata, BriefCutsLongTextAndRawShowsBytes) {
    const std::string prompt(400, 'x');
    const std::string png = dir_.file("long.png");
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p " + prompt + " -W 32 -H 32 --steps 1 -o " + png)).exit_code, 0);
    auto brief = run_command(metadata("-i " + png + " --metadata-brief"));
    ASSERT_EQ(brief.exit_code, 0) << brief.err;
    EXPECT_NE(brief.out.find("text: " + std::string(240, 'x') + "...\n"), std::string::npos) << brief.out;
    auto full = run_command(metadata("-i " + png));
    EXPECT_NE(full.out.find("text: " + prompt + "\n"), std::string::npos);

    auto raw = run_command(metadata("-i " + png + " --metadata-all --metadata-raw --metadata-format json"));
    const auto report = nlohmann::json::parse(raw.out);
    int idat = 0;
    for (const auto& e : report["entries"]) {
        if (e["name"] != "IDAT") continue;
        ++idat;
        // 64 bytes and a mark that more follow; a zlib stream's first byte says "deflate" (low nibble 8).
        const std::string preview = e["raw_hex_preview"];
        EXPECT_EQ(preview.size(), 64u * 3 - 1 + 4) << preview;
        EXPECT_EQ(preview.substr(preview.size() - 4), " ...");
        EXPECT_EQ(preview[1], '8') << preview;
    }
    EXPECT_GE(idat, 1);
}

TEST_F(CliMetadata, JpegSegmentsCarryTheUserComment) {
    const std::string jpg = dir_.file("out.jpg");
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p \"a red circle\" -W 32 -H 32 --steps 1 -o " + jpg)).exit_code, 0);
    auto r = run_command(metadata("-i " + jpg + " --metadata-format json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(r.out);
    EXPECT_EQ(report["format"], "JPEG");
    bool comment = false;
    for (const auto& e : report["entries"]) {
        if (e["marker"] == "APP1" && e["data"]["type"] == "Exif") {
            comment = e["data"]["UserComment"].get<std::string>().rfind("a red circle\n", 0) == 0;
        }
    }
    EXPECT_TRUE(comment) << r.out;
}

TEST_F(CliMetadata, DisableImageMetadataWritesNoParameters) {
    const std::string bare = dir_.file("bare.png");
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(
                              "-p \"a red circle\" -W 32 -H 32 --steps 1 -s 3 --disable-image-metadata -o " + bare))
                  .exit_code,
              0);
    auto r = run_command(metadata("-i " + bare));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "File: " + bare + "\nFormat: PNG\n\nNo metadata entries found.\n");
}

TEST_F(CliMetadata, OtherFilesAreOneError) {
    const std::string text = dir_.file("notes.txt");
    std::ofstream(text) << "not an image";
    auto r = run_command(metadata("-i " + text));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(text + ": not a PNG, JPEG or video file"), std::string::npos) << r.err;

    // A PNG cut inside a chunk.
    std::ifstream in(png_, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string cut = dir_.file("cut.png");
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, 60);
    auto c = run_command(metadata("-i " + cut));
    EXPECT_EQ(c.exit_code, 1);
    EXPECT_NE(c.err.find("runs past the end of the file"), std::string::npos) << c.err;
}

}  // namespace
}  // namespace kiln
