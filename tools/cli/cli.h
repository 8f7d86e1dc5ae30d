// The `kiln` program as a function, so tests can run it in-process.
#pragma once

#include <string>
#include <vector>

#include "kiln.h"
#include "util/result.h"

namespace kiln::cli {

// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // bad file, failed job
constexpr int kExitUsage = 2;    // bad flags or values

// The exit status of a failed kiln call, by its kind (never by its message):
// 2 for a request to fix (bad flags or values), 1 for everything else (bad
// files, out of memory, a failed job).
inline int exit_code_of(kiln_status status) { return status == KILN_ERROR_INVALID_REQUEST ? kExitUsage : kExitFailure; }
// The same for an error of the CLI's own work (kiln pull).
inline int exit_code_of(ErrorKind kind) { return kind == ErrorKind::InvalidRequest ? kExitUsage : kExitFailure; }

// Runs the command line `args` (without the program name).
int run_cli(const std::vector<std::string>& args);

}  // namespace kiln::cli
