#include "io/pickle.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

namespace kiln::io {
namespace {

// Caps on what a pickle may make us hold. Real checkpoints are far below
// them (Stable Diffusion's data.pkl: ~20k values, a memo of ~10k, a stack of
// a few dozen); they exist so that hostile input fails fast instead of
// exhausting memory.
constexpr size_t kMaxValues = size_t{1} << 20;
constexpr size_t kMaxStack = size_t{1} << 22;
constexpr size_t kMaxMemo = size_t{1} << 22;
constexpr size_t kMaxMessageName = 200;
// Dict keys longer than this are not indexed for lookup and replacement:
// hashing a long shared key on every SETITEM would cost time quadratic in the
// input. Real keys (tensor names, "state_dict") are far shorter.
constexpr size_t kMaxIndexedKey = 1024;
// Storage keys are small decimal numbers; a long one is hostile.
constexpr size_t kMaxStorageKey = 256;

using Kind = PickleValue::Kind;

// Opcode names for messages; null for bytes that are not pickle opcodes.
const char* opcode_name(uint8_t op) {
    switch (op) {
        case 0x28: return "MARK";
        case 0x2e: return "STOP";
        case 0x30: return "POP";
        case 0x31: return "POP_MARK";
        case 0x32: return "DUP";
        case 0x46: return "FLOAT";
        case 0x49: return "INT";
        case 0x4a: return "BININT";
        case 0x4b: return "BININT1";
        case 0x4c: return "LONG";
        case 0x4d: return "BININT2";
        case 0x4e: return "NONE";
        case 0x50: return "PERSID";
        case 0x51: return "BINPERSID";
        case 0x52: return "REDUCE";
        case 0x53: return "STRING";
        case 0x54: return "BINSTRING";
        case 0x55: return "SHORT_BINSTRING";
        case 0x56: return "UNICODE";
        case 0x58: return "BINUNICODE";
        case 0x61: return "APPEND";
        case 0x62: return "BUILD";
        case 0x63: return "GLOBAL";
        case 0x64: return "DICT";
        case 0x7d: return "EMPTY_DICT";
        case 0x65: return "APPENDS";
        case 0x67: return "GET";
        case 0x68: return "BINGET";
        case 0x69: return "INST";
        case 0x6a: return "LONG_BINGET";
        case 0x6c: return "LIST";
        case 0x5d: return "EMPTY_LIST";
        case 0x6f: return "OBJ";
        case 0x70: return "PUT";
        case 0x71: return "BINPUT";
        case 0x72: return "LONG_BINPUT";
        case 0x73: return "SETITEM";
        case 0x74: return "TUPLE";
        case 0x29: return "EMPTY_TUPLE";
        case 0x75: return "SETITEMS";
        case 0x47: return "BINFLOAT";
        case 0x80: return "PROTO";
        case 0x81: return "NEWOBJ";
        case 0x82: return "EXT1";
        case 0x83: return "EXT2";
        case 0x84: return "EXT4";
        case 0x85: return "TUPLE1";
        case 0x86: return "TUPLE2";
        case 0x87: return "TUPLE3";
        case 0x88: return "NEWTRUE";
        case 0x89: return "NEWFALSE";
        case 0x8a: return "LONG1";
        case 0x8b: return "LONG4";
        case 0x42: return "BINBYTES";
        case 0x43: return "SHORT_BINBYTES";
        case 0x8c: return "SHORT_BINUNICODE";
        case 0x8d: return "BINUNICODE8";
        case 0x8e: return "BINBYTES8";
        case 0x8f: return "EMPTY_SET";
        case 0x90: return "ADDITEMS";
        case 0x91: return "FROZENSET";
        case 0x92: return "NEWOBJ_EX";
        case 0x93: return "STACK_GLOBAL";
        case 0x94: return "MEMOIZE";
        case 0x95: return "FRAME";
        case 0x96: return "BYTEARRAY8";
        case 0x97: return "NEXT_BUFFER";
        case 0x98: return "READONLY_BUFFER";
        default: return nullptr;
    }
}

std::string hex_byte(uint8_t b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", b);
    return buf;
}

// Names from the input may be long or binary; keep messages short and printable.
std::string printable(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < kMaxMessageName; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    if (s.size() > kMaxMessageName) out += "...";
    return out;
}

// What an allow-listed global is to us.
enum class GlobalRole {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    RebuildParameterWithState,
    StorageType,
    Dtype,
    Size,
    Inert,
};

std::optional<GlobalRole> classify_global(std::string_view name) {
    struct Entry {
        std::string_view name;
        GlobalRole role;
    };
    static constexpr Entry kAllowed[] = {
        {"collections.OrderedDict", GlobalRole::OrderedDict},
        {"torch._utils._rebuild_tensor_v2", GlobalRole::RebuildTensorV2},
        {"torch._utils._rebuild_parameter", GlobalRole::RebuildParameter},
        {"torch._utils._rebuild_parameter_with_state", GlobalRole::RebuildParameterWithState},
        {"torch.FloatStorage", GlobalRole::StorageType},
        {"torch.HalfStorage", GlobalRole::StorageType},
        {"torch.BFloat16Storage", GlobalRole::StorageType},
        {"torch.DoubleStorage", GlobalRole::StorageType},
        {"torch.LongStorage", GlobalRole::StorageType},
        {"torch.IntStorage", GlobalRole::StorageType},
        {"torch.ShortStorage", GlobalRole::StorageType},
        {"torch.CharStorage", GlobalRole::StorageType},
        {"torch.ByteStorage", GlobalRole::StorageType},
        {"torch.BoolStorage", GlobalRole::StorageType},
        {"torch.float64", GlobalRole::Dtype},
        {"torch.float32", GlobalRole::Dtype},
        {"torch.float16", GlobalRole::Dtype},
        {"torch.bfloat16", GlobalRole::Dtype},
        {"torch.int64", GlobalRole::Dtype},
        {"torch.int32", GlobalRole::Dtype},
        {"torch.int16", GlobalRole::Dtype},
        {"torch.int8", GlobalRole::Dtype},
        {"torch.uint8", GlobalRole::Dtype},
        {"torch.bool", GlobalRole::Dtype},
        {"torch.Size", GlobalRole::Size},
        // Inert: found next to the state dict in real checkpoints (training
        // callbacks, numpy scalars in their state, byte strings written by
        // protocol 2). They only ever become placeholders.
        {"pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint", GlobalRole::Inert},
        {"numpy.core.multiarray.scalar", GlobalRole::Inert},
        {"numpy._core.multiarray.scalar", GlobalRole::Inert},
        {"numpy.core.multiarray._reconstruct", GlobalRole::Inert},
        {"numpy.ndarray", GlobalRole::Inert},
        {"numpy.dtype", GlobalRole::Inert},
        {"_codecs.encode", GlobalRole::Inert},
        {"__builtin__.set", GlobalRole::Inert},
        {"builtins.set", GlobalRole::Inert},
        {"torch.device", GlobalRole::Inert},
    };
    for (const Entry& e : kAllowed) {
        if (e.name == name) return e.role;
    }
    return std::nullopt;
}

}  // namespace

const PickleValue* PickleValue::find(std::string_view key) const {
    if (kind != Kind::Dict || !string_index_) return nullptr;
    auto it = string_index_->find(key);
    return it == string_index_->end() ? nullptr : entries[it->second].second;
}

const char* pickle_kind_name(PickleValue::Kind kind) {
    switch (kind) {
        case Kind::None: return "None";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "str";
        case Kind::Bytes: return "bytes";
        case Kind::Tuple: return "tuple";
        case Kind::List: return "list";
        case Kind::Dict: return "dict";
        case Kind::Set: return "set";
        case Kind::Global: return "global";
        case Kind::Storage: return "storage";
        case Kind::Tensor: return "tensor";
        case Kind::Opaque: return "placeholder";
    }
    return "value";
}

// The parser: a stack machine over the opcodes, with Python's semantics for
// the ones it accepts. Every value it creates is owned by doc_.values; the
// stack and memo hold plain pointers into it.
class PickleParser {
  public:
    PickleParser(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    Result<PickleDocument> run() {
        while (true) {
            if (pos_ >= size_) {
                op_pos_ = size_;
                return fail("truncated: no STOP opcode");
            }
            // Each opcode adds at most two values and one stack entry, so
            // checking the caps once per opcode bounds them.
            if (doc_.values.size() > kMaxValues)
                return fail("too many values (more than " + std::to_string(kMaxValues) + ")");
            if (stack_.size() > kMaxStack) return fail("stack too deep (more than " + std::to_string(kMaxStack) + ")");
            op_pos_ = pos_;
            op_ = data_[pos_++];
            bool stop = false;
            Status s = step(stop);
            if (!s) return s.error();
            if (stop) return std::move(doc_);
        }
    }

  private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    size_t op_pos_ = 0;  // where the current opcode starts, for messages
    uint8_t op_ = 0;
    PickleDocument doc_;
    std::vector<PickleValue*> stack_;
    std::vector<size_t> marks_;  // stack sizes at each MARK
    std::unordered_map<uint64_t, PickleValue*> memo_;
    PickleValue* none_ = nullptr;
    PickleValue* true_ = nullptr;
    PickleValue* false_ = nullptr;

    Error fail(const std::string& what) const {
        return Error{"pickle: " + what + " at byte " + std::to_string(op_pos_)};
    }
    std::string op_label() const {
        const char* name = opcode_name(op_);
        return name ? std::string(name) : hex_byte(op_);
    }

    // --- values -----------------------------------------------------------

    PickleValue* make(Kind kind) {
        doc_.values.push_back(std::make_unique<PickleValue>());
        PickleValue* v = doc_.values.back().get();
        v->kind = kind;
        return v;
    }
    PickleValue* make_int(int64_t x) {
        PickleValue* v = make(Kind::Int);
        v->integer = x;
        return v;
    }
    PickleValue* make_opaque(std::string_view name) {
        PickleValue* v = make(Kind::Opaque);
        v->text = std::string(name);
        return v;
    }

    // Records that `container` now holds `child`.
    Status note_child(PickleValue* container, const PickleValue* child) {
        const uint32_t d = child->depth + 1;
        if (d > container->depth) container->depth = d;
        if (container->depth > kMaxPickleNesting) {
            return fail("nesting deeper than " + std::to_string(kMaxPickleNesting));
        }
        return Status::Ok();
    }

    Status dict_set(PickleValue* dict, const PickleValue* key, const PickleValue* value) {
        KILN_TRY(note_child(dict, key));
        KILN_TRY(note_child(dict, value));
        if (key->kind == Kind::String && key->text.size() <= kMaxIndexedKey) {
            if (!dict->string_index_)
                dict->string_index_ = std::make_unique<std::unordered_map<std::string_view, size_t>>();
            auto [it, inserted] = dict->string_index_->emplace(std::string_view(key->text), dict->entries.size());
            if (!inserted) {
                dict->entries[it->second].second = value;
                return Status::Ok();
            }
        }
        dict->entries.emplace_back(key, value);
        return Status::Ok();
    }

    // --- stack --------------------------------------------------------------

    // The stack above the innermost MARK is all an opcode may touch.
    size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }

