// GGUF headers, read by kiln in time linear in the tensor count (ggml's
// parser compares every name with every earlier one): every ggml tensor type
// (quantized ones included) and every metadata key/value with its GGUF type,
// arrays of strings included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

// Parses a GGUF file held in [data, data + size) without reading tensor
// data. Tensor shapes are returned outermost first (GGUF's ne[] reversed).
// Errors start with `label` and say what is wrong and where.
Result<ParsedFile> parse_gguf(const uint8_t* data, size_t size, const std::string& label);

// True when the bytes start with the GGUF magic.
bool looks_like_gguf(const uint8_t* data, size_t size);

}  // namespace kiln::io
