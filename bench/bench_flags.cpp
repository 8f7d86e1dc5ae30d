#include "bench_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "args.h"

namespace kiln::bench {

std::optional<std::string> parse_flags(const std::vector<std::string>& args, const std::vector<BenchFlag>& flags) {
    for (size_t i = 0; i < args.size(); ++i) {
        std::string name = args[i];
        std::optional<std::string> inline_value;
        if (const auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
            inline_value = name.substr(eq + 1);
            name = name.substr(0, eq);
        }
        const BenchFlag* flag = nullptr;
        for (const BenchFlag& f : flags) {
            if ((f.short_name && name == f.short_name) || name == f.long_name) flag = &f;
        }
        if (!flag) {
            return name.size() > 1 && name[0] == '-' ? "unknown option '" + name + "'"
                                                     : "unexpected argument '" + name + "'";
        }
        std::string value;
        if (flag->value_name) {
            if (inline_value) {
                value = *inline_value;
            } else if (i + 1 < args.size()) {
                value = args[++i];
            } else {
                return std::string(flag->long_name) + ": missing value " + flag->value_name;
            }
        } else if (inline_value) {
            return std::string(flag->long_name) + " takes no value";
        }
        if (auto error = flag->apply(value)) return std::string(flag->long_name) + ": " + *error;
    }
    return std::nullopt;
}

std::string flags_help(const std::vector<BenchFlag>& flags) {
    std::string out;
    for (const BenchFlag& f : flags) {
        std::string names = f.short_name ? std::string(f.short_name) + ", " : "    ";
        names += f.long_name;
        if (f.value_name) names += std::string(" ") + f.value_name;
        out += "  " + names;
        out += std::string(names.size() < 30 ? 30 - names.size() : 1, ' ');
        out += std::string(f.help) + "\n";
    }
    return out;
}

std::function<std::optional<std::string>(const std::string&)> text_setter(std::string* field, const char* what) {
    return [field, what](const std::string& v) -> std::optional<std::string> {
        if (v.empty()) return std::string("expected ") + what + ", got an empty string";
        *field = v;
        return std::nullopt;
    };
}

std::function<std::optional<std::string>(const std::string&)> switch_setter(bool* field, bool value) {
    return [field, value](const std::string&) -> std::optional<std::string> {
        *field = value;
        return std::nullopt;
    };
}

std::optional<std::string> parse_int64(const std::string& text, long long min, long long max, int64_t* out) {
    long long v = 0;
    if (auto error = cli::parse_integer(text, min, max, &v)) return error;
    *out = v;
    return std::nullopt;
}

std::optional<std::string> parse_int(const std::string& text, long long min, long long max, int* out) {
    int64_t v = 0;
    if (auto error = parse_int64(text, min, max, &v)) return error;
    *out = static_cast<int>(v);
    return std::nullopt;
}

std::optional<std::string> parse_float(const std::string& text, float min, float max, float* out) {
    errno = 0;
    char* end = nullptr;
    const float v = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
        return "expected a number, got '" + text + "'";
    }
    if (v < min || v > max) {
        char range[64];
        std::snprintf(range, sizeof range, "from %g to %g", static_cast<double>(min), static_cast<double>(max));
        return "expected a number " + std::string(range) + ", got " + text;
    }
    *out = v;
    return std::nullopt;
}

}  // namespace kiln::bench
