// libFuzzer target for the kiln command line (tools/cli/args.h): the input,
// split at NUL bytes, is argv[1..]. parse_args never throws or crashes and
// gives either Options or a usage error with a message; the -o value of any
// accepted command line goes through OutputPattern, which never crashes
// and, when it accepts, names every image.
//
// Build and run: scripts/fuzz.sh args SECONDS
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "args.h"
#include "fuzz_check.h"
#include "util/output_pattern.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> args;
    std::string current;
    for (size_t i = 0; i < size; ++i) {
        if (data[i] == 0) {
            args.push_back(current);
            current.clear();
        } else {
            current += static_cast<char>(data[i]);
        }
    }
    if (!current.empty() || args.empty()) args.push_back(current);
    if (args.size() > 64) return 0;

    auto parsed = kiln::cli::parse_args(args);
    if (auto* usage = std::get_if<kiln::cli::UsageError>(&parsed)) {
        KILN_FUZZ_CHECK(!usage->message.empty() && !usage->hint.empty());
        return 0;
    }
    const auto& options = std::get<kiln::cli::Options>(parsed);
    auto pattern = kiln::OutputPattern::parse(options.output);
    if (pattern.ok()) {
        for (int i = 0; i < 3; ++i) KILN_FUZZ_CHECK(!pattern->path(i, 3).empty() || options.output.empty());
    } else {
        KILN_FUZZ_CHECK(pattern.error().message.rfind(options.output, 0) == 0);
    }
    return 0;
}
