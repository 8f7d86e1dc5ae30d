// The Unicode general categories inside \p{L} and the marks, which Tekken's
// pre-tokenizer pattern (Mistral's) tells apart: lowercase (Ll), uppercase
// and titlecase (Lu, Lt), marks (Mn, Mc, Me). Modifier and other letters (Lm,
// Lo) are the letters that are neither. Tables for Unicode 14.0, written by
// scripts/gen_letter_case.py, as text/unicode.h's.
#pragma once

namespace kiln::text {

bool is_lowercase_letter(char32_t c);  // Ll
bool is_uppercase_letter(char32_t c);  // Lu or Lt
bool is_mark(char32_t c);              // Mn, Mc or Me: not \p{L}

}  // namespace kiln::text
