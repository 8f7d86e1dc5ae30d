// Whether the client of a request is still there. A synchronous request
// (A1111's txt2img, OpenAI's generations) waits for its job; when its
// client goes away the job should not run on for nobody. cpp-httplib 0.11
// gives a handler no socket, so the connection is found among the
// process's sockets by its two addresses (the request's remote and local
// address and port), and is asked with poll() whether the peer closed it.
// The socket stays open while the handler runs: the connection's thread is
// the one waiting in it.
#pragma once

#include <httplib.h>

#include <optional>

namespace kiln::server {

class ClientConnection {
  public:
    // The request's connection; nullopt when it cannot be found (then the
    // caller simply cannot tell, and waits as before).
    static std::optional<ClientConnection> of(const httplib::Request& request);

    // True once the peer has closed or reset the connection (POLLRDHUP,
    // POLLHUP, POLLERR). A client that only shut down its sending side
    // counts as gone: HTTP clients do not do that while they wait.
    bool gone() const;

  private:
    explicit ClientConnection(int fd) : fd_(fd) {}
    int fd_;
};

}  // namespace kiln::server