    Status push(PickleValue* v) {
        stack_.push_back(v);
        return Status::Ok();
    }
    Result<PickleValue*> pop() {
        if (stack_.size() <= floor()) return fail("stack underflow in " + op_label());
        PickleValue* v = stack_.back();
        stack_.pop_back();
        return v;
    }
    Result<PickleValue*> top() {
        if (stack_.size() <= floor()) return fail("stack underflow in " + op_label());
        return stack_.back();
    }
    // Pops everything above the innermost MARK, and the MARK.
    Result<std::vector<PickleValue*>> pop_mark() {
        if (marks_.empty()) return fail(op_label() + " without a MARK");
        const size_t mark = marks_.back();
        marks_.pop_back();
        std::vector<PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
        stack_.resize(mark);
        return items;
    }

    // --- reading ------------------------------------------------------------

    Status need(uint64_t n) {
        if (n > size_ - pos_) {
            return fail("truncated: " + op_label() + " needs " + std::to_string(n) + " bytes, " +
                        std::to_string(size_ - pos_) + " left");
        }
        return Status::Ok();
    }
    uint64_t read_le(size_t n) {  // bounds checked by the caller
        uint64_t v = 0;
        for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
        pos_ += n;
        return v;
    }
    Result<uint64_t> read_uint(size_t n) {
        KILN_TRY(need(n));
        return read_le(n);
    }
    // A length-prefixed payload; the length is checked against what is left
    // before anything is allocated.
    Result<std::string_view> read_payload(size_t length_bytes) {
        auto len = read_uint(length_bytes);
        if (!len) return len.error();
        KILN_TRY(need(len.value()));
        std::string_view out(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len.value()));
        pos_ += static_cast<size_t>(len.value());
        return out;
    }
    Result<std::string_view> read_line() {
        const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
        if (!nl) return fail("truncated: " + op_label() + " argument has no end of line");
        const size_t len = static_cast<size_t>(static_cast<const uint8_t*>(nl) - (data_ + pos_));
        std::string_view out(reinterpret_cast<const char*>(data_ + pos_), len);
        pos_ += len + 1;
        return out;
    }

