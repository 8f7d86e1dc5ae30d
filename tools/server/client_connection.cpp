#include "client_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln::server {
namespace {

// The address and port of a socket address, as httplib writes them
// ("127.0.0.1", "::1"); false for other families.
bool address_of(const sockaddr_storage& addr, std::string* ip, int* port) {
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
        if (!inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) return false;
        *port = ntohs(in->sin_port);
    } else if (addr.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
        if (!inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text)) return false;
        *port = ntohs(in6->sin6_port);
    } else {
        return false;
    }
    *ip = text;
    return true;
}

bool matches(int fd, const httplib::Request& request) {
    sockaddr_storage peer{}, local{};
    socklen_t peer_size = sizeof peer, local_size = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0) {
        return false;
    }
    std::string peer_ip, local_ip;
    int peer_port = 0, local_port = 0;
    return address_of(peer, &peer_ip, &peer_port) && address_of(local, &local_ip, &local_port) &&
           peer_port == request.remote_port && local_port == request.local_port && peer_ip == request.remote_addr &&
           local_ip == request.local_addr;
}

}  // namespace

std::optional<ClientConnection> ClientConnection::of(const httplib::Request& request) {
    if (request.remote_port <= 0 || request.local_port <= 0) return std::nullopt;
    DIR* fds = opendir("/proc/self/fd");
    if (!fds) return std::nullopt;
    std::optional<ClientConnection> found;
    while (const dirent* entry = readdir(fds)) {
        char* end = nullptr;
        const long fd = std::strtol(entry->d_name, &end, 10);
        if (end == entry->d_name || *end != '\0' || fd == dirfd(fds)) continue;
        struct stat st {};
        if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        if (matches(static_cast<int>(fd), request)) {
            found = ClientConnection(static_cast<int>(fd));
            break;
        }
    }
    closedir(fds);
    return found;
}

bool ClientConnection::gone() const {
    pollfd p{fd_, POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kiln::server
