// What a model file says about one tensor, without its data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace kiln::io {

struct TensorInfo {
    std::string name;
    DType dtype = DType::F32;
    // Outermost dimension first, as PyTorch and safetensors write it
    // (GGUF's ne[] is innermost first; its parser reverses it).
    std::vector<int64_t> shape;
    size_t source = 0;    // index of the file it lives in (ModelIndex::sources)
    uint64_t offset = 0;  // absolute byte offset of the data in that file
    uint64_t nbytes = 0;
    // ComfyUI's scaled FP8 files (*_fp8_scaled.safetensors): an F8 weight's
    // values are this times the stored ones (its sibling X.scale_weight).
    float scale = 1.0f;

    int64_t element_count() const;
    std::string shape_string() const;  // "[320, 4, 3, 3]"
};

// A metadata value: safetensors has strings only; GGUF has typed scalars and
// arrays; checkpoints have none kiln reads.
struct MetaValue {
    enum class Kind { String, Int, UInt, Float, Bool, Array };
    Kind kind = Kind::String;
    std::string str;
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    bool b = false;
    std::vector<MetaValue> array;
    // A value read from a GGUF file keeps the gguf_type it was stored as
    // (for an array, its elements' type), so that a conversion writes it back
    // with the same type; -1 for values from other formats.
    int gguf_type = -1;

    static MetaValue of_string(std::string s);
    static MetaValue of_int(int64_t v);
    static MetaValue of_uint(uint64_t v);
    static MetaValue of_float(double v);
    static MetaValue of_bool(bool v);
    // An array of `items`, stored in a GGUF as elements of `gguf_type`.
    static MetaValue of_array(std::vector<MetaValue> items, int gguf_type);
    // This value, stored in a GGUF as `gguf_type` (a GGUF_TYPE_*).
    MetaValue as_gguf(int type) const;

    // Human-readable; arrays longer than max_items are elided with a count.
    std::string to_string(size_t max_items = 8) const;
};

using Metadata = std::map<std::string, MetaValue>;

enum class FileFormat { Safetensors, Gguf, Ckpt };
const char* file_format_name(FileFormat format);

// One parsed file: its tensors (offsets absolute within the file) and its
// metadata. Produced by the per-format parsers from the file's bytes.
struct ParsedFile {
    FileFormat format = FileFormat::Safetensors;
    std::vector<TensorInfo> tensors;
    Metadata metadata;
};

}  // namespace kiln::io
