#include "text/t5_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "gguf.h"
#include "io/model_file.h"
#include "text/sentencepiece_model.h"
#include "text/utf8.h"
#include "text/vocab_files.h"
#include "util/base64.h"
#include "util/files.h"
#include "util/format.h"
#include "util/message_text.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 "▁"
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
// sentencepiece's penalty of an unknown character below the lowest score.
constexpr float kUnkPenalty = 10.0f;
// Bounds on what a file may ask for: far above any real tokenizer (T5 has
// 32k pieces, UMT5 256k, spiece.model files are a few MiB, tokenizer.json
// files tens of MiB) and small enough that a hostile file cannot make kiln
// allocate without limit.
constexpr size_t kMaxPieces = static_cast<size_t>(kMaxVocabSize);
constexpr size_t kMaxPieceBytes = 1 << 16;
// A charsmap replacement longer than this is refused: the normalised text
// can grow by this factor (nmt_nfkc's longest is U+FDFA's 33 bytes).
constexpr size_t kMaxReplacementBytes = 4096;

// ---- UTF-8 ----

// sentencepiece's OneCharLen: the length a lead byte announces (1 for a
// stray continuation byte).
size_t one_char_len(uint8_t lead) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[lead >> 4];
}

// "<0x41>" -> 0x41; -1 if `piece` is not a byte piece (upper-case hex, as
// sentencepiece writes them).
int byte_piece_value(std::string_view piece) {
    if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
    int v = 0;
    for (size_t i = 3; i < 5; ++i) {
        const char c = piece[i];
        if (c >= '0' && c <= '9') {
            v = v * 16 + (c - '0');
        } else if (c >= 'A' && c <= 'F') {
            v = v * 16 + (c - 'A' + 10);
        } else {
            return -1;
        }
    }
    return v;
}

const char* piece_type_name(PieceType type) {
    switch (type) {
        case PieceType::Normal: return "normal";
        case PieceType::Unknown: return "unknown";
        case PieceType::Control: return "control";
        case PieceType::UserDefined: return "user-defined";
        case PieceType::Unused: return "unused";
        case PieceType::Byte: return "byte";
    }
    return "?";
}

}  // namespace

// ---- the tables built from a vocabulary ----

struct T5Tokenizer::Tables {
    // A byte trie of the matchable pieces: each node's children are a
    // singly linked list (first child, next sibling); the root's children
    // are indexed by byte.
    struct Node {
        int32_t child = -1;
        int32_t sibling = -1;
        int32_t id = -1;  // the piece ending here, -1 if none
        uint8_t label = 0;
    };
    std::vector<Node> nodes;
    int32_t root[256];
    std::unordered_map<std::string, int32_t> piece_ids;  // every piece
    int32_t byte_ids[256];

    // The precompiled charsmap: Darts-clone double-array units and the
    // replacement strings they point into.
    std::vector<uint32_t> units;
    std::string replacements;

    Tables() {
        std::fill(std::begin(root), std::end(root), -1);
        std::fill(std::begin(byte_ids), std::end(byte_ids), -1);
    }

    void insert(std::string_view piece, int32_t id) {
        int32_t* link = &root[static_cast<uint8_t>(piece[0])];
        int32_t node = *link;
        if (node < 0) node = *link = new_node(static_cast<uint8_t>(piece[0]));
        for (size_t i = 1; i < piece.size(); ++i) {
            const uint8_t c = static_cast<uint8_t>(piece[i]);
            int32_t child = nodes[static_cast<size_t>(node)].child;
            while (child >= 0 && nodes[static_cast<size_t>(child)].label != c) {
                child = nodes[static_cast<size_t>(child)].sibling;
            }
            if (child < 0) {
                child = new_node(c);
                nodes[static_cast<size_t>(child)].sibling = nodes[static_cast<size_t>(node)].child;
                nodes[static_cast<size_t>(node)].child = child;
            }
            node = child;
        }
        nodes[static_cast<size_t>(node)].id = id;
    }

    int32_t new_node(uint8_t label) {
        Node n;
        n.label = label;
        nodes.push_back(n);
        return static_cast<int32_t>(nodes.size() - 1);
    }

    // Calls visit(length, id) for every piece that prefixes `text`, shortest
    // first.
    template <class Visit>
    void prefixes(std::string_view text, Visit visit) const {
        if (text.empty()) return;
        int32_t node = root[static_cast<uint8_t>(text[0])];
        size_t i = 1;
        while (node >= 0) {
            const Node& n = nodes[static_cast<size_t>(node)];
            if (n.id >= 0) visit(i, n.id);
            if (i >= text.size()) break;
            const uint8_t c = static_cast<uint8_t>(text[i]);
            int32_t child = n.child;
            while (child >= 0 && nodes[static_cast<size_t>(child)].label != c) {
                child = nodes[static_cast<size_t>(child)].sibling;
            }
            node = child;
            ++i;
        }
    }

