#include "text/llm_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_map>

#include "gguf.h"
#include "io/gguf_file.h"
#include "io/mapped_file.h"
#include "io/model_file.h"
#include "text/bpe_merges.h"
#include "text/byte_level.h"
#include "text/letter_case.h"
#include "text/tekken_json.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "text/vocab_files.h"
#include "util/files.h"
#include "util/format.h"
#include "util/message_text.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;

// Bounds on what a file may ask for: far above any real tokenizer (Qwen's
// has 152k tokens and 151k merges in an 11 MiB tokenizer.json) and small
// enough that a hostile file cannot make kiln allocate without limit.
constexpr int64_t kMaxTokens = kMaxVocabSize;
constexpr size_t kMaxTokenBytes = 1 << 16;

// Qwen2's split pattern as tokenizer.json writes it.
constexpr std::string_view kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// Tekken's (Mistral's) split pattern as tokenizer.json writes it.
constexpr std::string_view kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool json_id(const json& v, int64_t& out) {
    if (!v.is_number_integer()) return false;
    out = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                                 : v.get<int64_t>();
    return out >= 0 && out < kMaxTokens;
}

// ---- pre-tokenisation ----

bool is_other(char32_t c) { return char_class(c) == CharClass::Other; }
bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }
char32_t ascii_lower(char32_t c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }

