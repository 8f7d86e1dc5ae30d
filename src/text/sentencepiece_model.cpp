#include "text/sentencepiece_model.h"

#include <algorithm>
#include <cstring>

#include "text/vocab_files.h"
#include "util/message_text.h"

namespace kiln::text {
namespace {

constexpr size_t kMaxPieces = static_cast<size_t>(kMaxVocabSize);

// ---- protobuf ----

enum WireType { kVarint = 0, kFixed64 = 1, kLen = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

// A reader of protobuf's wire format over one message's bytes. Every read is
// bounds-checked; a failure leaves a message (with the absolute byte offset)
// in `error`.
class ProtoReader {
  public:
    ProtoReader(const uint8_t* data, size_t size, size_t base_offset) : data_(data), size_(size), base_(base_offset) {}

    bool done() const { return pos_ >= size_; }
    size_t offset() const { return base_ + pos_; }
    const std::string& error() const { return error_; }

    // The next field's number and wire type.
    bool tag(uint32_t& field, int& wire) {
        const size_t at = offset();
        uint64_t key = 0;
        if (!varint(key)) return false;
        field = static_cast<uint32_t>(key >> 3);
        wire = static_cast<int>(key & 7);
        if (key >> 3 == 0 || key >> 3 > 0x1FFFFFFF) return fail_at(at, "field number " + std::to_string(key >> 3));
        if (wire == kStartGroup || wire == kEndGroup || wire > kFixed32) {
            return fail_at(at, "field " + std::to_string(field) + " has wire type " + std::to_string(wire) +
                                   " (groups and types 6, 7 are not read)");
        }
        return true;
    }

    bool varint(uint64_t& v) {
        const size_t at = offset();
        v = 0;
        for (int i = 0; i < 10; ++i) {
            if (pos_ >= size_) return fail_at(at, "truncated varint");
            const uint8_t b = data_[pos_++];
            if (i == 9 && b > 1) return fail_at(at, "varint longer than 64 bits");
            v |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
            if (!(b & 0x80)) return true;
        }
        return fail_at(at, "varint longer than 10 bytes");
    }

    bool fixed32(uint32_t& v) {
        if (size_ - pos_ < 4) return fail_at(offset(), "truncated fixed32");
        v = static_cast<uint32_t>(data_[pos_]) | static_cast<uint32_t>(data_[pos_ + 1]) << 8 |
            static_cast<uint32_t>(data_[pos_ + 2]) << 16 | static_cast<uint32_t>(data_[pos_ + 3]) << 24;
        pos_ += 4;
        return true;
    }

    // A length-delimited field's bytes and where they start in the file.
    bool bytes(const uint8_t*& out, size_t& n, size_t& at) {
        const size_t len_at = offset();
        uint64_t len = 0;
        if (!varint(len)) return false;
        if (len > size_ - pos_) {
            return fail_at(len_at, "length " + std::to_string(len) + " runs past the end (" +
                                       std::to_string(size_ - pos_) + " bytes left)");
        }
        out = data_ + pos_;
        n = static_cast<size_t>(len);
        at = offset();
        pos_ += n;
        return true;
    }

    bool skip(int wire) {
        switch (wire) {
            case kVarint: {
                uint64_t v;
                return varint(v);
            }
            case kFixed64:
                if (size_ - pos_ < 8) return fail_at(offset(), "truncated fixed64");
                pos_ += 8;
                return true;
            case kLen: {
                const uint8_t* p;
                size_t n, at;
                return bytes(p, n, at);
            }
            case kFixed32: {
                uint32_t v;
                return fixed32(v);
            }
            default: return fail_at(offset(), "wire type " + std::to_string(wire));
        }
    }

    // Checks that `field` came with the wire type its schema gives it.
    bool expect(uint32_t field, int wire, int wanted, const char* what) {
        if (wire == wanted) return true;
        static const char* const kNames[] = {"varint", "fixed64", "length-delimited", "group", "group", "fixed32"};
        return fail_at(offset(), std::string(what) + " (field " + std::to_string(field) + ") has wire type " +
                                     kNames[wire] + ", expected " + kNames[wanted]);
    }

  private:
    bool fail_at(size_t at, const std::string& what) {
        error_ = "byte " + std::to_string(at) + ": " + what;
        return false;
    }

