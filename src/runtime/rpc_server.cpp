#include "runtime/rpc_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "ggml-rpc.h"
#include "runtime/device_budget.h"
#include "runtime/devices.h"
#include "runtime/proxy_device.h"
#include "runtime/rpc_front.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

bool is_loopback(const std::string& host) { return host.rfind("127.", 0) == 0; }

// A free TCP port on 127.0.0.1 for ggml's own server, behind the front:
// bound to port 0, read, released.
Result<int> free_loopback_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Error{std::string("cannot create a socket: ") + std::strerror(errno)};
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof addr;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok) return Error{std::string("cannot find a free loopback port: ") + std::strerror(err)};
    return static_cast<int>(ntohs(addr.sin_port));
}

// --max-alloc in bytes; the device's total memory when not given.
Result<size_t> max_alloc_bytes(const std::string& spec, ggml_backend_dev_t device) {
    if (spec.empty()) {
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(device, &free, &total);
        return total > 0 ? total : SIZE_MAX;
    }
    return parse_size_bytes("--max-alloc", spec);
}

}  // namespace

Status serve_rpc(const RpcServeOptions& options) {
    auto device = find_device(options.device.empty() ? "CPU" : options.device);
    if (!device) return Error::invalid_request("--device: " + device.error().message);
    auto max_alloc = max_alloc_bytes(options.max_alloc, *device);
    if (!max_alloc.ok()) return max_alloc.error();
    size_t reported_memory = 0;
    if (!options.reported_memory.empty()) {
        auto bytes = parse_size_bytes("--mem", options.reported_memory);
        if (!bytes.ok()) return bytes.error();
        reported_memory = *bytes;
    }
    if (!options.cache_dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(options.cache_dir, ec);
        if (ec || !std::filesystem::is_directory(options.cache_dir) || access(options.cache_dir.c_str(), W_OK) != 0) {
            return Error::invalid_request("--cache-dir: cannot write to the folder '" + options.cache_dir +
                                          "': " + (ec ? ec.message() : std::strerror(errno)));
        }
    }
    // Clients reach ggml's server through the front (rpc_front.h), which
    // refuses messages over the limit before ggml allocates for them.
    auto backend_port = free_loopback_port();
    if (!backend_port.ok()) return backend_port.error();
    // Said before the port opens: a client (or a test) that sees it open has been warned of.
    if (!is_loopback(options.host)) {
        KILN_LOG_WARN(
            "will listen on %s: ggml's RPC protocol has no authentication; anyone who can reach port %d can use "
            "this machine's %s and its memory. Serve only on a trusted network.",
            options.host.c_str(), options.port, ggml_backend_dev_name(*device));
    }
    KILN_TRY(start_rpc_front(options.host, options.port, *backend_port, rpc_message_limit(*max_alloc)));
    const std::string endpoint = options.host + ":" + std::to_string(options.port);
    const size_t threads =
        options.threads > 0 ? static_cast<size_t>(options.threads) : std::max(1u, std::thread::hardware_concurrency());
    const std::string cache = options.cache_dir.empty() ? "no tensor cache" : "tensor cache in " + options.cache_dir;
    KILN_LOG_INFO("kiln rpc-server: serving %s (%s) on %s with %zu threads; buffers up to %s (--max-alloc); %s",
                  ggml_backend_dev_name(*device), ggml_backend_dev_description(*device), endpoint.c_str(), threads,
                  human_bytes(*max_alloc).c_str(), cache.c_str());
    if (reported_memory) {
        KILN_LOG_INFO("kiln rpc-server: reports %s free and total to clients (--mem); buffers still come from %s",
                      human_bytes(reported_memory).c_str(), ggml_backend_dev_name(*device));
    }
    std::fflush(stdout);
    // A client that closes its socket while the server still writes to it
    // must cost that client's connection only: without this, the write
    // raises SIGPIPE and ends the whole server. ggml then sees EPIPE and
    // drops the connection.
    std::signal(SIGPIPE, SIG_IGN);
    ProxyRules rules;
    rules.max_alloc = *max_alloc;
    rules.reported_memory = reported_memory;
    ggml_backend_dev_t dev = proxy_device(*device, rules);
    const std::string backend = "127.0.0.1:" + std::to_string(*backend_port);
    ggml_backend_rpc_start_server(backend.c_str(), options.cache_dir.empty() ? nullptr : options.cache_dir.c_str(),
                                  threads, 1, &dev);
    // ggml returns only when it could not set up (or keep) the listening socket.
    return Error{"rpc-server: the ggml RPC server on " + endpoint + " stopped (see the messages above)"};
}

std::string device_table() {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%-8s %-11s %12s %12s  %s\n", "name", "type", "free", "total", "description");
    out += line;
    for (const auto& d : list_devices()) {
        std::snprintf(line, sizeof line, "%-8s %-11s %12s %12s  %s\n", d.name.c_str(), device_type_name(d.type),
                      human_bytes(d.free).c_str(), human_bytes(d.total).c_str(), d.description.c_str());
        out += line;
    }
    return out;
}

}  // namespace kiln::runtime
