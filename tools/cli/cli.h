// The `kiln` program as a function, so tests can run it in-process.
#pragma once

#include <cctype>
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

// Owns a C API error string.
struct ErrorText {
    char* text = nullptr;
    ErrorText() = default;
    ErrorText(const ErrorText&) = delete;
    ErrorText& operator=(const ErrorText&) = delete;
    ~ErrorText() { kiln_free_string(text); }
    const char* c_str() const { return text ? text : "unknown error"; }
};

// Whether -o names a format kiln writes (.png, .jpg, .jpeg, .webp).
inline bool has_image_extension(const std::string& path) {
    const auto dot = path.rfind('.');
    if (dot == std::string::npos) return false;
    std::string ext = path.substr(dot);
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp";
}

// Runs the command line `args` (without the program name).
int run_cli(const std::vector<std::string>& args);

}  // namespace kiln::cli
