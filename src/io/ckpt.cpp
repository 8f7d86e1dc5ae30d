#include "io/ckpt.h"

#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "io/pickle.h"
#include "io/zip_reader.h"

namespace kiln::io {
namespace {

using Kind = PickleValue::Kind;

// State dicts nest a level or two at most; deeper dicts are rejected rather
// than followed.
constexpr int kMaxStateDictNesting = 32;
// Longest tensor name accepted. Names are copied per tensor, so this bounds
// the work a pickle can cause by reusing one long key string many times.
constexpr size_t kMaxTensorName = 1024;

std::optional<DType> dtype_from_storage_type(std::string_view type) {
    struct Entry {
        std::string_view type;
        DType dtype;
    };
    static constexpr Entry kTable[] = {
        {"FloatStorage", DType::F32},  {"HalfStorage", DType::F16}, {"BFloat16Storage", DType::BF16},
        {"DoubleStorage", DType::F64}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
        {"ShortStorage", DType::I16},  {"CharStorage", DType::I8},  {"ByteStorage", DType::U8},
        {"BoolStorage", DType::BOOL},
    };
    for (const Entry& e : kTable) {
        if (e.type == type) return e.dtype;
    }
    return std::nullopt;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
    if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
    out = a * b;
    return false;
}

bool has_tensor_value(const PickleValue* dict) {
    for (const auto& [key, value] : dict->entries) {
        if (value->kind == Kind::Tensor) return true;
    }
    return false;
}

// Picks the state dict out of what data.pkl holds (see parse_ckpt).
const PickleValue* find_state_dict(const PickleValue* root) {
    const PickleValue* sd = root->find("state_dict");
    if (sd && sd->kind == Kind::Dict) return sd;
    if (has_tensor_value(root)) return root;
    for (const char* key : {"model", "module", "ema"}) {
        const PickleValue* v = root->find(key);
        if (v && v->kind == Kind::Dict) return v;
    }
    return root;
}

class StateDictWalker {
  public:
    StateDictWalker(std::string prefix, const std::vector<ZipEntry>& entries, ParsedFile& out)
        : prefix_(std::move(prefix)), out_(out) {
        for (const ZipEntry& e : entries) by_name_.emplace(e.name, &e);  // the first of duplicate names wins
    }

    Status walk(const PickleValue* dict, const std::string& name_prefix, int depth) {
        if (depth > kMaxStateDictNesting) {
            return Error{"state dict nested deeper than " + std::to_string(kMaxStateDictNesting) + " levels at '" +
                         name_prefix + "'"};
        }
        // A dict walked twice (shared under two names, or a cycle) would
        // multiply the output; torch never writes one.
        if (!visited_.insert(dict).second) {
            return Error{"the state dict holds one dict under several names (at '" + name_prefix + "')"};
        }
        for (const auto& [key, value] : dict->entries) {
            if (value->kind != Kind::Dict && value->kind != Kind::Tensor) continue;  // ints, strings, placeholders
            std::string_view key_text;
            std::string int_key;
            if (key->kind == Kind::String || key->kind == Kind::Bytes) {
                key_text = key->text;
            } else if (key->kind == Kind::Int) {
                int_key = std::to_string(key->integer);
                key_text = int_key;
            } else {
                continue;  // a placeholder or tuple key names no tensor
            }
            if (name_prefix.size() + 1 + key_text.size() > kMaxTensorName) {
                return Error{"tensor name longer than " + std::to_string(kMaxTensorName) + " bytes under '" +
                             name_prefix.substr(0, 64) + "'"};
            }
            std::string name = name_prefix.empty() ? std::string(key_text) : name_prefix + "." + std::string(key_text);
            if (value->kind == Kind::Dict) {
                KILN_TRY(walk(value, name, depth + 1));
            } else if (value->kind == Kind::Tensor) {
                KILN_TRY(add_tensor(name, *value->tensor));
            }
        }
        return Status::Ok();
    }

  private:
    std::string prefix_;
    ParsedFile& out_;
    std::unordered_map<std::string_view, const ZipEntry*> by_name_;
    std::unordered_set<std::string> names_;
    std::unordered_set<const PickleValue*> visited_;

