#include "output_pattern.h"

namespace kiln::cli {

Result<OutputPattern> OutputPattern::parse(const std::string& text) {
    OutputPattern pattern;
    auto fail = [&](const std::string& what) {
        return Error{text + ": " + what +
                     " (an output name may hold one integer field such as %d or %03d, and %% for a percent sign)"};
    };
    std::string* part = &pattern.prefix_;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            *part += text[i];
            continue;
        }
        if (i + 1 < text.size() && text[i + 1] == '%') {
            *part += '%';
            ++i;
            continue;
        }
        const size_t start = i++;
        bool zero_pad = false;
        if (i < text.size() && text[i] == '0') {
            zero_pad = true;
            ++i;
        }
        int width = 0;
        size_t digits = 0;
        for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, ++digits) {
            if (digits == 0) width = text[i] - '0';  // more digits are refused below
        }
        if (i >= text.size() || (text[i] != 'd' && text[i] != 'i' && text[i] != 'u')) {
            return fail("'" + text.substr(start, i + 1 - start) + "' is not an integer field");
        }
        if (digits > 1) return fail("the field's width may be at most 9");
        if (pattern.has_field_) return fail("more than one integer field");
        pattern.has_field_ = true;
        pattern.zero_pad_ = zero_pad;
        pattern.width_ = width;
        part = &pattern.suffix_;
    }
    if (!pattern.has_field_) std::swap(pattern.prefix_, pattern.suffix_);
    return pattern;
}

std::string OutputPattern::path(int index, int count) const {
    if (has_field_) {
        std::string number = std::to_string(index);
        if (number.size() < static_cast<size_t>(width_)) {
            number.insert(0, width_ - number.size(), zero_pad_ ? '0' : ' ');
        }
        return prefix_ + number + suffix_;
    }
    const std::string& name = suffix_;
    if (count <= 1 || index == 0) return name;
    const auto dot = name.rfind('.');
    const auto slash = name.rfind('/');
    const std::string numbered = "_" + std::to_string(index + 1);
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return name + numbered;
    return name.substr(0, dot) + numbered + name.substr(dot);
}

}  // namespace kiln::cli