    // Darts-clone's unit fields.
    static bool has_leaf(uint32_t unit) { return (unit >> 8) & 1; }
    static uint32_t value(uint32_t unit) { return unit & 0x7FFFFFFFu; }
    static uint32_t label(uint32_t unit) { return unit & 0x800000FFu; }
    static uint32_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }
    static bool is_leaf_unit(uint32_t unit) { return (unit >> 31) != 0; }

    // The replacement of the longest charsmap rule that prefixes `text` and
    // the rule's length; length 0 if none does. Darts-clone's
    // commonPrefixSearch with every index checked.
    std::pair<std::string_view, size_t> longest_rule(std::string_view text) const {
        std::pair<std::string_view, size_t> best{{}, 0};
        if (units.empty()) return best;
        size_t pos = offset(units[0]);
        for (size_t i = 0; i < text.size(); ++i) {
            const uint8_t c = static_cast<uint8_t>(text[i]);
            if (c == 0) break;  // keys never hold NUL
            pos ^= c;
            if (pos >= units.size()) break;
            const uint32_t unit = units[pos];
            if (label(unit) != c) break;
            pos ^= offset(unit);
            if (!has_leaf(unit)) continue;
            if (pos >= units.size()) break;
            const uint32_t leaf = units[pos];
            if (!is_leaf_unit(leaf)) continue;  // checked at load: every leaf points into `replacements`
            const char* s = replacements.data() + value(leaf);
            const size_t left = replacements.size() - value(leaf);
            const void* nul = std::memchr(s, '\0', left);
            best = {std::string_view(s, nul ? static_cast<size_t>(static_cast<const char*>(nul) - s) : left), i + 1};
        }
        return best;
    }
};

// ---- building ----

T5Tokenizer::T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;
T5Tokenizer::~T5Tokenizer() = default;

Result<T5Tokenizer> T5Tokenizer::from_vocab(UnigramVocab vocab, const std::string& label) {
    const auto& pieces = vocab.pieces;
    if (pieces.empty()) return bad_file(label, "the vocabulary is empty");
    if (pieces.size() > kMaxPieces) {
        return bad_file(label, std::to_string(pieces.size()) + " pieces, more than the " + std::to_string(kMaxPieces) +
                                   " a tokenizer may have");
    }
    auto tables = std::make_unique<Tables>();
    tables->piece_ids.reserve(pieces.size());
    T5Tokenizer t;
    t.min_score_ = FLT_MAX;  // sentencepiece's initial values
    t.max_score_ = FLT_MIN;
    size_t n_normal = 0, n_bytes = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const UnigramPiece& p = pieces[i];
        const int32_t id = static_cast<int32_t>(i);
        const std::string where = "piece " + std::to_string(i) + " " + quoted_text(p.text);
        if (p.text.empty()) return bad_file(label, "piece " + std::to_string(i) + " is empty");
        if (p.text.size() > kMaxPieceBytes) {
            return bad_file(label, "piece " + std::to_string(i) + " is " + std::to_string(p.text.size()) +
                                       " bytes long, more than " + std::to_string(kMaxPieceBytes));
        }
        if (!valid_piece_type(static_cast<int64_t>(p.type))) {
            return bad_file(label, where + " has type " + std::to_string(static_cast<int64_t>(p.type)));
        }
        if (!std::isfinite(p.score)) return bad_file(label, where + " has a score that is not a finite number");
        const auto [it, inserted] = tables->piece_ids.emplace(p.text, id);
        if (!inserted) return bad_file(label, where + " is also piece " + std::to_string(it->second));
        switch (p.type) {
            case PieceType::Normal:
                ++n_normal;
                t.min_score_ = std::min(t.min_score_, p.score);
                t.max_score_ = std::max(t.max_score_, p.score);
                tables->insert(p.text, id);
                break;
            case PieceType::UserDefined: tables->insert(p.text, id); break;
            case PieceType::Unknown:
                if (t.unk_id_ >= 0) {
                    return bad_file(label,
                                    where + " and piece " + std::to_string(t.unk_id_) + " are both unknown pieces");
                }
                t.unk_id_ = id;
                break;
            case PieceType::Byte: {
                const int b = byte_piece_value(p.text);
                if (b < 0) return bad_file(label, where + " is typed byte but is not of the form <0xXX>");
                if (tables->byte_ids[b] >= 0) {
                    return bad_file(label,
                                    where + " and piece " + std::to_string(tables->byte_ids[b]) + " are the same byte");
                }
                tables->byte_ids[b] = id;
                ++n_bytes;
                break;
            }
            case PieceType::Control:
            case PieceType::Unused: break;  // never matched in text
        }
    }
    if (n_normal == 0) return bad_file(label, "the vocabulary has no normal pieces, only special ones");
    if (t.unk_id_ < 0) return bad_file(label, "the vocabulary has no unknown piece (like T5's <unk>)");
    if (n_bytes != 0 && n_bytes != 256) {
        return bad_file(label, "byte fallback needs all 256 byte pieces <0x00>..<0xFF>; the vocabulary has " +
                                   std::to_string(n_bytes));
    }
    t.byte_fallback_ = n_bytes == 256;

    for (const auto& [id, what] : {std::pair<int32_t, const char*>{vocab.eos_id, "the end-of-sequence"},
                                   std::pair<int32_t, const char*>{vocab.pad_id, "the padding"}}) {
        if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= pieces.size())) {
            return bad_file(label, std::string(what) + " id " + std::to_string(id) + " is not one of the " +
                                       std::to_string(pieces.size()) + " pieces");
        }
    }
    t.eos_id_ = vocab.eos_id;
    t.pad_id_ = vocab.pad_id;

    const std::string& blob = vocab.precompiled_charsmap;
    if (!blob.empty()) {
        const std::string what = "precompiled charsmap (" + std::to_string(blob.size()) + " bytes): ";
        if (blob.size() < 4) return bad_file(label, what + "too short for its 4-byte header");
        uint32_t trie_bytes = 0;
        for (int k = 3; k >= 0; --k) trie_bytes = trie_bytes << 8 | static_cast<uint8_t>(blob[static_cast<size_t>(k)]);
        if (trie_bytes == 0 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4) {
            return bad_file(label,
                            what + "its trie of " + std::to_string(trie_bytes) +
                                " bytes is empty, not whole 4-byte units or longer than the data after the header");
        }
        tables->units.resize(trie_bytes / 4);
        for (size_t u = 0; u < tables->units.size(); ++u) {
            uint32_t v = 0;
            for (int k = 3; k >= 0; --k) v = v << 8 | static_cast<uint8_t>(blob[4 + 4 * u + static_cast<size_t>(k)]);
            tables->units[u] = v;
        }
        tables->replacements = blob.substr(4 + trie_bytes);
        const std::string& r = tables->replacements;
        for (uint32_t unit : tables->units) {
            if (!Tables::is_leaf_unit(unit)) continue;
            const size_t at = Tables::value(unit);
            if (at >= r.size()) {
                return bad_file(label, what + "a rule points to byte " + std::to_string(at) + " of " +
                                           std::to_string(r.size()) + " bytes of replacement text");
            }
            const void* nul = std::memchr(r.data() + at, '\0', r.size() - at);
            const size_t len =
                nul ? static_cast<size_t>(static_cast<const char*>(nul) - (r.data() + at)) : r.size() - at;
            if (len > kMaxReplacementBytes) {
                return bad_file(label, what + "a replacement of " + std::to_string(len) + " bytes (at most " +
                                           std::to_string(kMaxReplacementBytes) + ")");
            }
        }
    }
    t.vocab_ = std::move(vocab);
    t.tables_ = std::move(tables);
    return t;
}

