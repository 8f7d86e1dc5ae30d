#include "io/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "gguf.h"
#include "io/gguf_file.h"
#include "io/tensor_convert.h"
#include "util/format.h"

namespace kiln::io {
namespace {

// One scalar with the GGUF type it was read as; values from other formats
// (safetensors' strings, kiln's own keys) take the widest type of their kind.
void set_scalar(gguf_context* ctx, const char* key, const MetaValue& v) {
    const double f = v.f;
    const int64_t i = v.kind == MetaValue::Kind::UInt ? static_cast<int64_t>(v.u) : v.i;
    const uint64_t u = v.kind == MetaValue::Kind::Int ? static_cast<uint64_t>(v.i) : v.u;
    switch (v.gguf_type) {
        case GGUF_TYPE_UINT8: gguf_set_val_u8(ctx, key, static_cast<uint8_t>(u)); return;
        case GGUF_TYPE_INT8: gguf_set_val_i8(ctx, key, static_cast<int8_t>(i)); return;
        case GGUF_TYPE_UINT16: gguf_set_val_u16(ctx, key, static_cast<uint16_t>(u)); return;
        case GGUF_TYPE_INT16: gguf_set_val_i16(ctx, key, static_cast<int16_t>(i)); return;
        case GGUF_TYPE_UINT32: gguf_set_val_u32(ctx, key, static_cast<uint32_t>(u)); return;
        case GGUF_TYPE_INT32: gguf_set_val_i32(ctx, key, static_cast<int32_t>(i)); return;
        case GGUF_TYPE_FLOAT32: gguf_set_val_f32(ctx, key, static_cast<float>(f)); return;
        case GGUF_TYPE_UINT64: gguf_set_val_u64(ctx, key, u); return;
        case GGUF_TYPE_INT64: gguf_set_val_i64(ctx, key, i); return;
        case GGUF_TYPE_FLOAT64: gguf_set_val_f64(ctx, key, f); return;
        default: break;
    }
    switch (v.kind) {
        case MetaValue::Kind::String: gguf_set_val_str(ctx, key, v.str.c_str()); return;
        case MetaValue::Kind::Int: gguf_set_val_i64(ctx, key, v.i); return;
        case MetaValue::Kind::UInt: gguf_set_val_u64(ctx, key, v.u); return;
        case MetaValue::Kind::Float: gguf_set_val_f64(ctx, key, v.f); return;
        case MetaValue::Kind::Bool: gguf_set_val_bool(ctx, key, v.b); return;
        case MetaValue::Kind::Array: return;  // not a scalar
    }
}

template <class T>
void append(std::vector<uint8_t>& bytes, T value) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// The elements of a numeric array in `type`'s encoding; false if `type` is no
// fixed-size numeric type.
bool encode_array(const MetaValue& array, int type, std::vector<uint8_t>& bytes) {
    for (const MetaValue& v : array.array) {
        const int64_t i = v.kind == MetaValue::Kind::UInt ? static_cast<int64_t>(v.u) : v.i;
        const uint64_t u = v.kind == MetaValue::Kind::Int ? static_cast<uint64_t>(v.i) : v.u;
        switch (type) {
            case GGUF_TYPE_UINT8: append(bytes, static_cast<uint8_t>(u)); break;
            case GGUF_TYPE_INT8: append(bytes, static_cast<int8_t>(i)); break;
            case GGUF_TYPE_UINT16: append(bytes, static_cast<uint16_t>(u)); break;
            case GGUF_TYPE_INT16: append(bytes, static_cast<int16_t>(i)); break;
            case GGUF_TYPE_UINT32: append(bytes, static_cast<uint32_t>(u)); break;
            case GGUF_TYPE_INT32: append(bytes, static_cast<int32_t>(i)); break;
            case GGUF_TYPE_FLOAT32: append(bytes, static_cast<float>(v.f)); break;
            case GGUF_TYPE_UINT64: append(bytes, u); break;
            case GGUF_TYPE_INT64: append(bytes, i); break;
            case GGUF_TYPE_FLOAT64: append(bytes, v.f); break;
            case GGUF_TYPE_BOOL: append(bytes, static_cast<int8_t>(v.b ? 1 : 0)); break;
            default: return false;
        }
    }
    return true;
}

// Every key with its value and type. ggml aborts on an empty key and on
// general.alignment of any type but a power-of-two u32, so those are checked
// here and refused with the key named.
Status copy_metadata(gguf_context* ctx, const Metadata& metadata, const std::string& path) {
    for (const auto& [key, value] : metadata) {
        if (key.empty() || key.find('\0') != std::string::npos) {
            return Error{path + ": metadata key '" + escaped(key) + "' cannot be written to GGUF (empty or NUL)"};
        }
        if (key == GGUF_KEY_GENERAL_ALIGNMENT) {
            const bool integral = value.kind == MetaValue::Kind::UInt || value.kind == MetaValue::Kind::Int;
            const uint64_t a = value.kind == MetaValue::Kind::UInt ? value.u : static_cast<uint64_t>(value.i);
            if (!integral || a == 0 || a > UINT32_MAX || (a & (a - 1)) != 0) {
                return Error{path + ": metadata key " GGUF_KEY_GENERAL_ALIGNMENT " must be a power of two (u32), got " +
                             value.to_string()};
            }
            gguf_set_val_u32(ctx, key.c_str(), static_cast<uint32_t>(a));
            continue;
        }
        if (value.kind != MetaValue::Kind::Array) {
            set_scalar(ctx, key.c_str(), value);
            continue;
        }
        bool all_strings = true;
        for (const MetaValue& v : value.array) all_strings = all_strings && v.kind == MetaValue::Kind::String;
        if (value.gguf_type == GGUF_TYPE_STRING || (value.gguf_type < 0 && all_strings && !value.array.empty())) {
            std::vector<const char*> items;
            for (const MetaValue& v : value.array) items.push_back(v.str.c_str());
            gguf_set_arr_str(ctx, key.c_str(), items.data(), items.size());
            continue;
        }
        std::vector<uint8_t> bytes;
        if (value.gguf_type >= 0 && encode_array(value, value.gguf_type, bytes)) {
            gguf_set_arr_data(ctx, key.c_str(), static_cast<gguf_type>(value.gguf_type), bytes.data(),
                              value.array.size());
        } else {
            // Mixed arrays from other formats have no GGUF type: kept as text.
            gguf_set_val_str(ctx, key.c_str(), value.to_string(SIZE_MAX).c_str());
        }
    }
    return Status::Ok();
}

}  // namespace

Status write_gguf(const ModelFile& model, const std::string& path, const GgufWriteOptions& options) {
    const auto& tensors = model.tensors();
    for (const TensorInfo& t : tensors) {
        if (t.name.size() >= GGML_MAX_NAME) {
            return Error{"tensor '" + t.name + "': name longer than GGUF allows (" + std::to_string(GGML_MAX_NAME - 1) +
                         " bytes)"};
        }
    }

    // Tensor descriptions only (no_alloc): the data is streamed after the header.
    ggml_init_params params{ggml_tensor_overhead() * (tensors.size() + 1), nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, void (*)(ggml_context*)> meta_ctx(ggml_init(params), ggml_free);
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> gguf(gguf_init_empty(), gguf_free);
    if (!meta_ctx || !gguf) return Error{path + ": out of memory preparing the GGUF header"};
    // Shapes recorded under kComfyOriginalShapeKey were applied when the
    // model was read; the tensors are written in those shapes.
    Metadata own = model.metadata();
    for (auto it = own.begin(); it != own.end();) {
        it = it->first.compare(0, kComfyOriginalShapeKey.size(), kComfyOriginalShapeKey) == 0 ? own.erase(it)
                                                                                              : std::next(it);
    }
    KILN_TRY(copy_metadata(gguf.get(), own, path));
    KILN_TRY(copy_metadata(gguf.get(), options.extra_metadata, path));

    std::vector<ggml_type> types;
    for (const TensorInfo& t : tensors) {
        const std::optional<size_t> rule = options.rules.match({t.name});
        const ggml_type type = compute_type(t, rule ? options.rules.type(*rule) : options.type);
        // ggml tensors have at most 4 dimensions: a deeper one (a 3-D
        // convolution's 5-D kernel) keeps its inner three and folds the rest
        // into the fourth, its shape recorded as ComfyUI-GGUF records one.
        int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
        for (size_t d = 0; d < t.shape.size(); ++d) {
            ne[std::min<size_t>(d, GGML_MAX_DIMS - 1)] *= t.shape[t.shape.size() - 1 - d];
        }
        if (t.shape.size() > GGML_MAX_DIMS) {
            std::vector<int32_t> shape;
            for (int64_t d : t.shape) {
                if (d > INT32_MAX)
                    return Error{"tensor '" + t.name + "': dimension " + std::to_string(d) + " too large"};
                shape.push_back(static_cast<int32_t>(d));
            }
            const std::string key = std::string(kComfyOriginalShapeKey) + t.name;
            gguf_set_arr_data(gguf.get(), key.c_str(), GGUF_TYPE_INT32, shape.data(), shape.size());
        }
        ggml_tensor* tensor = ggml_new_tensor(meta_ctx.get(), type,
                                              std::clamp<int>(static_cast<int>(t.shape.size()), 1, GGML_MAX_DIMS), ne);
        ggml_set_name(tensor, t.name.c_str());
        gguf_add_tensor(gguf.get(), tensor);
        types.push_back(type);
    }

    const std::string tmp_path = path + ".part";
    std::FILE* file = std::fopen(tmp_path.c_str(), "wb");
    if (!file) return Error{path + ": cannot create: " + std::strerror(errno)};
    auto fail = [&](const std::string& message) {
        std::fclose(file);
        std::remove(tmp_path.c_str());
        return Status(Error{message});
    };
    if (!gguf_write_to_file_ptr(gguf.get(), file, /*only_meta=*/true)) return fail(path + ": cannot write the header");

    const size_t alignment = gguf_get_alignment(gguf.get());
    const std::vector<uint8_t> padding(alignment, 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
        auto converted = convert_tensor(tensors[i], model.data(tensors[i]), types[i]);
        if (!converted.ok()) return fail(path + ": " + converted.error().message);
        const size_t pad = (alignment - converted->size() % alignment) % alignment;
        if (std::fwrite(converted->data(), 1, converted->size(), file) != converted->size() ||
            std::fwrite(padding.data(), 1, pad, file) != pad) {
            return fail(path + ": write failed: " + std::strerror(errno));
        }
        if (options.progress) options.progress(i + 1, tensors.size());
    }
    if (std::fclose(file) != 0) {
        std::remove(tmp_path.c_str());
        return Error{path + ": write failed: " + std::strerror(errno)};
    }
    if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
        std::remove(tmp_path.c_str());
        return Error{path + ": cannot rename from " + tmp_path + ": " + std::strerror(errno)};
    }
    return Status::Ok();
}

}  // namespace kiln::io
