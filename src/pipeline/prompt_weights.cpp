#include "pipeline/prompt_weights.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "text/unicode.h"
#include "text/utf8.h"
#include "util/format.h"
#include "util/log.h"
namespace kiln::pipeline {
namespace {

// Python's \w: letters, numbers, underscore.
bool is_word(char32_t c) {
    const text::CharClass k = text::char_class(c);
    return k == text::CharClass::Letter || k == text::CharClass::Number || c == '_';
}

bool is_digit_or_dot(char32_t c) { return (c >= '0' && c <= '9') || c == '.'; }

// Matches :\s*([+-]?[.\d]+)\s*\) at `pos`; on success sets `end` past the
// ')' and `number` to the captured text.
bool match_weight(const std::u32string& s, size_t pos, size_t& end, std::string& number) {
    size_t i = pos;
    if (i >= s.size() || s[i] != ':') return false;
    ++i;
    while (i < s.size() && text::is_space(s[i])) ++i;
    const size_t number_begin = i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t digits_begin = i;
    while (i < s.size() && is_digit_or_dot(s[i])) ++i;
    if (i == digits_begin) return false;
    const size_t number_end = i;
    while (i < s.size() && text::is_space(s[i])) ++i;
    if (i >= s.size() || s[i] != ')') return false;
    end = i + 1;
    number.clear();
    for (size_t k = number_begin; k < number_end; ++k) number.push_back(static_cast<char>(s[k]));
    return true;
}

// Python float() for [+-]?[.\d]+; malformed text ("1.2.3", ".") takes its
// longest valid prefix (sd.cpp's std::stod), or 1.0 if it has none.
double parse_weight(const std::string& number) {
    size_t i = 0;
    double sign = 1.0;
    if (i < number.size() && (number[i] == '+' || number[i] == '-')) {
        if (number[i] == '-') sign = -1.0;
        ++i;
    }
    double value = 0.0;
    const auto result = std::from_chars(number.data() + i, number.data() + number.size(), value);
    if (result.ec != std::errc()) return 1.0;
    return sign * value;
}

// re.split(r"\s*\bBREAK\b\s*", text).
std::vector<std::u32string> split_break(const std::u32string& s) {
    static const std::u32string kBreak = U"BREAK";
    std::vector<std::u32string> parts;
    size_t part_begin = 0;
    size_t search = 0;
    while (search + kBreak.size() <= s.size()) {
        const size_t k = s.find(kBreak, search);
        if (k == std::u32string::npos) break;
        const size_t after = k + kBreak.size();
        const bool boundary_before = k == 0 || !is_word(s[k - 1]);
        const bool boundary_after = after == s.size() || !is_word(s[after]);
        if (!boundary_before || !boundary_after) {
            search = k + 1;
            continue;
        }
        size_t match_begin = k;
        while (match_begin > part_begin && text::is_space(s[match_begin - 1])) --match_begin;
        size_t match_end = after;
        while (match_end < s.size() && text::is_space(s[match_end])) ++match_end;
        parts.push_back(s.substr(part_begin, match_begin - part_begin));
        part_begin = match_end;
        search = match_end;
    }
    parts.push_back(s.substr(part_begin));
    return parts;
}

bool is_syntax(char32_t c) { return c == '\\' || c == '(' || c == ')' || c == '[' || c == ']' || c == ':'; }

// parse_prompt_attention with the weights as Python computes them; the
// chunker tests BREAK markers on these (a marker inside brackets that cancel
// out, e.g. "[[[(((BREAK)))]]]", is -1.0000000000000002 in A1111, not a
// break, but -1.0f once rounded to float).
std::vector<std::pair<std::string, double>> parse_attention_exact(std::string_view text) {
    const std::u32string s = text::utf8_to_u32(text);
    std::vector<std::pair<std::u32string, double>> res;
    std::vector<size_t> round_brackets;
    std::vector<size_t> square_brackets;
    const double round_multiplier = 1.1;
    const double square_multiplier = 1 / 1.1;

    auto multiply_range = [&](size_t start, double multiplier) {
        for (size_t p = start; p < res.size(); ++p) res[p].second *= multiplier;
    };
    auto add_text = [&](const std::u32string& chunk) {
        const auto parts = split_break(chunk);
        for (size_t i = 0; i < parts.size(); ++i) {
            if (i > 0) res.emplace_back(U"BREAK", static_cast<double>(kBreakWeight));
            res.emplace_back(parts[i], 1.0);
        }
    };

    // One iteration per match of A1111's re_attention, alternatives in order.
    size_t i = 0;
    std::string number;
    while (i < s.size()) {
        const char32_t c = s[i];
        if (c == '\\') {
            const bool escape = i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == ')' || s[i + 1] == '[' ||
                                                     s[i + 1] == ']' || s[i + 1] == '\\');
            // text[1:]: the escaped character, or "" for a lone backslash.
            res.emplace_back(escape ? std::u32string(1, s[i + 1]) : std::u32string(), 1.0);
            i += escape ? 2 : 1;
        } else if (c == '(') {
            round_brackets.push_back(res.size());
            ++i;
        } else if (c == '[') {
            square_brackets.push_back(res.size());
            ++i;
        } else if (size_t weight_end = 0; c == ':' && match_weight(s, i, weight_end, number)) {
            if (!round_brackets.empty()) {
                multiply_range(round_brackets.back(), parse_weight(number));
                round_brackets.pop_back();
            } else {
                add_text(s.substr(i, weight_end - i));
            }
            i = weight_end;
        } else if (c == ')' && !round_brackets.empty()) {
            multiply_range(round_brackets.back(), round_multiplier);
            round_brackets.pop_back();
            ++i;
        } else if (c == ']' && !square_brackets.empty()) {
            multiply_range(square_brackets.back(), square_multiplier);
            square_brackets.pop_back();
            ++i;
        } else if (c == ')' || c == ']' || c == ':') {
            add_text(std::u32string(1, c));
            ++i;
        } else {
            size_t end = i;
            while (end < s.size() && !is_syntax(s[end])) ++end;
            add_text(s.substr(i, end - i));
            i = end;
        }
    }
    for (size_t pos : round_brackets) multiply_range(pos, round_multiplier);
    for (size_t pos : square_brackets) multiply_range(pos, square_multiplier);