// Length of the contraction ('s 't 're 've 'm 'll 'd) at t[pos], 0 if none.
size_t contraction(const std::u32string& t, size_t pos, bool ignore_case) {
    const size_t n = t.size();
    if (t[pos] != '\'' || pos + 1 >= n) return 0;
    const auto fold = [&](char32_t c) { return ignore_case ? ascii_lower(c) : c; };
    const char32_t a = fold(t[pos + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= n) return 0;
    const char32_t b = fold(t[pos + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

// End of the whitespace alternatives at t[pos] (a space character):
// \s*[\r\n]+ (Qwen2 only), \s+(?!\S), \s+.
size_t whitespace_end(const std::u32string& t, size_t pos, bool newline_rule) {
    const size_t n = t.size();
    size_t end = pos;
    size_t after_newline = 0;
    while (end < n && is_space(t[end])) {
        if (is_newline(t[end])) after_newline = end + 1;
        ++end;
    }
    if (newline_rule && after_newline > 0) return after_newline;
    if (end - pos > 1 && end < n) return end - 1;  // leave the last space to the next word
    return end;
}

// Qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t qwen2_next(const std::u32string& t, size_t pos) {
    const size_t n = t.size();
    if (size_t len = contraction(t, pos, true)) return pos + len;
    const char32_t c = t[pos];
    if (!is_newline(c) && !is_number(c) && (is_letter(c) || (pos + 1 < n && is_letter(t[pos + 1])))) {
        size_t end = pos + 1;
        while (end < n && is_letter(t[end])) ++end;
        return end;
    }
    if (is_number(c)) return pos + 1;
    if (is_other(c) || (c == ' ' && pos + 1 < n && is_other(t[pos + 1]))) {
        size_t end = c == ' ' ? pos + 1 : pos;
        while (end < n && is_other(t[end])) ++end;
        while (end < n && is_newline(t[end])) ++end;
        return end;
    }
    return whitespace_end(t, pos, true);
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_next(const std::u32string& t, size_t pos) {
    const size_t n = t.size();
    if (size_t len = contraction(t, pos, false)) return pos + len;
    const char32_t c = t[pos];
    const size_t start = c == ' ' && pos + 1 < n ? pos + 1 : pos;
    const CharClass k = char_class(t[start]);
    if (k != CharClass::Space) {
        size_t end = start;
        while (end < n && char_class(t[end]) == k) ++end;
        return end;
    }
    return whitespace_end(t, pos, false);
}

// Tekken's two letter classes: U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (no
// lowercase) and W = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (no uppercase); modifier and
// other letters and marks are both.
bool tekken_upper(char32_t c) { return (is_letter(c) && !is_lowercase_letter(c)) || is_mark(c); }
bool tekken_lower(char32_t c) { return (is_letter(c) && !is_uppercase_letter(c)) || is_mark(c); }

// End of Tekken's words at `from` (after the optional prefix), 0 if none:
//   U*W+ (backtracking: the longest run of U whose remainder still starts a
//   run of W), else U+W*.
size_t tekken_word_end(const std::u32string& t, size_t from) {
    const size_t n = t.size();
    size_t upper_end = from;
    while (upper_end < n && tekken_upper(t[upper_end])) ++upper_end;
    // U*W+: W+ starts at the last place k <= upper_end whose character is
    // in W (the greedy U* gives back as little as it can) and runs on.
    for (size_t k = upper_end + 1; k-- > from;) {
        if (k < n && tekken_lower(t[k])) {
            size_t end = k + 1;
            while (end < n && tekken_lower(t[end])) ++end;
            return end;
        }
    }
    if (upper_end == from) return 0;
    // U+W*: what follows the U run is not in U, so W* takes only lowercase.
    size_t end = upper_end;
    while (end < n && tekken_lower(t[end])) ++end;
    return end;
}

// Tekken (Mistral):
//   [^\r\n\p{L}\p{N}]?U*W+|[^\r\n\p{L}\p{N}]?U+W*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// The first two alternatives are tried with the prefix, then without it
// (only a mark can be either), before the others.
size_t tekken_next(const std::u32string& t, size_t pos) {
    const size_t n = t.size();
    const char32_t c = t[pos];
    if (!is_newline(c) && !is_letter(c) && !is_number(c) && pos + 1 < n) {
        if (size_t end = tekken_word_end(t, pos + 1)) return end;
    }
    if (size_t end = tekken_word_end(t, pos)) return end;
    if (is_number(c)) return pos + 1;
    if (is_other(c) || (c == ' ' && pos + 1 < n && is_other(t[pos + 1]))) {
        size_t end = c == ' ' ? pos + 1 : pos;
        while (end < n && is_other(t[end])) ++end;
        while (end < n && (is_newline(t[end]) || t[end] == '/')) ++end;
        return end;
    }
    return whitespace_end(t, pos, true);
}

// End of the piece at t[pos] under `pre`'s pattern.
size_t next_piece(LlmPreTokenizer pre, const std::u32string& t, size_t pos) {
    switch (pre) {
        case LlmPreTokenizer::Qwen2: return qwen2_next(t, pos);
        case LlmPreTokenizer::Gpt2: return gpt2_next(t, pos);
        case LlmPreTokenizer::Tekken: return tekken_next(t, pos);
    }
    return t.size();
}

std::u32string_view view(const std::u32string& s, size_t begin, size_t end) {
    return std::u32string_view(s).substr(begin, end - begin);
}

// ---- GGUF metadata ----

// tokenizer.ggml.pre's name of a pattern, as llama.cpp's converter writes it.
const char* gguf_pre_name(LlmPreTokenizer pre) {
    switch (pre) {
        case LlmPreTokenizer::Qwen2: return "qwen2";
        case LlmPreTokenizer::Gpt2: return "gpt-2";
        case LlmPreTokenizer::Tekken: return "tekken";
    }
    return "";
}

bool looks_special(const std::string& token) {
    return token.size() > 4 && token.compare(0, 2, "<|") == 0 && token.compare(token.size() - 2, 2, "|>") == 0;
}

// {token: id} into vocab.tokens.
Status add_vocab_object(const json& object, const std::string& where, const std::string& label, LlmBpeVocab& vocab) {
    if (!object.is_object()) return bad_file(label, where + " is not a JSON object of token -> id");
    for (auto it = object.begin(); it != object.end(); ++it) {
        int64_t id = 0;
        if (!json_id(it.value(), id)) {
            return bad_file(label, where + ": token " + quoted_text(it.key()) + " has id " + json_text(it.value()) +
                                       ", not an integer in [0, " + std::to_string(kMaxTokens) + ")");
        }
        if (static_cast<size_t>(id) >= vocab.tokens.size()) vocab.tokens.resize(static_cast<size_t>(id) + 1);
        std::string& slot = vocab.tokens[static_cast<size_t>(id)];
        if (!slot.empty()) {
            const std::string& a = std::min(slot, it.key());
            const std::string& b = std::max(slot, it.key());
            return bad_file(label, where + ": id " + std::to_string(id) + " is used by both " + quoted_text(a) +
                                       " and " + quoted_text(b));
        }
        if (it.key().empty()) return bad_file(label, where + ": an empty token (id " + std::to_string(id) + ")");
        slot = it.key();
    }
    return Status::Ok();
}

// An added token at `id`: the slot must be free or hold the same text.
Status add_added_token(const std::string& content, int64_t id, const std::string& where, const std::string& label,
                       LlmBpeVocab& vocab) {
    if (content.empty()) return bad_file(label, where + ": added token " + std::to_string(id) + " is empty");
    if (static_cast<size_t>(id) >= vocab.tokens.size()) vocab.tokens.resize(static_cast<size_t>(id) + 1);
    std::string& slot = vocab.tokens[static_cast<size_t>(id)];
    if (!slot.empty() && slot != content) {
        return bad_file(label, where + ": added token " + quoted_text(content) + " has id " + std::to_string(id) +
                                   ", which the vocabulary gives to " + quoted_text(slot));
    }
    slot = content;
    vocab.added_ids.push_back(static_cast<int32_t>(id));
    return Status::Ok();
}

// The pre-tokenizer a tokenizer.json's pre_tokenizer describes.
Result<LlmPreTokenizer> json_pre_tokenizer(const json& doc, const std::string& path) {
    const json* pre = find_member(doc, "pre_tokenizer");
    if (!pre || pre->is_null()) return bad_file(path, "no pre_tokenizer: not a byte-level BPE tokenizer.json");
    std::vector<const json*> steps;
    if (const json* type = find_member(*pre, "type"); type && *type == "Sequence") {
        const json* list = find_member(*pre, "pretokenizers");
        if (!list || !list->is_array()) return bad_file(path, "pre_tokenizer Sequence without a pretokenizers array");
        for (const json& step : *list) steps.push_back(&step);
    } else {
        steps.push_back(pre);
    }
    std::optional<LlmPreTokenizer> split;
    bool byte_level = false;
    bool byte_level_regex = false;
    for (const json* step : steps) {
        const json* type = find_member(*step, "type");
        if (!type || !type->is_string())
            return bad_file(path, "pre_tokenizer step " + json_text(*step) + " has no type");
        if (*type == "Split") {
            const json* pattern = find_member(*step, "pattern");
            const json* regex = pattern ? find_member(*pattern, "Regex") : nullptr;
            const bool qwen2 = regex && regex->is_string() && regex->get_ref<const std::string&>() == kQwen2Pattern;
            const bool tekken = regex && regex->is_string() && regex->get_ref<const std::string&>() == kTekkenPattern;
            if (!qwen2 && !tekken) {
                return bad_file(path, "pre_tokenizer splits by " +
                                          (pattern ? json_text(*pattern) : std::string("nothing")) +
                                          ", neither Qwen2's nor Tekken's pattern (the Split patterns supported)");
            }
            split = qwen2 ? LlmPreTokenizer::Qwen2 : LlmPreTokenizer::Tekken;
            const json* behavior = find_member(*step, "behavior");
            if (behavior && *behavior != "Isolated") {
                return bad_file(path,
                                "pre_tokenizer Split has behavior " + json_text(*behavior) + ", not \"Isolated\"");
            }
            const json* invert = find_member(*step, "invert");
            if (invert && *invert != false) return bad_file(path, "pre_tokenizer Split is inverted");
        } else if (*type == "ByteLevel") {
            byte_level = true;
            const json* use_regex = find_member(*step, "use_regex");
            byte_level_regex = !use_regex || *use_regex != false;
            const json* prefix = find_member(*step, "add_prefix_space");
            if (prefix && *prefix != false) {
                return bad_file(path, "pre_tokenizer ByteLevel has add_prefix_space, which is not supported");
            }
        } else {
            return bad_file(path,
                            "pre_tokenizer " + json_text(*type) + " is not supported (expected Split and ByteLevel)");
        }
    }
    if (!byte_level) return bad_file(path, "pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");
    if (split && !byte_level_regex) return *split;
    if (!split && byte_level_regex) return LlmPreTokenizer::Gpt2;
    return bad_file(path, split ? "pre_tokenizer splits twice (its Split and ByteLevel's own regex)"
                                : "pre_tokenizer ByteLevel has use_regex false and nothing splits the text");
}

}  // namespace

std::string_view tekken_split_pattern() { return kTekkenPattern; }

// ---- the tables ----

struct LlmTokenizer::Tables {
    struct Merge {
        int32_t rank;
        int32_t id;
    };
    std::vector<std::string> id_to_token;
    std::unordered_map<std::string, int32_t> token_to_id;
    std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> rank, merged id
    std::array<int32_t, 256> byte_ids{};         // id of each byte's character, -1 if absent
    std::vector<uint8_t> added;                  // per id: an added token
    // Added tokens by first byte, longest first.
    std::array<std::vector<std::pair<std::string, int32_t>>, 256> added_by_byte;
    bool has_added = false;
    LlmPreTokenizer pre = LlmPreTokenizer::Qwen2;
    bool ignore_merges = false;

    const Merge* find_merge(int32_t a, int32_t b) const {
        auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
        return it == merges.end() ? nullptr : &it->second;
    }
};

LlmTokenizer::LlmTokenizer() = default;
LlmTokenizer::LlmTokenizer(LlmTokenizer&&) noexcept = default;
LlmTokenizer& LlmTokenizer::operator=(LlmTokenizer&&) noexcept = default;
LlmTokenizer::~LlmTokenizer() = default;

Result<LlmTokenizer> LlmTokenizer::from_vocab(LlmBpeVocab vocab, const std::string& label) {
    const size_t n = vocab.tokens.size();
    if (n > static_cast<size_t>(kMaxTokens)) {
        return bad_file(label, std::to_string(n) + " tokens, more than the " + std::to_string(kMaxTokens) +
                                   " a tokenizer may have");
    }
    auto t = std::make_unique<Tables>();
    t->pre = vocab.pre;
    t->ignore_merges = vocab.ignore_merges;
    t->token_to_id.reserve(n);
    for (size_t id = 0; id < n; ++id) {
        const std::string& token = vocab.tokens[id];
        if (token.empty()) continue;  // a hole in the id space
        if (token.size() > kMaxTokenBytes) {
            return bad_file(label, "token " + std::to_string(id) + " is " + std::to_string(token.size()) +
                                       " bytes long, more than " + std::to_string(kMaxTokenBytes));
        }
        auto [it, inserted] = t->token_to_id.emplace(token, static_cast<int32_t>(id));
        if (!inserted) {
            return bad_file(label, "token " + quoted_text(token) + " appears at ids " + std::to_string(it->second) +
                                       " and " + std::to_string(id));
        }
    }
    if (t->token_to_id.empty()) return bad_file(label, "the vocabulary is empty");
    t->id_to_token = std::move(vocab.tokens);

    t->added.assign(n, 0);
    for (int32_t id : vocab.added_ids) {
        if (id < 0 || static_cast<size_t>(id) >= n || t->id_to_token[static_cast<size_t>(id)].empty()) {
            return bad_file(label, "added token id " + std::to_string(id) + " is not the id of a token");
        }
        if (t->added[static_cast<size_t>(id)]) continue;
        t->added[static_cast<size_t>(id)] = 1;
        const std::string& text = t->id_to_token[static_cast<size_t>(id)];
        t->added_by_byte[static_cast<uint8_t>(text[0])].emplace_back(text, id);
        t->has_added = true;
    }
    for (auto& bucket : t->added_by_byte) {
        std::sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) {
            return a.first.size() != b.first.size() ? a.first.size() > b.first.size() : a.second < b.second;
        });
    }

    const ByteMap& bm = byte_map();
    for (int b = 0; b < 256; ++b) {
        auto it = t->token_to_id.find(bm.byte_to_utf8[b]);
        t->byte_ids[b] = it == t->token_to_id.end() ? -1 : it->second;
    }

    t->merges.reserve(vocab.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
        const auto& [a, b] = vocab.merges[rank];
        if (rank > static_cast<size_t>(std::numeric_limits<int32_t>::max() - 1)) {
            return bad_file(label, "more merges than supported");
        }
        joined.assign(a).append(b);
        int32_t ids[3];
        const std::string* symbols[3] = {&a, &b, &joined};
        for (int k = 0; k < 3; ++k) {
            auto it = t->token_to_id.find(*symbols[k]);
            if (it == t->token_to_id.end()) {
                return bad_file(label, "merge " + std::to_string(rank) + " " + quoted_text(a + " " + b) + " uses " +
                                           quoted_text(*symbols[k]) + ", which is not in the vocabulary");
            }
            ids[k] = it->second;
        }
        // The first of repeated merges counts (llama.cpp's emplace).
        t->merges.emplace((static_cast<uint64_t>(static_cast<uint32_t>(ids[0])) << 32) | static_cast<uint32_t>(ids[1]),
                          Tables::Merge{static_cast<int32_t>(rank), ids[2]});
    }

    LlmTokenizer tokenizer;
    tokenizer.tables_ = std::move(t);
    return tokenizer;
}

// ---- loaders ----

Result<LlmTokenizer> LlmTokenizer::from_tokenizer_json(const std::string& path) {
    auto root = read_tokenizer_json(path);
    if (!root.ok()) return root.error();
    const json& doc = root.value();
    const json* model = find_member(doc, "model");
    if (!model || !model->is_object()) return bad_file(path, "not a tokenizer.json (no \"model\" object)");
    const json* type = find_member(*model, "type");
    if (type && *type != "BPE") return bad_file(path, "model.type is " + json_text(*type) + ", expected \"BPE\"");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        const json* v = find_member(*model, key);
        if (v && !v->is_null() && *v != "") {
            return bad_file(path, std::string("model.") + key + " is " + json_text(*v) +
                                      ": not a byte-level BPE of the GPT-2 kind");
        }
    }
    if (const json* v = find_member(*model, "byte_fallback"); v && *v == true) {
        return bad_file(path, "model.byte_fallback is set: not a byte-level BPE of the GPT-2 kind");
    }
    if (const json* normalizer = find_member(doc, "normalizer"); normalizer && !normalizer->is_null()) {
        const json* ntype = find_member(*normalizer, "type");
        if (!ntype || *ntype != "NFC") {
            return bad_file(path, "normalizer " + json_text(*normalizer) + " is not supported (only NFC, or none)");
        }
    }
    auto pre = json_pre_tokenizer(doc, path);
    if (!pre.ok()) return pre.error();

    LlmBpeVocab vocab;
    vocab.pre = pre.value();
    if (const json* v = find_member(*model, "ignore_merges"); v && !v->is_null()) {
        if (!v->is_boolean()) return bad_file(path, "model.ignore_merges is " + json_text(*v) + ", not true or false");
        vocab.ignore_merges = v->get<bool>();
    }
    const json* vocab_json = find_member(*model, "vocab");
    if (!vocab_json) return bad_file(path, "no model.vocab");
    KILN_TRY(add_vocab_object(*vocab_json, "model.vocab", path, vocab));

    if (const json* added = find_member(doc, "added_tokens"); added && !added->is_null()) {
        if (!added->is_array()) return bad_file(path, "added_tokens is not an array");
        for (const json& entry : *added) {
            const json* id = find_member(entry, "id");
            const json* content = find_member(entry, "content");
            int64_t value = 0;
            if (!id || !content || !json_id(*id, value) || !content->is_string()) {
                return bad_file(path,
                                "added_tokens entry " + json_text(entry) + " needs an integer id and a string content");
            }
            KILN_TRY(add_added_token(content->get<std::string>(), value, "added_tokens", path, vocab));
        }
    }

    auto merges = tokenizer_json_merges(*model, path);
    if (!merges.ok()) return merges.error();
    vocab.merges = std::move(merges).value();
    return from_vocab(std::move(vocab), path);
}

