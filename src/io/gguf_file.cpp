#include "io/gguf_file.h"

#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

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

// Walks the GGUF header (key/value pairs, then tensor infos) before ggml's
// parser sees it. Found by tests/fuzz/fuzz_gguf (reproducers and notes in
// tests/fuzz/regressions/gguf/ and tests/fuzz/regressions/README.md).
//
// Rejects what ggml's parser would hit undefined behaviour on:
//  - a key/value, array element or tensor type outside its enum: ggml reads
//    the raw int32 into gguf_type / ggml_type and range-checks it afterwards;
//  - a file that ends inside a key/value type: ggml then compares its enum
//    still holding gguf_type(-1) (likewise an unread, uninitialised tensor type);
//  - tensor dims whose product overflows int64: ggml_nelements() multiplies
//    ne[0]*ne[1]*ne[2]*ne[3] before ggml's own overflow check.
// And what ggml accepts but kiln would misread:
//  - the same overflow when a dim is 0 (ggml skips its check for an empty
//    tensor, but TensorInfo::element_count() multiplies the dims in another
//    order and overflows);
//  - a key or tensor name with a NUL byte: ggml hands them out as C strings,
//    so "\0x" would come back as the empty key ggml itself forbids and "a\0x"
//    and "a\0y" as the same key.
// Everything else is left to ggml: the walk returns nullopt (go ahead) as soon
// as it meets something ggml rejects safely before reading further (a bad
// version or count, a truncated string or value, a nested array, more than 4
// dims, a negative dim).
class HeaderWalk {
  public:
    HeaderWalk(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    std::optional<std::string> run() {
        pos_ = 4;  // magic, checked by the caller
        uint32_t version = 0;
        int64_t n_tensors = 0, n_kv = 0;
        if (!u32(version) || !i64(n_tensors) || !i64(n_kv)) return std::nullopt;  // ggml: failed to read header
        if (version < 2 || version > GGUF_VERSION || n_tensors < 0 || n_kv < 0) return std::nullopt;

        for (int64_t k = 0; k < n_kv; ++k) {
            std::string key;
            bool key_has_nul = false;
            if (!string(key, &key_has_nul)) return std::nullopt;  // ggml stops before reading the type
            const std::string where = "key/value pair " + std::to_string(k);
            if (key_has_nul) return where + " has a key with a NUL byte in it";
            uint32_t type = 0;
            if (!u32(type)) return "file ends inside the type of " + where;
            if (type >= GGUF_TYPE_COUNT) {
                return where + " ('" + printable(key) + "') has invalid type " +
                       std::to_string(static_cast<int32_t>(type));
            }
            uint64_t n = 1;
            if (type == GGUF_TYPE_ARRAY) {
                if (!u32(type)) return std::nullopt;  // ggml: read fails, its enum still holds ARRAY
                if (type >= GGUF_TYPE_COUNT) {
                    return where + " ('" + printable(key) + "') is an array of invalid type " +
                           std::to_string(static_cast<int32_t>(type));
                }
                if (type == GGUF_TYPE_ARRAY) return std::nullopt;  // nested arrays: ggml rejects them
                if (!u64(n)) return std::nullopt;
            }
            if (!skip_values(static_cast<gguf_type>(type), n)) return std::nullopt;  // ggml: truncated value
        }

        for (int64_t t = 0; t < n_tensors; ++t) {
            std::string name;
            bool name_has_nul = false;
            if (!string(name, &name_has_nul)) return std::nullopt;
            const std::string where = "tensor '" + printable(name) + "'";
            if (name_has_nul) return "tensor " + std::to_string(t) + " has a name with a NUL byte in it";
            uint32_t n_dims = 0;
            if (!u32(n_dims)) return "file ends inside the shape of " + where;
            if (n_dims > GGML_MAX_DIMS) return std::nullopt;
            int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
            int64_t product = 1;  // of the non-zero dims
            for (uint32_t d = 0; d < n_dims; ++d) {
                if (!i64(ne[d])) return "file ends inside the shape of " + where;
                if (ne[d] < 0) return std::nullopt;
                if (ne[d] == 0) continue;
                if (product > std::numeric_limits<int64_t>::max() / ne[d]) {
                    std::string shape;
                    for (uint32_t j = 0; j < n_dims; ++j) shape += (j ? ", " : "") + std::to_string(ne[j]);
                    return where + " has shape (" + shape + "), whose element count overflows int64";
                }
                product *= ne[d];
            }
            int32_t type = 0;
            if (!i32(type)) return "file ends inside the type of " + where;
            if (type < 0 || type >= GGML_TYPE_COUNT) return where + " has invalid ggml type " + std::to_string(type);
            uint64_t offset = 0;
            if (!u64(offset)) return std::nullopt;  // ggml: failed to read tensor info
        }
        return std::nullopt;
    }

  private:
    size_t remaining() const { return size_ - pos_; }

    template <class T>
    bool read(T& out) {
        if (remaining() < sizeof(T)) return false;
        std::memcpy(&out, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return true;
    }
    bool u32(uint32_t& v) { return read(v); }
    bool i32(int32_t& v) { return read(v); }
    bool u64(uint64_t& v) { return read(v); }
    bool i64(int64_t& v) { return read(v); }

    // A length-prefixed string; `out` gets its first 64 bytes (for messages).
    bool string(std::string& out, bool* has_nul = nullptr) {
        uint64_t n = 0;
        if (!u64(n) || n > remaining()) return false;
        const char* p = reinterpret_cast<const char*>(data_ + pos_);
        out.assign(p, std::min<uint64_t>(n, 64));
        if (has_nul) *has_nul = n != 0 && std::memchr(p, 0, n) != nullptr;
        pos_ += n;
        return true;
    }

    bool skip_values(gguf_type type, uint64_t n) {
        if (type == GGUF_TYPE_STRING) {
            if (n > remaining() / sizeof(uint64_t)) return false;  // each string has at least its length
            std::string ignored;
            for (uint64_t i = 0; i < n; ++i) {
                if (!string(ignored)) return false;
            }
            return true;
        }
        const uint64_t size = value_size(type);
        if (size == 0 || n > remaining() / size) return false;
        pos_ += n * size;
        return true;
    }

    // Bytes of one value of a fixed-size gguf_type (gguf.cpp's table is internal).
    static uint64_t value_size(gguf_type type) {
        switch (type) {
            case GGUF_TYPE_UINT8:
            case GGUF_TYPE_INT8:
            case GGUF_TYPE_BOOL: return 1;
            case GGUF_TYPE_UINT16:
            case GGUF_TYPE_INT16: return 2;
            case GGUF_TYPE_UINT32:
            case GGUF_TYPE_INT32:
            case GGUF_TYPE_FLOAT32: return 4;
            case GGUF_TYPE_UINT64:
            case GGUF_TYPE_INT64:
            case GGUF_TYPE_FLOAT64: return 8;
            default: return 0;
        }
    }

    static std::string printable(const std::string& s) {
        std::string out;
        for (char c : s) out += (c >= 0x20 && c < 0x7f) ? c : '?';
        return out;
    }

    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

}  // namespace

bool looks_like_gguf(const uint8_t* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

Result<ParsedFile> parse_gguf(const uint8_t* data, size_t size, const std::string& label) {
    if (!looks_like_gguf(data, size)) return Error{label + ": not a GGUF file (no GGUF magic)"};
    if (auto reason = HeaderWalk(data, size).run()) return Error{label + ": invalid GGUF file: " + *reason};

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
        MetaValue value = type == GGUF_TYPE_ARRAY ? array_value(ctx, k) : scalar_value(ctx, k, type);
        value.gguf_type = type == GGUF_TYPE_ARRAY ? gguf_get_arr_type(ctx, k) : type;
        parsed.metadata[gguf_get_key(ctx, k)] = std::move(value);
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
        const uint64_t relative_offset = gguf_get_tensor_offset(ctx, t);
        info.offset = data_offset + relative_offset;
        info.nbytes = gguf_get_tensor_size(ctx, t);
        if (relative_offset > size || info.offset > size || info.nbytes > size - info.offset) {
            return Error{label + ": tensor '" + info.name + "' data (" + std::to_string(info.nbytes) + " bytes at " +
                         std::to_string(info.offset) + ") is out of bounds: truncated file (" + std::to_string(size) +
                         " bytes)"};
        }
        parsed.tensors.push_back(std::move(info));
    }
    return parsed;
}

}  // namespace kiln::io
