#include "io/tensor_convert.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace kiln::io {
namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// Types a user may ask for with --type: the plain floats and the quantized
// types ggml quantizes without an importance matrix, as stable-diffusion.cpp
// offers them.
constexpr ggml_type kSelectableTypes[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};

template <class T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Decodes `n` source values to float. Only for float and integer dtypes.
bool decode_to_f32(DType dtype, const uint8_t* src, int64_t n, float* out) {
    switch (dtype) {
        case DType::F32: std::memcpy(out, src, static_cast<size_t>(n) * 4); return true;
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) out[i] = ggml_fp16_to_fp32(load<ggml_fp16_t>(src + 2 * i));
            return true;
        case DType::BF16:
            for (int64_t i = 0; i < n; ++i) out[i] = ggml_bf16_to_fp32(load<ggml_bf16_t>(src + 2 * i));
            return true;
        case DType::F64:
            for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<double>(src + 8 * i));
            return true;
        case DType::F8_E4M3:
            for (int64_t i = 0; i < n; ++i) out[i] = f8_e4m3_to_f32(src[i]);
            return true;
        case DType::F8_E5M2:
            for (int64_t i = 0; i < n; ++i) out[i] = f8_e5m2_to_f32(src[i]);
            return true;
        default: {
            auto type = dtype_to_ggml(dtype);
            if (!type || !ggml_is_quantized(*type)) return false;
            const auto* traits = ggml_get_type_traits(*type);
            if (!traits->to_float) return false;
            traits->to_float(src, out, n);
            return true;
        }
    }
}

// ggml's quantizers work row by row with no state shared between rows, so
// rows split among threads give the bytes of one call. The K-quants' scale
// search makes a large model's conversion minutes of one core's work, so
// every core takes a share.
void quantize_rows(ggml_type target, const float* values, uint8_t* out, int64_t rows, int64_t row) {
    constexpr int64_t kWeightsPerThread = int64_t{1} << 20;  // below this a thread costs more than it saves
    const int64_t wanted = std::max<int64_t>(1, rows * row / kWeightsPerThread);
    const int64_t threads =
        std::min({wanted, rows, static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()))});
    const size_t row_bytes = ggml_row_size(target, row);
    auto quantize = [&](int64_t first, int64_t count) {
        ggml_quantize_chunk(target, values + first * row, out + static_cast<size_t>(first) * row_bytes, 0, count, row,
                            nullptr);
    };
    std::vector<std::thread> workers;
    const int64_t per_thread = (rows + threads - 1) / threads;
    for (int64_t first = per_thread; first < rows; first += per_thread) {
        workers.emplace_back(quantize, first, std::min(per_thread, rows - first));
    }
    quantize(0, std::min(per_thread, rows));
    for (std::thread& worker : workers) worker.join();
}

}  // namespace

float f8_e4m3_to_f32(uint8_t bits) {
    const bool negative = bits & 0x80;
    const int exponent = (bits >> 3) & 0xF;
    const int mantissa = bits & 0x7;
    float value;
    if (exponent == 0xF && mantissa == 0x7) {
        value = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
        value = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
    } else {
        value = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
    }
    return negative ? -value : value;
}

float f8_e5m2_to_f32(uint8_t bits) {
    // E5M2 is the upper byte of an IEEE half.
    return ggml_fp16_to_fp32(static_cast<ggml_fp16_t>(static_cast<uint16_t>(bits) << 8));
}

Result<ggml_type> parse_weight_type(std::string_view name) {
    const std::string wanted = lower(name);
    for (ggml_type type : kSelectableTypes) {
        if (lower(ggml_type_name(type)) == wanted) return type;
    }
    return Error{"--type: unknown weight type '" + std::string(name) + "' (valid: " + weight_type_names() + ")"};
}

std::string weight_type_names() {
    std::string names;
    for (ggml_type type : kSelectableTypes) {
        if (!names.empty()) names += ", ";
        names += ggml_type_name(type);
    }
    return names;
}

