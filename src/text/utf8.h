// UTF-8 <-> code points for the tokenizers and the prompt parser. Invalid
// UTF-8 never fails: it becomes U+FFFD, in one of the two ways the reference
// tokenizers differ on (Utf8Errors).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::text {

constexpr char32_t kReplacementCodePoint = 0xFFFD;

// How invalid UTF-8 becomes U+FFFD. The tokenizers follow different
// references, and the number of U+FFFD changes the ids a text gets, so each
// keeps its own.
enum class Utf8Errors {
    // Python's bytes.decode("utf-8", "replace"): each maximal invalid
    // subsequence (a lead byte and the continuation bytes that fit it, or one
    // stray byte) becomes one U+FFFD. CLIP (open_clip, HF) and the LLM
    // tokenizer (HF) decode this way.
    ReplaceSubpart,
    // sentencepiece: each byte that does not start a valid character becomes
    // one U+FFFD, so a truncated 3-byte character gives two. The T5
    // tokenizer decodes this way.
    ReplaceByte,
};

// Length of the valid UTF-8 character at the start of `s` (shortest form, no
// surrogates, at most U+10FFFF), 0 if there is none.
size_t utf8_char_length(std::string_view s);

// Code points of `text`, invalid UTF-8 replaced as Utf8Errors::ReplaceSubpart.
std::u32string utf8_to_u32(std::string_view text);
std::string u32_to_utf8(std::u32string_view text);
void append_utf8(char32_t c, std::string& out);

// `text` with its invalid UTF-8 replaced by U+FFFD as `errors` says.
std::string valid_utf8(std::string_view text, Utf8Errors errors);

}  // namespace kiln::text
