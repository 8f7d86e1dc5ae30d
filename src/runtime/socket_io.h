// Whole-buffer I/O on a connected socket, as ggml's RPC protocol needs it:
// short reads and writes continue, EINTR retries, and a write to a closed
// peer fails instead of raising SIGPIPE (MSG_NOSIGNAL).
#pragma once

#include <cstddef>

namespace kiln::runtime {

// False when the peer closed or the socket failed before all was sent or read.
bool send_all(int fd, const void* data, size_t size);
bool recv_all(int fd, void* data, size_t size);

}  // namespace kiln::runtime