    if (res.empty()) res.emplace_back(U"", 1.0);

    // Merge runs of identical weights.
    for (size_t k = 0; k + 1 < res.size();) {
        if (res[k].second == res[k + 1].second) {
            res[k].first += res[k + 1].first;
            res.erase(res.begin() + static_cast<std::ptrdiff_t>(k + 1));
        } else {
            ++k;
        }
    }

    std::vector<std::pair<std::string, double>> out;
    out.reserve(res.size());
    for (const auto& [fragment, weight] : res) out.emplace_back(text::u32_to_utf8(fragment), weight);
    return out;
}

struct Fragment {
    const std::string* text;
    float weight;
    bool is_break;
};

TokenChunks chunk_fragments(const text::ClipTokenizer& tokenizer, const std::vector<Fragment>& fragments,
                            const ChunkOptions& options) {
    const size_t length = static_cast<size_t>(std::max(1, options.chunk_length));
    const int32_t pad = options.pad_id >= 0 ? options.pad_id : tokenizer.eos_id();
    const int32_t comma = tokenizer.comma_id();
    const size_t backtrack = static_cast<size_t>(std::max(0, options.comma_backtrack));

    TokenChunks out;
    std::vector<int32_t> tokens;
    std::vector<float> weights;
    // Index in `tokens` of the last comma, -1 for none.
    std::ptrdiff_t last_comma = -1;

    // A1111's next_chunk: BOS + tokens + EOS, padded. (A1111 pads with EOS
    // and SD2 then overwrites everything after the first EOS with its pad
    // id; writing the pad directly gives the same ids.)
    const size_t max_chunks = static_cast<size_t>(std::max(1, options.max_chunks));
    bool overflow = false;  // a chunk past max_chunks was dropped
    auto next_chunk = [&]() {
        if (out.tokens.size() == max_chunks) {
            overflow = true;
            tokens.clear();
            weights.clear();
            last_comma = -1;
            return;
        }
        std::vector<int32_t> chunk_tokens;
        std::vector<float> chunk_weights;
        chunk_tokens.reserve(length + 2);
        chunk_weights.reserve(length + 2);
        chunk_tokens.push_back(tokenizer.bos_id());
        chunk_weights.push_back(1.0f);
        chunk_tokens.insert(chunk_tokens.end(), tokens.begin(), tokens.end());
        chunk_weights.insert(chunk_weights.end(), weights.begin(), weights.end());
        chunk_tokens.push_back(tokenizer.eos_id());
        chunk_weights.push_back(1.0f);
        chunk_tokens.resize(std::max(chunk_tokens.size(), length + 2), pad);
        chunk_weights.resize(chunk_tokens.size(), 1.0f);
        out.tokens.push_back(std::move(chunk_tokens));
        out.weights.push_back(std::move(chunk_weights));
        tokens.clear();
        weights.clear();
        last_comma = -1;
    };

    for (const Fragment& fragment : fragments) {
        if (overflow) break;
        if (fragment.is_break) {
            next_chunk();
            continue;
        }
        const float weight = fragment.weight;
        const std::vector<int32_t> ids = tokenizer.encode(*fragment.text);
        size_t pos = 0;
        while (pos < ids.size()) {
            const int32_t token = ids[pos];
            if (comma >= 0 && token == comma) {
                last_comma = static_cast<std::ptrdiff_t>(tokens.size());
            } else if (backtrack != 0 && tokens.size() == length && last_comma != -1 &&
                       tokens.size() - static_cast<size_t>(last_comma) <= backtrack) {
                // Move the words after the comma into the next chunk.
                const size_t break_at = static_cast<size_t>(last_comma) + 1;
                std::vector<int32_t> moved_tokens(tokens.begin() + static_cast<std::ptrdiff_t>(break_at), tokens.end());
                std::vector<float> moved_weights(weights.begin() + static_cast<std::ptrdiff_t>(break_at),
                                                 weights.end());
                tokens.resize(break_at);
                weights.resize(break_at);
                next_chunk();
                tokens = std::move(moved_tokens);
                weights = std::move(moved_weights);
            }
            if (tokens.size() == length) next_chunk();

            // An embedding's vectors stay together in one chunk when they can.
            const text::EmbeddingToken* embedding = tokenizer.embedding_for_id(token);
            if (embedding && token == embedding->first_id && static_cast<size_t>(embedding->n_vectors) <= length) {
                size_t run = 0;
                while (run < static_cast<size_t>(embedding->n_vectors) && pos + run < ids.size() &&
                       ids[pos + run] == embedding->first_id + static_cast<int32_t>(run)) {
                    ++run;
                }
                if (tokens.size() + run > length) next_chunk();
                tokens.insert(tokens.end(), ids.begin() + static_cast<std::ptrdiff_t>(pos),
                              ids.begin() + static_cast<std::ptrdiff_t>(pos + run));
                weights.insert(weights.end(), run, weight);
                pos += run;
                continue;
            }
            tokens.push_back(token);
            weights.push_back(weight);
            ++pos;
        }
    }
    if (!tokens.empty() || out.tokens.empty()) next_chunk();
    if (overflow) {
        KILN_LOG_WARN("prompt: more than %zu chunks of %zu tokens; the rest is ignored", max_chunks, length);
    }
    return out;
}

}  // namespace

