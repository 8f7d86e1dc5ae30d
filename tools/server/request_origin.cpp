#include "request_origin.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

namespace kiln::server {
namespace {

std::string lower(std::string text) {
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    return text;
}

// "name:port", "[v6]:port" or "name" into the name (brackets dropped), lower case.
std::string host_name_of(const std::string& host) {
    if (!host.empty() && host[0] == '[') {
        const auto close = host.find(']');
        return lower(host.substr(1, close == std::string::npos ? std::string::npos : close - 1));
    }
    return lower(host.substr(0, host.find(':')));
}

bool is_ipv4(const std::string& name) {
    in_addr addr{};
    return inet_pton(AF_INET, name.c_str(), &addr) == 1;
}
bool is_ipv6(const std::string& name) {
    in6_addr addr{};
    return inet_pton(AF_INET6, name.c_str(), &addr) == 1;
}
// An origin as browsers write it: lower case, no trailing slash.
std::string normalized_origin(const std::string& origin) {
    std::string out = lower(origin);
    while (!out.empty() && out.back() == '/') out.pop_back();
    return out;
}

}  // namespace

bool is_loopback_address(const std::string& ip) {
    in_addr addr{};
    if (inet_pton(AF_INET, ip.c_str(), &addr) == 1) return (ntohl(addr.s_addr) >> 24) == 127;
    return ip == "::1";
}

std::optional<RequestError> check_host(const httplib::Request& req, const ServerOptions& policy) {
    // HTTP/1.0 clients may leave Host out; browsers always send it.
    if (!req.has_header("Host")) return std::nullopt;
    const std::string given = req.get_header_value("Host");
    const std::string name = host_name_of(given);
    const std::string listen = lower(policy.listen_ip);
    bool ours = name == listen;
    // A wildcard listen address serves every address of the machine. An
    // address literal cannot be a rebound name: the browser's page came
    // from that address itself.
    if (listen == "0.0.0.0") ours = ours || is_ipv4(name);
    if (listen == "::") ours = ours || is_ipv4(name) || is_ipv6(name);
    if (is_loopback_address(listen) || listen == "0.0.0.0" || listen == "::") ours = ours || name == "localhost";
    for (const std::string& h : policy.host_names) ours = ours || name == lower(h);
    if (ours) return std::nullopt;
    return RequestError{421, "Host",
                        "Host: '" + given + "' is not a name of this server (" + policy.listen_ip +
                            ", localhost, or a name given with --host-name)"};
}

std::optional<RequestError> check_origin(const httplib::Request& req, const ServerOptions& policy,
                                         httplib::Response& res) {
    if (!req.has_header("Origin")) return std::nullopt;  // not from a page: curl, SDKs, scripts
    const std::string origin = normalized_origin(req.get_header_value("Origin"));
    // The server's own page, loaded under the name the request gives (check_host
    // vouched for it), directly or through a TLS reverse proxy.
    if (req.has_header("Host")) {
        const std::string host = lower(req.get_header_value("Host"));
        if (origin == "http://" + host || origin == "https://" + host) return std::nullopt;
    }
    const bool any =
        std::find(policy.cors_origins.begin(), policy.cors_origins.end(), "*") != policy.cors_origins.end();
    const bool listed = std::any_of(policy.cors_origins.begin(), policy.cors_origins.end(),
                                    [&](const std::string& o) { return normalized_origin(o) == origin; });
    if (!any && !listed) {
        return RequestError{403, "Origin",
                            "Origin: pages from " + req.get_header_value("Origin") +
                                " may not call this server (start kiln serve with --cors-origin ORIGIN to let them)"};
    }
    res.set_header("Access-Control-Allow-Origin", req.get_header_value("Origin"));
    res.set_header("Access-Control-Expose-Headers", "Retry-After");
    res.set_header("Vary", "Origin");
    return std::nullopt;
}

void answer_preflight(const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (!req.has_header("Origin")) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
    res.set_header("Access-Control-Max-Age", "600");
}

}  // namespace kiln::server
