// Conversion of file dtypes to what ggml computes with, one tensor at a time
// (never a whole file): F32/F16/BF16 and quantized types pass through; F8
// (E4M3, E5M2) widens to F16 exactly, since ggml has no F8 compute type; F64
// narrows to F32; U8/BOOL widen to I32. An optional target type (--type)
// re-quantises float weight matrices with ggml's quantize functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tensor_info.h"
#include "util/result.h"

namespace kiln::io {

// Parses a --type value: f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, q2_K,
// q3_K, q4_K, q5_K, q6_K, ... (case-insensitive). Error lists the valid names.
Result<ggml_type> parse_weight_type(std::string_view name);
// The names parse_weight_type accepts, comma-separated.
std::string weight_type_names();

// The ggml type `tensor` is held in for compute. Float vectors (biases,
// norms) are always F32: they are tiny, and ggml's element-wise ops want F32.
// With `requested`, float tensors of two or more dimensions whose rows fill
// whole quantization blocks take the requested type; odd-sized rows keep
// their plain float type. A quantized tensor whose rows do not fill its
// blocks (stored in other rows: ComfyUI-GGUF's reshaped tensors) is
// dequantized to F16 (F32 for vectors).
ggml_type compute_type(const TensorInfo& tensor, std::optional<ggml_type> requested = std::nullopt);

// Converts the tensor's bytes (`tensor.nbytes` at `src`) to `target`. Errors
// name the tensor when the conversion is impossible (e.g. quantized to a
// different quantized type).
Result<std::vector<uint8_t>> convert_tensor(const TensorInfo& tensor, const uint8_t* src, ggml_type target);

// Exact decoders for the two 8-bit float formats (E4M3 is the "fn" variant:
// no infinities, 0x7f/0xff are NaN).
float f8_e4m3_to_f32(uint8_t bits);
float f8_e5m2_to_f32(uint8_t bits);

}  // namespace kiln::io
