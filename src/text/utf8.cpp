#include "text/utf8.h"

#include <cstdint>

namespace kiln::text {
namespace {

struct Utf8Char {
    char32_t code_point;  // kReplacementCodePoint when !valid
    size_t length;        // bytes: the character, or the maximal invalid subsequence
    bool valid;
};

// The character at the start of non-empty `s`, or the maximal invalid
// subsequence there (Unicode's "maximal subpart": a lead byte followed by
// the continuation bytes that can follow it, or one byte that starts
// nothing).
Utf8Char next_char(std::string_view s) {
    const auto b = static_cast<uint8_t>(s[0]);
    if (b < 0x80) return {b, 1, true};
    int need = 0;
    char32_t cp = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        cp = b & 0x1Fu;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        cp = b & 0x0Fu;
        if (b == 0xE0) lo = 0xA0;  // overlong
        if (b == 0xED) hi = 0x9F;  // surrogate
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        cp = b & 0x07u;
        if (b == 0xF0) lo = 0x90;  // overlong
        if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
        return {kReplacementCodePoint, 1, false};
    }
    size_t j = 1;
    int got = 0;
    while (got < need && j < s.size()) {
        const auto c = static_cast<uint8_t>(s[j]);
        const uint8_t l = got == 0 ? lo : uint8_t{0x80};
        const uint8_t h = got == 0 ? hi : uint8_t{0xBF};
        if (c < l || c > h) break;
        cp = (cp << 6) | (c & 0x3Fu);
        ++j;
        ++got;
    }
    if (got != need) return {kReplacementCodePoint, j, false};
    return {cp, j, true};
}

}  // namespace

size_t utf8_char_length(std::string_view s) {
    if (s.empty()) return 0;
    const Utf8Char c = next_char(s);
    return c.valid ? c.length : 0;
}

std::u32string utf8_to_u32(std::string_view text) {
    std::u32string out;
    out.reserve(text.size());
    while (!text.empty()) {
        const Utf8Char c = next_char(text);
        out.push_back(c.code_point);
        text.remove_prefix(c.length);
    }
    return out;
}

void append_utf8(char32_t c, std::string& out) {
    if (c < 0x80) {
        out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (c >> 6)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (c >> 12)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (c >> 18)));
        out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
}

std::string u32_to_utf8(std::u32string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t c : text) append_utf8(c, out);
    return out;
}

std::string valid_utf8(std::string_view text, Utf8Errors errors) {
    std::string out;
    out.reserve(text.size());
    while (!text.empty()) {
        const Utf8Char c = next_char(text);
        if (c.valid) {
            out.append(text.data(), c.length);
            text.remove_prefix(c.length);
        } else {
            append_utf8(kReplacementCodePoint, out);
            text.remove_prefix(errors == Utf8Errors::ReplaceByte ? 1 : c.length);
        }
    }
    return out;
}

}  // namespace kiln::text