Result<LlmTokenizer> LlmTokenizer::from_tekken_json(const std::string& path) {
    auto vocab = read_tekken_json(path);
    if (!vocab.ok()) return vocab.error();
    return from_vocab(std::move(vocab).value(), path);
}

Result<LlmTokenizer> LlmTokenizer::from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
    auto root = read_tokenizer_json(vocab_path);
    if (!root.ok()) return root.error();
    LlmBpeVocab vocab;
    KILN_TRY(add_vocab_object(root.value(), "the vocabulary", vocab_path, vocab));
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
        if (looks_special(vocab.tokens[id])) vocab.added_ids.push_back(static_cast<int32_t>(id));
    }

    const size_t slash = vocab_path.find_last_of('/');
    const std::string config_path =
        (slash == std::string::npos ? std::string() : vocab_path.substr(0, slash + 1)) + "tokenizer_config.json";
    if (path_status(config_path).kind == PathKind::File) {
        auto config = read_tokenizer_json(config_path);
        if (!config.ok()) return config.error();
        const json& c = config.value();
        if (!c.is_object()) return bad_file(config_path, "not a JSON object");
        if (const json* cls = find_member(c, "tokenizer_class"); cls && *cls == "GPT2Tokenizer") {
            vocab.pre = LlmPreTokenizer::Gpt2;
        }
        if (const json* decoder = find_member(c, "added_tokens_decoder"); decoder && !decoder->is_null()) {
            if (!decoder->is_object()) return bad_file(config_path, "added_tokens_decoder is not an object");
            for (auto it = decoder->begin(); it != decoder->end(); ++it) {
                int64_t id = -1;
                const std::string& key = it.key();
                if (!key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos) {
                    id = std::stoll(key);
                }
                const json* content = find_member(it.value(), "content");
                if (id < 0 || id >= kMaxTokens || !content || !content->is_string()) {
                    return bad_file(config_path, "added_tokens_decoder entry " + quoted_text(key) + ": " +
                                                     json_text(it.value()) + " needs an id key and a string content");
                }
                KILN_TRY(add_added_token(content->get<std::string>(), id, "added_tokens_decoder", config_path, vocab));
            }
        }
    }

    auto text = read_tokenizer_file(merges_path);
    if (!text.ok()) return text.error();
    auto merges = parse_merges_text(text.value(), merges_path);
    if (!merges.ok()) return merges.error();
    vocab.merges = std::move(merges).value();
    return from_vocab(std::move(vocab), vocab_path + " + " + merges_path);
}

