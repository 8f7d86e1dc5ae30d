// The command lines of kiln's benchmarks: a table of flags, each with its
// names, value, help line and how it stores a value, parsed the way `kiln`
// parses its own (tools/cli/args.cpp): "--flag VALUE" or "--flag=VALUE".
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::bench {

// Exit codes, as kiln's (tools/cli/cli.h).
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // a missing file, a failed run
constexpr int kExitUsage = 2;    // bad flags or values

struct BenchFlag {
    const char* short_name;  // "-m" or nullptr
    const char* long_name;   // "--model"
    const char* value_name;  // "PATH"; nullptr for a switch
    const char* help;
    // Stores the value; returns what is wrong with a bad one.
    std::function<std::optional<std::string>(const std::string& value)> apply;
};

// Applies every argument; the error names the flag and what is wrong
// ("--steps: expected an integer from 1 to 10000, got 'x'").
std::optional<std::string> parse_flags(const std::vector<std::string>& args, const std::vector<BenchFlag>& flags);

// One line per flag, aligned.
std::string flags_help(const std::vector<BenchFlag>& flags);

// BenchFlag::apply for a text value that must not be empty (`what`: "a path").
std::function<std::optional<std::string>(const std::string&)> text_setter(std::string* field, const char* what);
// BenchFlag::apply for a switch: stores `value`.
std::function<std::optional<std::string>(const std::string&)> switch_setter(bool* field, bool value);

// Value parsers for BenchFlag::apply: nullopt, or what is wrong.
std::optional<std::string> parse_int(const std::string& text, long long min, long long max, int* out);
std::optional<std::string> parse_int64(const std::string& text, long long min, long long max, int64_t* out);
std::optional<std::string> parse_float(const std::string& text, float min, float max, float* out);

}  // namespace kiln::bench
