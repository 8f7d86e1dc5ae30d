#include "text/clip_tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "text/bpe_merges.h"
#include "text/byte_level.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "text/vocab_files.h"
#include "util/files.h"
#include "util/format.h"
#include "util/message_text.h"
namespace kiln::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Larger ids are rejected: they would only make id_to_token_ huge (the real
// vocabulary has 49408 entries).
constexpr int64_t kMaxVocabId = kMaxVocabSize - 1;
// open_clip and HF's slow CLIPTokenizer use this many merges of
// bpe_simple_vocab_16e6.txt: 49152 tokens minus bytes and the two specials.
constexpr size_t kClipMergeCount = 49152 - 256 - 2;
// Bound on the per-piece BPE cache; a long-running server sees unbounded
// distinct words.
constexpr size_t kMaxCacheEntries = 1 << 16;

// ---- text clean-up (ftfy + html.unescape subset) ----

struct Entity {
    const char* name;
    char32_t value;
    bool legacy;  // HTML5 also accepts it without ';' (Python's html.unescape does)
};

constexpr Entity kEntities[] = {
    {"amp", '&', true},        {"lt", '<', true},        {"gt", '>', true},         {"quot", '"', true},
    {"apos", '\'', false},     {"nbsp", 0xA0, true},     {"copy", 0xA9, true},      {"reg", 0xAE, true},
    {"deg", 0xB0, true},       {"times", 0xD7, true},    {"divide", 0xF7, true},    {"middot", 0xB7, true},
    {"laquo", 0xAB, true},     {"raquo", 0xBB, true},    {"cent", 0xA2, true},      {"pound", 0xA3, true},
    {"yen", 0xA5, true},       {"sect", 0xA7, true},     {"para", 0xB6, true},      {"shy", 0xAD, true},
    {"hellip", 0x2026, false}, {"mdash", 0x2014, false}, {"ndash", 0x2013, false},  {"lsquo", 0x2018, false},
    {"rsquo", 0x2019, false},  {"ldquo", 0x201C, false}, {"rdquo", 0x201D, false},  {"bull", 0x2022, false},
    {"euro", 0x20AC, false},   {"trade", 0x2122, false}, {"hearts", 0x2665, false}, {"larr", 0x2190, false},
    {"rarr", 0x2192, false},
};

// Python's html: numeric references 0x80..0x9F are read as windows-1252.
constexpr char32_t kCp1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                  0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                  0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                  0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};

bool is_hex(char32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

int hex_value(char32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    return static_cast<int>(c - 'A' + 10);
}

const Entity* find_entity(const std::u32string& s, size_t begin, size_t len) {
    for (const Entity& e : kEntities) {
        const size_t n = std::char_traits<char>::length(e.name);
        if (n != len) continue;
        bool same = true;
        for (size_t k = 0; k < n && same; ++k) same = s[begin + k] == static_cast<char32_t>(e.name[k]);
        if (same) return &e;
    }
    return nullptr;
}

// One pass of Python's html.unescape for the entities above and every
// numeric reference.
std::u32string html_unescape(const std::u32string& s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        if (s[i] != '&') {
            out.push_back(s[i++]);
            continue;
        }
        size_t j = i + 1;
        if (j < s.size() && s[j] == '#') {
            ++j;
            const bool hex = j < s.size() && (s[j] == 'x' || s[j] == 'X');
            if (hex) ++j;
            const size_t digits_begin = j;
            uint64_t value = 0;
            while (j < s.size() && (hex ? is_hex(s[j]) : (s[j] >= '0' && s[j] <= '9'))) {
                value =
                    std::min<uint64_t>(value * (hex ? 16 : 10) + static_cast<uint64_t>(hex_value(s[j])), 0x7FFFFFFF);
                ++j;
            }
            if (j == digits_begin) {  // "&#" or "&#x" without digits stays as it is
                out.push_back(s[i++]);
                continue;
            }
            if (j < s.size() && s[j] == ';') ++j;
            char32_t c;
            if (value == 0 || (value >= 0xD800 && value <= 0xDFFF) || value > 0x10FFFF) {
                c = kReplacementCodePoint;
            } else if (value >= 0x80 && value <= 0x9F) {
                c = kCp1252[value - 0x80];
            } else {
                c = static_cast<char32_t>(value);
            }
            out.push_back(c);
            i = j;
            continue;
        }
        // Named: up to 32 characters other than \t \n \f space < & # ;
        while (j < s.size() && j - (i + 1) < 32 && s[j] != '\t' && s[j] != '\n' && s[j] != '\f' && s[j] != ' ' &&
               s[j] != '<' && s[j] != '&' && s[j] != '#' && s[j] != ';') {
            ++j;
        }
        const size_t name_len = j - (i + 1);
        const bool semicolon = j < s.size() && s[j] == ';';
        const Entity* e = semicolon ? find_entity(s, i + 1, name_len) : nullptr;
        if (e) {
            out.push_back(e->value);
            i = j + 1;
            continue;
        }
        // Longest legacy entity that prefixes the name ("&ampx" -> "&x").
        bool replaced = false;
        for (size_t len = name_len; len >= 2 && !replaced; --len) {
            const Entity* p = find_entity(s, i + 1, len);
            if (p && p->legacy) {
                out.push_back(p->value);
                i = i + 1 + len;
                replaced = true;
            }
        }
        if (!replaced) out.push_back(s[i++]);
    }
    return out;
}

