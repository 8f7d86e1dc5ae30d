// Base64 (RFC 4648, standard alphabet): images in the server's JSON bodies
// (the native, OpenAI and A1111 APIs carry them as base64 strings) and
// tokenizer.json's precompiled_charsmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

std::string base64_encode(const uint8_t* data, size_t size);
inline std::string base64_encode(const std::vector<uint8_t>& bytes) {
    return base64_encode(bytes.data(), bytes.size());
}

// What base64_decode() accepts besides the standard alphabet and '='
// padding (with or without it).
enum class Base64Input {
    // What HTTP clients send: a "data:image/png;base64," prefix (browsers,
    // A1111 clients) is skipped, whitespace is ignored, and the URL-safe
    // '-' and '_' are read as '+' and '/'. A lone character after the last
    // whole group is an error.
    Lenient,
    // A file's own field (tokenizer.json): nothing else. A lone character
    // after the last whole group (6 bits, no byte) is dropped, as the T5
    // tokenizer has always read its charsmap.
    Strict,
};

// The bytes of `text`; nullopt for a character `input` does not allow, data
// after the padding, more than two '=' or (Lenient) a truncated final group.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view text, Base64Input input = Base64Input::Lenient);

}  // namespace kiln