Status check_prompt_size(std::string_view prompt, const std::string& what) {
    if (prompt.size() > kMaxPromptBytes) {
        return Error::invalid_request(what + ": " + std::to_string(prompt.size()) + " bytes, more than the limit of " +
                                      std::to_string(kMaxPromptBytes));
    }
    size_t breaks = 0;
    for (const auto& [text, weight] : parse_attention_exact(prompt)) {
        breaks += text == "BREAK" && weight == -1.0;
        if (!(std::fabs(weight) <= kMaxPromptWeight)) {
            const std::string fragment = text.size() > 40 ? text.substr(0, 40) + "..." : text;
            return Error::invalid_request(what + ": '" + escaped(fragment) + "' has the weight " +
                                          format_number(static_cast<float>(weight)) +
                                          " (nested parentheses multiply "
                                          "by 1.1 each), beyond the limit of " +
                                          format_number(static_cast<float>(kMaxPromptWeight)) + " either way");
        }
    }
    if (breaks + 1 > static_cast<size_t>(kMaxPromptChunks)) {
        return Error::invalid_request(what + ": " + std::to_string(breaks) + " BREAKs make at least " +
                                      std::to_string(breaks + 1) + " chunks; at most " +
                                      std::to_string(kMaxPromptChunks) + " chunks (of 75 tokens) are allowed");
    }
    return Status::Ok();
}

std::vector<std::pair<std::string, float>> parse_prompt_attention(std::string_view text) {
    std::vector<std::pair<std::string, float>> out;
    for (auto& [fragment, weight] : parse_attention_exact(text)) {
        out.emplace_back(std::move(fragment), static_cast<float>(weight));
    }
    return out;
}

TokenChunks tokenize_fragments(const text::ClipTokenizer& tokenizer,
                               const std::vector<std::pair<std::string, float>>& fragments,
                               const ChunkOptions& options) {
    std::vector<Fragment> list;
    list.reserve(fragments.size());
    for (const auto& [text, weight] : fragments)
        list.push_back({&text, weight, text == "BREAK" && weight == kBreakWeight});
    return chunk_fragments(tokenizer, list, options);
}

TokenChunks tokenize_with_weights(const text::ClipTokenizer& tokenizer, std::string_view prompt,
                                  const ChunkOptions& options) {
    if (!options.parse_weights) {
        const std::string text(prompt);
        return chunk_fragments(tokenizer, {{&text, 1.0f, false}}, options);
    }
    const auto parsed = parse_attention_exact(prompt);
    std::vector<Fragment> list;
    list.reserve(parsed.size());
    for (const auto& [text, weight] : parsed) {
        list.push_back({&text, static_cast<float>(weight), text == "BREAK" && weight == -1.0});
    }
    return chunk_fragments(tokenizer, list, options);
}

void apply_token_weights(float* hidden, int n_tokens, int width, const float* weights) {
    if (n_tokens <= 0 || width <= 0) return;
    const size_t count = static_cast<size_t>(n_tokens) * static_cast<size_t>(width);
    double original_sum = 0.0;
    for (size_t i = 0; i < count; ++i) original_sum += hidden[i];
    double new_sum = 0.0;
    for (int t = 0; t < n_tokens; ++t) {
        float* row = hidden + static_cast<size_t>(t) * static_cast<size_t>(width);
        for (int c = 0; c < width; ++c) {
            row[c] *= weights[t];
            new_sum += row[c];
        }
    }
    // Both means divide by the same count, so the ratio of sums is the ratio
    // of means.
    if (new_sum == 0.0) return;
    const double scale = original_sum / new_sum;
    if (!std::isfinite(scale)) return;
    for (size_t i = 0; i < count; ++i) hidden[i] = static_cast<float>(hidden[i] * scale);
}

}  // namespace kiln::pipeline