// ftfy's remove_control_chars set.
bool is_removed_control(char32_t c) {
    return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// ftfy's fix_latin_ligatures, fix_character_width and uncurl_quotes, and its
// control-character removal.
void ftfy_subset(const std::u32string& s, std::u32string& out) {
    out.clear();
    out.reserve(s.size());
    for (char32_t c : s) {
        if (is_removed_control(c)) continue;
        if (c >= 0xFF01 && c <= 0xFF5E) {
            out.push_back(c - 0xFEE0);
        } else if (c == 0x3000) {
            out.push_back(' ');
        } else if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) {
            out.push_back('\'');
        } else if (c >= 0x201C && c <= 0x201F) {
            out.push_back('"');
        } else if (c >= 0xFB00 && c <= 0xFB06) {
            static const char32_t* const kLigatures[] = {U"ff", U"fi", U"fl", U"ffi", U"ffl", U"\u017Ft", U"st"};
            out += kLigatures[c - 0xFB00];
        } else if (c == 0x132 || c == 0x133) {
            out += c == 0x132 ? U"IJ" : U"ij";
        } else if (c == 0x149) {  // ŉ -> ʼn, whose ʼ uncurl_quotes then straightens
            out += U"'n";
        } else if (c >= 0x1C4 && c <= 0x1CC) {
            static const char32_t* const kDigraphs[] = {U"D\u017D", U"D\u017E", U"d\u017E", U"LJ", U"Lj",
                                                        U"lj",      U"NJ",      U"Nj",      U"nj"};
            out += kDigraphs[c - 0x1C4];
        } else if (c >= 0x1F1 && c <= 0x1F3) {
            static const char32_t* const kDz[] = {U"DZ", U"Dz", U"dz"};
            out += kDz[c - 0x1F1];
        } else {
            out.push_back(c);
        }
    }
}

// whitespace_clean: runs of whitespace -> one space, ends trimmed.
std::u32string whitespace_clean(const std::u32string& s) {
    std::u32string out;
    out.reserve(s.size());
    bool pending_space = false;
    for (char32_t c : s) {
        if (is_space(c)) {
            pending_space = !out.empty();
            continue;
        }
        if (pending_space) out.push_back(' ');
        pending_space = false;
        out.push_back(c);
    }
    return out;
}

std::u32string clean_text(std::string_view text) {
    std::u32string s = html_unescape(html_unescape(utf8_to_u32(text)));
    std::u32string fixed;
    ftfy_subset(s, fixed);
    return whitespace_clean(fixed);
}

// Characters that continue an embedding name, so "style" does not match in
// "style_v2" or "my-style".
bool is_name_char(char32_t c) {
    const CharClass k = char_class(c);
    return k == CharClass::Letter || k == CharClass::Number || c == '_' || c == '-';
}

