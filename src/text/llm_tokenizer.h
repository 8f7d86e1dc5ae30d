// The byte-level BPE tokenizer of LLM text encoders (Qwen2/Qwen2.5/Qwen3,
// the GPT-2 family, Mistral's Tekken), behaving like llama.cpp's
// llm_tokenizer_bpe with tokenizer.ggml.pre "qwen2", "gpt-2" or "tekken" and
// like HF tokenizers' tokenizer.json of each.
//
// encode(text):
//   1. added tokens (<|im_start|>, <|im_end|>, <|endoftext|>, <think>, ...:
//      GGUF token types CONTROL and USER_DEFINED, tokenizer.json's
//      added_tokens, tokenizer_config.json's added_tokens_decoder) are cut
//      out of the raw text first, leftmost first and the longest where
//      several start at one place (HF's added-vocabulary matching), and
//      become their single ids; they are never split.
//   2. the text between them is split by the pre-tokenizer's pattern,
//      implemented by hand with char_class() (text/unicode.h) for \p{L},
//      \p{N} and \s:
//        Qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//               ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//        GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//               \s+(?!\S)|\s+
//        Tekken: [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
//                [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
//                \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//                (the letter classes from text/letter_case.h: Mistral's own
//                pattern, where llama.cpp approximates them by ASCII case)
//      ((?i:...) is ASCII-only case folding, as llama.cpp's).
//   3. each piece -> UTF-8 bytes -> GPT-2's bytes_to_unicode characters ->
//      BPE (the adjacent pair of lowest merge rank first, leftmost on ties,
//      until no pair has a rank) -> vocabulary ids. A byte whose character
//      is not in the vocabulary is dropped (HF without unk_token); real
//      vocabularies have all 256.
//      With ignore_merges (Tekken: tokenizer.json's model.ignore_merges,
//      and always for a "tekken" GGUF, as llama.cpp), a piece that is a
//      vocabulary token whole is that token, merges or not (tiktoken's rule).
//   No BOS or EOS is added (Qwen's add_bos_token is false; Mistral's chat template
//   writes its "<s>" as text, an added token), no lower-casing,
//   no clean-up of spaces.
//
// Differences from HF, all following llama.cpp:
//   - no NFC normalisation (HF's Qwen2 tokenizer.json has an NFC normalizer;
//     llama.cpp does not normalise). Text that is already NFC, which is what
//     keyboards and most files give, gets the same ids.
//   - invalid UTF-8 becomes U+FFFD (each maximal invalid subsequence one
//     U+FFFD, as Python's "replace"; llama.cpp replaces byte by byte), then
//     is tokenized as that character.
//   - character classes are Unicode 14.0 (char_class()); code points that
//     later Unicode versions assigned may split differently.
//
// Loaders return an Error of kind BadFile naming the file (or the label
// given) and the problem; nothing throws, and no input, however truncated or
// hostile, crashes a loader or encode(). A loaded tokenizer is immutable:
// encode() and decode() may be called from any thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tensor_info.h"
#include "text/tokenizer.h"
#include "util/result.h"

namespace kiln::io {
class ModelFile;
}

namespace kiln::text {

// Which split pattern step 2 uses.
enum class LlmPreTokenizer { Qwen2, Gpt2, Tekken };

// Everything a byte-level BPE tokenizer is made of, whatever file it came
// from.
struct LlmBpeVocab {
    std::vector<std::string> tokens;  // id = index; "" where no token has that id
    // Added tokens: matched whole in the text before pre-tokenisation.
    std::vector<int32_t> added_ids;
    // "a" + "b" merges; rank = index. The first of repeated merges counts.
    std::vector<std::pair<std::string, std::string>> merges;
    LlmPreTokenizer pre = LlmPreTokenizer::Qwen2;
    bool ignore_merges = false;  // a whole piece in the vocabulary is its token
};

// Tekken's split pattern as Mistral's files write it (tokenizer.json's Split
// regex, tekken.json's config.pattern).
std::string_view tekken_split_pattern();

class LlmTokenizer final : public Tokenizer {
  public:
    // A file or a folder. A folder is searched, then its tokenizer/
    // subfolder, for tokenizer.json, then tekken.json, then vocab.json +
    // merges.txt, then a single *.gguf. A file: GGUF (by its magic bytes),
    // vocab.json (with merges.txt beside it), tekken.json, any other *.json
    // as tokenizer.json.
    static Result<LlmTokenizer> load(const std::string& path);

