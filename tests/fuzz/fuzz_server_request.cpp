// libFuzzer target for kiln serve's reading of a request before any route
// works on it: the Host and Origin checks (request_origin.h, with the
// server listening on 127.0.0.1 and on 0.0.0.0), the JSON body
// (json_body.h: content type, nesting bound, parse) and the field readers
// every API's parser is a list of (request_fields.h). Multipart bodies and
// the header syntax are cpp-httplib's own parsing, which this does not
// reach. The input is lines: Host, Origin, Content-Type, then the body.
//
// Invariants: a refusal is a RequestError with a 4xx status that names
// its field; a body the depth scan lets through parses or is "not valid
// JSON"; no other exception escapes.
//
// Build and run: scripts/fuzz.sh server_request SECONDS
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "json_body.h"
#include "request_fields.h"
#include "request_origin.h"

namespace {

using kiln::server::RequestError;

// The next line of `text` from `at` (without its '\n'); at moves past it.
std::string next_line(const std::string& text, size_t& at) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string line = text.substr(at, end - at);
    at = std::min(end + 1, text.size());
    return line;
}

void check_refusal(const RequestError& e) {
    KILN_FUZZ_CHECK(e.status >= 400 && e.status < 500);
    KILN_FUZZ_CHECK(!e.message.empty());
    KILN_FUZZ_CHECK(e.field.empty() || e.message.rfind(e.field, 0) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    size_t at = 0;
    httplib::Request req;
    req.method = "POST";
    const std::string host = next_line(text, at), origin = next_line(text, at), type = next_line(text, at);
    if (!host.empty()) req.headers.emplace("Host", host);
    if (!origin.empty()) req.headers.emplace("Origin", origin);
    req.headers.emplace("Content-Type", type);
    req.body = text.substr(at);

    for (const char* listen : {"127.0.0.1", "0.0.0.0"}) {
        kiln::server::ServerOptions options;
        options.listen_ip = listen;
        options.host_names = {"kiln.lan"};
        options.cors_origins = {"http://app.example:3000"};
        httplib::Response res;
        if (auto refused = kiln::server::check_host(req, options)) check_refusal(*refused);
        if (auto refused = kiln::server::check_origin(req, options, res)) check_refusal(*refused);
    }

    const bool shallow = kiln::server::json_depth(req.body, kiln::server::kMaxJsonDepth) <= kiln::server::kMaxJsonDepth;
    try {
        const auto body = kiln::server::parse_json_body(req);
        KILN_FUZZ_CHECK(shallow && body.is_object());
        kiln::server::ServerLimits limits;
        // Each reader alone: one field's refusal must not hide another's crash.
        auto guard = [](auto&& read) {
            try {
                read();
            } catch (const RequestError& e) {
                check_refusal(e);
            }
        };
        guard([&] { (void)kiln::server::read_string(body, "prompt"); });
        guard([&] { (void)kiln::server::read_integer(body, "steps", 0, 0, limits.max_steps); });
        guard([&] { (void)kiln::server::read_integer(body, "seed", -1, -1, INT64_MAX); });
        guard([&] { (void)kiln::server::read_number(body, "cfg_scale", -1, -1, 1000); });
        guard([&] { (void)kiln::server::read_bool(body, "preview_noisy", false); });
    } catch (const RequestError& e) {
        check_refusal(e);
        if (e.message == "body: not valid JSON") KILN_FUZZ_CHECK(shallow);
    }
    return 0;
}
