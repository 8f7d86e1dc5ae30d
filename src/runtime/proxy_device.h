// A ggml device that is another device in every way but the rules it is
// given. ggml has no hook for either rule kiln needs, so kiln hands ggml this
// proxy instead of the device:
// - `kiln rpc-server --max-alloc`: ggml's RPC server allocates whatever size
//   a client's ALLOC_BUFFER request names (a 9-byte header can ask for
//   4 GiB) and its only entry point, ggml_backend_rpc_start_server, takes
//   devices but no limit. A refused buffer reaches the client as a failed
//   allocation, which kiln reports as out of memory.
// - The BLAS backend on the CPU declines thin matrix products, which
//   ggml-cpu computes faster (runtime/blas_device.h): ggml's scheduler gives
//   an op to the first backend whose device supports it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml-backend.h"

namespace kiln::runtime {

struct ProxyRules {
    // The largest buffer the proxy's buffer type allocates (its reported max
    // size is the smaller of this and the device's).
    size_t max_alloc = SIZE_MAX;
    // Non-zero: the free and total memory the device reports (kiln
    // rpc-server --mem); allocations still come from the real device.
    size_t reported_memory = 0;
    // Ops the proxy declines although the device supports them; null: none.
    bool (*declines_op)(const ggml_tensor* op) = nullptr;
};

// The proxy of `device` under `rules`. It lives until the process ends, as
// ggml's device pointers do.
ggml_backend_dev_t proxy_device(ggml_backend_dev_t device, const ProxyRules& rules);

}  // namespace kiln::runtime
