#include "util/log.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace kiln {
namespace {

// Restores the process-wide level after each test.
class LogTest : public ::testing::Test {
  protected:
    void TearDown() override {
        log_set_level(LogLevel::Info);
        log_set_color(false);
    }
};

TEST_F(LogTest, ErrorsGoToStderrTheRestToStdout) {
    log_set_level(LogLevel::Debug);
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    KILN_LOG_DEBUG("d %d", 1);
    KILN_LOG_VERBOSE("v");
    KILN_LOG_INFO("plain info");
    KILN_LOG_WARN("careful");
    KILN_LOG_ERROR("broken %s", "file.safetensors");
    const std::string out = testing::internal::GetCapturedStdout();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(out, "debug: d 1\nverbose: v\nplain info\nwarn: careful\n");
    EXPECT_EQ(err, "error: broken file.safetensors\n");
}

TEST_F(LogTest, LevelFiltersLowerLevels) {
    log_set_level(LogLevel::Warn);
    testing::internal::CaptureStdout();
    KILN_LOG_INFO("hidden");
    KILN_LOG_VERBOSE("hidden");
    KILN_LOG_WARN("shown");
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "warn: shown\n");
}

TEST_F(LogTest, ColorWrapsTheTag) {
    log_set_color(true);
    testing::internal::CaptureStdout();
    KILN_LOG_WARN("w");
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "\033[33mwarn:\033[0m w\n");
}

TEST_F(LogTest, CallbackReceivesWholeLinesInsteadOfTheStreams) {
    std::vector<std::pair<LogLevel, std::string>> lines;
    log_set_callback(
        [](LogLevel level, const char* text, void* user) {
            static_cast<std::vector<std::pair<LogLevel, std::string>>*>(user)->emplace_back(level, text);
        },
        &lines);
    testing::internal::CaptureStdout();
    KILN_LOG_INFO("hello %d", 7);
    KILN_LOG_ERROR("bad\n");
    KILN_LOG_DEBUG("filtered");
    log_set_callback(nullptr, nullptr);
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], std::make_pair(LogLevel::Info, std::string("hello 7")));
    EXPECT_EQ(lines[1], std::make_pair(LogLevel::Error, std::string("bad")));
}

TEST_F(LogTest, ParsesLevelNames) {
    EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
    EXPECT_EQ(parse_log_level("Verbose"), LogLevel::Verbose);
    EXPECT_EQ(parse_log_level("warning"), LogLevel::Warn);
    EXPECT_EQ(parse_log_level("ERROR"), LogLevel::Error);
    EXPECT_FALSE(parse_log_level("trace").has_value());
}

}  // namespace
}  // namespace kiln
