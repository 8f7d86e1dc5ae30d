// How much memory this machine can still give: the limit a CPU compute
// buffer is checked against before ggml tries (and fails) to allocate it.
#pragma once

#include <cstdint>

namespace kiln::runtime {

// MemAvailable from /proc/meminfo (free memory plus reclaimable cache), or
// the free physical pages when that is unreadable.
uint64_t host_available_bytes();

}  // namespace kiln::runtime
