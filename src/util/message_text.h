// Text from a file, made safe and short for an error message: control bytes
// escaped, invalid UTF-8 replaced, long text cut. Tokenizer and model loaders
// quote what they refuse with these, so a hostile file cannot flood or
// corrupt a message.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln {

// 'text', escaped, cut after 80 bytes with "...".
std::string quoted_text(std::string_view text);

// A JSON value, walking only its top level: nested arrays and objects print as
// <array> and <object> (dump() recurses once per nesting level, and a hostile
// file can nest 100k deep), at most 4 items, invalid UTF-8 replaced, cut at 200
// bytes, escaped.
std::string json_text(const nlohmann::json& value);

}  // namespace kiln
