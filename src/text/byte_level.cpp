#include "text/byte_level.h"

#include "text/utf8.h"

namespace kiln::text {

const ByteMap& byte_map() {
    static const ByteMap map = [] {
        ByteMap m;
        m.char_to_byte.fill(-1);
        std::array<bool, 256> printable{};
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            if (printable[b]) m.order[n++] = static_cast<uint8_t>(b);
        }
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const char32_t c = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
            m.char_to_byte[c] = static_cast<int16_t>(b);
            append_utf8(c, m.byte_to_utf8[b]);
            if (!printable[b]) m.order[n++] = static_cast<uint8_t>(b);
        }
        return m;
    }();
    return map;
}

void append_token_bytes(std::string_view token, std::string& bytes) {
    const ByteMap& bm = byte_map();
    for (char32_t c : utf8_to_u32(token)) {
        if (c < bm.char_to_byte.size() && bm.char_to_byte[c] >= 0) {
            bytes.push_back(static_cast<char>(bm.char_to_byte[c]));
        } else {
            append_utf8(c, bytes);
        }
    }
}

}  // namespace kiln::text
