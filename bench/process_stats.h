// What the kernel knows about this process: its peak resident memory and
// how long ago it started (exec included, so dynamic loading counts too).
#pragma once

#include <cstdint>

namespace kiln::bench {

// VmHWM from /proc/self/status: the peak resident set size so far, in bytes
// (0 when unreadable).
uint64_t peak_rss_bytes();

// Seconds since the process started, from /proc/self/stat's start time
// (clock-tick resolution, 10 ms on Linux) and CLOCK_BOOTTIME; negative when
// unreadable.
double seconds_since_process_start();

}  // namespace kiln::bench