    Status add_tensor(const std::string& name, const PickleValue::TensorRef& t) {
        const std::string q = "tensor '" + name + "'";
        const PickleValue::StorageRef& s = *t.storage_value->storage;
        const auto dtype = dtype_from_storage_type(s.type);
        if (!dtype) return Error{q + ": unsupported storage type '" + std::string(s.type) + "'"};
        const uint64_t elem = *dtype_byte_size(*dtype, 1);

        uint64_t numel = 1;
        for (int64_t d : t.shape) {
            if (mul_overflows(numel, static_cast<uint64_t>(d), numel)) return Error{q + ": element count overflows"};
        }
        if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return Error{q + ": element count overflows"};
        }
        // Row-major contiguity; a size-1 dimension may have any stride, and
        // an empty tensor has no layout to check.
        if (numel != 0) {
            uint64_t expected = 1;
            for (size_t i = t.shape.size(); i-- > 0;) {
                const auto dim = static_cast<uint64_t>(t.shape[i]);
                if (dim != 1 && t.stride[i] != static_cast<int64_t>(expected)) {
                    return Error{q + " is not contiguous (shape " + dims_string(t.shape) + ", stride " +
                                 dims_string(t.stride) + "); save it after .contiguous()"};
                }
                expected *= dim;  // <= numel, no overflow
            }
        }
        uint64_t nbytes = 0;
        uint64_t start = 0;
        if (mul_overflows(numel, elem, nbytes) || mul_overflows(static_cast<uint64_t>(t.storage_offset), elem, start)) {
            return Error{q + ": byte size overflows"};
        }

        const std::string entry_name = prefix_ + "/data/" + std::string(s.key);
        auto it = by_name_.find(entry_name);
        if (it == by_name_.end()) return Error{q + ": storage entry '" + entry_name + "' is missing from the archive"};
        const ZipEntry& entry = *it->second;
        if (start > entry.size || nbytes > entry.size - start) {
            return Error{q + " (byte offset " + std::to_string(start) + ", " + std::to_string(nbytes) +
                         " bytes) lies outside its storage entry '" + entry_name + "' (" + std::to_string(entry.size) +
                         " bytes)"};
        }
        if (!names_.insert(name).second) return Error{"duplicate tensor name '" + name + "'"};

        TensorInfo info;
        info.name = name;
        info.dtype = *dtype;
        info.shape = t.shape;
        info.source = 0;
        info.offset = entry.data_offset + start;  // inside the entry, so inside the file
        info.nbytes = nbytes;
        out_.tensors.push_back(std::move(info));
        return Status::Ok();
    }

    static std::string dims_string(const std::vector<int64_t>& dims) {
        std::string s = "[";
        for (size_t i = 0; i < dims.size(); ++i) {
            if (i) s += ", ";
            s += std::to_string(dims[i]);
        }
        return s + "]";
    }
};

Result<ParsedFile> parse_zip_ckpt(const uint8_t* data, size_t size) {
    auto entries_r = read_zip(data, size);
    if (!entries_r) return entries_r.error();
    const std::vector<ZipEntry>& entries = entries_r.value();

    // torch writes every entry under one top folder named after the file
    // (or "archive"); find it through data.pkl.
    const ZipEntry* pkl = nullptr;
    std::string prefix;
    for (const ZipEntry& e : entries) {
        const size_t slash = e.name.find('/');
        if (slash != std::string::npos && slash > 0 && std::string_view(e.name).substr(slash) == "/data.pkl") {
            pkl = &e;
            prefix = e.name.substr(0, slash);
            break;
        }
    }
    if (!pkl) return Error{"no <folder>/data.pkl in the zip archive (not a torch.save checkpoint)"};
    for (const ZipEntry& e : entries) {
        if (e.name == prefix + "/byteorder" && e.size == 3 && std::memcmp(data + e.data_offset, "big", 3) == 0) {
            return Error{"big-endian checkpoints are not supported"};
        }
    }

    auto doc = unpickle(data + pkl->data_offset, static_cast<size_t>(pkl->size));
    if (!doc) return doc.error();
    const PickleValue* root = doc.value().root;
    if (root->kind != Kind::Dict) {
        return Error{pkl->name + " holds a " + std::string(pickle_kind_name(root->kind)) + ", not a dict of tensors"};
    }

    ParsedFile out;
    out.format = FileFormat::Ckpt;
    StateDictWalker walker(prefix, entries, out);
    KILN_TRY(walker.walk(find_state_dict(root), "", 0));
    return out;
}

}  // namespace

Result<ParsedFile> parse_ckpt(const uint8_t* data, size_t size, const std::string& label) {
    if (!looks_like_zip(data, size)) {
        // torch < 1.6 wrote a bare pickle stream (a magic number, protocol
        // info, then the object), even older versions a tar archive.
        const bool legacy_pickle = size >= 2 && data[0] == 0x80 && data[1] <= 5;
        const bool legacy_tar = size >= 262 && std::memcmp(data + 257, "ustar", 5) == 0;
        if (legacy_pickle || legacy_tar) {
            return Error{label +
                         ": legacy PyTorch checkpoint format (torch < 1.6, not a zip archive) is not supported; "
                         "re-save it with a current PyTorch, e.g. "
                         "torch.save(torch.load(path, weights_only=True), new_path), or convert it to safetensors"};
        }
        return Error{label + ": not a PyTorch checkpoint (no zip archive)"};
    }
    auto parsed = parse_zip_ckpt(data, size);
    if (!parsed) return Error{label + ": " + parsed.error().message};
    return parsed;
}

}  // namespace kiln::io
