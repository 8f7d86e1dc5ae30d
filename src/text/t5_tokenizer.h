// The T5 tokenizer (Flux's and SD3's T5-XXL, Chroma, later UMT5 for Wan): a
// SentencePiece unigram model, behaving like sentencepiece's
// SentencePieceProcessor::Encode with its default (optimised) encoder.
//
// encode(text):
//   1. normalisation, sentencepiece's Normalizer: at each byte the longest
//      rule of the precompiled charsmap (T5: nmt_nfkc, NFKC plus NMT's
//      control-character and whitespace rules) that prefixes the rest of the
//      text replaces it; a byte no rule covers is copied with the rest of its
//      UTF-8 character, and an invalid UTF-8 byte becomes U+FFFD. With
//      remove_extra_whitespaces (T5: on), spaces (' ' in the normalised
//      output; the charsmap maps tabs, newlines and other spaces to it) are
//      trimmed at both ends and runs collapse to one. Each space becomes
//      U+2581 "▁", and add_dummy_prefix (T5: on) puts one "▁" in front.
//      Without a charsmap only the whitespace part is done.
//   2. Viterbi over the unigram lattice of the normalised text: the
//      segmentation into vocabulary pieces with the best total score.
//      Normal and unused pieces score their own score (unused ones are never
//      chosen), user-defined pieces length_in_bytes * max_score - 0.1 (so
//      they always win), a character no piece starts with is an unknown node
//      scoring min_score - 10 (min and max over normal pieces). Ties keep the
//      piece found first (shorter pieces, earlier starts), as sentencepiece.
//   3. consecutive unknown characters become one unk id; with byte fallback
//      (the vocabulary has the 256 "<0xXX>" byte pieces: UMT5, not T5) an
//      unknown character becomes the ids of its UTF-8 bytes instead.
// Control pieces ("</s>", "<pad>", "<extra_id_0>") are never matched in the
// text: "</s>" typed in a prompt is ordinary characters, as in sentencepiece
// (HF's fast tokenizer would give EOS there). No EOS is appended by encode();
// encode_padded() appends it.
//
// HF tokenizer.json, spiece.model and GGUF metadata of the same model give
// the same ids for any text. Loaders return an Error of kind BadFile naming
// the file (or the label given) and the problem; nothing throws, and no
// input, however truncated or hostile, crashes a loader or encode().
// A loaded tokenizer is immutable: encode() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tensor_info.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer.h"
#include "util/result.h"

namespace kiln::io {
class ModelFile;
}

namespace kiln::text {

// encode_padded()'s result: ids and mask have the same length.
struct PaddedTokens {
    std::vector<int32_t> ids;
    std::vector<int32_t> mask;  // 1 for a real token (EOS included), 0 for padding
};

class T5Tokenizer final : public Tokenizer {
  public:
    // A file or a folder: a folder is searched, then its tokenizer_2/ and
    // tokenizer/ subfolders (diffusers: Flux and SD3 keep T5's tokenizer in
    // tokenizer_2/, PixArt in tokenizer/), for spiece.model, then
    // tokenizer.json; a *.json file is read as tokenizer.json, anything else
    // as spiece.model.
    static Result<T5Tokenizer> load(const std::string& path);

    // HF tokenizer.json with model.type "Unigram": model.vocab [[piece,
    // score], ...], model.unk_id, model.byte_fallback; added_tokens marked
    // special become control pieces, the others user-defined; the normalizer
    // (Precompiled with its base64 charsmap, Replace " {2,}" -> " ", Strip,
    // or a Sequence of these) and the Metaspace pre-tokenizer ("▁", prepend
    // scheme or add_prefix_space; alone or after WhitespaceSplit) are read
    // into the settings above. Any other model type (CLIP's BPE) or
    // normaliser is an error naming the file and what it found.
    static Result<T5Tokenizer> from_tokenizer_json(const std::string& path);

    // sentencepiece's spiece.model (a serialized ModelProto), read by a
    // bounds-checked protobuf reader of kiln's own: pieces with their scores
    // and types, trainer_spec (model_type must be UNIGRAM; byte_fallback;
    // unk/eos/pad piece names), normalizer_spec (precompiled_charsmap,
    // add_dummy_prefix, remove_extra_whitespaces). Unknown fields are skipped.
    static Result<T5Tokenizer> from_spiece_model(const std::string& path);
    // The same from bytes in memory; `label` names them in errors.
    static Result<T5Tokenizer> from_spiece_bytes(const uint8_t* data, size_t size, const std::string& label);

