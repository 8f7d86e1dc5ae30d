// Unicode character data for the tokenizers and the prompt parser: the
// character classes of the pre-tokenisation regexes (\s, \p{L}, \p{N}) and
// Python's str.lower(). Tables for Unicode 14.0, generated from Python
// 3.11's unicodedata, the data HF's and open_clip's `regex` patterns follow.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::text {

// Character classes for the pre-tokenisation regexes: \s, \p{L}, \p{N}, and
// everything else. Exact for Unicode 14.0, except that unassigned code
// points inside a letter or number range count as members.
enum class CharClass { Letter, Number, Space, Other };
CharClass char_class(char32_t c);

// The `regex` module's \s (HF, open_clip): ASCII \t \n \v \f \r and space,
// and Unicode White_Space. Python's re would add 0x1C..0x1F.
bool is_space(char32_t c);
inline bool is_letter(char32_t c) { return char_class(c) == CharClass::Letter; }
inline bool is_number(char32_t c) { return char_class(c) == CharClass::Number; }

// Python's str.lower() of s[begin, end): one-to-one mappings from the table,
// U+0130 -> "i\u0307", and capital sigma -> final sigma at the end of a
// word. Final sigma is approximate: "cased" means a letter of the Latin,
// Greek, Cyrillic, Armenian or Georgian blocks.
std::u32string python_lower(const std::u32string& s, size_t begin, size_t end);

}  // namespace kiln::text