// ---- normalisation ----

std::pair<std::string_view, size_t> T5Tokenizer::normalize_prefix(std::string_view text) const {
    const auto rule = tables_->longest_rule(text);
    if (rule.second > 0) return rule;
    const size_t n = utf8_char_length(text);
    if (n == 0) return {kReplacementChar, 1};
    return {text.substr(0, n), n};
}

std::string T5Tokenizer::normalize(std::string_view text) const {
    std::string out;
    const bool remove_spaces = vocab_.remove_extra_whitespaces;
    if (remove_spaces) {
        while (!text.empty()) {
            const auto [piece, consumed] = normalize_prefix(text);
            if (piece != " ") break;
            text.remove_prefix(consumed);
        }
    }
    if (text.empty()) return out;
    out.reserve(text.size() * 3);
    if (vocab_.add_dummy_prefix) out += kSpaceSymbol;
    // sentencepiece's loop: a replacement's leading spaces are dropped after
    // a space, so runs collapse across rules.
    bool prev_space = remove_spaces;
    while (!text.empty()) {
        auto [piece, consumed] = normalize_prefix(text);
        while (prev_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
        if (!piece.empty()) {
            for (char c : piece) {
                if (c == ' ') {
                    out += kSpaceSymbol;
                } else {
                    out.push_back(c);
                }
            }
            prev_space = piece.back() == ' ';
        }
        text.remove_prefix(consumed);
        if (!remove_spaces) prev_space = false;
    }
    if (remove_spaces) {
        while (out.size() >= kSpaceSymbol.size() &&
               out.compare(out.size() - kSpaceSymbol.size(), kSpaceSymbol.size(), kSpaceSymbol) == 0) {
            out.resize(out.size() - kSpaceSymbol.size());
        }
    }
    return out;
}

// ---- encoding ----

std::vector<int32_t> T5Tokenizer::encode(std::string_view text) const {
    const std::string norm = normalize(text);
    const size_t n = norm.size();
    std::vector<int32_t> out;
    if (n == 0) return out;

    // sentencepiece's EncodeOptimized: the best path ending at each byte
    // position, with its arithmetic (a piece's score and the path's sum in
    // double, stored as float), so near-ties resolve the same way.
    struct Best {
        float score = 0.0f;
        int64_t start = -1;
        int32_t id = -1;
    };
    std::vector<Best> best(n + 1);
    const float unk_score = min_score_ - kUnkPenalty;
    const std::vector<UnigramPiece>& pieces = vocab_.pieces;
    size_t start = 0;
    while (start < n) {
        const float base = best[start].score;
        const size_t char_len = std::min(one_char_len(static_cast<uint8_t>(norm[start])), n - start);
        bool has_single = false;
        tables_->prefixes(std::string_view(norm).substr(start), [&](size_t length, int32_t id) {
            const UnigramPiece& p = pieces[static_cast<size_t>(id)];
            const double score = p.type == PieceType::UserDefined
                                     ? static_cast<double>(static_cast<float>(length) * max_score_) - 0.1
                                     : static_cast<double>(p.score);
            const double candidate = score + static_cast<double>(base);
            Best& target = best[start + length];
            if (target.start < 0 || candidate > static_cast<double>(target.score)) {
                target.score = static_cast<float>(candidate);
                target.start = static_cast<int64_t>(start);
                target.id = id;
            }
            if (length == char_len) has_single = true;
        });
        if (!has_single) {
            Best& target = best[start + char_len];
            const float candidate = unk_score + base;
            if (target.start < 0 || candidate > target.score) {
                target.score = candidate;
                target.start = static_cast<int64_t>(start);
                target.id = unk_id_;
            }
        }
        start += char_len;
    }

    struct Span {
        size_t begin;
        size_t end;
        int32_t id;
    };
    std::vector<Span> path;
    for (size_t end = n; end > 0;) {
        const Best& b = best[end];
        const size_t begin = static_cast<size_t>(b.start);
        path.push_back({begin, end, b.id});
        end = begin;
    }
    std::reverse(path.begin(), path.end());

    out.reserve(path.size());
    bool prev_unk = false;
    for (const Span& s : path) {
        const bool unk = s.id == unk_id_;
        if (unk && byte_fallback_) {
            for (size_t i = s.begin; i < s.end; ++i) out.push_back(tables_->byte_ids[static_cast<uint8_t>(norm[i])]);
        } else if (!(unk && prev_unk)) {  // a run of unknown characters is one unknown piece
            out.push_back(s.id);
        }
        prev_unk = unk;
    }
    return out;
}

PaddedTokens T5Tokenizer::encode_padded(std::string_view text, int max_length, bool pad) const {
    PaddedTokens t;
    t.ids = encode(text);
    if (eos_id_ >= 0) t.ids.push_back(eos_id_);
    if (max_length > 0 && t.ids.size() > static_cast<size_t>(max_length)) {
        t.ids.resize(static_cast<size_t>(max_length));
        if (eos_id_ >= 0) t.ids.back() = eos_id_;
    }
    t.mask.assign(t.ids.size(), 1);
    if (pad && max_length > 0) {
        const int32_t filler = pad_id_ >= 0 ? pad_id_ : eos_id_;
        t.ids.resize(static_cast<size_t>(max_length), filler);
        t.mask.resize(static_cast<size_t>(max_length), 0);
    }
    return t;
}

// ---- decoding ----

std::string T5Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string text;
    std::string bytes;  // a run of byte pieces
    const auto flush_bytes = [&] {
        text += valid_utf8(bytes, Utf8Errors::ReplaceByte);  // as sentencepiece's decoder
        bytes.clear();
    };
    // sentencepiece strips the "▁" the normaliser put in front: with
    // remove_extra_whitespaces from every piece until text appears,
    // otherwise from the first piece only.
    bool strip_front = vocab_.add_dummy_prefix || vocab_.remove_extra_whitespaces;
    for (int32_t id : ids) {
        if (id < 0 || id >= size()) continue;
        const UnigramPiece& p = vocab_.pieces[static_cast<size_t>(id)];
        if (p.type == PieceType::Byte) {
            bytes.push_back(static_cast<char>(byte_piece_value(p.text)));
            continue;
        }
        flush_bytes();
        if (!text.empty()) strip_front = false;
        if (p.type == PieceType::Control) continue;
        if (p.type == PieceType::Unknown) {
            text += " \xE2\x81\x87 ";
            continue;
        }
        std::string_view piece = p.text;
        if (strip_front && piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
            piece.remove_prefix(kSpaceSymbol.size());
            if (!vocab_.remove_extra_whitespaces) strip_front = false;
        }
        for (size_t i = 0; i < piece.size();) {
            if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
                text.push_back(' ');
                i += kSpaceSymbol.size();
            } else {
                text.push_back(piece[i++]);
            }
        }
    }
    flush_bytes();
    return text;
}

