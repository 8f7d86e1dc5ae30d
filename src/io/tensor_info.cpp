#include "io/tensor_info.h"

#include <cstdio>

namespace kiln::io {

int64_t TensorInfo::element_count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string TensorInfo::shape_string() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

MetaValue MetaValue::of_string(std::string s) {
    MetaValue v;
    v.kind = Kind::String;
    v.str = std::move(s);
    return v;
}
MetaValue MetaValue::of_int(int64_t x) {
    MetaValue v;
    v.kind = Kind::Int;
    v.i = x;
    return v;
}
MetaValue MetaValue::of_uint(uint64_t x) {
    MetaValue v;
    v.kind = Kind::UInt;
    v.u = x;
    return v;
}
MetaValue MetaValue::of_float(double x) {
    MetaValue v;
    v.kind = Kind::Float;
    v.f = x;
    return v;
}
MetaValue MetaValue::of_bool(bool x) {
    MetaValue v;
    v.kind = Kind::Bool;
    v.b = x;
    return v;
}

MetaValue MetaValue::of_array(std::vector<MetaValue> items, int type) {
    MetaValue v;
    v.kind = Kind::Array;
    v.array = std::move(items);
    v.gguf_type = type;
    return v;
}

MetaValue MetaValue::as_gguf(int type) const {
    MetaValue v = *this;
    v.gguf_type = type;
    return v;
}

std::string MetaValue::to_string(size_t max_items) const {
    switch (kind) {
        case Kind::String: return str;
        case Kind::Int: return std::to_string(i);
        case Kind::UInt: return std::to_string(u);
        case Kind::Float: {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%g", f);
            return buf;
        }
        case Kind::Bool: return b ? "true" : "false";
        case Kind::Array: {
            std::string s = "[";
            for (size_t k = 0; k < array.size() && k < max_items; ++k) {
                if (k) s += ", ";
                s += array[k].kind == Kind::String ? "\"" + array[k].str + "\"" : array[k].to_string(max_items);
            }
            if (array.size() > max_items) s += ", ... (" + std::to_string(array.size()) + " items)";
            return s + "]";
        }
    }
    return {};
}

const char* file_format_name(FileFormat format) {
    switch (format) {
        case FileFormat::Safetensors: return "safetensors";
        case FileFormat::Gguf: return "gguf";
        case FileFormat::Ckpt: return "ckpt";
    }
    return "unknown";
}

}  // namespace kiln::io
