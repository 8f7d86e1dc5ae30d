// Serving one of this machine's devices to other processes over ggml's RPC
// protocol (`kiln rpc-server`), and the device table `kiln --list-devices`
// prints.
#pragma once

#include <string>

#include "util/result.h"

namespace kiln::runtime {

struct RpcServeOptions {
    std::string host = "127.0.0.1";
    int port = 50052;
    std::string device = "CPU";  // a ggml device name
    int threads = 0;             // <= 0: every core
    // --max-alloc: the largest buffer a client may allocate, as for
    // --max-vram ("2G", "512M"); empty: the device's total memory.
    std::string max_alloc;
    // --mem: the memory the device reports to clients as free and total
    // ("32G"), so they plan for a device of that size (kiln plan of a card
    // this machine does not have); each buffer still comes from the device.
    // Empty: the device's own.
    std::string reported_memory;
    // -c / --cache-dir: where ggml's RPC server keeps the large tensors
    // clients send, by hash, so a client's next upload of one sends the hash
    // alone; made when missing. Empty: no cache.
    std::string cache_dir;
};

// Serves until the process ends; returns only on failure. Errors: an
// unknown device (invalid request), a port that cannot be bound. Any
// address but loopback logs a warning: the protocol has no authentication.
// A client that closes early costs only its connection (SIGPIPE ignored).
// A buffer over max_alloc is refused (proxy_device.h), and so is a message
// that claims more, before anything is allocated for it (rpc_front.h). A
// bad max_alloc or reported_memory is an invalid request.
Status serve_rpc(const RpcServeOptions& options);

// One line per ggml device: name, type, free and total memory, description.
std::string device_table();

}  // namespace kiln::runtime
