// Who may call, from where: a browser lets any web page send "simple"
// cross-origin requests (GET, and POST with a text or form body) without
// asking first, and a DNS-rebinding page reaches 127.0.0.1 under its own
// name. So before anything else a request to a server without --api-key
// must name it in its Host (an address it listens on, localhost, or a
// --host-name; a rebound page cannot send a key, so a keyed server takes
// any Host, as behind a reverse proxy), and a request
// from a page (it carries Origin) must come from this server's own origin
// or one given with --cors-origin. Allowed origins get CORS answers,
// preflights (OPTIONS) included.
#pragma once

#include <httplib.h>

#include <optional>
#include <string>

#include "job_request.h"
#include "server_options.h"

namespace kiln::server {

// 127.0.0.0/8 and ::1.
bool is_loopback_address(const std::string& ip);

// 421 when the Host header names another server (nullopt: it is this one's, or absent).
std::optional<RequestError> check_host(const httplib::Request& req, const ServerOptions& policy);
// 403 when the request comes from a page of another origin not allowed;
// sets the CORS headers on `res` when it comes from an allowed one.
std::optional<RequestError> check_origin(const httplib::Request& req, const ServerOptions& policy,
                                         httplib::Response& res);
// An OPTIONS request (a CORS preflight) answered: 204 with what may be sent.
// Call after check_origin has passed.
void answer_preflight(const httplib::Request& req, httplib::Response& res);

}  // namespace kiln::server
