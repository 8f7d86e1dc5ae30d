// The CLIP byte-level BPE tokenizer (SD1.x, SD2.x OpenCLIP, SDXL), behaving
// like HF transformers' CLIPTokenizer and open_clip's SimpleTokenizer.
//
// encode(text):
//   1. clean-up (what ftfy + html.unescape would do, for the cases prompts
//      meet): invalid UTF-8 becomes U+FFFD; HTML entities are unescaped twice
//      (open_clip does html.unescape(html.unescape(x))): the common named
//      ones (&amp; &lt; &gt; &quot; &apos; &nbsp; ...) and every numeric
//      one; ftfy's control characters are dropped; fullwidth ASCII
//      (U+FF01..FF5E, U+3000) becomes ASCII; ftfy's Latin ligatures and
//      digraphs (U+FB00..FB06, IJ, DŽ, LJ, NJ, DZ, ŉ) are split; curly quotes
//      become ' and " (ftfy's uncurl_quotes); runs of whitespace become one
//      space and the ends are trimmed. ftfy's mojibake repair and NFC
//      normalisation are not done.
//   2. textual-inversion words (add_embedding_token) are cut out here,
//      case-sensitively, before lower-casing.
//   3. lower-casing as Python's str.lower() (Unicode 14 tables). Final
//      sigma is approximate: "cased" means a letter of the Latin, Greek,
//      Cyrillic, Armenian or Georgian blocks.
//   4. pre-tokenisation by CLIP's regex
//        <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|
//        [\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//      with the character classes of char_class() (text/unicode.h).
//   5. each piece -> UTF-8 bytes -> bytes_to_unicode characters -> BPE with
//      "</w>" on the last symbol -> vocabulary ids. A piece that is exactly a
//      special token maps to its id; a BPE symbol missing from the
//      vocabulary maps to the unknown id, which is <|endoftext|> as in HF.
//   BPE results are cached per piece (bounded; thread-safe).
//
// Ids are read from the vocabulary, never assumed: BOS is <|startoftext|>
// (49406 in the real CLIP vocabulary) and EOS <|endoftext|> (49407); the
// newer open_clip names <start_of_text>/<end_of_text> are accepted too.
//
// Every loader returns an Error naming the file (or the label given) and
// the problem; nothing throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/tokenizer.h"
#include "util/result.h"

namespace kiln::text {

// A textual-inversion embedding registered with the tokenizer: the word
// `name` encodes to the ids first_id .. first_id + n_vectors - 1, which lie
// past the vocabulary so the text encoder can tell them apart.
struct EmbeddingToken {
    std::string name;
    int32_t first_id = 0;
    int32_t n_vectors = 0;
};

class ClipTokenizer final : public Tokenizer {
  public:
    // Loads from a file or a folder:
    //   - a folder with vocab.json + merges.txt, or tokenizer.json, or a
    //     diffusers model folder whose tokenizer/ subfolder holds them;
    //   - a HF tokenizer.json (any *.json not named vocab.json);
    //   - vocab.json (merges.txt must sit next to it);
    //   - a *.txt merges list alone (open_clip's bpe_simple_vocab_16e6.txt,
    //     what sd.cpp embeds): see from_clip_merges().
    static Result<ClipTokenizer> load(const std::string& path);

    // HF tokenizer.json: model.vocab {token: id}, model.merges as "a b"
    // strings or [a, b] pairs, added_tokens merged into the vocabulary.
    static Result<ClipTokenizer> from_tokenizer_json(const std::string& path);

    // vocab.json {token: id} + merges.txt (an optional "#version" first line,
    // then one "a b" merge per line, rank = order).
    static Result<ClipTokenizer> from_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

    // GGUF-style: tokenizer.ggml.tokens (id = index) and tokenizer.ggml.merges
    // ("a b" strings, rank = order). `label` names the source in errors.
    static Result<ClipTokenizer> from_tokens_and_merges(std::vector<std::string> tokens,
                                                        const std::vector<std::string>& merges,
                                                        const std::string& label = "tokenizer");