int32_t T5Tokenizer::piece_id(std::string_view piece) const {
    auto it = tables_->piece_ids.find(std::string(piece));
    return it == tables_->piece_ids.end() ? -1 : it->second;
}

const std::string& T5Tokenizer::piece_text(int32_t id) const {
    static const std::string kEmpty;
    if (id < 0 || id >= size()) return kEmpty;
    return vocab_.pieces[static_cast<size_t>(id)].text;
}

// ---- spiece.model ----

Result<T5Tokenizer> T5Tokenizer::from_spiece_bytes(const uint8_t* data, size_t size, const std::string& label) {
    auto vocab = read_sentencepiece_model(data, size, label);
    if (!vocab.ok()) return vocab.error();
    return from_vocab(std::move(vocab).value(), label);
}

Result<T5Tokenizer> T5Tokenizer::from_spiece_model(const std::string& path) {
    auto bytes = read_tokenizer_file(path);
    if (!bytes.ok()) return bytes.error();
    return from_spiece_bytes(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), path);
}

// ---- tokenizer.json ----

namespace {

struct JsonSettings {
    std::string charsmap;
    bool collapse_spaces = false;  // Replace " {2,}" -> " " or WhitespaceSplit
    bool metaspace = false;
    bool add_prefix = true;
};

// object[key], or null when absent.
const json& member(const json& object, const char* key) {
    static const json kNull;
    const json* value = find_member(object, key);
    return value ? *value : kNull;
}

// Sequences nest; deeper than this is no real tokenizer (and recursion on a
// hostile file's nesting would overflow the stack).
constexpr int kMaxJsonNesting = 8;

Status read_normalizer(const json& n, const std::string& label, JsonSettings& s, int depth = 0) {
    if (n.is_null()) return Status::Ok();
    if (depth > kMaxJsonNesting)
        return bad_file(label, "normalizer Sequences nested deeper than " + std::to_string(kMaxJsonNesting));
    if (!n.is_object() || !n.contains("type") || !n["type"].is_string()) {
        return bad_file(label, "normalizer " + json_text(n) + " has no type");
    }
    const std::string type = n["type"].get<std::string>();
    if (type == "Sequence") {
        const json& list = member(n, "normalizers");
        if (!list.is_array()) return bad_file(label, "normalizer Sequence without a normalizers list");
        for (const json& item : list) KILN_TRY(read_normalizer(item, label, s, depth + 1));
        return Status::Ok();
    }
    if (type == "Precompiled") {
        const json& map = member(n, "precompiled_charsmap");
        if (map.is_null()) return Status::Ok();
        const auto bytes =
            map.is_string() ? base64_decode(map.get_ref<const std::string&>(), Base64Input::Strict) : std::nullopt;
        if (!bytes) return bad_file(label, "normalizer Precompiled: precompiled_charsmap is not base64 text");
        s.charsmap.assign(bytes->begin(), bytes->end());
        return Status::Ok();
    }
    if (type == "Replace") {
        // T5's: runs of spaces become one, which remove_extra_whitespaces does.
        const json& pattern = member(n, "pattern");
        const bool runs = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"] == " {2,}";
        if (runs && n.contains("content") && n["content"] == " ") {
            s.collapse_spaces = true;
            return Status::Ok();
        }
        return bad_file(label, "normalizer Replace " + json_text(n) +
                                   " is not supported (only T5's Replace of \" {2,}\" by \" \")");
    }
    if (type == "Strip") return Status::Ok();  // ends are trimmed with remove_extra_whitespaces anyway
    return bad_file(label, "normalizer " + quoted_text(type) +
                               " is not supported (a SentencePiece unigram tokenizer has Precompiled and Replace)");
}

Status read_pre_tokenizer(const json& p, const std::string& label, JsonSettings& s, int depth = 0) {
    if (p.is_null()) return Status::Ok();
    if (depth > kMaxJsonNesting) {
        return bad_file(label, "pre_tokenizer Sequences nested deeper than " + std::to_string(kMaxJsonNesting));
    }
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
        return bad_file(label, "pre_tokenizer " + json_text(p) + " has no type");
    }
    const std::string type = p["type"].get<std::string>();
    if (type == "Sequence") {
        const json& list = member(p, "pretokenizers");
        if (!list.is_array()) return bad_file(label, "pre_tokenizer Sequence without a pretokenizers list");
        for (const json& item : list) KILN_TRY(read_pre_tokenizer(item, label, s, depth + 1));
        return Status::Ok();
    }
    if (type == "WhitespaceSplit") {
        s.collapse_spaces = true;
        return Status::Ok();
    }
    if (type == "Metaspace") {
        const json& replacement = member(p, "replacement");
        if (replacement != std::string(kSpaceSymbol)) {
            return bad_file(label, "pre_tokenizer Metaspace replaces spaces by " + json_text(replacement) +
                                       ", only \"\xE2\x96\x81\" is supported");
        }
        s.metaspace = true;
        if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string()) {
            s.add_prefix = p["prepend_scheme"] != "never";
        } else if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean()) {
            s.add_prefix = p["add_prefix_space"].get<bool>();
        }
        return Status::Ok();
    }
    return bad_file(label, "pre_tokenizer " + quoted_text(type) +
                               " is not supported (a SentencePiece unigram tokenizer has Metaspace)");
}

