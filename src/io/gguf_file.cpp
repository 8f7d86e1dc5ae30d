#include "io/gguf_file.h"

#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gguf.h"
#include "util/format.h"

namespace kiln::io {
namespace {

// GGUF stores a rank per tensor; ggml's own parser stops at GGML_MAX_DIMS
// (4), but gguf-py writes any rank, and ComfyUI-GGUF's Wan, HunyuanVideo and
// LTX files keep 3-D convolution kernels 5-D (city96's fix_5d_tensors.py).
// kiln's tensors carry PyTorch shapes of any rank, so 5-D ones load as
// safetensors' do; 8 leaves room and still bounds the header.
constexpr uint32_t kMaxFileDims = 8;

// Gives each tensor named by a kComfyOriginalShapeKey key (header) that shape, after
// checking it holds the same number of values.
Status apply_original_shapes(ParsedFile& parsed) {
    std::unordered_map<std::string, TensorInfo*> by_name;
    for (TensorInfo& t : parsed.tensors) by_name[t.name] = &t;
    for (const auto& [key, value] : parsed.metadata) {
        if (key.compare(0, kComfyOriginalShapeKey.size(), kComfyOriginalShapeKey) != 0) continue;
        auto it = by_name.find(key.substr(kComfyOriginalShapeKey.size()));
        if (it == by_name.end()) continue;  // as ComfyUI-GGUF: only tensors the file has
        TensorInfo& t = *it->second;
        const std::string where = "invalid GGUF file: " + escaped(key);
        if (value.kind != MetaValue::Kind::Array || value.array.empty() || value.array.size() > kMaxFileDims) {
            return Error{where + " is not a shape (an array of 1 to " + std::to_string(kMaxFileDims) + " integers)"};
        }
        std::vector<int64_t> shape;
        int64_t count = 1;
        for (const MetaValue& d : value.array) {
            const bool integer = d.kind == MetaValue::Kind::Int || d.kind == MetaValue::Kind::UInt;
            const int64_t dim = d.kind == MetaValue::Kind::UInt ? static_cast<int64_t>(d.u) : d.i;
            if (!integer || dim <= 0 || (d.kind == MetaValue::Kind::UInt && d.u > INT64_MAX) ||
                count > std::numeric_limits<int64_t>::max() / dim) {
                return Error{where + " is not a shape of positive integers"};
            }
            count *= dim;
            shape.push_back(dim);
        }
        if (count != t.element_count()) {
            TensorInfo wanted = t;
            wanted.shape = shape;
            return Error{where + " gives " + wanted.shape_string() + " (" + std::to_string(count) +
                         " values) for tensor '" + escaped(t.name) + "', which holds " + t.shape_string() + " (" +
                         std::to_string(t.element_count()) + " values)"};
        }
        t.shape = std::move(shape);
    }
    return Status::Ok();
}

// kiln's own GGUF header reader. ggml's (gguf_init_from_reader) checks every
// tensor name against all earlier ones with strcmp, so a header of n tensors
// cost n^2 (100k tensors: 15 s); here names go into a hash set. It accepts
// what ggml's parser accepts and rejects the rest with the reason, and it
// also rejects what ggml would hit undefined behaviour on or kiln would
// misread (found by tests/fuzz/fuzz_gguf; reproducers in
// tests/fuzz/regressions/gguf/):
//  - a key/value, array element or tensor type outside its enum;
//  - tensor dims whose product overflows int64, a zero dim included (kiln's
//    TensorInfo::element_count() multiplies in another order);
//  - a key or tensor name with a NUL byte ("a\0x" and "a\0y" would be one name).
// Only the header is read: tensor data stays in the mapping.
class GgufReader {
  public:
    GgufReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    // The file's metadata and tensors, or why the header is invalid.
    Result<ParsedFile> run() {
        pos_ = 4;  // magic, checked by the caller
        uint32_t version = 0;
        int64_t n_tensors = 0, n_kv = 0;
        if (!read(version) || !read(n_tensors) || !read(n_kv)) return fail("file ends inside the header");
        if (version == 1) return fail("GGUF version 1 is no longer supported");
        if (version == 0 || version > GGUF_VERSION || (version & 0xffff) == 0) {
            return fail("GGUF version " + std::to_string(version) + " is not supported (1 < version <= " +
                        std::to_string(GGUF_VERSION) + "; a huge number means the other byte order)");
        }
        // Each tensor takes at least 8 + 4 + 4 + 8 bytes, each pair 8 + 4 bytes.
        // The counts are printed as the unsigned numbers the bytes hold: 2^63
        // is not "-9223372036854775808".
        if (n_tensors < 0 || static_cast<uint64_t>(n_tensors) > remaining() / 24) {
            return fail("tensor count " + std::to_string(static_cast<uint64_t>(n_tensors)) +
                        " cannot fit in the file");
        }
        if (n_kv < 0 || static_cast<uint64_t>(n_kv) > remaining() / 12) {
            return fail("key/value count " + std::to_string(static_cast<uint64_t>(n_kv)) + " cannot fit in the file");
        }

        ParsedFile parsed;
        parsed.format = FileFormat::Gguf;
        for (int64_t k = 0; k < n_kv; ++k) {
            const std::string where = "key/value pair " + std::to_string(k);
            std::string key;
            if (!string(key)) return fail("file ends inside the key of " + where);
            if (key.empty()) return fail(where + " has an empty key");
            if (key.find('\0') != std::string::npos) return fail(where + " has a key with a NUL byte in it");
            uint32_t type = 0;
            if (!read(type)) return fail("file ends inside the type of " + where);
            if (type >= GGUF_TYPE_COUNT) {
                return fail(where + " ('" + escaped(key) + "') has invalid type " +
                            std::to_string(static_cast<int32_t>(type)));
            }
            MetaValue value;
            if (type == GGUF_TYPE_ARRAY) {
                uint32_t element_type = 0;
                uint64_t n = 0;
                if (!read(element_type)) return fail("file ends inside the type of " + where);
                if (element_type >= GGUF_TYPE_COUNT) {
                    return fail(where + " ('" + escaped(key) + "') is an array of invalid type " +
                                std::to_string(static_cast<int32_t>(element_type)));
                }
                if (element_type == GGUF_TYPE_ARRAY) return fail(where + " ('" + escaped(key) + "') nests arrays");
                if (!read(n)) return fail("file ends inside the length of " + where);
                if (!array(static_cast<gguf_type>(element_type), n, value)) {
                    return fail("file ends inside the value of " + where + " ('" + escaped(key) + "')");
                }
            } else if (!scalar(static_cast<gguf_type>(type), value)) {
                return fail("file ends inside the value of " + where + " ('" + escaped(key) + "')");
            }
            if (!parsed.metadata.emplace(key, std::move(value)).second) {
                return fail("duplicate key '" + escaped(key) + "'");
            }
        }

        uint64_t alignment = GGUF_DEFAULT_ALIGNMENT;
        if (auto it = parsed.metadata.find(GGUF_KEY_GENERAL_ALIGNMENT); it != parsed.metadata.end()) {
            if (it->second.gguf_type != GGUF_TYPE_UINT32) {
                return fail(std::string(GGUF_KEY_GENERAL_ALIGNMENT) + " must be of type u32");
            }
            alignment = it->second.u;
            if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
                return fail(std::string(GGUF_KEY_GENERAL_ALIGNMENT) + " " + std::to_string(alignment) +
                            " is not a power of 2");
            }
        }

