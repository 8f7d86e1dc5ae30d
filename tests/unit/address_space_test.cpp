// Under an address-space limit (ulimit -v, a container's), a job runs when
// the limit holds what it needs, and is one out-of-memory error (exit 1, no
// abort) when it does not: kiln's ggml schedulers grow with the graphs they
// meet instead of reserving for the largest (runtime/sized_scheduler.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "test_files.h"

namespace kiln {
namespace {

bool have_prlimit() { return std::system("command -v prlimit > /dev/null 2>&1") == 0; }

TEST(AddressSpace, DefaultJobRunsUnderTwoGigabytesAndIsOneErrorBelowWhatItNeeds) {
    if (!have_prlimit()) GTEST_SKIP() << "prlimit (util-linux) is not installed";
    test::TempDir dir;
    const std::string job = std::string(KILN_BIN) + " -t 1 -p x --steps 2 -o ";
    // Before, 12 schedulers of 65536 nodes reserved 1.5 GB each: this aborted (exit 134).
    auto fits = test::run_command("prlimit --as=2000000000 " + job + dir.file("a.png"));
    EXPECT_EQ(fits.exit_code, 0) << fits.err << fits.out;
    EXPECT_TRUE(std::filesystem::exists(dir.file("a.png")));
    // Below the schedulers' own needs (OpenBLAS alone spins at start-up under about 400 MB, before kiln runs).
    auto tight = test::run_command("prlimit --as=600000000 " + job + dir.file("b.png"));
    EXPECT_EQ(tight.exit_code, 1) << tight.err << tight.out;
    const std::string said = tight.out + tight.err;
    EXPECT_NE(said.find("error: out of memory"), std::string::npos) << said;
    EXPECT_EQ(said.find("GGML_ASSERT"), std::string::npos) << said;
    EXPECT_FALSE(std::filesystem::exists(dir.file("b.png")));
}

}  // namespace
}  // namespace kiln
