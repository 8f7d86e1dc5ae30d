// safetensors: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and [begin, end) data offsets, then the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

// Parses the header of a safetensors file held in [data, data + size) and
// validates every entry against the file: known dtype, shape x dtype equal to
// the byte length, ranges inside the file, no two ranges overlapping, no
// duplicate names. Reads no tensor data. Errors start with `label`.
Result<ParsedFile> parse_safetensors(const uint8_t* data, size_t size, const std::string& label);

// Largest header accepted (the reference implementation's limit), so a
// corrupt length cannot make the parser allocate gigabytes.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

}  // namespace kiln::io
