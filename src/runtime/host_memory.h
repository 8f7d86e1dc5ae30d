// How much memory this machine can still give: the limit a CPU compute
// buffer is checked against before ggml tries (and fails) to allocate it.
#pragma once

#include <cstdint>

namespace kiln::runtime {

// MemAvailable from /proc/meminfo (free memory plus reclaimable cache), or
// the free physical pages when that is unreadable; or the bytes
// assume_host_available_bytes set.
uint64_t host_available_bytes();

// kiln plan --ram: from now on, this process plans as if `bytes` of RAM
// were available (a machine it does not run on): placement's RAM rule and
// the CPU's books both read it. Process-wide, so only a process that runs no
// job may set it. 0: this machine's again.
void assume_host_available_bytes(uint64_t bytes);

}  // namespace kiln::runtime
