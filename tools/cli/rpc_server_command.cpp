#include "rpc_server_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "cli.h"
#include "ggml-rpc.h"
#include "runtime/devices.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

bool is_loopback(const std::string& host) { return host.rfind("127.", 0) == 0; }

// Binds host:port once (as ggml's server will, with SO_REUSEADDR) so that a
// port in use is a clear error instead of ggml's "Failed to create server socket".
Status check_can_listen(const std::string& host, int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Error{std::string("cannot create a socket: ") + std::strerror(errno)};
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok) return Error{"--port: cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(err)};
    return Status::Ok();
}

}  // namespace

int run_list_devices(const Options& options, std::ostream& out) {
    if (!options.rpc_servers.empty()) {
        if (Status s = runtime::add_rpc_servers(options.rpc_servers); !s) {
            KILN_LOG_ERROR("%s", s.error().message.c_str());
            return kExitFailure;
        }
    }
    const auto devices = runtime::list_devices();
    char line[512];
    std::snprintf(line, sizeof line, "%-8s %-11s %12s %12s  %s\n", "name", "type", "free", "total", "description");
    out << line;
    for (const auto& d : devices) {
        std::snprintf(line, sizeof line, "%-8s %-11s %12s %12s  %s\n", d.name.c_str(),
                      runtime::device_type_name(d.type), human_bytes(d.free).c_str(), human_bytes(d.total).c_str(),
                      d.description.c_str());
        out << line;
    }
    return kExitOk;
}

int run_rpc_server(const Options& options) {
    if (!options.rpc_servers.empty()) {
        KILN_LOG_ERROR("--rpc-servers: rpc-server serves this machine's own devices; it cannot relay remote ones");
        return kExitUsage;
    }
    auto device = runtime::find_device(options.rpc_device.empty() ? "CPU" : options.rpc_device);
    if (!device) {
        KILN_LOG_ERROR("--device: %s", device.error().message.c_str());
        return kExitUsage;
    }
    if (Status s = check_can_listen(options.rpc_host, options.rpc_port); !s) {
        KILN_LOG_ERROR("%s", s.error().message.c_str());
        return kExitFailure;
    }
    if (!is_loopback(options.rpc_host)) {
        KILN_LOG_WARN(
            "listening on %s: ggml's RPC protocol has no authentication; anyone who can reach port %d can use "
            "this machine's %s and its memory. Serve only on a trusted network.",
            options.rpc_host.c_str(), options.rpc_port, ggml_backend_dev_name(*device));
    }
    const std::string endpoint = options.rpc_host + ":" + std::to_string(options.rpc_port);
    const size_t threads =
        options.threads > 0 ? static_cast<size_t>(options.threads) : std::max(1u, std::thread::hardware_concurrency());
    KILN_LOG_INFO("kiln rpc-server: serving %s (%s) on %s with %zu threads", ggml_backend_dev_name(*device),
                  ggml_backend_dev_description(*device), endpoint.c_str(), threads);
    std::fflush(stdout);
    // A client that closes its socket while the server still writes to it
    // must cost that client's connection only: without this, the write
    // raises SIGPIPE and ends the whole server. ggml then sees EPIPE and
    // drops the connection.
    std::signal(SIGPIPE, SIG_IGN);
    ggml_backend_dev_t dev = *device;
    ggml_backend_rpc_start_server(endpoint.c_str(), /*cache_dir=*/nullptr, threads, 1, &dev);
    // ggml returns only when it could not set up (or keep) the listening socket.
    KILN_LOG_ERROR("rpc-server: the ggml RPC server on %s stopped (see the messages above)", endpoint.c_str());
    return kExitFailure;
}

}  // namespace kiln::cli
