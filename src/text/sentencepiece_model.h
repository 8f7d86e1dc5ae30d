// sentencepiece's unigram vocabulary and its .model file (a serialized
// ModelProto), read by a bounds-checked protobuf reader of kiln's own. The
// T5 tokenizer is built from a UnigramVocab, whichever file it came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::text {

// A vocabulary entry's role, with sentencepiece's numbering (which llama.cpp's
// tokenizer.ggml.token_type shares; its 0, "undefined", loads as Normal).
enum class PieceType : int32_t {
    Normal = 1,
    Unknown = 2,      // exactly one: what characters outside the vocabulary become
    Control = 3,      // </s>, <pad>, <extra_id_N>: never matched in text
    UserDefined = 4,  // always matched as a whole where it occurs
    Unused = 5,       // in the vocabulary, never produced
    Byte = 6,         // "<0x41>": byte fallback
};

struct UnigramPiece {
    std::string text;
    float score = 0.0f;
    PieceType type = PieceType::Normal;
};

// Everything a unigram tokenizer is made of, whatever file it came from.
struct UnigramVocab {
    std::vector<UnigramPiece> pieces;  // id = index
    // Ids of the end-of-sequence and padding pieces, -1 for none. The file
    // loaders take the control pieces named "</s>" and "<pad>" (or what
    // spiece.model's trainer_spec names them), as sentencepiece does.
    int32_t eos_id = -1;
    int32_t pad_id = -1;
    // sentencepiece's precompiled_charsmap bytes: uint32 trie size in bytes
    // (little-endian), the Darts-clone double-array trie (uint32 units), then
    // the NUL-separated replacement strings. Empty: no charsmap.
    std::string precompiled_charsmap;
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
};

// Whether `v` is one of PieceType's values (sentencepiece's 1..6).
bool valid_piece_type(int64_t v);

// spiece.model's bytes: pieces with their scores and types, trainer_spec
// (model_type must be UNIGRAM; byte_fallback; unk/eos/pad piece names),
// normalizer_spec (precompiled_charsmap, add_dummy_prefix,
// remove_extra_whitespaces). Unknown fields are skipped. EOS and padding are
// the control pieces trainer_spec names, as sentencepiece finds them. The
// vocabulary itself is checked by T5Tokenizer::from_vocab(). `label` names
// the bytes in errors (BadFile).
Result<UnigramVocab> read_sentencepiece_model(const uint8_t* data, size_t size, const std::string& label);

}  // namespace kiln::text
