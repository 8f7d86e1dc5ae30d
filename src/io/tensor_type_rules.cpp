#include "io/tensor_type_rules.h"

#include "io/tensor_convert.h"

namespace kiln::io {
namespace {

std::string_view trimmed(std::string_view s) {
    const size_t first = s.find_first_not_of(" \t");
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

Result<TensorTypeRules> TensorTypeRules::parse(std::string_view text) {
    auto rules = std::make_shared<std::vector<Rule>>();
    // Entries are split at every comma, as sd-cli splits them: a pattern
    // cannot hold one ("x{1,2}").
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = std::min(text.find(',', start), text.size());
        const std::string_view entry = trimmed(text.substr(start, comma - start));
        start = comma + 1;
        if (entry.empty()) continue;
        const std::string where = "--tensor-type-rules: '" + std::string(entry) + "'";
        const size_t eq = entry.rfind('=');
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == entry.size()) {
            return Error::invalid_request(where + " is not PATTERN=TYPE (e.g. \"^vae\\.=f16,attn=q8_0\")");
        }
        auto type = parse_weight_type(trimmed(entry.substr(eq + 1)));
        if (!type.ok()) {
            return Error::invalid_request(where + ": unknown type '" + std::string(trimmed(entry.substr(eq + 1))) +
                                          "' (valid: " + weight_type_names() + ")");
        }
        Rule rule{std::string(entry), {}, *type};
        try {
            rule.pattern = std::regex(std::string(entry.substr(0, eq)), std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            return Error::invalid_request(where + ": the pattern is not a regular expression (" + e.what() + ")");
        }
        rules->push_back(std::move(rule));
    }
    TensorTypeRules out;
    if (!rules->empty()) out.rules_ = std::move(rules);
    return out;
}

std::optional<size_t> TensorTypeRules::match(const std::vector<std::string>& names) const {
    for (size_t i = 0; i < size(); ++i) {
        for (const std::string& name : names) {
            if (std::regex_search(name, (*rules_)[i].pattern)) return i;
        }
    }
    return std::nullopt;
}

}  // namespace kiln::io