    // HF tokenizer.json: model.type "BPE" with model.vocab {token: id} and
    // model.merges as "a b" strings or ["a", "b"] pairs, no byte fallback,
    // no subword prefix or word-end suffix; added_tokens (special or not)
    // become added tokens. The pre_tokenizer must be a Split by Qwen2's or
    // Tekken's pattern followed by ByteLevel (Qwen2/Qwen3, Mistral), or
    // ByteLevel with its own regex (GPT-2); anything else is an error naming
    // it. model.ignore_merges is read. The normalizer
    // may be absent or NFC (not applied, see above).
    static Result<LlmTokenizer> from_tokenizer_json(const std::string& path);

    // vocab.json {token: id} + merges.txt (an optional "#version" first
    // line, then one "a b" merge per line, rank = order). Added tokens come
    // from tokenizer_config.json beside vocab.json (added_tokens_decoder),
    // if present; vocabulary tokens of the form <|...|> are added tokens
    // too. tokenizer_config.json's tokenizer_class "GPT2Tokenizer" selects
    // GPT-2's pattern; anything else, or no config, Qwen2's.
    static Result<LlmTokenizer> from_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

    // Mistral's tekken.json (text/tekken_json.h).
    static Result<LlmTokenizer> from_tekken_json(const std::string& path);

    // A GGUF file (a full model or vocab-only), read through its metadata.
    static Result<LlmTokenizer> from_gguf_file(const std::string& path);

    // llama.cpp's GGUF keys: tokenizer.ggml.model = "gpt2",
    // tokenizer.ggml.pre = "qwen2" (or "deepseek-r1-qwen", the same),
    // "gpt-2" or "tekken"; tokenizer.ggml.tokens, tokenizer.ggml.merges ("a b" strings),
    // tokenizer.ggml.token_type (optional; CONTROL (3) and USER_DEFINED (4)
    // tokens are added tokens; without it, tokens of the form <|...|> are).
    // Any other pre-tokenizer is an error naming it.
    static Result<LlmTokenizer> from_gguf_metadata(const io::Metadata& metadata, const std::string& label);
    // The first file of `file` is named in errors.
    static Result<LlmTokenizer> from_gguf_metadata(const io::ModelFile& file);

    // Checks the vocabulary (at least one token, no token text twice,
    // added ids in range and non-empty, every merge's two symbols and their
    // concatenation in the vocabulary) and builds the tokenizer.
    static Result<LlmTokenizer> from_vocab(LlmBpeVocab vocab, const std::string& label);

    LlmTokenizer(LlmTokenizer&&) noexcept;
    LlmTokenizer& operator=(LlmTokenizer&&) noexcept;
    ~LlmTokenizer() override;

    const char* name() const override { return "LLM"; }

    // Token ids of `text`, added tokens parsed, no BOS/EOS.
    std::vector<int32_t> encode(std::string_view text) const override;

    // Step 2 alone, on text without added tokens: the pieces (UTF-8, before
    // the byte mapping) that BPE works on.
    std::vector<std::string> pre_tokenize(std::string_view text) const;

    // Text of `ids`: added tokens as their text, the others' byte
    // characters back to bytes; invalid UTF-8 in the result becomes U+FFFD
    // (HF's errors="replace"); ids out of range or without a token are
    // skipped.
    std::string decode(const std::vector<int32_t>& ids) const override;

    // The id of a token's text, -1 if absent.
    int32_t token_id(const std::string& token) const;
    // The text of an id ("" out of range).
    const std::string& token_text(int32_t id) const;
    // Whether `id` is an added token (matched whole in the text).
    bool is_added(int32_t id) const;
    // One past the largest id, added tokens included (Qwen2's GGUF: 151936;
    // Qwen3's tokenizer.json: 151669; the text encoder's table may be larger).
    int32_t size() const;
    int32_t vocab_size() const override { return size(); }
    LlmPreTokenizer pre_tokenizer() const;

    // The tokenizer.ggml.* keys from_gguf_metadata() reads, as llama.cpp's
    // converter writes them (model "gpt2", pre, tokens, merges by rank,
    // token_type: 3 for added tokens, 5 for ids without a token, 1 for the
    // rest; no BOS added), with their GGUF types: what -M convert --tokenizer
    // llm=PATH writes into the GGUF it makes.
    io::Metadata gguf_metadata() const;

  private:
    struct Tables;

    LlmTokenizer();

    // Appends the ids of one pre-tokenised piece.
    void bpe(std::string_view piece, std::vector<int32_t>& out) const;
    // Appends the ids of text holding no added token.
    void encode_plain(std::string_view text, std::vector<int32_t>& out) const;

    std::unique_ptr<const Tables> tables_;
};

}  // namespace kiln::text
