// GPT-2's bytes_to_unicode, shared by the byte-level BPE tokenizers (CLIP and
// the LLM one): a reversible byte <-> character map under which printable
// Latin-1 bytes are themselves and the others move to U+0100 upwards, so BPE
// never sees whitespace or control characters.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::text {

struct ByteMap {
    std::array<std::string, 256> byte_to_utf8;  // each byte's character, UTF-8
    std::array<int16_t, 324> char_to_byte{};    // -1 where no byte maps
    // The bytes in the order of their characters in the vocabulary (the
    // printable ones first): CLIP's first 256 token ids.
    std::array<uint8_t, 256> order{};
};

const ByteMap& byte_map();

// Appends the bytes `token`'s characters stand for. A character that is not
// a byte character (a hand-made vocabulary) is appended as its UTF-8.
void append_token_bytes(std::string_view token, std::string& bytes);

}  // namespace kiln::text