Result<LlmTokenizer> LlmTokenizer::from_gguf_metadata(const io::Metadata& metadata, const std::string& label) {
    KILN_TRY(expect_gguf_tokenizer_model(metadata, "gpt2", "a byte-level BPE tokenizer", label));
    LlmBpeVocab vocab;
    const io::MetaValue* pre = find_meta(metadata, "tokenizer.ggml.pre");
    if (!pre || pre->kind != io::MetaValue::Kind::String) {
        return bad_file(label, "tokenizer.ggml.pre is missing or not a string: the pre-tokenizer is unknown");
    }
    if (pre->str == "qwen2" || pre->str == "deepseek-r1-qwen") {
        vocab.pre = LlmPreTokenizer::Qwen2;
    } else if (pre->str == "gpt-2") {
        vocab.pre = LlmPreTokenizer::Gpt2;
    } else if (pre->str == "tekken") {
        vocab.pre = LlmPreTokenizer::Tekken;
        vocab.ignore_merges = true;  // as llama.cpp reads a "tekken" vocabulary
    } else {
        return bad_file(label,
                        "tokenizer.ggml.pre is " + quoted_text(pre->str) +
                            ", a pre-tokenizer kiln does not know (supported: \"qwen2\", \"gpt-2\", \"tekken\")");
    }

    const io::MetaValue* tokens = find_meta(metadata, "tokenizer.ggml.tokens");
    if (!tokens || tokens->kind != io::MetaValue::Kind::Array) {
        return bad_file(label, "tokenizer.ggml.tokens is missing or not an array");
    }
    const size_t n = tokens->array.size();
    if (n > static_cast<size_t>(kMaxTokens)) {
        return bad_file(label, std::to_string(n) + " tokens, more than the " + std::to_string(kMaxTokens) +
                                   " a tokenizer may have");
    }
    const io::MetaValue* types = find_meta(metadata, "tokenizer.ggml.token_type");
    if (types && (types->kind != io::MetaValue::Kind::Array || types->array.size() != n)) {
        return bad_file(label,
                        "tokenizer.ggml.token_type is not an array of " + std::to_string(n) + " types (one per token)");
    }
    vocab.tokens.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const io::MetaValue& text = tokens->array[i];
        if (text.kind != io::MetaValue::Kind::String) {
            return bad_file(label, "tokenizer.ggml.tokens[" + std::to_string(i) + "] is not a string");
        }
        vocab.tokens[i] = text.str;
        bool added = false;
        if (types) {
            int64_t type = 0;
            if (!meta_integer(types->array[i], type) || type < 0 || type > 6) {
                return bad_file(label, "tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                                           types->array[i].to_string() + ", not a token type 0..6");
            }
            added = type == 3 || type == 4;  // CONTROL, USER_DEFINED
        } else {
            added = looks_special(text.str);
        }
        if (added) {
            if (text.str.empty()) {
                return bad_file(label, "tokenizer.ggml.tokens[" + std::to_string(i) + "] is an empty control token");
            }
            vocab.added_ids.push_back(static_cast<int32_t>(i));
        }
    }

    const io::MetaValue* merges = find_meta(metadata, "tokenizer.ggml.merges");
    if (!merges || merges->kind != io::MetaValue::Kind::Array) {
        return bad_file(label, "tokenizer.ggml.merges is missing or not an array");
    }
    vocab.merges.reserve(merges->array.size());
    for (size_t i = 0; i < merges->array.size(); ++i) {
        const io::MetaValue& m = merges->array[i];
        std::pair<std::string, std::string> merge;
        if (m.kind != io::MetaValue::Kind::String || !split_merge(m.str, merge)) {
            return bad_file(label, "tokenizer.ggml.merges[" + std::to_string(i) + "] " + quoted_text(m.to_string()) +
                                       " is not two space-separated symbols");
        }
        vocab.merges.push_back(std::move(merge));
    }
    return from_vocab(std::move(vocab), label);
}

