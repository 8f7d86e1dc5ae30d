#include "io/gguf_file.h"

#include <cstring>
#include <memory>
#include <mutex>

#include "gguf.h"

namespace kiln::io {
namespace {

// ggml's gguf parser explains failures only through the ggml log. While it
// parses, the log is redirected here so the reason ends up in the Error.
struct GgmlLogCapture {
    std::string text;
    ggml_log_callback previous_callback = nullptr;
    void* previous_user_data = nullptr;

    GgmlLogCapture() {
        ggml_log_get(&previous_callback, &previous_user_data);
        ggml_log_set(
            [](ggml_log_level level, const char* message, void* user_data) {
                if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
                    auto* self = static_cast<GgmlLogCapture*>(user_data);
                    if (self->text.empty()) self->text = message;  // the first line is the cause
                }
            },
            this);
    }
    ~GgmlLogCapture() { ggml_log_set(previous_callback, previous_user_data); }

    // "gguf_init_from_reader: tensor 'x' ...\n" -> "tensor 'x' ..."
    std::string reason() const {
        std::string r = text;
        const auto colon = r.find(": ");
        if (colon != std::string::npos && r.compare(0, 5, "gguf_") == 0) r = r.substr(colon + 2);
        while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
        return r;
    }
};
std::mutex g_gguf_parse_mutex;  // the log redirection is process-wide

MetaValue scalar_value(const gguf_context* ctx, int64_t key, gguf_type type) {
    switch (type) {
        case GGUF_TYPE_UINT8: return MetaValue::of_uint(gguf_get_val_u8(ctx, key));
        case GGUF_TYPE_INT8: return MetaValue::of_int(gguf_get_val_i8(ctx, key));
        case GGUF_TYPE_UINT16: return MetaValue::of_uint(gguf_get_val_u16(ctx, key));
        case GGUF_TYPE_INT16: return MetaValue::of_int(gguf_get_val_i16(ctx, key));
        case GGUF_TYPE_UINT32: return MetaValue::of_uint(gguf_get_val_u32(ctx, key));
        case GGUF_TYPE_INT32: return MetaValue::of_int(gguf_get_val_i32(ctx, key));
        case GGUF_TYPE_FLOAT32: return MetaValue::of_float(gguf_get_val_f32(ctx, key));
        case GGUF_TYPE_UINT64: return MetaValue::of_uint(gguf_get_val_u64(ctx, key));
        case GGUF_TYPE_INT64: return MetaValue::of_int(gguf_get_val_i64(ctx, key));
        case GGUF_TYPE_FLOAT64: return MetaValue::of_float(gguf_get_val_f64(ctx, key));
        case GGUF_TYPE_BOOL: return MetaValue::of_bool(gguf_get_val_bool(ctx, key));
        case GGUF_TYPE_STRING: return MetaValue::of_string(gguf_get_val_str(ctx, key));
        default: return MetaValue::of_string("<unsupported gguf type>");
    }
}

template <class T>
T element(const void* base, size_t i) {
    T v;
    std::memcpy(&v, static_cast<const uint8_t*>(base) + i * sizeof(T), sizeof(T));
    return v;
}

MetaValue array_value(const gguf_context* ctx, int64_t key) {
    MetaValue out;
    out.kind = MetaValue::Kind::Array;
    const gguf_type type = gguf_get_arr_type(ctx, key);
    const size_t n = gguf_get_arr_n(ctx, key);
    if (type == GGUF_TYPE_STRING) {
        for (size_t i = 0; i < n; ++i) out.array.push_back(MetaValue::of_string(gguf_get_arr_str(ctx, key, i)));
        return out;
    }
    if (type == GGUF_TYPE_ARRAY) return out;  // nested arrays: ggml rejects them at parse time
    const void* data = gguf_get_arr_data(ctx, key);
    out.array.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        switch (type) {
            case GGUF_TYPE_UINT8: out.array.push_back(MetaValue::of_uint(element<uint8_t>(data, i))); break;
            case GGUF_TYPE_INT8: out.array.push_back(MetaValue::of_int(element<int8_t>(data, i))); break;
            case GGUF_TYPE_UINT16: out.array.push_back(MetaValue::of_uint(element<uint16_t>(data, i))); break;
            case GGUF_TYPE_INT16: out.array.push_back(MetaValue::of_int(element<int16_t>(data, i))); break;
            case GGUF_TYPE_UINT32: out.array.push_back(MetaValue::of_uint(element<uint32_t>(data, i))); break;
            case GGUF_TYPE_INT32: out.array.push_back(MetaValue::of_int(element<int32_t>(data, i))); break;
            case GGUF_TYPE_FLOAT32: out.array.push_back(MetaValue::of_float(element<float>(data, i))); break;
            case GGUF_TYPE_UINT64: out.array.push_back(MetaValue::of_uint(element<uint64_t>(data, i))); break;
            case GGUF_TYPE_INT64: out.array.push_back(MetaValue::of_int(element<int64_t>(data, i))); break;
            case GGUF_TYPE_FLOAT64: out.array.push_back(MetaValue::of_float(element<double>(data, i))); break;
            case GGUF_TYPE_BOOL: out.array.push_back(MetaValue::of_bool(element<int8_t>(data, i) != 0)); break;
            default: break;
        }
    }
    return out;
}

}  // namespace

