// GGUF headers, read by kiln in time linear in the tensor count (ggml's
// parser compares every name with every earlier one): every ggml tensor type
// (quantized ones included) and every metadata key/value with its GGUF type,
// arrays of strings included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

// ComfyUI-GGUF's converter (city96's convert.py, its `shape_fix` archs SD1.x
// and SDXL) stores a tensor whose rows do not fill 256-value blocks as rows
// of 256, so that it can be quantized, and keeps the real shape under this
// prefix plus the tensor's name (an array of integers). parse_gguf gives the
// tensor that shape; its quantized rows then differ from its own, so
// tensor_convert's compute_type dequantizes it. kiln's writer records tensors
// of more than 4 dimensions the same way.
inline constexpr std::string_view kComfyOriginalShapeKey = "comfy.gguf.orig_shape.";

// Parses a GGUF file held in [data, data + size) without reading tensor
// data. Tensor shapes are returned outermost first (GGUF's ne[] reversed),
// of up to 8 dimensions (ggml's own parser stops at 4), with the shapes of
// kComfyOriginalShapeKey keys applied.
// Errors start with `label` and say what is wrong and where.
Result<ParsedFile> parse_gguf(const uint8_t* data, size_t size, const std::string& label);

// True when the bytes start with the GGUF magic.
bool looks_like_gguf(const uint8_t* data, size_t size);

}  // namespace kiln::io
