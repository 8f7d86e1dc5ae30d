// Element types of tensors in model files. The ggml types keep their ggml
// values (so every quantized GGUF type is a DType); the four types that
// safetensors/PyTorch files have and ggml does not get values of their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ggml.h"

namespace kiln::io {

enum class DType : int32_t {
    F32 = GGML_TYPE_F32,
    F16 = GGML_TYPE_F16,
    BF16 = GGML_TYPE_BF16,
    F64 = GGML_TYPE_F64,
    I8 = GGML_TYPE_I8,
    I16 = GGML_TYPE_I16,
    I32 = GGML_TYPE_I32,
    I64 = GGML_TYPE_I64,
    // Not ggml types.
    F8_E4M3 = 0x1000,
    F8_E5M2,
    U8,
    BOOL,
};

DType dtype_from_ggml(ggml_type type);
// The ggml type with the same layout, if ggml has one.
std::optional<ggml_type> dtype_to_ggml(DType dtype);
// "F32", "BF16", "F8_E4M3", "Q4_K", ...
std::string dtype_name(DType dtype);
// Parses a safetensors dtype string ("F16", "BOOL", ...); nullopt if unknown.
std::optional<DType> dtype_from_safetensors(std::string_view name);
// Bytes needed for `elements` values; nullopt if the count does not fill
// whole quantization blocks or the size overflows.
std::optional<uint64_t> dtype_byte_size(DType dtype, int64_t elements);
bool dtype_is_float(DType dtype);
// Whether a network can compute with weights of this dtype: floating point
// (widened or narrowed to a compute type) or a ggml quantized type. Integer
// and boolean dtypes are not weights ggml's matrix and element-wise kernels
// take.
bool dtype_is_weight(DType dtype);

}  // namespace kiln::io
