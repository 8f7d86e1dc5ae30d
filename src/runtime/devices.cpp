#include "runtime/devices.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "ggml-rpc.h"
#include "runtime/socket_io.h"
#include "util/format.h"

namespace kiln::runtime {
namespace {

// The probe speaks the first message of ggml's RPC protocol itself (ggml does
// not expose it): RPC_CMD_HELLO is fixed at 14 for every protocol version, and
// the request/response layout below is that of protocol major version 7.
static_assert(RPC_PROTO_MAJOR_VERSION == 7, "ggml's RPC protocol changed: check the HELLO probe in devices.cpp");
constexpr uint8_t kRpcCmdHello = 14;
constexpr size_t kRpcConnCapsSize = 24;
constexpr int kConnectTimeoutMs = 3000;
constexpr int kReplyTimeoutMs = 5000;

// The RPC servers added so far (or being added), as "127.0.0.1:50052 (RPC0)",
// for the abort hook below. Read from whichever thread ggml aborts on, so it
// is published through an atomic pointer and never freed (a few bytes per
// --rpc list): the hook takes no lock that the aborting thread might hold.
std::atomic<const std::string*> g_rpc_servers{nullptr};

void publish_rpc_servers(std::string text) { g_rpc_servers.store(new std::string(std::move(text))); }

// ggml aborts the process when an RPC server stops answering mid-run
// (RPC_STATUS_ASSERT in ggml-rpc.cpp); kiln cannot turn that into an error
// value without forking ggml. This hook runs just before the abort and says
// which server it was in one line, instead of ggml's bare message and backtrace.
void report_ggml_abort(const char* message) {
    const std::string* servers = g_rpc_servers.load();
    if (servers && std::strstr(message, "ggml-rpc") != nullptr) {
        std::fprintf(stderr,
                     "error: lost the ggml RPC server %s (it stopped answering or sent a malformed reply); ggml "
                     "cannot recover from that, so kiln stops (ggml: %s)\n",
                     servers->c_str(), message);
    } else {
        std::fprintf(stderr, "error: ggml aborted: %s\n", message);
    }
    std::fflush(stderr);
}

DeviceInfo::Type to_type(enum ggml_backend_dev_type type) {
    switch (type) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return DeviceInfo::Cpu;
        case GGML_BACKEND_DEVICE_TYPE_GPU:
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return DeviceInfo::Gpu;
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return DeviceInfo::Accelerator;
        default: return DeviceInfo::Other;
    }
}

// Closes a socket descriptor on scope exit.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Connects to `endpoint` (already validated) with a timeout and performs the
// RPC HELLO handshake, then hangs up so the server is free for ggml's own
// connection. An Error says what went wrong at which endpoint.
Status probe_rpc_server(const std::string& endpoint) {
    const size_t colon = endpoint.find(':');
    const std::string host = endpoint.substr(0, colon);
    const std::string port = endpoint.substr(colon + 1);
    const std::string where = "--rpc-servers: " + endpoint + ": ";

    addrinfo hints{};
    hints.ai_family = AF_INET;  // what ggml's RPC client connects with
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0 || !found) {
        return Error{where + "cannot resolve host '" + host + "': " + ::gai_strerror(rc)};
    }
    sockaddr_in addr{};
    std::memcpy(&addr, found->ai_addr, sizeof addr);
    ::freeaddrinfo(found);

    Fd sock{::socket(AF_INET, SOCK_STREAM, 0)};
    if (sock.fd < 0) return Error{where + "cannot create a socket: " + std::strerror(errno)};
    const int flags = ::fcntl(sock.fd, F_GETFL, 0);
    ::fcntl(sock.fd, F_SETFL, flags | O_NONBLOCK);
    int err = 0;
    if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
        if (errno != EINPROGRESS) {
            err = errno;
        } else {
            pollfd p{sock.fd, POLLOUT, 0};
            int ready;
            do {
                ready = ::poll(&p, 1, kConnectTimeoutMs);
            } while (ready < 0 && errno == EINTR);
            if (ready == 0) {
                return Error{where + "no ggml RPC server reachable (connection timed out after " +
                             std::to_string(kConnectTimeoutMs / 1000) + " s)"};
            }
            socklen_t len = sizeof err;
            if (ready < 0 || ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        }
    }
    if (err != 0) return Error{where + "no ggml RPC server reachable (" + std::strerror(err) + ")"};
    ::fcntl(sock.fd, F_SETFL, flags);
    timeval tv{kReplyTimeoutMs / 1000, 0};
    ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