bool starts_with(const std::u32string& s, size_t pos, const std::u32string& prefix) {
    return !prefix.empty() && s.size() - pos >= prefix.size() && s.compare(pos, prefix.size(), prefix) == 0;
}

// {token: id} from a JSON object.
Result<std::unordered_map<std::string, int32_t>> vocab_from_json(const json& object, const std::string& where) {
    if (!object.is_object()) return Error{where + " is not a JSON object of token -> id"};
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(object.size());
    for (auto it = object.begin(); it != object.end(); ++it) {
        const json& id = it.value();
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxVocabId) {
            return Error{where + ": token '" + escaped(it.key()) + "' has id " + json_text(id) +
                         ", not an integer in [0, " + std::to_string(kMaxVocabId) + "]"};
        }
        vocab[it.key()] = static_cast<int32_t>(id.get<int64_t>());
    }
    return vocab;
}

}  // namespace

struct ClipTokenizer::Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

ClipTokenizer::ClipTokenizer() : cache_(std::make_unique<Cache>()) {}
ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

Result<ClipTokenizer> ClipTokenizer::build(std::unordered_map<std::string, int32_t> vocab,
                                           const std::vector<std::pair<std::string, std::string>>& merges,
                                           const std::string& label) {
    ClipTokenizer t;
    int32_t max_id = -1;
    for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
    t.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
    std::vector<bool> used(t.id_to_token_.size(), false);
    for (const auto& [token, id] : vocab) {
        if (used[id]) {
            // Report the pair in a stable order whatever the map's order.
            const std::string& other = t.id_to_token_[id];
            const std::string& a = std::min(token, other);
            const std::string& b = std::max(token, other);
            return Error{label + ": id " + std::to_string(id) + " is used by both '" + escaped(a) + "' and '" +
                         escaped(b) + "'"};
        }
        used[id] = true;
        t.id_to_token_[id] = token;
    }
    t.token_to_id_ = std::move(vocab);

    auto find_special = [&](const char* name, const char* alt) {
        int32_t id = t.token_id(name);
        return id >= 0 ? id : t.token_id(alt);
    };
    t.bos_id_ = find_special("<|startoftext|>", "<start_of_text>");
    t.eos_id_ = find_special("<|endoftext|>", "<end_of_text>");
    if (t.bos_id_ < 0) return Error{label + ": the vocabulary has no <|startoftext|> token"};
    if (t.eos_id_ < 0) return Error{label + ": the vocabulary has no <|endoftext|> token"};
    t.comma_id_ = t.token_id(",</w>");

    t.merge_ranks_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto& [a, b] = merges[rank];
        for (const std::string& symbol : {a, b, a + b}) {
            if (t.token_id(symbol) < 0) {
                return Error{label + ": merge " + std::to_string(rank) + " '" + escaped(a) + " " + escaped(b) +
                             "' uses '" + escaped(symbol) + "', which is not in the vocabulary"};
            }
        }
        // A repeated merge takes the later rank, as HF's dict(zip(...)) does.
        t.merge_ranks_[a + " " + b] = static_cast<int32_t>(rank);
    }
    t.next_embedding_id_ = t.vocab_size();
    return t;
}

Result<ClipTokenizer> ClipTokenizer::from_tokenizer_json(const std::string& path) {
    auto root = read_tokenizer_json(path);
    if (!root.ok()) return root.error();
    const json& doc = root.value();
    if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
        return Error{path + ": not a tokenizer.json (no \"model\" object)"};
    }
    const json& model = doc["model"];
    if (model.contains("type") && model["type"] != "BPE") {
        return Error{path + ": model.type is " + json_text(model["type"]) + ", expected \"BPE\""};
    }
    if (!model.contains("vocab")) return Error{path + ": no model.vocab"};
    auto vocab = vocab_from_json(model["vocab"], path + ": model.vocab");
    if (!vocab.ok()) return vocab.error();

    if (doc.contains("added_tokens")) {
        const json& added = doc["added_tokens"];
        if (!added.is_array()) return Error{path + ": added_tokens is not an array"};
        for (const json& entry : added) {
            if (!entry.is_object() || !entry.contains("id") || !entry.contains("content") ||
                !entry["id"].is_number_integer() || !entry["content"].is_string() || entry["id"].get<int64_t>() < 0 ||
                entry["id"].get<int64_t>() > kMaxVocabId) {
                return Error{path + ": added_tokens entry " + json_text(entry) +
                             " needs an integer id and a string content"};
            }
            // The vocabulary already holds CLIP's special tokens; only new ones are added.
            vocab->emplace(entry["content"].get<std::string>(), static_cast<int32_t>(entry["id"].get<int64_t>()));
        }
    }

    auto merges = tokenizer_json_merges(model, path);
    if (!merges.ok()) return merges.error();
    return build(std::move(vocab.value()), merges.value(), path);
}

