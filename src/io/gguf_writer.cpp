#include "io/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "gguf.h"
#include "io/tensor_convert.h"

namespace kiln::io {
namespace {

void copy_metadata(gguf_context* ctx, const Metadata& metadata) {
    for (const auto& [key, value] : metadata) {
        switch (value.kind) {
            case MetaValue::Kind::String: gguf_set_val_str(ctx, key.c_str(), value.str.c_str()); break;
            case MetaValue::Kind::Int: gguf_set_val_i64(ctx, key.c_str(), value.i); break;
            case MetaValue::Kind::UInt: gguf_set_val_u64(ctx, key.c_str(), value.u); break;
            case MetaValue::Kind::Float: gguf_set_val_f64(ctx, key.c_str(), value.f); break;
            case MetaValue::Kind::Bool: gguf_set_val_bool(ctx, key.c_str(), value.b); break;
            case MetaValue::Kind::Array: {
                // Arrays of strings (tokenizer vocabularies) are the ones that
                // matter; other arrays are kept as their text form.
                bool all_strings = true;
                for (const MetaValue& v : value.array) all_strings = all_strings && v.kind == MetaValue::Kind::String;
                if (all_strings) {
                    std::vector<const char*> items;
                    for (const MetaValue& v : value.array) items.push_back(v.str.c_str());
                    gguf_set_arr_str(ctx, key.c_str(), items.data(), items.size());
                } else {
                    gguf_set_val_str(ctx, key.c_str(), value.to_string(SIZE_MAX).c_str());
                }
                break;
            }
        }
    }
}

}  // namespace

Status write_gguf(const ModelFile& model, const std::string& path, const GgufWriteOptions& options) {
    const auto& tensors = model.tensors();
    for (const TensorInfo& t : tensors) {
        if (t.name.size() >= GGML_MAX_NAME) {
            return Error{"tensor '" + t.name + "': name longer than GGUF allows (" + std::to_string(GGML_MAX_NAME - 1) +
                         " bytes)"};
        }
        if (t.shape.size() > GGML_MAX_DIMS) {
            return Error{"tensor '" + t.name + "': " + std::to_string(t.shape.size()) + " dimensions; GGUF allows " +
                         std::to_string(GGML_MAX_DIMS)};
        }
    }

    // Tensor descriptions only (no_alloc): the data is streamed after the header.
    ggml_init_params params{ggml_tensor_overhead() * (tensors.size() + 1), nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, void (*)(ggml_context*)> meta_ctx(ggml_init(params), ggml_free);
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> gguf(gguf_init_empty(), gguf_free);
    if (!meta_ctx || !gguf) return Error{path + ": out of memory preparing the GGUF header"};
    copy_metadata(gguf.get(), model.metadata());

    std::vector<ggml_type> types;
    for (const TensorInfo& t : tensors) {
        const ggml_type type = compute_type(t, options.type);
        int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
        for (size_t d = 0; d < t.shape.size(); ++d) ne[d] = t.shape[t.shape.size() - 1 - d];
        ggml_tensor* tensor =
            ggml_new_tensor(meta_ctx.get(), type, std::max<int>(1, static_cast<int>(t.shape.size())), ne);
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
