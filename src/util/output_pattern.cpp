#include "util/output_pattern.h"

#include <algorithm>

#include "util/format.h"

namespace kiln {
namespace {

// Where `name`'s extension starts (its last '.' after the last '/'), or npos.
size_t extension_start(const std::string& name) {
    const size_t dot = name.rfind('.'), slash = name.rfind('/');
    return dot == std::string::npos || (slash != std::string::npos && dot < slash) ? std::string::npos : dot;
}

bool writes_format(const std::string& name, bool video) {
    const size_t dot = extension_start(name);
    if (dot == std::string::npos) return false;
    const std::string ext = ascii_lower(name.substr(dot));
    return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp" ||
           (video && (ext == ".avi" || ext == ".webm"));
}

}  // namespace

Result<OutputPattern> OutputPattern::parse(const std::string& given, int first_index, bool video) {
    const std::string text = writes_format(given, video) ? given : given + ".png";
    OutputPattern pattern;
    pattern.first_index_ = first_index;
    auto fail = [&](const std::string& what) {
        return Error{given + ": " + what +
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
            return fail("'" + given.substr(start, std::min(i + 1, given.size()) - start) + "' is not an integer field");
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
    const std::string n = std::to_string(first_index_ + index);
    if (has_field_) {
        std::string number = n;
        if (number.size() < static_cast<size_t>(width_)) {
            number.insert(0, width_ - number.size(), zero_pad_ ? '0' : ' ');
        }
        return prefix_ + number + suffix_;
    }
    const std::string& name = suffix_;
    if (count <= 1) return name;
    const size_t dot = extension_start(name);  // there is one: parse gave every name an image extension
    return name.substr(0, dot) + "_" + n + name.substr(dot);
}

}  // namespace kiln
