// A restricted unpickler for PyTorch checkpoints. It never runs code: it
// understands the opcodes torch.save uses (protocol 2, plus the framing and
// short forms of protocols up to 5) and treats a small allow-list of globals
// as data constructors implemented here in C++:
//   collections.OrderedDict            -> a Dict
//   torch._utils._rebuild_tensor_v2    -> a Tensor (storage, offset, shape, stride)
//   torch._utils._rebuild_parameter[_with_state] -> its tensor argument
//   torch.<X>Storage                   -> a storage type, used by persistent ids
//   torch.Size                         -> a Tuple
//   torch.float32 etc.                 -> opaque dtype objects
// plus "inert" globals that real checkpoints carry next to the state dict
// (pytorch_lightning ModelCheckpoint, numpy scalars and dtypes, _codecs.encode,
// set): they become Opaque placeholders that are never called or interpreted,
// and anything built from them (REDUCE, NEWOBJ, BUILD) is another placeholder.
// Every other global, and every opcode outside the list (INST, OBJ, EXT*, the
// text forms, out-of-band buffers), is an error naming it and its byte offset.
//
// Persistent ids (BINPERSID) must be torch's storage tuples
// ('storage', <storage type>, key, location, numel) and become Storage values.
//
// Resource bounds: the stack, the mark stack, the memo and the number of
// values are capped, lengths are checked against the remaining bytes before
// anything is allocated, and containers nested deeper than kMaxPickleNesting
// (as built; see PickleValue::depth) are rejected. The parser and the value
// destructor never recurse. Values may still form cycles or deep structures
// through later mutation (APPEND to a list that is already nested, or to
// itself), so code that walks values recursively must bound its own depth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/result.h"

namespace kiln::io {

// Containers nested deeper than this at construction are an error.
constexpr uint32_t kMaxPickleNesting = 100;
// A tensor (or torch.Size) with more dimensions than this is an error.
constexpr size_t kMaxTensorDims = 64;

struct PickleValue {
    enum class Kind {
        None,
        Bool,
        Int,
        Float,
        String,  // unicode text, as UTF-8 bytes (not validated)
        Bytes,   // BINBYTES, and BINSTRING (Python 2 str)
        Tuple,
        List,
        Dict,
        Set,      // EMPTY_SET/ADDITEMS/FROZENSET; elements in items
        Global,   // an allow-listed global itself (OrderedDict, a storage type, a dtype, ...)
        Storage,  // a persistent-id storage reference
        Tensor,   // the result of _rebuild_tensor_v2
        Opaque,   // a placeholder: an inert global, anything built from one, or an int beyond 64 bits
    };

    Kind kind = Kind::None;
    bool boolean = false;
    int64_t integer = 0;
    double number = 0;
    // String/Bytes: the content. Global/Opaque: the qualified name of the
    // global ("collections.OrderedDict", "numpy.dtype").
    std::string text;
    // Tuple/List/Set: the elements. Not owned (see PickleDocument).
    std::vector<const PickleValue*> items;
    // Dict: entries in insertion order; a repeated string key (of at most
    // 1024 bytes) replaces the value in place, as in Python. Not owned.
    std::vector<std::pair<const PickleValue*, const PickleValue*>> entries;

    // Storage: a persistent-id storage reference; Tensor: its storage and layout.
    struct StorageRef {
        std::string_view type;      // "FloatStorage", "HalfStorage", ... (the global's name without "torch.")
        std::string_view key;       // the storage's name in the archive's data/ folder
        std::string_view location;  // "cpu", "cuda:0", ...
        int64_t numel = 0;          // elements, as torch recorded them
    };
    struct TensorRef {
        const PickleValue* storage_value = nullptr;  // a Storage value
        int64_t storage_offset = 0;                  // in elements
        std::vector<int64_t> shape;                  // outermost first; at most kMaxTensorDims
        std::vector<int64_t> stride;                 // in elements, same length as shape
    };
    // Set for Storage and Tensor values respectively. The views point into
    // values of the same document.
    std::unique_ptr<StorageRef> storage;
    std::unique_ptr<TensorRef> tensor;

    // Nesting depth when built: 0 for scalars, 1 + the deepest element for
    // containers (updated as elements are added to it, but not propagated to
    // containers that already hold it).
    uint32_t depth = 0;

    // Dict lookup by string key (keys over 1024 bytes are not found); null if
    // absent or not a Dict.
    const PickleValue* find(std::string_view key) const;

    bool is(Kind k) const { return kind == k; }

  private:
    friend class PickleParser;
    // Dict: string key -> index in entries. Keys view the key values' text, so
    // a shared key costs no copy.
    std::unique_ptr<std::unordered_map<std::string_view, size_t>> string_index_;
};

// The result of unpickling: every value lives in `values` (so destruction is
// flat, and shared or cyclic references are harmless); `root` points into it.
struct PickleDocument {
    std::vector<std::unique_ptr<PickleValue>> values;
    const PickleValue* root = nullptr;
};

// Unpickles data[0, size). Requires data to be readable for `size` bytes.
// Reads up to the STOP opcode; trailing bytes are ignored. Errors start with
// "pickle: " and end with " at byte N", the offset of the opcode at fault.
Result<PickleDocument> unpickle(const uint8_t* data, size_t size);

// Short description of a value's kind, for messages: "dict", "tensor", ...
const char* pickle_kind_name(PickleValue::Kind kind);

}  // namespace kiln::io