        std::unordered_set<std::string> names;
        names.reserve(static_cast<size_t>(n_tensors));
        std::vector<uint64_t> relative_offsets;
        parsed.tensors.reserve(static_cast<size_t>(n_tensors));
        for (int64_t t = 0; t < n_tensors; ++t) {
            TensorInfo info;
            if (!string(info.name)) return fail("file ends inside the name of tensor " + std::to_string(t));
            if (info.name.find('\0') != std::string::npos) {
                return fail("tensor " + std::to_string(t) + " has a name with a NUL byte in it");
            }
            const std::string where = "tensor '" + escaped(info.name) + "'";
            if (info.name.size() >= GGML_MAX_NAME) {
                return fail(where + " has a name longer than " + std::to_string(GGML_MAX_NAME - 1) + " bytes");
            }
            if (!names.insert(info.name).second) return fail("duplicate tensor name '" + escaped(info.name) + "'");
            uint32_t n_dims = 0;
            if (!read(n_dims)) return fail("file ends inside the shape of " + where);
            if (n_dims > kMaxFileDims) {
                return fail(where + " has " + std::to_string(n_dims) + " dimensions (at most " +
                            std::to_string(kMaxFileDims) + ")");
            }
            int64_t ne[kMaxFileDims] = {1, 1, 1, 1, 1, 1, 1, 1};
            int64_t product = 1;  // of the non-zero dims
            for (uint32_t d = 0; d < n_dims; ++d) {
                if (!read(ne[d])) return fail("file ends inside the shape of " + where);
                if (ne[d] < 0) return fail(where + " has a negative dimension");
                if (ne[d] == 0) continue;
                if (product > std::numeric_limits<int64_t>::max() / ne[d]) {
                    std::string shape;
                    for (uint32_t j = 0; j < n_dims; ++j) shape += (j ? ", " : "") + std::to_string(ne[j]);
                    return fail(where + " has shape (" + shape + "), whose element count overflows int64");
                }
                product *= ne[d];
            }
            int32_t type = 0;
            if (!read(type)) return fail("file ends inside the type of " + where);
            if (type < 0 || type >= GGML_TYPE_COUNT)
                return fail(where + " has invalid ggml type " + std::to_string(type));
            const auto ggml = static_cast<ggml_type>(type);
            const int64_t block = ggml_blck_size(ggml);
            if (block == 0 || ggml_type_size(ggml) == 0) {
                return fail(where + " has ggml type " + std::to_string(type) + ", which is no longer supported");
            }
            if (ne[0] % block != 0) {
                return fail(where + " of type " + ggml_type_name(ggml) + " has " + std::to_string(ne[0]) +
                            " elements per row, not a multiple of its block size " + std::to_string(block));
            }
            // Bytes: rows of ne[0] / block blocks; the element count fits
            // int64, so dividing by the block first keeps this in range.
            const uint64_t blocks = product / block * (ne[0] == 0 ? 0 : 1);
            if (blocks > std::numeric_limits<uint64_t>::max() / ggml_type_size(ggml)) {
                return fail(where + " is too large");
            }
            uint64_t offset = 0;
            if (!read(offset)) return fail("file ends inside the data offset of " + where);
            bool empty = false;
            for (uint32_t d = 0; d < n_dims; ++d) empty = empty || ne[d] == 0;
            info.dtype = dtype_from_ggml(ggml);
            int dims = static_cast<int>(std::max<uint32_t>(n_dims, GGML_MAX_DIMS));
            while (dims > 1 && ne[dims - 1] == 1) --dims;
            for (int d = dims - 1; d >= 0; --d) info.shape.push_back(ne[d]);
            info.nbytes = empty ? 0 : blocks * ggml_type_size(ggml);
            relative_offsets.push_back(offset);
            parsed.tensors.push_back(std::move(info));
        }