Result<LlmTokenizer> LlmTokenizer::from_gguf_metadata(const io::ModelFile& file) {
    return from_gguf_metadata(file.metadata(), model_file_label(file));
}

Result<LlmTokenizer> LlmTokenizer::from_gguf_file(const std::string& path) {
    auto status = regular_file_status(path);
    if (!status.ok()) return status.error().as(ErrorKind::BadFile);
    auto map = io::MappedFile::open(path);
    if (!map.ok()) return map.error().as(ErrorKind::BadFile);
    const io::MappedFile& f = *map.value();
    if (!io::looks_like_gguf(f.data(), f.size())) return bad_file(path, "not a GGUF file (no GGUF magic)");
    auto parsed = io::parse_gguf(f.data(), f.size(), path);
    if (!parsed.ok()) return parsed.error().as(ErrorKind::BadFile);
    return from_gguf_metadata(parsed->metadata, path);
}

Result<LlmTokenizer> LlmTokenizer::load(const std::string& path) {
    const PathStatus status = path_status(path);
    if (status.kind == PathKind::Folder) {
        for (const std::string& dir : {path, path + "/tokenizer"}) {
            if (path_status(dir).kind != PathKind::Folder) continue;
            const std::string json_path = dir + "/tokenizer.json";
            if (path_status(json_path).kind == PathKind::File) return from_tokenizer_json(json_path);
            const std::string tekken_path = dir + "/tekken.json";
            if (path_status(tekken_path).kind == PathKind::File) return from_tekken_json(tekken_path);
            const std::string vocab_path = dir + "/vocab.json";
            const std::string merges_path = dir + "/merges.txt";
            if (path_status(vocab_path).kind == PathKind::File && path_status(merges_path).kind == PathKind::File) {
                return from_vocab_merges(vocab_path, merges_path);
            }
            auto entries = list_folder(dir);
            if (!entries.ok()) return entries.error().as(ErrorKind::BadFile);
            std::vector<std::string> ggufs;
            for (const FolderEntry& e : entries.value()) {
                if (e.status.kind == PathKind::File && e.name.size() > 5 &&
                    e.name.compare(e.name.size() - 5, 5, ".gguf") == 0) {
                    ggufs.push_back(e.path);
                }
            }
            if (ggufs.size() == 1) return from_gguf_file(ggufs.front());
            if (ggufs.size() > 1) {
                return bad_file(dir, "holds " + std::to_string(ggufs.size()) +
                                         " .gguf files and no tokenizer.json: name the one to read");
            }
        }
        return bad_file(path,
                        "no tokenizer.json, tekken.json, vocab.json + merges.txt or .gguf file here or in tokenizer/");
    }
    if (status.kind != PathKind::File) return path_error(path, status).as(ErrorKind::BadFile);
    const size_t slash = path.find_last_of('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    const auto ends_with = [&](std::string_view suffix) {
        return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (name == "vocab.json") return from_vocab_merges(path, path.substr(0, slash + 1) + "merges.txt");
    if (name == "tekken.json") return from_tekken_json(path);
    if (ends_with(".json")) return from_tokenizer_json(path);
    // Anything else must be GGUF; from_gguf_file checks the magic.
    return from_gguf_file(path);
}

// ---- encoding ----

std::vector<std::string> LlmTokenizer::pre_tokenize(std::string_view text) const {
    const std::u32string t = utf8_to_u32(text);
    std::vector<std::string> pieces;
    size_t pos = 0;
    while (pos < t.size()) {
        const size_t end = next_piece(tables_->pre, t, pos);
        pieces.push_back(u32_to_utf8(view(t, pos, end)));
        pos = end;
    }
    return pieces;
}

void LlmTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const Tables& t = *tables_;
    if (t.ignore_merges) {
        std::string whole;
        for (char byte : piece) whole += byte_map().byte_to_utf8[static_cast<uint8_t>(byte)];
        if (auto it = t.token_to_id.find(whole); it != t.token_to_id.end()) {
            out.push_back(it->second);
            return;
        }
    }
    constexpr int32_t kDead = -2;
    struct Symbol {
        int32_t id;  // -1: a byte outside the vocabulary (never merged, dropped)
        int32_t prev;
        int32_t next;
    };
    std::vector<Symbol> symbols(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) {
        symbols[i] = {t.byte_ids[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1,
                      i + 1 < piece.size() ? static_cast<int32_t>(i) + 1 : -1};
    }
    if (symbols.size() > 1) {
        struct Candidate {
            int32_t rank;
            int32_t left;
            int32_t left_id;
            int32_t right_id;
        };
        // Lowest rank first, then leftmost (HF's and llama.cpp's order).
        const auto later = [](const Candidate& a, const Candidate& b) {
            return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
        };
        std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
        const auto consider = [&](int32_t left) {
            if (left < 0) return;
            const int32_t right = symbols[static_cast<size_t>(left)].next;
            if (right < 0) return;
            const int32_t a = symbols[static_cast<size_t>(left)].id;
            const int32_t b = symbols[static_cast<size_t>(right)].id;
            if (a < 0 || b < 0) return;
            if (const Tables::Merge* m = t.find_merge(a, b)) queue.push({m->rank, left, a, b});
        };
        for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int32_t>(i));
        while (!queue.empty()) {
            const Candidate c = queue.top();
            queue.pop();
            Symbol& left = symbols[static_cast<size_t>(c.left)];
            if (left.id != c.left_id || left.next < 0) continue;  // stale
            Symbol& right = symbols[static_cast<size_t>(left.next)];
            if (right.id != c.right_id) continue;
            const Tables::Merge* m = t.find_merge(c.left_id, c.right_id);
            left.id = m->id;
            right.id = kDead;
            left.next = right.next;
            if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
            consider(left.prev);
            consider(c.left);
        }
    }
    for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
        if (symbols[static_cast<size_t>(i)].id >= 0) out.push_back(symbols[static_cast<size_t>(i)].id);
    }
}

void LlmTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    const std::u32string t = utf8_to_u32(text);
    std::string piece;
    size_t pos = 0;
    while (pos < t.size()) {
        const size_t end = next_piece(tables_->pre, t, pos);
        piece = u32_to_utf8(view(t, pos, end));
        bpe(piece, out);
        pos = end;
    }
}

std::vector<int32_t> LlmTokenizer::encode(std::string_view text) const {
    const Tables& t = *tables_;
    std::vector<int32_t> out;
    if (!t.has_added) {
        encode_plain(text, out);
        return out;
    }
    size_t segment = 0;
    size_t i = 0;
    while (i < text.size()) {
        const auto& bucket = t.added_by_byte[static_cast<uint8_t>(text[i])];
        const std::pair<std::string, int32_t>* hit = nullptr;
        for (const auto& candidate : bucket) {  // longest first
            if (text.compare(i, candidate.first.size(), candidate.first) == 0) {
                hit = &candidate;
                break;
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        encode_plain(text.substr(segment, i - segment), out);
        out.push_back(hit->second);
        i += hit->first.size();
        segment = i;
    }
    encode_plain(text.substr(segment), out);
    return out;
}

std::string LlmTokenizer::decode(const std::vector<int32_t>& ids) const {
    const Tables& t = *tables_;
    std::string bytes;
    for (int32_t id : ids) {
        if (id < 0 || id >= size()) continue;
        const std::string& text = t.id_to_token[static_cast<size_t>(id)];
        if (t.added[static_cast<size_t>(id)]) {
            bytes += text;
            continue;
        }
        append_token_bytes(text, bytes);
    }
    return valid_utf8(bytes, Utf8Errors::ReplaceSubpart);
}

int32_t LlmTokenizer::token_id(const std::string& token) const {
    auto it = tables_->token_to_id.find(token);
    return it == tables_->token_to_id.end() ? -1 : it->second;
}

const std::string& LlmTokenizer::token_text(int32_t id) const {
    static const std::string kEmpty;
    if (id < 0 || id >= size()) return kEmpty;
    return tables_->id_to_token[static_cast<size_t>(id)];
}

bool LlmTokenizer::is_added(int32_t id) const {
    return id >= 0 && id < size() && tables_->added[static_cast<size_t>(id)];
}

int32_t LlmTokenizer::size() const { return static_cast<int32_t>(tables_->id_to_token.size()); }

LlmPreTokenizer LlmTokenizer::pre_tokenizer() const { return tables_->pre; }

io::Metadata LlmTokenizer::gguf_metadata() const {
    const Tables& t = *tables_;
    std::vector<io::MetaValue> tokens, types;
    tokens.reserve(t.id_to_token.size());
    types.reserve(t.id_to_token.size());
    for (size_t id = 0; id < t.id_to_token.size(); ++id) {
        const std::string& text = t.id_to_token[id];
        // A hole gets llama.cpp's placeholder name, which no text can produce.
        tokens.push_back(io::MetaValue::of_string(text.empty() ? "[PAD" + std::to_string(id) + "]" : text));
        types.push_back(io::MetaValue::of_int(text.empty() ? 5 : t.added[id] ? 3 : 1));
    }
    // Merges by rank: the first of duplicates is the one that counts.
    std::vector<std::pair<int32_t, std::string>> ranked;
    ranked.reserve(t.merges.size());
    for (const auto& [pair, merge] : t.merges) {
        const auto left = static_cast<int32_t>(pair >> 32), right = static_cast<int32_t>(pair & 0xFFFFFFFFu);
        ranked.emplace_back(merge.rank,
                            t.id_to_token[static_cast<size_t>(left)] + " " + t.id_to_token[static_cast<size_t>(right)]);
    }
    std::sort(ranked.begin(), ranked.end());
    std::vector<io::MetaValue> merges;
    merges.reserve(ranked.size());
    for (auto& [rank, text] : ranked) merges.push_back(io::MetaValue::of_string(std::move(text)));
    io::Metadata m;
    m["tokenizer.ggml.model"] = io::MetaValue::of_string("gpt2").as_gguf(GGUF_TYPE_STRING);
    m["tokenizer.ggml.pre"] = io::MetaValue::of_string(gguf_pre_name(t.pre)).as_gguf(GGUF_TYPE_STRING);
    m["tokenizer.ggml.tokens"] = io::MetaValue::of_array(std::move(tokens), GGUF_TYPE_STRING);
    m["tokenizer.ggml.token_type"] = io::MetaValue::of_array(std::move(types), GGUF_TYPE_INT32);
    m["tokenizer.ggml.merges"] = io::MetaValue::of_array(std::move(merges), GGUF_TYPE_STRING);
    m["tokenizer.ggml.add_bos_token"] = io::MetaValue::of_bool(false).as_gguf(GGUF_TYPE_BOOL);
    return m;
}

}  // namespace kiln::text
