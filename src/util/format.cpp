#include "util/format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kiln {

std::string human_bytes(uint64_t bytes) {
    static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = static_cast<double>(bytes);
    int unit = 0;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        ++unit;
    }
    char buf[32];
    if (unit == 0) {
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    } else {
        std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
    }
    return buf;
}

std::string grouped(uint64_t value) {
    std::string digits = std::to_string(value);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

std::string format_number(float value) {
    char buf[48];
    // Whole numbers in full ("100", "4294967296"), not "1e+02".
    if (std::fabs(value) < 1e15f && value == std::trunc(value)) {
        std::snprintf(buf, sizeof buf, "%.0f", static_cast<double>(value));
        return buf;
    }
    for (int precision = 1; precision < 10; ++precision) {
        std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(value));
        if (std::strtof(buf, nullptr) == value) break;
    }
    return buf;
}

}  // namespace kiln
