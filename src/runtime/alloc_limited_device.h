// A ggml device that is another device in every way but one: its buffer
// type refuses any buffer larger than a limit. `kiln rpc-server --max-alloc`
// serves this proxy, because ggml's RPC server allocates whatever size a
// client's ALLOC_BUFFER request names (a 9-byte header can ask for 4 GiB)
// and its only entry point, ggml_backend_rpc_start_server, takes devices but
// no limit. A refused buffer reaches the client as a failed allocation, which
// kiln reports as out of memory.
#pragma once

#include <cstddef>

#include "ggml-backend.h"

namespace kiln::runtime {

// The proxy of `device` whose buffers may be at most `max_alloc` bytes (its
// reported max buffer size is the smaller of that and the device's). It
// lives until the process ends, as ggml's device pointers do.
ggml_backend_dev_t alloc_limited_device(ggml_backend_dev_t device, size_t max_alloc);

}  // namespace kiln::runtime