Result<ClipTokenizer> ClipTokenizer::from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
    auto root = read_tokenizer_json(vocab_path);
    if (!root.ok()) return root.error();
    auto vocab = vocab_from_json(root.value(), vocab_path);
    if (!vocab.ok()) return vocab.error();
    auto text = read_tokenizer_file(merges_path);
    if (!text.ok()) return text.error();
    auto merges = parse_merges_text(text.value(), merges_path);
    if (!merges.ok()) return merges.error();
    return build(std::move(vocab.value()), merges.value(), vocab_path + " + " + merges_path);
}

Result<ClipTokenizer> ClipTokenizer::from_tokens_and_merges(std::vector<std::string> tokens,
                                                            const std::vector<std::string>& merges,
                                                            const std::string& label) {
    if (tokens.size() > static_cast<size_t>(kMaxVocabId) + 1) {
        return Error{label + ": " + std::to_string(tokens.size()) + " tokens is more than supported"};
    }
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) {
        if (tokens[id].empty()) continue;  // a hole in the id space
        auto [it, inserted] = vocab.emplace(std::move(tokens[id]), static_cast<int32_t>(id));
        if (!inserted) {
            return Error{label + ": token '" + escaped(it->first) + "' appears at ids " + std::to_string(it->second) +
                         " and " + std::to_string(id)};
        }
    }
    std::vector<std::pair<std::string, std::string>> pairs;
    pairs.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        std::pair<std::string, std::string> merge;
        if (!split_merge(merges[i], merge)) {
            return Error{label + ": merge " + std::to_string(i) + " '" + escaped(merges[i].substr(0, 80)) +
                         "' is not two space-separated symbols"};
        }
        pairs.push_back(std::move(merge));
    }
    return build(std::move(vocab), pairs, label);
}

Result<ClipTokenizer> ClipTokenizer::from_clip_merges(std::string_view merges_text, const std::string& label) {
    auto parsed = parse_merges_text(merges_text, label);
    if (!parsed.ok()) return parsed.error();
    auto& merges = parsed.value();
    if (merges.size() > kClipMergeCount) merges.resize(kClipMergeCount);

    const ByteMap& bm = byte_map();
    std::vector<std::string> tokens;
    tokens.reserve(512 + merges.size() + 2);
    for (uint8_t b : bm.order) tokens.push_back(bm.byte_to_utf8[b]);
    for (uint8_t b : bm.order) tokens.push_back(bm.byte_to_utf8[b] + "</w>");
    for (const auto& [a, b] : merges) tokens.push_back(a + b);
    tokens.emplace_back("<|startoftext|>");
    tokens.emplace_back("<|endoftext|>");
    // open_clip's encoder is dict(zip(vocab, ids)): a repeated token keeps
    // its last id.
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = static_cast<int32_t>(id);
    return build(std::move(vocab), merges, label);
}