    const uint8_t* data_;
    size_t size_;
    size_t base_;
    size_t pos_ = 0;
    std::string error_;
};

struct SpmModel {
    UnigramVocab vocab;
    int model_type = 1;  // TrainerSpec.ModelType, UNIGRAM by default
    bool byte_fallback = false;
    bool treat_whitespace_as_suffix = false;
    bool escape_whitespaces = true;
    std::string unk_piece = "<unk>";
    std::string eos_piece = "</s>";
    std::string pad_piece = "<pad>";
};

// ModelProto.SentencePiece { 1: piece, 2: score, 3: type }.
bool parse_piece(ProtoReader& r, UnigramPiece& piece, size_t index, std::string& why) {
    int64_t type = 1;
    while (!r.done()) {
        uint32_t field;
        int wire;
        if (!r.tag(field, wire)) return false;
        if (field == 1) {
            if (!r.expect(field, wire, kLen, "piece")) return false;
            const uint8_t* p;
            size_t n, at;
            if (!r.bytes(p, n, at)) return false;
            piece.text.assign(reinterpret_cast<const char*>(p), n);
        } else if (field == 2) {
            if (!r.expect(field, wire, kFixed32, "score")) return false;
            uint32_t bits = 0;
            if (!r.fixed32(bits)) return false;
            std::memcpy(&piece.score, &bits, sizeof(float));
        } else if (field == 3) {
            if (!r.expect(field, wire, kVarint, "type")) return false;
            uint64_t v;
            if (!r.varint(v)) return false;
            type = static_cast<int64_t>(v);
        } else if (!r.skip(wire)) {
            return false;
        }
    }
    if (!valid_piece_type(type)) {
        why = "piece " + std::to_string(index) + " " + quoted_text(piece.text) + " has type " + std::to_string(type) +
              ", not one of sentencepiece's 1..6";
        return false;
    }
    piece.type = static_cast<PieceType>(type);
    return true;
}

bool parse_string(ProtoReader& r, std::string& out) {
    const uint8_t* p;
    size_t n, at;
    if (!r.bytes(p, n, at)) return false;
    out.assign(reinterpret_cast<const char*>(p), n);
    return true;
}

bool parse_bool(ProtoReader& r, uint32_t field, int wire, const char* what, bool& out) {
    if (!r.expect(field, wire, kVarint, what)) return false;
    uint64_t v;
    if (!r.varint(v)) return false;
    out = v != 0;
    return true;
}

// TrainerSpec: 3 model_type, 24 treat_whitespace_as_suffix, 35
// byte_fallback, 45..48 unk/bos/eos/pad piece names. The numeric
// unk/bos/eos/pad ids (40..43) only say where the trainer put those pieces;
// sentencepiece itself finds them by name, as here.
bool parse_trainer_spec(ProtoReader& r, SpmModel& m) {
    while (!r.done()) {
        uint32_t field;
        int wire;
        if (!r.tag(field, wire)) return false;
        if (field == 3) {
            if (!r.expect(field, wire, kVarint, "trainer_spec.model_type")) return false;
            uint64_t v;
            if (!r.varint(v)) return false;
            m.model_type = static_cast<int>(std::min<uint64_t>(v, 1000000));
        } else if (field == 24) {
            if (!parse_bool(r, field, wire, "trainer_spec.treat_whitespace_as_suffix", m.treat_whitespace_as_suffix))
                return false;
        } else if (field == 35) {
            if (!parse_bool(r, field, wire, "trainer_spec.byte_fallback", m.byte_fallback)) return false;
        } else if (field == 45 || field == 47 || field == 48) {
            if (!r.expect(field, wire, kLen, "trainer_spec piece name")) return false;
            std::string& out = field == 45 ? m.unk_piece : field == 47 ? m.eos_piece : m.pad_piece;
            if (!parse_string(r, out)) return false;
        } else if (!r.skip(wire)) {
            return false;
        }
    }
    return true;
}

// NormalizerSpec: 2 precompiled_charsmap, 3 add_dummy_prefix, 4
// remove_extra_whitespaces, 5 escape_whitespaces.
bool parse_normalizer_spec(ProtoReader& r, SpmModel& m) {
    while (!r.done()) {
        uint32_t field;
        int wire;
        if (!r.tag(field, wire)) return false;
        if (field == 2) {
            if (!r.expect(field, wire, kLen, "normalizer_spec.precompiled_charsmap")) return false;
            if (!parse_string(r, m.vocab.precompiled_charsmap)) return false;
        } else if (field == 3) {
            if (!parse_bool(r, field, wire, "normalizer_spec.add_dummy_prefix", m.vocab.add_dummy_prefix)) return false;
        } else if (field == 4) {
            if (!parse_bool(r, field, wire, "normalizer_spec.remove_extra_whitespaces",
                            m.vocab.remove_extra_whitespaces))
                return false;
        } else if (field == 5) {
            if (!parse_bool(r, field, wire, "normalizer_spec.escape_whitespaces", m.escape_whitespaces)) return false;
        } else if (!r.skip(wire)) {
            return false;
        }
    }
    return true;
}

// ModelProto: 1 pieces (repeated), 2 trainer_spec, 3 normalizer_spec; the
// rest (self-test data, denormalizer_spec, extensions) is skipped.
Result<SpmModel> parse_model_proto(const uint8_t* data, size_t size, const std::string& label) {
    SpmModel m;
    ProtoReader r(data, size, 0);
    std::string why;
    const auto failed = [&](const ProtoReader& reader) {
        return bad_file(label, "not a sentencepiece model: " + (why.empty() ? reader.error() : why));
    };
    while (!r.done()) {
        uint32_t field;
        int wire;
        if (!r.tag(field, wire)) return failed(r);
        if (field >= 1 && field <= 3) {
            static const char* const kNames[] = {"", "pieces", "trainer_spec", "normalizer_spec"};
            if (!r.expect(field, wire, kLen, kNames[field])) return failed(r);
            const uint8_t* p;
            size_t n, at;
            if (!r.bytes(p, n, at)) return failed(r);
            ProtoReader sub(p, n, at);
            bool ok = true;
            if (field == 1) {
                if (m.vocab.pieces.size() >= kMaxPieces) {
                    return bad_file(label, "more than " + std::to_string(kMaxPieces) + " pieces");
                }
                UnigramPiece piece;
                ok = parse_piece(sub, piece, m.vocab.pieces.size(), why);
                m.vocab.pieces.push_back(std::move(piece));
            } else if (field == 2) {
                ok = parse_trainer_spec(sub, m);
            } else {
                ok = parse_normalizer_spec(sub, m);
            }
            if (!ok) return failed(sub);
        } else if (!r.skip(wire)) {
            return failed(r);
        }
    }
    return m;
}

}  // namespace

bool valid_piece_type(int64_t v) { return v >= 1 && v <= 6; }

Result<UnigramVocab> read_sentencepiece_model(const uint8_t* data, size_t size, const std::string& label) {
    if (size == 0) return bad_file(label, "empty file, not a sentencepiece model");
    auto parsed = parse_model_proto(data, size, label);
    if (!parsed.ok()) return parsed.error();
    SpmModel& m = parsed.value();
    if (m.model_type != 1) {
        static const char* const kTypes[] = {"", "UNIGRAM", "BPE", "WORD", "CHAR"};
        const std::string name = m.model_type >= 1 && m.model_type <= 4 ? kTypes[m.model_type] : "unknown";
        return bad_file(label, "a sentencepiece model of type " + std::to_string(m.model_type) + " (" + name +
                                   "), not UNIGRAM (1): kiln's T5 tokenizer reads unigram models only");
    }
    if (m.treat_whitespace_as_suffix)
        return bad_file(label, "trainer_spec.treat_whitespace_as_suffix is not supported");
    if (!m.escape_whitespaces) return bad_file(label, "normalizer_spec.escape_whitespaces = false is not supported");
    if (m.vocab.pieces.empty()) return bad_file(label, "the sentencepiece model has no pieces");
    bool has_bytes = false;
    for (const UnigramPiece& p : m.vocab.pieces) has_bytes = has_bytes || p.type == PieceType::Byte;
    if (has_bytes && !m.byte_fallback) {
        return bad_file(label, "byte pieces although trainer_spec.byte_fallback is false");
    }
    if (m.byte_fallback && !has_bytes)
        return bad_file(label, "trainer_spec.byte_fallback is true but there are no byte pieces");
    // The unknown piece is the one typed so; EOS and padding are found by
    // the names trainer_spec gives them, as sentencepiece does.
    const auto find = [&](const std::string& name) -> int32_t {
        for (size_t i = 0; i < m.vocab.pieces.size(); ++i) {
            if (m.vocab.pieces[i].text == name) return static_cast<int32_t>(i);
        }
        return -1;
    };
    const int32_t eos = find(m.eos_piece);
    const int32_t pad = find(m.pad_piece);
    m.vocab.eos_id = eos >= 0 && m.vocab.pieces[static_cast<size_t>(eos)].type == PieceType::Control ? eos : -1;
    m.vocab.pad_id = pad >= 0 && m.vocab.pieces[static_cast<size_t>(pad)].type == PieceType::Control ? pad : -1;
    return std::move(m.vocab);
}

}  // namespace kiln::text
