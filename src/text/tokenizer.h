// What the three tokenizers (text::ClipTokenizer, text::T5Tokenizer,
// text::LlmTokenizer) share: text to ids and back, the size of the id space
// and their special ids. What differs stays in the concrete classes: CLIP's
// textual-inversion words and 77-token chunks (pipeline/prompt_weights.h),
// T5's padding to a fixed length (encode_padded), the LLM's chat template
// (pipeline/conditioner.h). All are immutable once loaded apart from CLIP's
// add_embedding_token(), and encode()/decode() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::text {

class Tokenizer {
  public:
    virtual ~Tokenizer() = default;

    // "CLIP", "T5", "LLM": for messages.
    virtual const char* name() const = 0;

    // Token ids of `text`, without BOS, EOS or padding.
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    // Text of `ids` (each tokenizer's reference decoder; invalid UTF-8
    // becomes U+FFFD; ids it does not know are skipped).
    virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

    // One past the largest id the tokenizer produces from its vocabulary
    // (the text encoder's table may be larger).
    virtual int32_t vocab_size() const = 0;

    // Special ids, -1 where the tokenizer has none (CLIP: BOS and EOS; T5:
    // EOS and padding; the LLM tokenizer adds none).
    virtual int32_t bos_id() const { return -1; }
    virtual int32_t eos_id() const { return -1; }
    virtual int32_t pad_id() const { return -1; }

  protected:
    Tokenizer() = default;
    Tokenizer(const Tokenizer&) = default;
    Tokenizer(Tokenizer&&) = default;
    Tokenizer& operator=(const Tokenizer&) = default;
    Tokenizer& operator=(Tokenizer&&) = default;
};

}  // namespace kiln::text