        // The data section starts at the next multiple of the alignment, and
        // tensors lie in it in order, each padded to the alignment (as ggml
        // writes them and requires them).
        const uint64_t data_offset = (pos_ + alignment - 1) / alignment * alignment;
        if (n_tensors > 0 && data_offset > size_) return fail("file ends before the data section");
        uint64_t expected = 0;
        for (size_t t = 0; t < parsed.tensors.size(); ++t) {
            TensorInfo& info = parsed.tensors[t];
            const std::string where = "tensor '" + escaped(info.name) + "'";
            if (relative_offsets[t] != expected) {
                return fail(where + " has data offset " + std::to_string(relative_offsets[t]) + ", expected " +
                            std::to_string(expected));
            }
            const uint64_t padded = (info.nbytes + alignment - 1) / alignment * alignment;
            if (padded < info.nbytes || expected > std::numeric_limits<uint64_t>::max() - padded) {
                return fail(where + " is too large");
            }
            expected += padded;
            info.offset = data_offset + relative_offsets[t];
            if (info.offset > size_ || info.nbytes > size_ - info.offset) {
                return Error{"tensor '" + info.name + "' data (" + std::to_string(info.nbytes) + " bytes at " +
                             std::to_string(info.offset) + ") is out of bounds: truncated file (" +
                             std::to_string(size_) + " bytes)"};
            }
        }
        return parsed;
    }

