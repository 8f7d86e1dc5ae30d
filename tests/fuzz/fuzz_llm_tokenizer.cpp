// libFuzzer target for kiln's byte-level BPE (LLM) tokenizer loaders: HF
// tokenizer.json, vocab.json + merges.txt, GGUF files (kiln's GGUF
// parser, then the tokenizer.ggml.* keys) and Mistral's tekken.json. The
// first byte picks the loader ('0': tokenizer.json, '1': vocab.json with the
// input's second half as merges.txt, '2': GGUF, '3': tekken.json); the rest
// is the file. A loaded tokenizer must
// encode any text (the samples and the input itself) without crashing, to
// ids of its own vocabulary, and decode them.
//
// Built with the other fuzzers (cmake --build build-fuzz --target kiln_fuzz);
// run build-fuzz/tests/fuzz/fuzz_llm_tokenizer -max_total_time=SECONDS
// (scripts/fuzz.sh does not list it yet).
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_check.h"
#include "text/llm_tokenizer.h"

namespace {

using kiln::text::LlmTokenizer;

std::string temp_dir() {
    const std::string dir = "/tmp/kiln-fuzz-llm-" + std::to_string(getpid());
    mkdir(dir.c_str(), 0700);
    return dir;
}

std::string write_temp(const std::string& name, const std::string& bytes) {
    const std::string path = temp_dir() + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) __builtin_trap();
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
}

void exercise(const LlmTokenizer& t, const std::string& text) {
    for (const std::string& sample : {std::string("<|im_start|>user\nhello, world's  \t\r\n\n 123<|im_end|>\n"),
                                      std::string("<s>[INST]Hello WORLDwide caf\xC3\xA9/x\n[/INST]"),
                                      std::string("\xFF\xC3 \x01\xE4\xB8"), text.substr(0, 256)}) {
        const auto ids = t.encode(sample);
        for (int32_t id : ids) KILN_FUZZ_CHECK(id >= 0 && id < t.size());
        (void)t.decode(ids);
        (void)t.pre_tokenize(sample);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    kiln::Result<LlmTokenizer> t = kiln::Error{"no loader"};
    switch (static_cast<char>(data[0])) {
        case '0': t = LlmTokenizer::from_tokenizer_json(write_temp("tokenizer.json", text)); break;
        case '1': {
            const size_t half = text.size() / 2;
            const std::string vocab = write_temp("vocab.json", text.substr(0, half));
            t = LlmTokenizer::from_vocab_merges(vocab, write_temp("merges.txt", text.substr(half)));
            break;
        }
        case '2': t = LlmTokenizer::from_gguf_file(write_temp("vocab.gguf", text)); break;
        case '3': t = LlmTokenizer::from_tekken_json(write_temp("tekken.json", text)); break;
        default: return 0;
    }
    if (!t.ok()) {
        KILN_FUZZ_CHECK(!t.error().message.empty());
        return 0;
    }
    exercise(*t, text);
    return 0;
}
