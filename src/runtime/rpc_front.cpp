#include "runtime/rpc_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/rpc_message_guard.h"
#include "runtime/socket_io.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::runtime {
namespace {

constexpr uint64_t kDescriptionBytes = 1 << 20;  // a tensor's description and offsets beside its data

// ggml's server at 127.0.0.1:port, or -1. It may still be starting when
// the first client comes: a few tries, each after a pause.
int connect_backend(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int attempt = 0; attempt < 50; ++attempt) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        ::close(fd);
        ::usleep(100 * 1000);
    }
    return -1;
}

// Client to server: each piece through the guard, then on to ggml. Adds
// the bytes received to `received`.
void relay_requests(int client, int backend, uint64_t limit, const std::string& peer, uint64_t& received) {
    uint8_t buffer[1 << 16];
    RpcMessageGuard guard(limit);
    for (;;) {
        const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        received += static_cast<uint64_t>(n);
        const size_t allowed = guard.feed(buffer, static_cast<size_t>(n));
        if (allowed > 0 && !send_all(backend, buffer, allowed)) return;
        if (const auto& refused = guard.refused()) {
            KILN_LOG_WARN(
                "rpc-server: %s sent command %u claiming %s, over the limit of %s (--max-alloc); connection closed",
                peer.c_str(), static_cast<unsigned>(refused->command), human_bytes(refused->claimed).c_str(),
                human_bytes(limit).c_str());
            return;
        }
    }
}

// Server to client, as it comes; adds the bytes sent to `sent`.
void relay_answers(int backend, int client, uint64_t* sent) {
    uint8_t buffer[1 << 16];
    for (;;) {
        const ssize_t n = ::recv(backend, buffer, sizeof buffer, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || !send_all(client, buffer, static_cast<size_t>(n))) break;
        *sent += static_cast<uint64_t>(n);
    }
    // Nothing more can reach the client: end its side too, which also ends
    // the requests' relay if ggml hung up first.
    ::shutdown(client, SHUT_RDWR);
}

void serve_connection(int client, int backend_port, uint64_t limit, std::string peer) {
    const int backend = connect_backend(backend_port);
    if (backend < 0) {
        KILN_LOG_ERROR("rpc-server: cannot reach ggml's server on 127.0.0.1:%d for %s", backend_port, peer.c_str());
        ::close(client);
        return;
    }
    uint64_t received = 0, sent = 0;
    std::thread answers(relay_answers, backend, client, &sent);
    relay_requests(client, backend, limit, peer, received);
    // The client is gone or refused: ggml reads the end of its requests,
    // answers those before it and closes, which ends the answers' relay.
    ::shutdown(backend, SHUT_WR);
    answers.join();
    // What a connection cost the network (a client's second job sends less
    // when the tensor cache has its weights).
    KILN_LOG_INFO("rpc-server: %s disconnected; received %s, sent %s", peer.c_str(), human_bytes(received).c_str(),
                  human_bytes(sent).c_str());
    ::close(backend);
    ::close(client);
}

}  // namespace

uint64_t rpc_message_limit(uint64_t max_alloc) {
    return max_alloc > UINT64_MAX - kDescriptionBytes ? UINT64_MAX : max_alloc + kDescriptionBytes;
}

Status start_rpc_front(const std::string& host, int port, int backend_port, uint64_t message_limit) {
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return Error{std::string("cannot create a socket: ") + std::strerror(errno)};
    const int one = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, SOMAXCONN) != 0) {
        const int err = errno;
        ::close(listener);
        return Error{"--port: cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(err)};
    }
    std::thread([listener, backend_port, message_limit] {
        for (;;) {
            sockaddr_in from{};
            socklen_t length = sizeof from;
            const int client = ::accept4(listener, reinterpret_cast<sockaddr*>(&from), &length, SOCK_CLOEXEC);
            if (client < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                if (errno == EMFILE || errno == ENFILE) {  // out of descriptors: let connections end first
                    ::usleep(100 * 1000);
                    continue;
                }
                KILN_LOG_ERROR("rpc-server: accept failed: %s", std::strerror(errno));
                return;
            }
            const int nodelay = 1;  // answers are small: send them at once
            ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
            char ip[INET_ADDRSTRLEN] = "?";
            ::inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
            const std::string peer = std::string(ip) + ":" + std::to_string(ntohs(from.sin_port));
            std::thread(serve_connection, client, backend_port, message_limit, peer).detach();
        }
    }).detach();
    return Status::Ok();
}

}  // namespace kiln::runtime