ggml_type compute_type(const TensorInfo& tensor, std::optional<ggml_type> requested) {
    ggml_type natural;
    switch (tensor.dtype) {
        case DType::F8_E4M3:
        case DType::F8_E5M2: natural = GGML_TYPE_F16; break;
        case DType::F64: natural = GGML_TYPE_F32; break;
        case DType::U8:
        case DType::BOOL: natural = GGML_TYPE_I32; break;
        default: natural = dtype_to_ggml(tensor.dtype).value_or(GGML_TYPE_F32); break;
    }
    if (ggml_is_quantized(natural) && !tensor.shape.empty() && tensor.shape.back() % ggml_blck_size(natural) != 0) {
        // Quantized in rows other than its own (a ComfyUI-GGUF tensor stored
        // as rows of 256, io/gguf_file.cpp): ggml cannot compute with it as
        // it is, so it is dequantized, as ComfyUI-GGUF does.
        return tensor.shape.size() < 2 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    }
    if (!dtype_is_float(tensor.dtype)) return natural;
    // Vectors (biases, norms) are tiny and sensitive: always F32.
    if (tensor.shape.size() < 2) return GGML_TYPE_F32;
    const int64_t row_size = tensor.shape.back();
    // An fp8 matrix (t5xxl_fp8_e4m3fn.safetensors) stays about a byte a
    // weight: ggml has no fp8 type, and q8_0 (8.5 bits) holds every e4m3
    // value of a 32-value block to within its 8-bit step, where F16 would
    // double the memory of the weights.
    const bool fp8 = tensor.dtype == DType::F8_E4M3 || tensor.dtype == DType::F8_E5M2;
    if (fp8 && !requested && row_size % ggml_blck_size(GGML_TYPE_Q8_0) == 0) return GGML_TYPE_Q8_0;
    if (!requested) return natural;
    if (row_size % ggml_blck_size(*requested) != 0) return natural;
    return *requested;
}

Result<std::vector<uint8_t>> convert_tensor(const TensorInfo& tensor, const uint8_t* src, ggml_type target) {
    const std::string where = "tensor '" + tensor.name + "'";
    const int64_t n = tensor.element_count();
    const auto target_bytes = dtype_byte_size(dtype_from_ggml(target), n);
    if (!target_bytes) {
        return Error{where + ": " + std::to_string(n) + " elements do not fill whole " + ggml_type_name(target) +
                     " blocks"};
    }
    if (dtype_from_ggml(target) == tensor.dtype) return std::vector<uint8_t>(src, src + tensor.nbytes);

    std::vector<uint8_t> out(*target_bytes);
    if (target == GGML_TYPE_I32) {
        if (tensor.dtype != DType::U8 && tensor.dtype != DType::BOOL) {
            return Error{where + ": cannot convert " + dtype_name(tensor.dtype) + " to I32"};
        }
        for (int64_t i = 0; i < n; ++i) {
            const int32_t v = src[i];
            std::memcpy(out.data() + 4 * i, &v, 4);
        }
        return out;
    }

    std::vector<float> values(static_cast<size_t>(n));
    if (!decode_to_f32(tensor.dtype, src, n, values.data())) {
        return Error{where + ": cannot convert " + dtype_name(tensor.dtype) + " to " + ggml_type_name(target)};
    }
    if (tensor.scale != 1.0f) {
        for (float& v : values) v *= tensor.scale;
    }
    switch (target) {
        case GGML_TYPE_F32: std::memcpy(out.data(), values.data(), out.size()); return out;
        case GGML_TYPE_F16:
            ggml_fp32_to_fp16_row(values.data(), reinterpret_cast<ggml_fp16_t*>(out.data()), n);
            return out;
        case GGML_TYPE_BF16:
            ggml_fp32_to_bf16_row(values.data(), reinterpret_cast<ggml_bf16_t*>(out.data()), n);
            return out;
        default: break;
    }
    const int64_t row = tensor.shape.empty() ? 1 : tensor.shape.back();
    if (row <= 0 || row % ggml_blck_size(target) != 0) {
        return Error{where + ": rows of " + std::to_string(row) + " do not fill whole " + ggml_type_name(target) +
                     " blocks"};
    }
    quantize_rows(target, values.data(), out.data(), n / row, row);
    return out;
}

}  // namespace kiln::io