Result<UnigramVocab> vocab_from_tokenizer_json(const json& root, const std::string& label) {
    if (!root.is_object()) return bad_file(label, "not a tokenizer.json (the top level is not a JSON object)");
    if (!root.contains("model") || !root["model"].is_object())
        return bad_file(label, "not a tokenizer.json (no model)");
    const json& model = root["model"];
    if (!model.contains("type") || !model["type"].is_string()) {
        return bad_file(label,
                        "model has no type; expected \"Unigram\" (a SentencePiece unigram tokenizer such as T5's)");
    }
    const std::string type = model["type"].get<std::string>();
    if (type != "Unigram") {
        return bad_file(label, "model.type is " + quoted_text(type) +
                                   ", not \"Unigram\": this is not a SentencePiece unigram tokenizer such as T5's" +
                                   (type == "BPE" ? " (a BPE one, such as CLIP's)" : ""));
    }
    if (!model.contains("vocab") || !model["vocab"].is_array()) {
        return bad_file(label, "model.vocab is not a list of [piece, score] pairs");
    }
    UnigramVocab vocab;
    const json& list = model["vocab"];
    if (list.empty()) return bad_file(label, "model.vocab is empty");
    if (list.size() > kMaxPieces)
        return bad_file(label, "model.vocab has more than " + std::to_string(kMaxPieces) + " pieces");
    vocab.pieces.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
        const json& e = list[i];
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number()) {
            return bad_file(
                label, "model.vocab[" + std::to_string(i) + "] is " + json_text(e) + ", not a [piece, score] pair");
        }
        UnigramPiece p;
        p.text = e[0].get<std::string>();
        p.score = static_cast<float>(e[1].get<double>());
        vocab.pieces.push_back(std::move(p));
    }
    const size_t n = vocab.pieces.size();
    const json& unk = member(model, "unk_id");
    if (!unk.is_number_integer() || unk.get<int64_t>() < 0 || static_cast<uint64_t>(unk.get<int64_t>()) >= n) {
        return bad_file(label, "model.unk_id is " + json_text(unk) + ", not the id of one of the " + std::to_string(n) +
                                   " pieces (a unigram tokenizer needs an unknown piece)");
    }
    const size_t unk_id = static_cast<size_t>(unk.get<int64_t>());
    vocab.pieces[unk_id].type = PieceType::Unknown;

    const bool byte_fallback =
        model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>();
    if (byte_fallback) {
        for (UnigramPiece& p : vocab.pieces) {
            if (p.type == PieceType::Normal && byte_piece_value(p.text) >= 0) p.type = PieceType::Byte;
        }
    }

    // Added tokens: HF matches them before the model runs; special ones are
    // sentencepiece's control pieces, the others its user-defined ones.
    const json& added = member(root, "added_tokens");
    if (!added.is_array() && !added.is_null()) return bad_file(label, "added_tokens is not a list");
    if (added.is_array()) {
        for (const json& a : added) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
                !a["content"].is_string()) {
                return bad_file(label, "added token " + json_text(a) + " has no integer id and content");
            }
            const int64_t id = a["id"].get<int64_t>();
            const std::string& content = a["content"].get_ref<const std::string&>();
            if (id < 0 || static_cast<uint64_t>(id) >= n || vocab.pieces[static_cast<size_t>(id)].text != content) {
                return bad_file(label, "added token " + quoted_text(content) + " (id " + std::to_string(id) +
                                           ") is not that entry of model.vocab");
            }
            UnigramPiece& p = vocab.pieces[static_cast<size_t>(id)];
            if (p.type == PieceType::Unknown) continue;
            const bool is_special = a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
            p.type = is_special ? PieceType::Control : PieceType::UserDefined;
        }
    }

    JsonSettings s;
    KILN_TRY(read_normalizer(member(root, "normalizer"), label, s));
    KILN_TRY(read_pre_tokenizer(member(root, "pre_tokenizer"), label, s));
    if (!s.metaspace) {
        return bad_file(label,
                        "no Metaspace pre-tokenizer: spaces would not become \"\xE2\x96\x81\" as a SentencePiece "
                        "unigram tokenizer needs");
    }
    vocab.precompiled_charsmap = std::move(s.charsmap);
    vocab.add_dummy_prefix = s.add_prefix;
    vocab.remove_extra_whitespaces = s.collapse_spaces;
    // EOS and padding: the special pieces named so (sentencepiece's rule).
    for (const char* name : {"</s>", "<pad>"}) {
        for (size_t i = 0; i < n; ++i) {
            if (vocab.pieces[i].text != name || vocab.pieces[i].type != PieceType::Control) continue;
            (name[1] == '/' ? vocab.eos_id : vocab.pad_id) = static_cast<int32_t>(i);
        }
    }
    return vocab;
}

}  // namespace

