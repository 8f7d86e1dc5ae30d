// Text pieces the benchmark reports share: JSON strings and numbers, and
// times, sizes and rates as a person reads them in a markdown table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/result.h"

namespace kiln::bench {

// A JSON string literal, quotes included.
std::string json_quote(std::string_view text);
// A JSON number with enough digits to read back the same double; null for
// a value that is not finite.
std::string json_number(double value);

// "850 us", "12.3 ms", "1.25 s".
std::string human_seconds(double seconds);
// "12.3 GFLOP/s" from FLOPs and seconds.
std::string human_gflops(double flops, double seconds);

// Prints `markdown` on stdout and writes it to `markdown_path` and `json`
// to `json_path` (an empty path: no file). The error names a file that
// cannot be written.
Status publish_report(const std::string& markdown, const std::string& markdown_path, const std::string& json,
                      const std::string& json_path);

}  // namespace kiln::bench
