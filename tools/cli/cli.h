// The `kiln` program as a function, so tests can run it in-process.
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // bad file, failed job
constexpr int kExitUsage = 2;    // bad flags or values

// Runs the command line `args` (without the program name).
int run_cli(const std::vector<std::string>& args);

}  // namespace kiln::cli
