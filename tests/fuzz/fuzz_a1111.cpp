// libFuzzer target for image metadata: A1111 "parameters" text
// (parse_a1111_parameters, and formatting what it read), EXIF UserComment
// blocks and PNG text chunks (image/png_metadata.h). The first byte picks
// the parser ('0' text, '1' EXIF, '2' PNG); the rest is its input.
//
// Build and run: scripts/fuzz.sh a1111 SECONDS
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "image/png_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t* body = data + 1;
    const size_t n = size - 1;
    switch (data[0]) {
        case '0': {
            const std::string text(reinterpret_cast<const char*>(body), n);
            const auto info = kiln::image::parse_a1111_parameters(text);
            volatile size_t sink = kiln::image::format_a1111_parameters(info).size();
            (void)sink;
            break;
        }
        case '1': {
            if (auto comment = kiln::image::parse_exif_user_comment(body, n)) {
                // What kiln reads back it can write again.
                const auto block = kiln::image::make_exif_user_comment(*comment);
                KILN_FUZZ_CHECK(!block.empty());
            }
            break;
        }
        case '2': {
            auto chunks = kiln::image::parse_png_text(body, n, "fuzz.png");
            if (!chunks.ok()) KILN_FUZZ_CHECK(chunks.error().message.rfind("fuzz.png", 0) == 0);
            break;
        }
        default: break;
    }
    return 0;
}
