#include "text/tekken_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/vocab_files.h"
#include "util/base64.h"
#include "util/message_text.h"

namespace kiln::text {
namespace {

using json = nlohmann::json;

Result<int64_t> integer_field(const json& object, const char* key, const std::string& where, const std::string& path) {
    const json* v = find_member(object, key);
    if (!v || !v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() >= kMaxVocabSize) {
        return bad_file(path, where + "." + key + " is " + (v ? json_text(*v) : std::string("missing")) +
                                  ", not an integer in [0, " + std::to_string(kMaxVocabSize) + ")");
    }
    return v->get<int64_t>();
}

}  // namespace

Result<LlmBpeVocab> read_tekken_json(const std::string& path) {
    auto root = read_tokenizer_json(path);
    if (!root.ok()) return root.error();
    const json& doc = root.value();
    const json* config = find_member(doc, "config");
    if (!config || !config->is_object()) return bad_file(path, "no \"config\" object: not a tekken.json");
    const json* pattern = find_member(*config, "pattern");
    if (!pattern || !pattern->is_string() || pattern->get_ref<const std::string&>() != tekken_split_pattern()) {
        return bad_file(path, "config.pattern is " + (pattern ? json_text(*pattern) : std::string("missing")) +
                                  ", not Tekken's split pattern");
    }
    auto num_special = integer_field(*config, "default_num_special_tokens", "config", path);
    if (!num_special.ok()) return num_special.error();
    auto vocab_size = integer_field(*config, "default_vocab_size", "config", path);
    if (!vocab_size.ok()) return vocab_size.error();
    if (*vocab_size <= *num_special) {
        return bad_file(path, "config.default_vocab_size " + std::to_string(*vocab_size) + " leaves no room after " +
                                  std::to_string(*num_special) + " special tokens");
    }

    LlmBpeVocab vocab;
    vocab.pre = LlmPreTokenizer::Tekken;
    vocab.ignore_merges = true;
    vocab.tokens.resize(static_cast<size_t>(*vocab_size));

    const json* specials = find_member(doc, "special_tokens");
    if (specials && !specials->is_array()) return bad_file(path, "special_tokens is not an array");
    if (specials) {
        for (const json& entry : *specials) {
            auto rank = integer_field(entry, "rank", "special_tokens[]", path);
            if (!rank.ok()) return rank.error();
            const json* text = find_member(entry, "token_str");
            if (*rank >= *num_special || !text || !text->is_string() || text->get_ref<const std::string&>().empty()) {
                return bad_file(path, "special token " + json_text(entry) + " needs a rank below " +
                                          std::to_string(*num_special) + " and a token_str");
            }
            vocab.tokens[static_cast<size_t>(*rank)] = text->get<std::string>();
        }
    }
    for (int64_t id = 0; id < *num_special; ++id) {
        std::string& slot = vocab.tokens[static_cast<size_t>(id)];
        if (slot.empty()) slot = "<SPECIAL_" + std::to_string(id) + ">";
        vocab.added_ids.push_back(static_cast<int32_t>(id));
    }

    const json* entries = find_member(doc, "vocab");
    if (!entries || !entries->is_array()) return bad_file(path, "no \"vocab\" array");
    const int64_t used = *vocab_size - *num_special;
    const ByteMap& bm = byte_map();
    std::unordered_map<std::string, int64_t> rank_of;  // byte-level text -> rank
    for (const json& entry : *entries) {
        auto rank = integer_field(entry, "rank", "vocab[]", path);
        if (!rank.ok()) return rank.error();
        if (*rank >= used) continue;  // beyond default_vocab_size: mistral_common cuts them
        const json* b64 = find_member(entry, "token_bytes");
        std::optional<std::vector<uint8_t>> bytes;
        if (b64 && b64->is_string()) bytes = base64_decode(b64->get_ref<const std::string&>(), Base64Input::Strict);
        if (!bytes || bytes->empty()) {
            return bad_file(path, "vocab entry of rank " + std::to_string(*rank) + " has no token_bytes in base64");
        }
        std::string text;
        for (uint8_t b : *bytes) text += bm.byte_to_utf8[b];
        std::string& slot = vocab.tokens[static_cast<size_t>(*num_special + *rank)];
        if (!slot.empty()) return bad_file(path, "vocab rank " + std::to_string(*rank) + " appears twice");
        slot = text;
        rank_of.emplace(std::move(text), *rank);
    }

    // Every split of every token into two tokens, ordered as HF's converter
    // orders them: by the merged token's rank, then by the parts' ranks.
    std::vector<std::tuple<int64_t, int64_t, int64_t, std::string, std::string>> splits;
    for (const auto& [text, rank] : rank_of) {
        // Split at character boundaries of the byte-level text (each byte
        // is one character of 1 or 2 UTF-8 bytes).
        for (size_t cut = 1; cut < text.size(); ++cut) {
            if ((static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) continue;
            auto left = rank_of.find(text.substr(0, cut));
            auto right = rank_of.find(text.substr(cut));
            if (left == rank_of.end() || right == rank_of.end()) continue;
            splits.emplace_back(rank, left->second, right->second, left->first, right->first);
        }
    }
    std::sort(splits.begin(), splits.end());
    vocab.merges.reserve(splits.size());
    for (auto& [rank, l, r, a, b] : splits) vocab.merges.emplace_back(std::move(a), std::move(b));
    return vocab;
}

}  // namespace kiln::text