Result<T5Tokenizer> T5Tokenizer::from_tokenizer_json(const std::string& path) {
    auto parsed = read_tokenizer_json(path);
    if (!parsed.ok()) return parsed.error();
    const json& root = parsed.value();
    Result<UnigramVocab> vocab = Error{};
    try {
        vocab = vocab_from_tokenizer_json(root, path);
    } catch (const json::exception& e) {  // a value of an unexpected type the checks above missed
        return bad_file(path, std::string("unexpected JSON: ") + e.what());
    }
    if (!vocab.ok()) return vocab.error();
    return from_vocab(std::move(vocab).value(), path);
}

// ---- GGUF metadata ----

Result<T5Tokenizer> T5Tokenizer::from_gguf_metadata(const io::Metadata& metadata, const std::string& label) {
    KILN_TRY(expect_gguf_tokenizer_model(metadata, "t5", "a SentencePiece unigram tokenizer", label));
    const io::MetaValue* tokens = find_meta(metadata, "tokenizer.ggml.tokens");
    if (!tokens || tokens->kind != io::MetaValue::Kind::Array) {
        return bad_file(label, "tokenizer.ggml.tokens is missing or not an array");
    }
    const size_t n = tokens->array.size();
    const io::MetaValue* scores = find_meta(metadata, "tokenizer.ggml.scores");
    if (!scores || scores->kind != io::MetaValue::Kind::Array || scores->array.size() != n) {
        return bad_file(label, "tokenizer.ggml.scores is missing or not an array of " + std::to_string(n) +
                                   " scores (one per token)");
    }
    const io::MetaValue* types = find_meta(metadata, "tokenizer.ggml.token_type");
    if (types && (types->kind != io::MetaValue::Kind::Array || types->array.size() != n)) {
        return bad_file(label, "tokenizer.ggml.token_type is not an array of " + std::to_string(n) + " types");
    }
    UnigramVocab vocab;
    vocab.pieces.resize(n);
    for (size_t i = 0; i < n; ++i) {
        UnigramPiece& p = vocab.pieces[i];
        const io::MetaValue& text = tokens->array[i];
        if (text.kind != io::MetaValue::Kind::String) {
            return bad_file(label, "tokenizer.ggml.tokens[" + std::to_string(i) + "] is not a string");
        }
        p.text = text.str;
        double score = 0;
        if (!meta_number(scores->array[i], score)) {
            return bad_file(label, "tokenizer.ggml.scores[" + std::to_string(i) + "] is not a number");
        }
        p.score = static_cast<float>(score);
        if (types) {
            int64_t t = 0;
            if (!meta_integer(types->array[i], t) || (t != 0 && !valid_piece_type(t))) {
                return bad_file(label, "tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                                           types->array[i].to_string() + ", not a token type 0..6");
            }
            p.type = t == 0 ? PieceType::Normal : static_cast<PieceType>(t);
        }
    }
    // The special ids; without token types they also say which pieces are
    // unknown and control.
    const auto id_of = [&](const char* key, int32_t& out) -> Status {
        out = -1;
        const io::MetaValue* v = find_meta(metadata, key);
        if (!v) return Status::Ok();
        int64_t id = 0;
        if (!meta_integer(*v, id) || id < 0 || static_cast<uint64_t>(id) >= n) {
            return bad_file(label, std::string(key) + " is " + v->to_string() + ", not the id of one of the " +
                                       std::to_string(n) + " tokens");
        }
        out = static_cast<int32_t>(id);
        return Status::Ok();
    };
    int32_t unk = -1;
    KILN_TRY(id_of("tokenizer.ggml.unknown_token_id", unk));
    KILN_TRY(id_of("tokenizer.ggml.eos_token_id", vocab.eos_id));
    KILN_TRY(id_of("tokenizer.ggml.padding_token_id", vocab.pad_id));
    if (!types) {
        if (unk >= 0) vocab.pieces[static_cast<size_t>(unk)].type = PieceType::Unknown;
        for (int32_t id : {vocab.eos_id, vocab.pad_id}) {
            if (id >= 0 && id != unk) vocab.pieces[static_cast<size_t>(id)].type = PieceType::Control;
        }
    } else if (unk >= 0 && vocab.pieces[static_cast<size_t>(unk)].type != PieceType::Unknown) {
        return bad_file(label, "tokenizer.ggml.unknown_token_id is " + std::to_string(unk) +
                                   " but that token is typed " +
                                   piece_type_name(vocab.pieces[static_cast<size_t>(unk)].type));
    }

    if (const io::MetaValue* map = find_meta(metadata, "tokenizer.ggml.precompiled_charsmap")) {
        if (map->kind != io::MetaValue::Kind::Array) {
            return bad_file(label, "tokenizer.ggml.precompiled_charsmap is not an array of bytes");
        }
        vocab.precompiled_charsmap.reserve(map->array.size());
        for (const io::MetaValue& b : map->array) {
            int64_t v = 0;
            if (!meta_integer(b, v) || v < -128 || v > 255) {
                return bad_file(label, "tokenizer.ggml.precompiled_charsmap holds " + b.to_string() + ", not a byte");
            }
            vocab.precompiled_charsmap.push_back(static_cast<char>(static_cast<uint8_t>(v & 0xFF)));
        }
    }
    for (const auto& [key, flag] :
         {std::pair<const char*, bool*>{"tokenizer.ggml.add_space_prefix", &vocab.add_dummy_prefix},
          std::pair<const char*, bool*>{"tokenizer.ggml.remove_extra_whitespaces", &vocab.remove_extra_whitespaces}}) {
        const io::MetaValue* v = find_meta(metadata, key);
        if (!v) continue;
        if (v->kind != io::MetaValue::Kind::Bool) return bad_file(label, std::string(key) + " is not a boolean");
        *flag = v->b;
    }
    return from_vocab(std::move(vocab), label);
}

Result<T5Tokenizer> T5Tokenizer::from_gguf_metadata(const io::ModelFile& file) {
    return from_gguf_metadata(file.metadata(), model_file_label(file));
}

io::Metadata T5Tokenizer::gguf_metadata() const {
    io::Metadata m;
    std::vector<io::MetaValue> tokens, scores, types;
    tokens.reserve(vocab_.pieces.size());
    scores.reserve(vocab_.pieces.size());
    types.reserve(vocab_.pieces.size());
    for (const UnigramPiece& p : vocab_.pieces) {
        tokens.push_back(io::MetaValue::of_string(p.text));
        scores.push_back(io::MetaValue::of_float(p.score));
        types.push_back(io::MetaValue::of_int(static_cast<int32_t>(p.type)));
    }
    m["tokenizer.ggml.model"] = io::MetaValue::of_string("t5").as_gguf(GGUF_TYPE_STRING);
    m["tokenizer.ggml.tokens"] = io::MetaValue::of_array(std::move(tokens), GGUF_TYPE_STRING);
    m["tokenizer.ggml.scores"] = io::MetaValue::of_array(std::move(scores), GGUF_TYPE_FLOAT32);
    m["tokenizer.ggml.token_type"] = io::MetaValue::of_array(std::move(types), GGUF_TYPE_INT32);
    m["tokenizer.ggml.unknown_token_id"] =
        io::MetaValue::of_uint(static_cast<uint64_t>(unk_id_)).as_gguf(GGUF_TYPE_UINT32);
    if (eos_id_ >= 0) {
        m["tokenizer.ggml.eos_token_id"] =
            io::MetaValue::of_uint(static_cast<uint64_t>(eos_id_)).as_gguf(GGUF_TYPE_UINT32);
    }
    if (pad_id_ >= 0) {
        m["tokenizer.ggml.padding_token_id"] =
            io::MetaValue::of_uint(static_cast<uint64_t>(pad_id_)).as_gguf(GGUF_TYPE_UINT32);
    }
    m["tokenizer.ggml.add_space_prefix"] = io::MetaValue::of_bool(vocab_.add_dummy_prefix).as_gguf(GGUF_TYPE_BOOL);
    m["tokenizer.ggml.remove_extra_whitespaces"] =
        io::MetaValue::of_bool(vocab_.remove_extra_whitespaces).as_gguf(GGUF_TYPE_BOOL);
    // T5 appends EOS and no BOS (llama.cpp's converter writes the same).
    m["tokenizer.ggml.add_bos_token"] = io::MetaValue::of_bool(false).as_gguf(GGUF_TYPE_BOOL);
    m["tokenizer.ggml.add_eos_token"] = io::MetaValue::of_bool(true).as_gguf(GGUF_TYPE_BOOL);
    if (!vocab_.precompiled_charsmap.empty()) {
        std::vector<io::MetaValue> bytes;
        bytes.reserve(vocab_.precompiled_charsmap.size());
        for (char c : vocab_.precompiled_charsmap) bytes.push_back(io::MetaValue::of_uint(static_cast<uint8_t>(c)));
        m["tokenizer.ggml.precompiled_charsmap"] = io::MetaValue::of_array(std::move(bytes), GGUF_TYPE_UINT8);
    }
    return m;
}

// ---- finding the files ----

Result<T5Tokenizer> T5Tokenizer::load(const std::string& path) {
    const PathStatus status = path_status(path);
    if (status.kind == PathKind::Folder) {
        for (const std::string& dir : {path, path + "/tokenizer_2", path + "/tokenizer"}) {
            const std::string spiece = dir + "/spiece.model";
            if (path_status(spiece).kind == PathKind::File) return from_spiece_model(spiece);
            const std::string json_path = dir + "/tokenizer.json";
            if (path_status(json_path).kind == PathKind::File) return from_tokenizer_json(json_path);
        }
        return bad_file(path, "no spiece.model or tokenizer.json here or in tokenizer_2/ or tokenizer/");
    }
    if (status.kind != PathKind::File) return path_error(path, status).as(ErrorKind::BadFile);
    const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    return is_json ? from_tokenizer_json(path) : from_spiece_model(path);
}

}  // namespace kiln::text