    // | cmd (1 byte) | request size (8 bytes) | conn caps (24 zero bytes: plain TCP) |
    uint8_t request[1 + 8 + kRpcConnCapsSize] = {};
    request[0] = kRpcCmdHello;
    const uint64_t request_size = kRpcConnCapsSize;
    std::memcpy(request + 1, &request_size, sizeof request_size);
    // | response size (8 bytes) | major, minor, patch, padding, conn caps (24 bytes) |
    uint64_t response_size = 0;
    uint8_t response[4 + kRpcConnCapsSize] = {};
    if (!send_all(sock.fd, request, sizeof request) || !recv_all(sock.fd, &response_size, sizeof response_size)) {
        return Error{where +
                     "the server did not answer the RPC handshake (not a ggml RPC server, or busy with "
                     "another client)"};
    }
    if (response_size != sizeof response || !recv_all(sock.fd, response, sizeof response)) {
        return Error{where + "not a ggml RPC server of protocol version " + std::to_string(RPC_PROTO_MAJOR_VERSION) +
                     ".x (unexpected handshake reply)"};
    }
    if (response[0] != RPC_PROTO_MAJOR_VERSION || response[1] > RPC_PROTO_MINOR_VERSION) {
        return Error{where + "the server speaks RPC protocol " + std::to_string(response[0]) + "." +
                     std::to_string(response[1]) + "." + std::to_string(response[2]) + ", this kiln speaks " +
                     std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) + ".x"};
    }
    return Status::Ok();
}

}  // namespace

std::vector<std::string> registered_device_names() {
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i)
        names.emplace_back(ggml_backend_dev_name(ggml_backend_dev_get(i)));
    return names;
}

const char* device_type_name(DeviceInfo::Type type) {
    switch (type) {
        case DeviceInfo::Cpu: return "CPU";
        case DeviceInfo::Gpu: return "GPU";
        case DeviceInfo::Accelerator: return "accelerator";
        case DeviceInfo::Other: break;
    }
    return "other";
}

std::vector<DeviceInfo> list_devices() {
    std::vector<DeviceInfo> devices;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        DeviceInfo info;
        info.name = ggml_backend_dev_name(dev);
        info.description = ggml_backend_dev_description(dev);
        info.type = to_type(ggml_backend_dev_type(dev));
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        info.free = free;
        info.total = total;
        devices.push_back(std::move(info));
    }
    return devices;
}

Result<std::vector<std::string>> parse_rpc_endpoints(std::string_view endpoints) {
    std::vector<std::string> out;
    for (const std::string& endpoint : split_list(endpoints, ',')) {
        if (endpoint.empty())
            return Error::invalid_request("--rpc-servers: empty endpoint in '" + std::string(endpoints) +
                                          "' (expected host:port)");
        const size_t colon = endpoint.rfind(':');
        if (colon == std::string::npos)
            return Error::invalid_request("--rpc-servers: " + endpoint + ": expected host:port");
        const std::string host = endpoint.substr(0, colon);
        const std::string port = endpoint.substr(colon + 1);
        if (host.empty())
            return Error::invalid_request("--rpc-servers: " + endpoint + ": empty host (expected host:port)");
        if (host.find(':') != std::string::npos) {
            return Error::invalid_request("--rpc-servers: " + endpoint +
                                          ": IPv6 addresses are not supported (use an IPv4 address or a host name)");
        }
        const bool digits = !port.empty() && port.size() <= 5 &&
                            std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
        const long value = digits ? std::stol(port) : 0;
        if (value < 1 || value > 65535) {
            return Error::invalid_request("--rpc-servers: " + endpoint +
                                          ": the port must be a number from 1 to 65535, got '" + port + "'");
        }
        const std::string normalised = host + ":" + std::to_string(value);
        if (std::find(out.begin(), out.end(), normalised) == out.end()) out.push_back(normalised);
    }
    return out;
}

Status add_rpc_servers(const std::string& endpoints) {
    auto parsed = parse_rpc_endpoints(endpoints);
    if (!parsed) return parsed.error();
    static std::mutex mutex;
    static std::set<std::string> added;
    static std::string described;  // what g_rpc_servers holds, servers comma-separated
    std::lock_guard<std::mutex> lock(mutex);
    ggml_set_abort_callback(report_ggml_abort);
    // ggml's RPC client writes with send() and no MSG_NOSIGNAL: a write to a
    // server that has gone would kill the process with SIGPIPE, silently.
    // Ignored, the write fails with EPIPE and ggml's failure path (and the
    // hook above) runs instead. This changes the process's disposition, which
    // is why it happens only once RPC servers are asked for.
    std::signal(SIGPIPE, SIG_IGN);
    for (const std::string& endpoint : *parsed) {
        if (added.count(endpoint)) continue;
        KILN_TRY(probe_rpc_server(endpoint));
        const std::string before = described;
        if (!described.empty()) described += ", ";
        described += endpoint;
        publish_rpc_servers(described);  // ggml's handshake below may already abort
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());
        if (!reg || ggml_backend_reg_dev_count(reg) == 0) {
            described = before;
            publish_rpc_servers(described);
            return Error{"--rpc-servers: " + endpoint + ": the server offers no devices"};
        }
        std::string names;
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            names += std::string(i ? ", " : "") + ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i));
        }
        described += " (" + names + ")";
        publish_rpc_servers(described);
        ggml_backend_register(reg);
        added.insert(endpoint);
    }
    return Status::Ok();
}

Result<ggml_backend_dev_t> find_device(std::string_view name) {
    const std::string wanted = ascii_lower(trim_space(name));
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ascii_lower(ggml_backend_dev_name(dev)) == wanted) return dev;
    }
    return Error{"unknown device '" + std::string(name) + "' (valid: " + join_list(registered_device_names()) + ")"};
}

}  // namespace kiln::runtime
