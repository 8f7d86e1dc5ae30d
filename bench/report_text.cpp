#include "report_text.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <utility>

namespace kiln::bench {

std::string json_quote(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char escaped[8];
                    std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
                    out += escaped;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

std::string json_number(double value) {
    if (!std::isfinite(value)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", value);
    return buf;
}

std::string human_seconds(double seconds) {
    char buf[32];
    if (seconds < 1e-3) {
        std::snprintf(buf, sizeof buf, "%.0f us", seconds * 1e6);
    } else if (seconds < 1.0) {
        std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
    } else if (seconds < 100.0) {
        std::snprintf(buf, sizeof buf, "%.3g s", seconds);
    } else {
        std::snprintf(buf, sizeof buf, "%.0f s", seconds);
    }
    return buf;
}

std::string human_gflops(double flops, double seconds) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GFLOP/s", seconds > 0 ? flops / seconds * 1e-9 : 0.0);
    return buf;
}

namespace {

bool write_text_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << text;
    out.close();
    return static_cast<bool>(out);
}

}  // namespace

Status publish_report(const std::string& markdown, const std::string& markdown_path, const std::string& json,
                      const std::string& json_path) {
    std::cout << markdown << std::flush;
    for (const auto& [path, text] : {std::pair{&json_path, &json}, std::pair{&markdown_path, &markdown}}) {
        if (!path->empty() && !write_text_file(*path, *text)) return Error{"cannot write " + *path};
    }
    return Status::Ok();
}

}  // namespace kiln::bench
