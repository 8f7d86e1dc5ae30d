// Small text formatting helpers for reports and messages.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// "1.72 GiB", "12.0 KiB", "512 B".
std::string human_bytes(uint64_t bytes);
// "123,456,789".
std::string grouped(uint64_t value);
// "0.5", "0.75", "1e+39": the shortest form that reads back as the same
// float, as A1111 prints parameters.
std::string format_number(float value);

}  // namespace kiln