  private:
    static Error fail(const std::string& reason) { return Error{"invalid GGUF file: " + reason}; }

    size_t remaining() const { return size_ - pos_; }

    template <class T>
    bool read(T& out) {
        if (remaining() < sizeof(T)) return false;
        std::memcpy(&out, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return true;
    }

    bool string(std::string& out) {
        uint64_t n = 0;
        if (!read(n) || n > remaining()) return false;
        out.assign(reinterpret_cast<const char*>(data_ + pos_), n);
        pos_ += n;
        return true;
    }

    // One value of a fixed-size type or a string, as a MetaValue.
    bool element(gguf_type type, MetaValue& out) {
        switch (type) {
            case GGUF_TYPE_UINT8: return number<uint8_t>(out, &MetaValue::of_uint);
            case GGUF_TYPE_INT8: return number<int8_t>(out, &MetaValue::of_int);
            case GGUF_TYPE_UINT16: return number<uint16_t>(out, &MetaValue::of_uint);
            case GGUF_TYPE_INT16: return number<int16_t>(out, &MetaValue::of_int);
            case GGUF_TYPE_UINT32: return number<uint32_t>(out, &MetaValue::of_uint);
            case GGUF_TYPE_INT32: return number<int32_t>(out, &MetaValue::of_int);
            case GGUF_TYPE_FLOAT32: return number<float>(out, &MetaValue::of_float);
            case GGUF_TYPE_UINT64: return number<uint64_t>(out, &MetaValue::of_uint);
            case GGUF_TYPE_INT64: return number<int64_t>(out, &MetaValue::of_int);
            case GGUF_TYPE_FLOAT64: return number<double>(out, &MetaValue::of_float);
            case GGUF_TYPE_BOOL: {
                int8_t b = 0;
                if (!read(b)) return false;
                out = MetaValue::of_bool(b != 0);
                return true;
            }
            case GGUF_TYPE_STRING: {
                std::string text;
                if (!string(text)) return false;
                out = MetaValue::of_string(std::move(text));
                return true;
            }
            default: return false;
        }
    }

    template <class T, class Make>
    bool number(MetaValue& out, Make make) {
        T v{};
        if (!read(v)) return false;
        out = make(v);
        return true;
    }

    bool scalar(gguf_type type, MetaValue& out) {
        if (!element(type, out)) return false;
        out.gguf_type = type;
        return true;
    }

    bool array(gguf_type type, uint64_t n, MetaValue& out) {
        // Every element takes at least one byte (a string at least 8).
        if (n > remaining() / (type == GGUF_TYPE_STRING ? 8 : value_size(type))) return false;
        out.kind = MetaValue::Kind::Array;
        out.gguf_type = type;
        out.array.resize(static_cast<size_t>(n));
        for (MetaValue& v : out.array) {
            if (!element(type, v)) return false;
        }
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
            default: return 1;
        }
    }

    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

}  // namespace

bool looks_like_gguf(const uint8_t* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

Result<ParsedFile> parse_gguf(const uint8_t* data, size_t size, const std::string& label) {
    if (!looks_like_gguf(data, size)) return Error{label + ": not a GGUF file (no GGUF magic)"};
    auto parsed = GgufReader(data, size).run();
    if (!parsed) return Error{label + ": " + parsed.error().message};
    if (Status s = apply_original_shapes(*parsed); !s.ok()) return Error{label + ": " + s.error().message};
    return parsed;
}

}  // namespace kiln::io