    // llama.cpp's GGUF keys: tokenizer.ggml.model = "t5",
    // tokenizer.ggml.tokens, .scores, .token_type (optional: all normal but
    // the unknown token), .unknown_token_id, .eos_token_id,
    // .padding_token_id, .precompiled_charsmap (uint8 or int8 array),
    // .add_space_prefix, .remove_extra_whitespaces (both default true).
    static Result<T5Tokenizer> from_gguf_metadata(const io::Metadata& metadata, const std::string& label);
    // The first file of `file` is named in errors.
    static Result<T5Tokenizer> from_gguf_metadata(const io::ModelFile& file);

    // Checks the vocabulary (non-empty pieces, no piece text twice, finite
    // scores, at least one normal piece, exactly one unknown piece, ids in
    // range, all 256 byte pieces or none, a usable charsmap) and builds the
    // tokenizer.
    static Result<T5Tokenizer> from_vocab(UnigramVocab vocab, const std::string& label);

    // The tokenizer.ggml.* keys from_gguf_metadata() reads, with their GGUF
    // types, for a converter to add to the GGUF it writes
    // (io::GgufWriteOptions::extra_metadata).
    io::Metadata gguf_metadata() const;

    T5Tokenizer(T5Tokenizer&&) noexcept;
    T5Tokenizer& operator=(T5Tokenizer&&) noexcept;
    ~T5Tokenizer() override;

    const char* name() const override { return "T5"; }

    // Token ids of `text`, without EOS.
    std::vector<int32_t> encode(std::string_view text) const override;

    // encode(text) + EOS. With max_length > 0, cut to max_length tokens
    // (the last one stays EOS), and with `pad` filled up to max_length with
    // pad_id() (EOS where the vocabulary has no pad piece). Flux pads T5 to
    // 512 (dev) or 256 (schnell); Chroma needs the mask.
    PaddedTokens encode_padded(std::string_view text, int max_length, bool pad) const;

    // Step 1 of encode() alone: the text the lattice is built on.
    std::string normalize(std::string_view text) const;

    // Text of `ids`, sentencepiece's way: pieces joined, "▁" back to spaces,
    // the leading space removed, byte pieces back to bytes (invalid UTF-8
    // becomes U+FFFD), control pieces dropped, unknown as " ⁇ "; ids out of
    // range are skipped.
    std::string decode(const std::vector<int32_t>& ids) const override;

    int32_t unk_id() const { return unk_id_; }
    // -1 when the vocabulary has no "</s>" / "<pad>" (T5: 1 and 0).
    int32_t eos_id() const override { return eos_id_; }
    int32_t pad_id() const override { return pad_id_; }
    // Number of pieces (the text encoder's table may be larger: T5's has
    // 32128 rows for 32000 spiece.model or 32100 tokenizer.json pieces).
    int32_t size() const { return static_cast<int32_t>(vocab_.pieces.size()); }
    int32_t vocab_size() const override { return size(); }
    const UnigramVocab& vocab() const { return vocab_; }
    // The id of a piece's text, -1 if absent.
    int32_t piece_id(std::string_view piece) const;
    // The text of an id ("" out of range).
    const std::string& piece_text(int32_t id) const;

  private:
    struct Tables;

    T5Tokenizer();

    // Step 1's unit: the replacement of the longest charsmap rule at the
    // start of `text` (or its first character, or U+FFFD for an invalid
    // byte) and how many bytes of `text` it consumes.
    std::pair<std::string_view, size_t> normalize_prefix(std::string_view text) const;

    UnigramVocab vocab_;
    int32_t unk_id_ = -1;
    int32_t eos_id_ = -1;
    int32_t pad_id_ = -1;
    float min_score_ = 0.0f;
    float max_score_ = 0.0f;
    bool byte_fallback_ = false;
    // The trie of matchable pieces (normal and user-defined), the
    // piece -> id map, the byte pieces' ids and the decoded charsmap.
    std::unique_ptr<const Tables> tables_;
};

}  // namespace kiln::text
