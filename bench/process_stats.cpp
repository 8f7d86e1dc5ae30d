#include "process_stats.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace kiln::bench {

uint64_t peak_rss_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmHWM:", 0) != 0) continue;
        std::istringstream fields(line.substr(6));
        uint64_t kib = 0;
        fields >> kib;
        return kib * 1024;
    }
    return 0;
}

double seconds_since_process_start() {
    std::ifstream file("/proc/self/stat");
    std::string stat;
    std::getline(file, stat);
    // The command name (field 2) may hold spaces and parentheses: count
    // fields from the last ')'. Field 22 is the start time in clock ticks
    // after boot.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    for (int index = 3; index < 22 && fields >> field; ++index) {
    }
    unsigned long long start_ticks = 0;
    if (!(fields >> start_ticks)) return -1;
    timespec now{};
    if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
    const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double since_boot = static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
    return since_boot - static_cast<double>(start_ticks) / ticks_per_second;
}

}  // namespace kiln::bench