bool looks_like_gguf(const uint8_t* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

Result<ParsedFile> parse_gguf(const uint8_t* data, size_t size, const std::string& label) {
    if (!looks_like_gguf(data, size)) return Error{label + ": not a GGUF file (no GGUF magic)"};

    gguf_context* ctx = nullptr;
    std::string reason;
    {
        std::lock_guard<std::mutex> lock(g_gguf_parse_mutex);
        GgmlLogCapture capture;
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
        ctx = gguf_init_from_buffer(data, size, params);
        reason = capture.reason();
    }
    if (!ctx) return Error{label + ": invalid GGUF file: " + (reason.empty() ? "ggml's parser rejected it" : reason)};
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> guard(ctx, gguf_free);

    ParsedFile parsed;
    parsed.format = FileFormat::Gguf;
    const int64_t n_kv = gguf_get_n_kv(ctx);
    for (int64_t k = 0; k < n_kv; ++k) {
        const gguf_type type = gguf_get_kv_type(ctx, k);
        parsed.metadata[gguf_get_key(ctx, k)] =
            type == GGUF_TYPE_ARRAY ? array_value(ctx, k) : scalar_value(ctx, k, type);
    }

    const uint64_t data_offset = gguf_get_data_offset(ctx);
    const int64_t n_tensors = gguf_get_n_tensors(ctx);
    for (int64_t t = 0; t < n_tensors; ++t) {
        TensorInfo info;
        info.name = gguf_get_tensor_name(ctx, t);
        const ggml_type type = gguf_get_tensor_type(ctx, t);
        info.dtype = dtype_from_ggml(type);
        const int64_t* ne = gguf_get_tensor_ne(ctx, t);
        int dims = GGML_MAX_DIMS;
        while (dims > 1 && ne[dims - 1] == 1) --dims;
        for (int d = dims - 1; d >= 0; --d) info.shape.push_back(ne[d]);
        info.offset = data_offset + gguf_get_tensor_offset(ctx, t);
        info.nbytes = gguf_get_tensor_size(ctx, t);
        if (info.offset > size || info.nbytes > size - info.offset) {
            return Error{label + ": tensor '" + info.name + "' data (" + std::to_string(info.nbytes) + " bytes at " +
                         std::to_string(info.offset) + ") is out of bounds: truncated file (" + std::to_string(size) +
                         " bytes)"};
        }
        parsed.tensors.push_back(std::move(info));
    }
    return parsed;
}

}  // namespace kiln::io
