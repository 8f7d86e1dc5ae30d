// libFuzzer target for the prompt parser (pipeline/prompt_weights.h):
// A1111 attention syntax, BREAK, chunking. Every input parses; the chunks
// are never more than kMaxPromptChunks, each BOS + 75 tokens + EOS long with
// one weight per token; check_prompt_size never throws.
//
// Build and run: scripts/fuzz.sh prompt SECONDS
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "pipeline/prompt_weights.h"
#include "text/clip_tokenizer.h"

namespace {

// open_clip's construction with no merges: the 512 byte tokens and the two
// specials, so every input encodes.
const kiln::text::ClipTokenizer& tokenizer() {
    static auto t = kiln::text::ClipTokenizer::from_clip_merges("#version: 0.2\n", "fuzz");
    if (!t.ok()) __builtin_trap();
    return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string prompt(reinterpret_cast<const char*>(data), size);
    const auto fragments = kiln::pipeline::parse_prompt_attention(prompt);
    KILN_FUZZ_CHECK(!fragments.empty());
    (void)kiln::pipeline::check_prompt_size(prompt, "--prompt");

    for (bool weights : {true, false}) {
        kiln::pipeline::ChunkOptions options;
        options.parse_weights = weights;
        const auto chunks = kiln::pipeline::tokenize_with_weights(tokenizer(), prompt, options);
        KILN_FUZZ_CHECK(!chunks.tokens.empty());
        KILN_FUZZ_CHECK(chunks.tokens.size() <= static_cast<size_t>(kiln::pipeline::kMaxPromptChunks));
        KILN_FUZZ_CHECK(chunks.tokens.size() == chunks.weights.size());
        for (size_t c = 0; c < chunks.tokens.size(); ++c) {
            KILN_FUZZ_CHECK(chunks.tokens[c].size() == 77);
            KILN_FUZZ_CHECK(chunks.weights[c].size() == 77);
            KILN_FUZZ_CHECK(chunks.tokens[c][0] == tokenizer().bos_id());
        }
    }
    const auto again = kiln::pipeline::tokenize_fragments(tokenizer(), fragments);
    KILN_FUZZ_CHECK(again.tokens.size() <= static_cast<size_t>(kiln::pipeline::kMaxPromptChunks));
    return 0;
}
