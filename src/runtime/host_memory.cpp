#include "runtime/host_memory.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace kiln::runtime {
namespace {

std::atomic<uint64_t> assumed_available{0};

}  // namespace

void assume_host_available_bytes(uint64_t bytes) { assumed_available.store(bytes); }

uint64_t host_available_bytes() {
    if (const uint64_t assumed = assumed_available.load()) return assumed;
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (std::fgets(line, sizeof line, f)) {
            if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                found = true;
                break;
            }
        }
        std::fclose(f);
        if (found) return static_cast<uint64_t>(kib) * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : UINT64_MAX;
}

}  // namespace kiln::runtime
