#include "util/message_text.h"

#include "util/format.h"

namespace kiln {

using json = nlohmann::json;

std::string quoted_text(std::string_view text) {
    std::string s = escaped(text.substr(0, 80));
    if (text.size() > 80) s += "...";
    return "'" + s + "'";
}

std::string json_text(const json& value) {
    const auto scalar = [](const json& v) -> std::string {
        if (v.is_array()) return "<array>";
        if (v.is_object()) return "<object>";
        std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
        if (text.size() > 80) text = text.substr(0, 80) + "...";
        return text;
    };
    std::string text;
    if (value.is_array() || value.is_object()) {
        text = value.is_array() ? "[" : "{";
        size_t shown_items = 0;
        for (auto it = value.begin(); it != value.end(); ++it) {
            if (shown_items == 4) {
                text += ", ...";
                break;
            }
            if (shown_items++ > 0) text += ", ";
            if (value.is_object()) text += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ": ";
            text += scalar(*it);
        }
        text += value.is_array() ? "]" : "}";
    } else {
        text = scalar(value);
    }
    if (text.size() > 200) text = text.substr(0, 200) + "...";
    return escaped(text);
}

}  // namespace kiln
