#include "io/dtype.h"

#include <cctype>
#include <limits>

namespace kiln::io {

DType dtype_from_ggml(ggml_type type) { return static_cast<DType>(type); }

std::optional<ggml_type> dtype_to_ggml(DType dtype) {
    const auto value = static_cast<int32_t>(dtype);
    if (value >= 0 && value < GGML_TYPE_COUNT && ggml_get_type_traits(static_cast<ggml_type>(value))->blck_size != 0) {
        return static_cast<ggml_type>(value);
    }
    return std::nullopt;
}

std::string dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F8_E4M3: return "F8_E4M3";
        case DType::F8_E5M2: return "F8_E5M2";
        case DType::U8: return "U8";
        case DType::BOOL: return "BOOL";
        default: break;
    }
    if (auto type = dtype_to_ggml(dtype)) {
        std::string name = ggml_type_name(*type);
        for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return name;
    }
    return "unknown(" + std::to_string(static_cast<int32_t>(dtype)) + ")";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
    struct Entry {
        std::string_view name;
        DType dtype;
    };
    static constexpr Entry kTable[] = {
        {"F64", DType::F64},         {"F32", DType::F32},         {"F16", DType::F16}, {"BF16", DType::BF16},
        {"F8_E4M3", DType::F8_E4M3}, {"F8_E5M2", DType::F8_E5M2}, {"I64", DType::I64}, {"I32", DType::I32},
        {"I16", DType::I16},         {"I8", DType::I8},           {"U8", DType::U8},   {"BOOL", DType::BOOL},
    };
    for (const Entry& e : kTable) {
        if (e.name == name) return e.dtype;
    }
    return std::nullopt;
}

std::optional<uint64_t> dtype_byte_size(DType dtype, int64_t elements) {
    if (elements < 0) return std::nullopt;
    const auto n = static_cast<uint64_t>(elements);
    switch (dtype) {
        case DType::F8_E4M3:
        case DType::F8_E5M2:
        case DType::U8:
        case DType::BOOL: return n;
        default: break;
    }
    auto type = dtype_to_ggml(dtype);
    if (!type) return std::nullopt;
    const uint64_t block = ggml_blck_size(*type);
    const uint64_t block_bytes = ggml_type_size(*type);
    if (n % block != 0) return std::nullopt;
    const uint64_t blocks = n / block;
    if (block_bytes != 0 && blocks > std::numeric_limits<uint64_t>::max() / block_bytes) return std::nullopt;
    return blocks * block_bytes;
}

bool dtype_is_float(DType dtype) {
    switch (dtype) {
        case DType::F64:
        case DType::F32:
        case DType::F16:
        case DType::BF16:
        case DType::F8_E4M3:
        case DType::F8_E5M2: return true;
        default: return false;
    }
}

bool dtype_is_weight(DType dtype) {
    if (dtype_is_float(dtype)) return true;
    const std::optional<ggml_type> type = dtype_to_ggml(dtype);
    return type && ggml_is_quantized(*type);
}

}  // namespace kiln::io
