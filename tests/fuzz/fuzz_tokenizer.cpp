// libFuzzer target for kiln's tokenizer-file loaders (ClipTokenizer): HF
// tokenizer.json, vocab.json + merges.txt, GGUF-style token and merge
// arrays, and open_clip's merges-only file. The first byte picks the loader
// ('0'..'3'); the rest is the file (for vocab + merges, the two files split
// at the first "\n--\n"; for the arrays, tokens and merges one per line,
// split the same way). A loaded tokenizer must encode any text without
// crashing and with ids of its own vocabulary.
//
// Build and run: scripts/fuzz.sh tokenizer SECONDS
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "text/clip_tokenizer.h"

namespace {

using kiln::text::ClipTokenizer;

// The loaders take paths: each input is written to this process's own files.
std::string write_temp(const std::string& name, const std::string& bytes) {
    const std::string path = "/tmp/kiln-fuzz-tokenizer-" + std::to_string(getpid()) + "-" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) __builtin_trap();
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
}

std::pair<std::string, std::string> split(const std::string& text) {
    const auto at = text.find("\n--\n");
    if (at == std::string::npos) return {text, std::string()};
    return {text.substr(0, at), text.substr(at + 4)};
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t end = std::min(text.find('\n', start), text.size());
        out.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

void exercise(const ClipTokenizer& t, const std::string& text) {
    for (const std::string& sample : {std::string("a red circle, BREAK (x:1.2)"), text.substr(0, 256)}) {
        for (int32_t id : t.encode(sample)) KILN_FUZZ_CHECK(id >= 0);
    }
    KILN_FUZZ_CHECK(t.bos_id() >= 0 && t.eos_id() >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const char mode = static_cast<char>(data[0]);
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    kiln::Result<ClipTokenizer> t = kiln::Error{"no loader"};
    switch (mode) {
        case '0': t = ClipTokenizer::from_tokenizer_json(write_temp("tokenizer.json", text)); break;
        case '1': {
            const auto [vocab, merges] = split(text);
            t = ClipTokenizer::from_vocab_merges(write_temp("vocab.json", vocab), write_temp("merges.txt", merges));
            break;
        }
        case '2': {
            const auto [tokens, merges] = split(text);
            t = ClipTokenizer::from_tokens_and_merges(lines(tokens), lines(merges), "fuzz");
            break;
        }
        case '3': t = ClipTokenizer::from_clip_merges(text, "fuzz"); break;
        default: return 0;
    }
    if (!t.ok()) {
        KILN_FUZZ_CHECK(!t.error().message.empty());
        return 0;
    }
    exercise(*t, text);
    return 0;
}
