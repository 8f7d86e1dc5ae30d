// -o names and patterns: one integer field and "%%", nothing else.
#include "util/output_pattern.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_files.h"

namespace kiln::cli {
namespace {

std::string path_of(const std::string& pattern, int index, int count, int first_index = 0) {
    auto parsed = OutputPattern::parse(pattern, first_index);
    EXPECT_TRUE(parsed.ok()) << pattern << ": " << parsed.error().message;
    return parsed ? parsed->path(index, count) : std::string();
}

TEST(OutputPattern, FillsTheOneIntegerField) {
    EXPECT_EQ(path_of("out_%03d.png", 2, 3), "out_002.png");
    EXPECT_EQ(path_of("out_%d.png", 12, 20), "out_12.png");
    EXPECT_EQ(path_of("out_%3i.png", 7, 20), "out_  7.png");
    EXPECT_EQ(path_of("%u.png", 0, 1), "0.png");
    EXPECT_EQ(path_of("100%%_%02d.png", 1, 2), "100%_01.png");
    EXPECT_EQ(path_of("out_%d.jpg", 1, 2, 10), "out_11.jpg");  // --output-begin-idx 10
    EXPECT_EQ(path_of("out_%d", 0, 2), "out_0.png");
}

// sd-cli's names: one image keeps the name; a batch numbers every image from
// --output-begin-idx (0); a name that is not .png, .jpg, .jpeg or .webp gets .png.
TEST(OutputPattern, NamesWithoutAFieldAsSdCliNamesThem) {
    EXPECT_EQ(path_of("out.png", 0, 1), "out.png");
    EXPECT_EQ(path_of("b.png", 0, 3), "b_0.png");
    EXPECT_EQ(path_of("b.png", 2, 3), "b_2.png");
    EXPECT_EQ(path_of("b.png", 1, 3, 5), "b_6.png");
    EXPECT_EQ(path_of("out", 0, 1), "out.png");
    EXPECT_EQ(path_of("out.JPG", 0, 1), "out.JPG");
    EXPECT_EQ(path_of("out.v2", 0, 1), "out.v2.png");
    EXPECT_EQ(path_of("dir.v2/out", 1, 2), "dir.v2/out_1.png");
    EXPECT_EQ(path_of("50%%.webp", 1, 2), "50%_1.webp");
}

TEST(OutputPattern, RefusesEveryOtherConversion) {
    for (const std::string bad :
         {"out_%n.png", "out_%s.png", "out_%5$s.png", "out_%x.png", "out_%d_%d.png", "out_%.png", "out_%",
          "out_%-3d.png", "out_%lld.png", "out_%100d.png", "out_%8888888888888d.png", "out_%*d.png", "out_%f.png"}) {
        auto parsed = OutputPattern::parse(bad);
        ASSERT_FALSE(parsed.ok()) << bad;
        EXPECT_EQ(parsed.error().message.rfind(bad + ": ", 0), 0u) << parsed.error().message;
        EXPECT_NE(parsed.error().message.find("%03d"), std::string::npos) << parsed.error().message;
    }
}

// The command refuses the pattern before the model loads: exit 2, one line, no file.
TEST(OutputPattern, KilnRefusesAFormatPatternWithoutWritingAFile) {
    test::TempDir dir;
    for (const std::string name : {"out_%n.png", "out_%s.png", "out_%5$s.png"}) {
        auto r = test::run_command(std::string(KILN_BIN) + " -p x --steps 1 -o '" + dir.file(name) + "'");
        EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
        EXPECT_NE(r.err.find(name + ": "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("is not an integer field"), std::string::npos) << r.err;
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace kiln::cli
