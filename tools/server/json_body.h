// A request's JSON body, read so that a hostile one costs little: only with
// a JSON Content-Type (a browser sends text/plain and form types across
// origins without asking first), nested no deeper than kMaxJsonDepth
// (checked by a scan that allocates nothing, before the parse builds a
// tree), and an object. Each refusal is a RequestError naming "body".
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string_view>

namespace kiln::server {

// No API nests deeper than A1111's override_settings inside its request
// (depth 2); a few dozen levels leave room for clients' extras.
constexpr int kMaxJsonDepth = 32;

// 415 unless the Content-Type is application/json or some application/...+json.
void check_json_content_type(const httplib::Request& req);
// The deepest nesting of arrays and objects in `text`, counting no further
// than `limit` + 1. Strings (and the brackets in them) are skipped; the text
// need not be valid JSON.
int json_depth(std::string_view text, int limit);
// The body as a JSON object: the content type, the depth, then the parse.
nlohmann::json parse_json_body(const httplib::Request& req);

}  // namespace kiln::server
