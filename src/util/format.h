// Small text formatting helpers for reports and messages.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// "1.72 GiB", "12.0 KiB", "512 B".
std::string human_bytes(uint64_t bytes);
// "123,456,789".
std::string grouped(uint64_t value);

}  // namespace kiln
