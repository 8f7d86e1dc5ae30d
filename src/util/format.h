// Small text formatting helpers for reports and messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// "1.72 GiB", "12.0 KiB", "512 B".
std::string human_bytes(uint64_t bytes);
// "123,456,789".
std::string grouped(uint64_t value);
// Text from a file, safe to print on a terminal: control characters (C0,
// DEL, C1), backslashes and bytes that are not valid UTF-8 become \xNN
// escapes; everything else (printable ASCII, valid UTF-8) is kept.
std::string escaped(std::string_view text);
// "0.5", "0.75", "1e+39": the shortest form that reads back as the same
// float, as A1111 prints parameters.
std::string format_number(float value);

// ASCII lower case ("RPC0" -> "rpc0").
std::string ascii_lower(std::string_view text);
// `text` without leading and trailing white space.
std::string trim_space(std::string_view text);
// The items of a `sep`-separated list, each trimmed ("a, b," -> a, b, "").
std::vector<std::string> split_list(std::string_view text, char sep);
// "a, b, c".
std::string join_list(const std::vector<std::string>& items);

}  // namespace kiln