Result<ClipTokenizer> ClipTokenizer::load(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (fs::is_directory(p, ec)) {
        for (const fs::path& dir : {p, p / "tokenizer"}) {
            if (fs::is_regular_file(dir / "vocab.json", ec) && fs::is_regular_file(dir / "merges.txt", ec)) {
                return from_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
            }
            if (fs::is_regular_file(dir / "tokenizer.json", ec))
                return from_tokenizer_json((dir / "tokenizer.json").string());
        }
        // Say what is there under those names (a FIFO, a folder, a loop), so
        // a vocab.json that is not a file is not reported as missing.
        std::string found;
        for (const fs::path& dir : {p, p / "tokenizer"}) {
            for (const char* name : {"vocab.json", "merges.txt", "tokenizer.json"}) {
                const PathStatus st = path_status((dir / name).string());
                if (st.kind == PathKind::Missing || st.kind == PathKind::File) continue;
                found += "; " + path_error((dir / name).string(), st).message;
            }
        }
        return Error{path + ": no tokenizer.json or vocab.json + merges.txt here or in tokenizer/" + found};
    }
    if (!fs::exists(p, ec)) return Error{path + ": no such file or folder"};
    const std::string name = p.filename().string();
    const std::string ext = p.extension().string();
    if (name == "vocab.json") return from_vocab_merges(path, (p.parent_path() / "merges.txt").string());
    if (ext == ".json") return from_tokenizer_json(path);
    if (ext == ".txt") {
        auto text = read_tokenizer_file(path);
        if (!text.ok()) return text.error();
        return from_clip_merges(text.value(), path);
    }
    return Error{path + ": not a tokenizer file (expected tokenizer.json, vocab.json, a merges .txt or a folder)"};
}

int32_t ClipTokenizer::token_id(const std::string& token) const {
    auto it = token_to_id_.find(token);
    return it == token_to_id_.end() ? -1 : it->second;
}

const std::string& ClipTokenizer::token_text(int32_t id) const {
    static const std::string kEmpty;
    if (id < 0 || id >= vocab_size()) return kEmpty;
    return id_to_token_[static_cast<size_t>(id)];
}

