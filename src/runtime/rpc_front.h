// A front for ggml's RPC server that reads each message's header before
// ggml does. ggml's server sizes its input buffer from the header's 8-byte
// length and zero-fills it while it waits for the bytes: a 17-byte header
// that claims 3 GB took 3 GB of memory, whatever --max-alloc said. The
// front listens where clients connect, relays each connection to ggml's
// server on a loopback port of its own, and closes a connection whose
// message claims more than the limit before anything is allocated for it.
//
// The check itself, on the client's bytes, is rpc_message_guard.h's (it
// also zeroes HELLO's transport capabilities, so that ggml does not try to
// move the connection off the socket it relays). Answers, server to
// client, are relayed as they are.
#pragma once

#include <cstdint>
#include <string>

#include "util/result.h"

namespace kiln::runtime {

// The most a message may claim: the largest buffer a client may set
// (--max-alloc) plus its tensor's description. Commands and graphs are far smaller.
uint64_t rpc_message_limit(uint64_t max_alloc);

// Listens on host:port (the socket is bound before it returns, so a port
// in use is an error here) and relays every client to ggml's server at
// 127.0.0.1:backend_port from a thread of its own, refusing messages over
// `message_limit`. Runs until the process ends.
Status start_rpc_front(const std::string& host, int port, int backend_port, uint64_t message_limit);

}  // namespace kiln::runtime