    // --- opcodes ------------------------------------------------------------

    Status push_text(Kind kind, size_t length_bytes) {
        auto payload = read_payload(length_bytes);
        if (!payload) return payload.error();
        PickleValue* v = make(kind);
        v->text = std::string(payload.value());
        return push(v);
    }

    // LONG1/LONG4: little-endian two's complement of any length.
    Status push_long(size_t length_bytes) {
        auto payload = read_payload(length_bytes);
        if (!payload) return payload.error();
        std::string_view b = payload.value();
        if (length_bytes == 4 && b.size() > 0x7fffffff) return fail("negative LONG4 length");
        if (b.size() > 8) return push(make_opaque("int"));  // beyond int64; nothing in a state dict needs it
        uint64_t u = 0;
        for (size_t i = 0; i < b.size(); ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
        if (!b.empty() && b.size() < 8 && (static_cast<uint8_t>(b.back()) & 0x80)) u |= ~uint64_t{0} << (8 * b.size());
        int64_t x;
        std::memcpy(&x, &u, sizeof x);
        return push(make_int(x));
    }

    Status push_global(std::string_view module, std::string_view name) {
        std::string full;
        full.reserve(module.size() + 1 + name.size());
        full.append(module).append(".").append(name);
        if (!classify_global(full)) return fail("forbidden global '" + printable(full) + "'");
        PickleValue* v = make(Kind::Global);
        v->text = std::move(full);
        return push(v);
    }

    Status memo_put(uint64_t index) {
        auto v = top();
        if (!v) return v.error();
        if (memo_.size() >= kMaxMemo && memo_.find(index) == memo_.end()) {
            return fail("memo too large (more than " + std::to_string(kMaxMemo) + " entries)");
        }
        memo_[index] = v.value();
        return Status::Ok();
    }
    Status memo_get(uint64_t index) {
        auto it = memo_.find(index);
        if (it == memo_.end()) return fail("memo index " + std::to_string(index) + " not found");
        return push(it->second);
    }

    Status make_tuple(const std::vector<PickleValue*>& items) {
        PickleValue* t = make(Kind::Tuple);
        t->items.assign(items.begin(), items.end());
        for (const PickleValue* item : items) KILN_TRY(note_child(t, item));
        return push(t);
    }
    Status tuple_n(size_t n) {
        if (stack_.size() - floor() < n) return fail("stack underflow in " + op_label());
        std::vector<PickleValue*> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        return make_tuple(items);
    }

    Status append_items(PickleValue* target, const std::vector<PickleValue*>& items) {
        if (target->kind == Kind::Opaque) return Status::Ok();  // placeholders absorb anything
        if (target->kind != Kind::List && !(op_ == 0x90 && target->kind == Kind::Set)) {
            return fail(op_label() + " on a " + pickle_kind_name(target->kind));
        }
        for (PickleValue* item : items) {
            KILN_TRY(note_child(target, item));
            target->items.push_back(item);
        }
        return Status::Ok();
    }

    Status set_items(PickleValue* target, const std::vector<PickleValue*>& items) {
        if (items.size() % 2 != 0) return fail(op_label() + " with an odd number of items");
        if (target->kind == Kind::Opaque) return Status::Ok();
        if (target->kind != Kind::Dict) return fail(op_label() + " on a " + pickle_kind_name(target->kind));
        for (size_t i = 0; i < items.size(); i += 2) KILN_TRY(dict_set(target, items[i], items[i + 1]));
        return Status::Ok();
    }

    // BINPERSID: torch's ('storage', storage type, key, location, numel).
    Status persistent_load(const PickleValue* pid) {
        const auto& it = pid->items;
        const bool ok = pid->kind == Kind::Tuple && it.size() == 5 &&
                        (it[0]->kind == Kind::String || it[0]->kind == Kind::Bytes) && it[0]->text == "storage" &&
                        it[1]->kind == Kind::Global && classify_global(it[1]->text) == GlobalRole::StorageType &&
                        it[2]->kind == Kind::String && it[3]->kind == Kind::String && it[4]->kind == Kind::Int &&
                        it[4]->integer >= 0;
        if (!ok) return fail("persistent id is not a torch storage reference ('storage', type, key, location, numel)");
        if (it[2]->text.size() > kMaxStorageKey)
            return fail("storage key longer than " + std::to_string(kMaxStorageKey) + " bytes");
        PickleValue* s = make(Kind::Storage);
        s->storage = std::make_unique<PickleValue::StorageRef>();
        s->storage->type = std::string_view(it[1]->text).substr(6);  // drop "torch."
        s->storage->key = it[2]->text;
        s->storage->location = it[3]->text;
        s->storage->numel = it[4]->integer;
        return push(s);
    }

    // Reads a tuple of ints (a tensor's size or stride).
    bool int_tuple(const PickleValue* v, std::vector<int64_t>& out) {
        if (v->kind != Kind::Tuple || v->items.size() > kMaxTensorDims) return false;
        out.clear();
        for (const PickleValue* item : v->items) {
            if (item->kind != Kind::Int) return false;
            out.push_back(item->integer);
        }
        return true;
    }

    Result<PickleValue*> rebuild_tensor_v2(const PickleValue* args) {
        // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        const auto& a = args->items;
        auto t = std::make_unique<PickleValue::TensorRef>();
        const bool ok = (a.size() == 6 || a.size() == 7) && a[0]->kind == Kind::Storage && a[1]->kind == Kind::Int &&
                        a[1]->integer >= 0 && int_tuple(a[2], t->shape) && int_tuple(a[3], t->stride) &&
                        t->shape.size() == t->stride.size();
        if (!ok) return fail("bad arguments to torch._utils._rebuild_tensor_v2");
        for (int64_t d : t->shape) {
            if (d < 0) return fail("negative tensor dimension in torch._utils._rebuild_tensor_v2");
        }
        t->storage_value = a[0];
        t->storage_offset = a[1]->integer;
        PickleValue* v = make(Kind::Tensor);
        v->tensor = std::move(t);
        return v;
    }

    Status reduce() {
        auto args_r = pop();
        if (!args_r) return args_r.error();
        auto callable_r = pop();
        if (!callable_r) return callable_r.error();
        const PickleValue* args = args_r.value();
        const PickleValue* callable = callable_r.value();

        if (callable->kind == Kind::Opaque) return push(make_opaque(callable->text));
        if (callable->kind != Kind::Global) return fail("REDUCE on a " + std::string(pickle_kind_name(callable->kind)));
        const GlobalRole role = *classify_global(callable->text);
        if (role == GlobalRole::Inert) return push(make_opaque(callable->text));
        if (args->kind != Kind::Tuple)
            return fail("REDUCE arguments are a " + std::string(pickle_kind_name(args->kind)));

        switch (role) {
            case GlobalRole::OrderedDict:
                // torch writes OrderedDict() and adds the items with SETITEMS;
                // taking no arguments keeps every copy linear in the input.
                if (!args->items.empty()) return fail("collections.OrderedDict with arguments is not supported");
                return push(make(Kind::Dict));
            case GlobalRole::RebuildTensorV2: {
                auto t = rebuild_tensor_v2(args);
                if (!t) return t.error();
                return push(t.value());
            }
            case GlobalRole::RebuildParameter:
            case GlobalRole::RebuildParameterWithState: {
                // (data, requires_grad, backward_hooks[, state]): a Parameter is its data.
                const size_t n = role == GlobalRole::RebuildParameter ? 3 : 4;
                if (args->items.size() != n || args->items[0]->kind != Kind::Tensor) {
                    return fail("bad arguments to " + callable->text);
                }
                PickleValue* v = make(Kind::Tensor);
                v->tensor = std::make_unique<PickleValue::TensorRef>(*args->items[0]->tensor);
                return push(v);
            }
            case GlobalRole::Size: {
                std::vector<int64_t> dims;
                if (args->items.size() != 1 || !int_tuple(args->items[0], dims))
                    return fail("bad arguments to torch.Size");
                PickleValue* t = make(Kind::Tuple);
                t->items = args->items[0]->items;
                t->depth = 1;
                return push(t);
            }
            case GlobalRole::StorageType:
            case GlobalRole::Dtype:
            case GlobalRole::Inert: break;
        }
        return fail("cannot call '" + callable->text + "'");
    }

    // NEWOBJ / NEWOBJ_EX: cls.__new__(cls, *args).
    Status new_object(const PickleValue* cls) {
        if (cls->kind == Kind::Opaque) return push(make_opaque(cls->text));
        if (cls->kind == Kind::Global) {
            const GlobalRole role = *classify_global(cls->text);
            if (role == GlobalRole::Inert) return push(make_opaque(cls->text));
            if (role == GlobalRole::OrderedDict) return push(make(Kind::Dict));  // __new__ ignores its arguments
        }
        const std::string what = cls->kind == Kind::Global ? "'" + cls->text + "'" : pickle_kind_name(cls->kind);
        return fail(op_label() + " on " + what);
    }

    Status build() {
        auto state = pop();
        if (!state) return state.error();
        auto target = top();
        if (!target) return target.error();
        // Attributes set by BUILD (a state dict's _metadata, a placeholder's
        // fields) carry nothing kiln reads; keep the object as it is.
        switch (target.value()->kind) {
            case Kind::Dict:
            case Kind::Tensor:
            case Kind::Opaque: return Status::Ok();
            default: return fail("BUILD on a " + std::string(pickle_kind_name(target.value()->kind)));
        }
    }

    Status unsupported() {
        const char* name = opcode_name(op_);
        if (name) return fail("unsupported opcode " + std::string(name) + " (" + hex_byte(op_) + ")");
        return fail("unknown opcode " + hex_byte(op_));
    }

    Status step(bool& stop) {
        switch (op_) {
            case 0x80: {  // PROTO
                auto proto = read_uint(1);
                if (!proto) return proto.error();
                if (proto.value() > 5) return fail("unsupported pickle protocol " + std::to_string(proto.value()));
                return Status::Ok();
            }
            case 0x95: {  // FRAME: framing is only a buffering hint
                auto len = read_uint(8);
                if (!len) return len.error();
                return need(len.value());
            }
            case 0x2e: {  // STOP
                auto v = pop();
                if (!v) return v.error();
                doc_.root = v.value();
                stop = true;
                return Status::Ok();
            }
            case 0x28:  // MARK
                if (marks_.size() >= kMaxPickleNesting) {
                    return fail("nesting deeper than " + std::to_string(kMaxPickleNesting) + " (MARK)");
                }
                marks_.push_back(stack_.size());
                return Status::Ok();
            case 0x30: {  // POP
                auto v = pop();
                return v ? Status::Ok() : Status(v.error());
            }
            case 0x31: {  // POP_MARK
                auto items = pop_mark();
                return items ? Status::Ok() : Status(items.error());
            }
            case 0x32: {  // DUP
                auto v = top();
                if (!v) return v.error();
                return push(v.value());
            }

            case 0x4e:  // NONE
                if (!none_) none_ = make(Kind::None);
                return push(none_);
            case 0x88:  // NEWTRUE
            case 0x89:  // NEWFALSE
            {
                PickleValue*& slot = op_ == 0x88 ? true_ : false_;
                if (!slot) {
                    slot = make(Kind::Bool);
                    slot->boolean = op_ == 0x88;
                }
                return push(slot);
            }
            case 0x4a: {  // BININT: signed 32-bit
                auto u = read_uint(4);
                if (!u) return u.error();
                return push(make_int(static_cast<int32_t>(static_cast<uint32_t>(u.value()))));
            }
            case 0x4b:    // BININT1
            case 0x4d: {  // BININT2
                auto u = read_uint(op_ == 0x4b ? 1 : 2);
                if (!u) return u.error();
                return push(make_int(static_cast<int64_t>(u.value())));
            }
            case 0x8a: return push_long(1);  // LONG1
            case 0x8b: return push_long(4);  // LONG4
            case 0x47: {                     // BINFLOAT: big-endian double
                KILN_TRY(need(8));
                uint64_t u = 0;
                for (size_t i = 0; i < 8; ++i) u = (u << 8) | data_[pos_ + i];
                pos_ += 8;
                PickleValue* v = make(Kind::Float);
                std::memcpy(&v->number, &u, sizeof u);
                return push(v);
            }

            case 0x58: return push_text(Kind::String, 4);  // BINUNICODE
            case 0x8c: return push_text(Kind::String, 1);  // SHORT_BINUNICODE
            case 0x8d: return push_text(Kind::String, 8);  // BINUNICODE8
            case 0x54: {                                   // BINSTRING: signed 32-bit length
                KILN_TRY(need(4));
                if (data_[pos_ + 3] & 0x80) return fail("negative BINSTRING length");
                return push_text(Kind::Bytes, 4);
            }
            case 0x55: return push_text(Kind::Bytes, 1);  // SHORT_BINSTRING
            case 0x42: return push_text(Kind::Bytes, 4);  // BINBYTES
            case 0x43: return push_text(Kind::Bytes, 1);  // SHORT_BINBYTES
            case 0x8e: return push_text(Kind::Bytes, 8);  // BINBYTES8
            case 0x96: return push_text(Kind::Bytes, 8);  // BYTEARRAY8

            case 0x7d: return push(make(Kind::Dict));   // EMPTY_DICT
            case 0x5d: return push(make(Kind::List));   // EMPTY_LIST
            case 0x29: return push(make(Kind::Tuple));  // EMPTY_TUPLE
            case 0x8f: return push(make(Kind::Set));    // EMPTY_SET
            case 0x85: return tuple_n(1);               // TUPLE1
            case 0x86: return tuple_n(2);               // TUPLE2
            case 0x87: return tuple_n(3);               // TUPLE3
            case 0x74: {                                // TUPLE
                auto items = pop_mark();
                if (!items) return items.error();
                return make_tuple(items.value());
            }
            case 0x6c:    // LIST
            case 0x91: {  // FROZENSET
                auto items = pop_mark();
                if (!items) return items.error();
                PickleValue* c = make(op_ == 0x6c ? Kind::List : Kind::Set);
                c->items.assign(items.value().begin(), items.value().end());
                for (const PickleValue* item : items.value()) KILN_TRY(note_child(c, item));
                return push(c);
            }
            case 0x64: {  // DICT
                auto items = pop_mark();
                if (!items) return items.error();
                PickleValue* d = make(Kind::Dict);
                KILN_TRY(set_items(d, items.value()));
                return push(d);
            }
            case 0x61: {  // APPEND
                auto v = pop();
                if (!v) return v.error();
                auto target = top();
                if (!target) return target.error();
                return append_items(target.value(), {v.value()});
            }
            case 0x65:    // APPENDS
            case 0x90: {  // ADDITEMS
                auto items = pop_mark();
                if (!items) return items.error();
                auto target = top();
                if (!target) return target.error();
                return append_items(target.value(), items.value());
            }
            case 0x73: {  // SETITEM
                auto value = pop();
                if (!value) return value.error();
                auto key = pop();
                if (!key) return key.error();
                auto target = top();
                if (!target) return target.error();
                return set_items(target.value(), {key.value(), value.value()});
            }
            case 0x75: {  // SETITEMS
                auto items = pop_mark();
                if (!items) return items.error();
                auto target = top();
                if (!target) return target.error();
                return set_items(target.value(), items.value());
            }

            case 0x71: {  // BINPUT
                auto i = read_uint(1);
                if (!i) return i.error();
                return memo_put(i.value());
            }
            case 0x72: {  // LONG_BINPUT
                auto i = read_uint(4);
                if (!i) return i.error();
                return memo_put(i.value());
            }
            case 0x94: return memo_put(memo_.size());  // MEMOIZE
            case 0x68: {                               // BINGET
                auto i = read_uint(1);
                if (!i) return i.error();
                return memo_get(i.value());
            }
            case 0x6a: {  // LONG_BINGET
                auto i = read_uint(4);
                if (!i) return i.error();
                return memo_get(i.value());
            }

            case 0x63: {  // GLOBAL: "module\nname\n"
                auto module = read_line();
                if (!module) return module.error();
                auto name = read_line();
                if (!name) return name.error();
                return push_global(module.value(), name.value());
            }
            case 0x93: {  // STACK_GLOBAL
                auto name = pop();
                if (!name) return name.error();
                auto module = pop();
                if (!module) return module.error();
                if (module.value()->kind != Kind::String || name.value()->kind != Kind::String) {
                    return fail("STACK_GLOBAL needs two strings");
                }
                return push_global(module.value()->text, name.value()->text);
            }
            case 0x52: return reduce();  // REDUCE
            case 0x81: {                 // NEWOBJ: cls, args
                auto args = pop();
                if (!args) return args.error();
                auto cls = pop();
                if (!cls) return cls.error();
                return new_object(cls.value());
            }
            case 0x92: {  // NEWOBJ_EX: cls, args, kwargs
                auto kwargs = pop();
                if (!kwargs) return kwargs.error();
                auto args = pop();
                if (!args) return args.error();
                auto cls = pop();
                if (!cls) return cls.error();
                return new_object(cls.value());
            }
            case 0x62: return build();  // BUILD
            case 0x51: {                // BINPERSID
                auto pid = pop();
                if (!pid) return pid.error();
                return persistent_load(pid.value());
            }

            default: return unsupported();
        }
    }
};

Result<PickleDocument> unpickle(const uint8_t* data, size_t size) {
    PickleParser parser(data, size);
    return parser.run();
}

}  // namespace kiln::io
