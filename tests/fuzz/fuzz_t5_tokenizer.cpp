// libFuzzer target for kiln's T5 (SentencePiece unigram) tokenizer loaders:
// spiece.model bytes (kiln's own protobuf reader and the precompiled
// charsmap) and HF tokenizer.json. The first byte picks the loader ('0':
// spiece.model, '1': tokenizer.json); the rest is the file. A loaded
// tokenizer must encode any text (the samples and the input itself) without
// crashing, to ids of its own vocabulary.
//
// Build and run: scripts/fuzz.sh t5_tokenizer SECONDS
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_check.h"
#include "text/t5_tokenizer.h"

namespace {

using kiln::text::T5Tokenizer;

std::string write_temp(const std::string& bytes) {
    const std::string path = "/tmp/kiln-fuzz-t5-" + std::to_string(getpid()) + "-tokenizer.json";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) __builtin_trap();
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
}

void exercise(const T5Tokenizer& t, const std::string& text) {
    for (const std::string& sample :
         {std::string("a red circle, \xEF\xBC\xA1 \t\n  cat"), std::string("\xFF\xC3 \x01"), text.substr(0, 256)}) {
        for (int32_t id : t.encode(sample)) KILN_FUZZ_CHECK(id >= 0 && id < t.size());
        const auto padded = t.encode_padded(sample, 16, true);
        KILN_FUZZ_CHECK(padded.ids.size() == 16 && padded.mask.size() == 16);
        (void)t.decode(padded.ids);
    }
    KILN_FUZZ_CHECK(t.unk_id() >= 0 && t.unk_id() < t.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    kiln::Result<T5Tokenizer> t = kiln::Error{"no loader"};
    switch (static_cast<char>(data[0])) {
        case '0': t = T5Tokenizer::from_spiece_bytes(data + 1, size - 1, "fuzz"); break;
        case '1': t = T5Tokenizer::from_tokenizer_json(write_temp(text)); break;
        default: return 0;
    }
    if (!t.ok()) {
        KILN_FUZZ_CHECK(!t.error().message.empty());
        return 0;
    }
    exercise(*t, text);
    return 0;
}