    // open_clip's merges-only file: an optional "#version" line, then merges.
    // The vocabulary is built the way open_clip and sd.cpp build it: the 256
    // byte characters, the same with "</w>", one token per merge (only the
    // first 49152 - 256 - 2 merges are used, as open_clip does), then
    // <|startoftext|> and <|endoftext|>. For the real file this gives the
    // real CLIP ids.
    static Result<ClipTokenizer> from_clip_merges(std::string_view merges_text, const std::string& label);

    ClipTokenizer(ClipTokenizer&&) noexcept;
    ClipTokenizer& operator=(ClipTokenizer&&) noexcept;
    ~ClipTokenizer() override;

    const char* name() const override { return "CLIP"; }

    // Token ids of `text`, without BOS/EOS.
    std::vector<int32_t> encode(std::string_view text) const override;

    // Text of `ids` the open_clip way: tokens joined, byte characters turned
    // back into bytes (invalid UTF-8 becomes U+FFFD), "</w>" becomes a space,
    // the ends trimmed (HF). Special tokens appear as their text, an
    // embedding id run as the embedding's name; unknown ids are skipped.
    std::string decode(const std::vector<int32_t>& ids) const override;

    // Registers a textual-inversion embedding of n_vectors vectors and
    // returns its first id (ids are allocated past the vocabulary and
    // earlier embeddings). encode() then maps every whole-word occurrence of
    // `name` (case-sensitive; a word boundary is any character other than a
    // letter, number, '_' or '-', or the text's ends) to those ids; when
    // names overlap the longest wins. Errors: empty name, name with
    // surrounding whitespace, name already registered, n_vectors < 1. Not to
    // be called while another thread encodes.
    Result<int32_t> add_embedding_token(const std::string& name, int n_vectors);

    // The embedding whose ids contain `id`, or nullptr.
    const EmbeddingToken* embedding_for_id(int32_t id) const;
    const std::vector<EmbeddingToken>& embeddings() const { return embeddings_; }

    int32_t bos_id() const override { return bos_id_; }
    int32_t eos_id() const override { return eos_id_; }
    // Id of ",</w>" (A1111's comma used for chunk back-tracking), -1 if none.
    int32_t comma_id() const { return comma_id_; }
    // One past the largest vocabulary id (the text encoder's table size);
    // embedding ids start here.
    int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
    // The id of a vocabulary token, -1 if absent.
    int32_t token_id(const std::string& token) const;
    // The vocabulary string of an id ("" for holes and out-of-range ids).
    const std::string& token_text(int32_t id) const;

  private:
    struct Cache;

    ClipTokenizer();
    static Result<ClipTokenizer> build(std::unordered_map<std::string, int32_t> vocab,
                                       const std::vector<std::pair<std::string, std::string>>& merges,
                                       const std::string& label);

    // Appends the ids of one already-lower-cased, whitespace-free-at-ends
    // text segment.
    void encode_segment(const std::u32string& text, std::vector<int32_t>& out) const;
    // BPE of one pre-token (byte characters, UTF-8), with caching.
    void bpe(const std::string& piece, std::vector<int32_t>& out) const;

    std::unordered_map<std::string, int32_t> token_to_id_;
    std::vector<std::string> id_to_token_;
    // "a b" -> rank (lower merges first). No BPE symbol contains a space:
    // the byte characters map the space byte elsewhere.
    std::unordered_map<std::string, int32_t> merge_ranks_;
    int32_t bos_id_ = -1;
    int32_t eos_id_ = -1;
    int32_t comma_id_ = -1;
    std::vector<EmbeddingToken> embeddings_;
    std::vector<std::u32string> embedding_names_u32_;
    int32_t next_embedding_id_ = 0;
    std::unique_ptr<Cache> cache_;
};

}  // namespace kiln::text