void ClipTokenizer::bpe(const std::string& piece, std::vector<int32_t>& out) const {
    {
        std::lock_guard<std::mutex> lock(cache_->mutex);
        auto it = cache_->pieces.find(piece);
        if (it != cache_->pieces.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const ByteMap& bm = byte_map();
    std::vector<std::string> word;
    word.reserve(piece.size());
    for (char ch : piece) word.push_back(bm.byte_to_utf8[static_cast<uint8_t>(ch)]);
    if (word.empty()) return;
    word.back() += "</w>";

    // HF's loop: merge every occurrence of the lowest-ranked adjacent pair
    // until no adjacent pair has a rank.
    std::vector<std::string> next;
    std::string key;
    while (word.size() > 1) {
        int32_t best_rank = std::numeric_limits<int32_t>::max();
        size_t best = 0;
        for (size_t i = 0; i + 1 < word.size(); ++i) {
            key.assign(word[i]).append(" ").append(word[i + 1]);
            auto it = merge_ranks_.find(key);
            if (it != merge_ranks_.end() && it->second < best_rank) {
                best_rank = it->second;
                best = i;
            }
        }
        if (best_rank == std::numeric_limits<int32_t>::max()) break;
        const std::string first = word[best];
        const std::string second = word[best + 1];
        next.clear();
        for (size_t i = 0; i < word.size();) {
            if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
                next.push_back(first + second);
                i += 2;
            } else {
                next.push_back(std::move(word[i]));
                i += 1;
            }
        }
        word.swap(next);
    }

    std::vector<int32_t> ids;
    ids.reserve(word.size());
    for (const std::string& symbol : word) {
        const int32_t id = token_id(symbol);
        ids.push_back(id >= 0 ? id : eos_id_);  // HF: unknown -> unk_token = <|endoftext|>
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->pieces.size() >= kMaxCacheEntries) cache_->pieces.clear();
    cache_->pieces.emplace(piece, std::move(ids));
}

void ClipTokenizer::encode_segment(const std::u32string& text, std::vector<int32_t>& out) const {
    static const std::u32string kContractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
    const std::u32string bos_text = utf8_to_u32(token_text(bos_id_));
    const std::u32string eos_text = utf8_to_u32(token_text(eos_id_));
    size_t i = 0;
    while (i < text.size()) {
        // The regex's alternatives in order, at each position.
        if (starts_with(text, i, bos_text)) {
            out.push_back(bos_id_);
            i += bos_text.size();
            continue;
        }
        if (starts_with(text, i, eos_text)) {
            out.push_back(eos_id_);
            i += eos_text.size();
            continue;
        }
        size_t end = i;
        for (const std::u32string& c : kContractions) {
            if (starts_with(text, i, c)) {
                end = i + c.size();
                break;
            }
        }
        if (end == i) {
            const CharClass k = char_class(text[i]);
            if (k == CharClass::Space) {
                ++i;
                continue;
            }
            end = i + 1;
            if (k == CharClass::Letter || k == CharClass::Other) {
                while (end < text.size() && char_class(text[end]) == k) ++end;
            }
        }
        bpe(u32_to_utf8(std::u32string_view(text).substr(i, end - i)), out);
        i = end;
    }
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
    const std::u32string cleaned = clean_text(text);
    std::vector<int32_t> out;
    // Cut out embedding words first: their names are case-sensitive.
    size_t segment_begin = 0;
    size_t i = 0;
    while (i < cleaned.size()) {
        const bool at_boundary = i == 0 || !is_name_char(cleaned[i - 1]);
        const EmbeddingToken* hit = nullptr;
        size_t hit_len = 0;
        if (at_boundary) {
            for (size_t e = 0; e < embeddings_.size(); ++e) {
                const std::u32string& name = embedding_names_u32_[e];
                if (name.size() <= hit_len || !starts_with(cleaned, i, name)) continue;
                const size_t after = i + name.size();
                if (after < cleaned.size() && is_name_char(cleaned[after])) continue;
                hit = &embeddings_[e];
                hit_len = name.size();
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        encode_segment(python_lower(cleaned, segment_begin, i), out);
        for (int32_t k = 0; k < hit->n_vectors; ++k) out.push_back(hit->first_id + k);
        i += hit_len;
        segment_begin = i;
    }
    encode_segment(python_lower(cleaned, segment_begin, cleaned.size()), out);
    return out;
}

std::string ClipTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string bytes;
    for (int32_t id : ids) {
        if (const EmbeddingToken* e = embedding_for_id(id)) {
            if (id == e->first_id) bytes += e->name + " ";
            continue;
        }
        append_token_bytes(token_text(id), bytes);
    }
    std::string text;
    const std::string kWordEnd = "</w>";
    const std::string valid = valid_utf8(bytes, Utf8Errors::ReplaceSubpart);
    for (size_t i = 0; i < valid.size();) {
        if (valid.compare(i, kWordEnd.size(), kWordEnd) == 0) {
            text.push_back(' ');
            i += kWordEnd.size();
        } else {
            text.push_back(valid[i++]);
        }
    }
    const size_t first = text.find_first_not_of(" \t\n\r\f\v");
    if (first == std::string::npos) return std::string();
    const size_t last = text.find_last_not_of(" \t\n\r\f\v");
    return text.substr(first, last - first + 1);
}

Result<int32_t> ClipTokenizer::add_embedding_token(const std::string& name, int n_vectors) {
    if (name.empty()) return Error{"embedding name is empty"};
    const std::u32string name32 = utf8_to_u32(name);
    if (is_space(name32.front()) || is_space(name32.back())) {
        return Error{"embedding name '" + name + "' starts or ends with whitespace"};
    }
    if (n_vectors < 1) {
        return Error{"embedding '" + name + "' has " + std::to_string(n_vectors) + " vectors, needs at least 1"};
    }
    for (const EmbeddingToken& e : embeddings_) {
        if (e.name == name) return Error{"embedding '" + name + "' is already registered"};
    }
    if (static_cast<int64_t>(next_embedding_id_) + n_vectors > std::numeric_limits<int32_t>::max()) {
        return Error{"embedding '" + name + "': token ids exhausted"};
    }
    const int32_t first = next_embedding_id_;
    embeddings_.push_back({name, first, n_vectors});
    embedding_names_u32_.push_back(name32);
    next_embedding_id_ += n_vectors;
    return first;
}

const EmbeddingToken* ClipTokenizer::embedding_for_id(int32_t id) const {
    if (id < vocab_size()) return nullptr;
    for (const EmbeddingToken& e : embeddings_) {
        if (id >= e.first_id && id < e.first_id + e.n_vectors) return &e;
    }
    return nullptr;
}

}  // namespace kiln::text
