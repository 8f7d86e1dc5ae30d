#include "json_body.h"

#include <algorithm>
#include <cctype>

#include "job_request.h"

namespace kiln::server {

void check_json_content_type(const httplib::Request& req) {
    const std::string given = req.get_header_value("Content-Type");
    // The media type, without parameters (charset) and in lower case.
    std::string type = given.substr(0, given.find(';'));
    type.erase(std::remove_if(type.begin(), type.end(), [](unsigned char c) { return std::isspace(c); }), type.end());
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
    const bool json_suffix =
        type.rfind("application/", 0) == 0 && type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0;
    if (type == "application/json" || json_suffix) return;
    throw RequestError{415, "body",
                       "body: expected Content-Type: application/json, got " +
                           (given.empty() ? std::string("none") : "'" + given + "'")};
}

int json_depth(std::string_view text, int limit) {
    int depth = 0;
    int deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;  // the escaped character, a quote included
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
            if (deepest > limit) return deepest;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return deepest;
}

nlohmann::json parse_json_body(const httplib::Request& req) {
    check_json_content_type(req);
    if (json_depth(req.body, kMaxJsonDepth) > kMaxJsonDepth) {
        throw RequestError{400, "body",
                           "body: nested deeper than " + std::to_string(kMaxJsonDepth) + " arrays and objects"};
    }
    nlohmann::json parsed = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) throw RequestError{400, "body", "body: not valid JSON"};
    if (!parsed.is_object()) {
        throw RequestError{400, "body", std::string("body: expected a JSON object, got ") + parsed.type_name()};
    }
    return parsed;
}

}  // namespace kiln::server
