// Sorted, disjoint ranges of code points and the membership test the
// Unicode tables (text/unicode.cpp, text/letter_case.cpp) share.
#pragma once

#include <algorithm>
#include <cstddef>

namespace kiln::text {

struct CodePointRange {
    char32_t lo;
    char32_t hi;
};

template <size_t N>
bool in_table(const CodePointRange (&table)[N], char32_t c) {
    const CodePointRange* it =
        std::upper_bound(table, table + N, c, [](char32_t v, const CodePointRange& r) { return v < r.lo; });
    return it != table && c <= (it - 1)->hi;
}

}  // namespace kiln::text
