// The restricted unpickler: pickles are built byte by byte here so that each
// test controls exactly which opcodes appear and where.
#include "io/pickle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_files.h"

namespace kiln::io {
namespace {

using Kind = PickleValue::Kind;
using test::put_bytes;
using test::put_u32;
using test::put_u64;
using test::put_u8;

// Appends opcodes and their arguments; at() is the offset the next opcode
// will have, for checking "at byte N" in messages.
class PickleBuilder {
  public:
    size_t at() const { return bytes.size(); }
    PickleBuilder& op(uint8_t o) {
        put_u8(bytes, o);
        return *this;
    }
    PickleBuilder& proto(uint8_t v = 2) { return op(0x80).op(v); }
    PickleBuilder& stop() { return op('.'); }
    PickleBuilder& mark() { return op('('); }
    PickleBuilder& int1(uint8_t v) { return op('K').op(v); }
    PickleBuilder& int4(int32_t v) {
        op('J');
        put_u32(bytes, static_cast<uint32_t>(v));
        return *this;
    }
    PickleBuilder& str(std::string_view s) {
        op('X');
        put_u32(bytes, static_cast<uint32_t>(s.size()));
        put_bytes(bytes, s);
        return *this;
    }
    PickleBuilder& short_str(std::string_view s) {
        op(0x8c).op(static_cast<uint8_t>(s.size()));
        put_bytes(bytes, s);
        return *this;
    }
    PickleBuilder& global(std::string_view module, std::string_view name) {
        op('c');
        put_bytes(bytes, module);
        put_u8(bytes, '\n');
        put_bytes(bytes, name);
        put_u8(bytes, '\n');
        return *this;
    }
    PickleBuilder& put(uint8_t i) { return op('q').op(i); }
    PickleBuilder& get(uint8_t i) { return op('h').op(i); }
    PickleBuilder& ints_tuple(const std::vector<int64_t>& v) {
        mark();
        for (int64_t x : v) int4(static_cast<int32_t>(x));
        return op('t');
    }
    // torch's _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()).
    PickleBuilder& tensor(std::string_view storage_type, std::string_view key, int64_t numel, int64_t offset,
                          const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
        global("torch._utils", "_rebuild_tensor_v2");
        mark();
        mark().str("storage").global("torch", storage_type).str(key).str("cpu").int4(static_cast<int32_t>(numel));
        op('t').op('Q');  // TUPLE, BINPERSID
        int4(static_cast<int32_t>(offset)).ints_tuple(shape).ints_tuple(stride).op(0x89);
        global("collections", "OrderedDict").op(')').op('R');
        op('t').op('R');
        return *this;
    }
    std::vector<uint8_t> bytes;
};

Result<PickleDocument> run(const PickleBuilder& p) { return unpickle(p.bytes.data(), p.bytes.size()); }

std::string error_of(const PickleBuilder& p) {
    auto r = run(p);
    return r.ok() ? std::string("(no error)") : r.error().message;
}

TEST(Pickle, StateDictAsTorchWritesIt) {
    PickleBuilder p;
    p.proto().op('}').put(0).mark();
    p.str("w").tensor("HalfStorage", "0", 6, 0, {2, 3}, {3, 1});
    p.str("b").tensor("FloatStorage", "1", 4, 1, {3}, {1});
    p.str("step").int1(7);
    p.op('u').stop();  // SETITEMS

    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    const PickleValue* root = doc->root;
    ASSERT_EQ(root->kind, Kind::Dict);
    ASSERT_EQ(root->entries.size(), 3u);

    const PickleValue* w = root->find("w");
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(w->kind, Kind::Tensor);
    EXPECT_EQ(w->tensor->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(w->tensor->stride, (std::vector<int64_t>{3, 1}));
    EXPECT_EQ(w->tensor->storage_offset, 0);
    const PickleValue* storage = w->tensor->storage_value;
    ASSERT_EQ(storage->kind, Kind::Storage);
    EXPECT_EQ(storage->storage->type, "HalfStorage");
    EXPECT_EQ(storage->storage->key, "0");
    EXPECT_EQ(storage->storage->location, "cpu");
    EXPECT_EQ(storage->storage->numel, 6);

    const PickleValue* b = root->find("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->tensor->storage_offset, 1);
    EXPECT_EQ(b->tensor->storage_value->storage->type, "FloatStorage");

    ASSERT_NE(root->find("step"), nullptr);
    EXPECT_EQ(root->find("step")->integer, 7);
    EXPECT_EQ(root->find("missing"), nullptr);
}

TEST(Pickle, OrderedDictWithMetadataBuildAndParameter) {
    PickleBuilder p;
    p.proto().global("collections", "OrderedDict").put(1).op(')').op('R').put(2);
    p.mark().str("p").global("torch._utils", "_rebuild_parameter");
    p.tensor("FloatStorage", "0", 2, 0, {2}, {1}).op(0x88).get(1).op(')').op('R').op(0x87).op('R');  // TUPLE3, REDUCE
    p.op('u');
    // state dict._metadata, set through BUILD: ignored.
    p.op('}').str("_metadata").get(1).op(')').op('R').op('s').op('b');
    p.stop();

    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    ASSERT_EQ(doc->root->kind, Kind::Dict);
    ASSERT_EQ(doc->root->entries.size(), 1u);
    const PickleValue* param = doc->root->find("p");
    ASSERT_NE(param, nullptr);
    ASSERT_EQ(param->kind, Kind::Tensor);
    EXPECT_EQ(param->tensor->shape, std::vector<int64_t>{2});
}

TEST(Pickle, ScalarsStringsAndContainers) {
    PickleBuilder p;
    p.proto(4);
    p.op(0x95);
    put_u64(p.bytes, 0);  // FRAME of 0 bytes (a hint; ignored)
    p.op(']').op(0x94);   // EMPTY_LIST, MEMOIZE -> memo 0
    p.mark();
    p.int4(-5);
    p.op('M').op(0x34).op(0x12);         // BININT2 0x1234
    p.op(0x8a).op(2).op(0x00).op(0x80);  // LONG1 2 bytes: -32768
    p.op(0x8a).op(0);                    // LONG1 0 bytes: 0
    p.op(0x8a).op(9);                    // LONG1 9 bytes: beyond int64
    for (int i = 0; i < 9; ++i) p.op(0x11);
    p.op('G');  // BINFLOAT 1.5 (big-endian)
    for (int byte : {0x3f, 0xf8, 0, 0, 0, 0, 0, 0}) p.op(static_cast<uint8_t>(byte));
    p.short_str("hi").op('U').op(2).op('a').op('b');  // SHORT_BINSTRING
    p.op('C').op(1).op('z');                          // SHORT_BINBYTES
    p.op('N').op(0x88).op(0x89);
    p.int1(1).int1(2).op(0x86);                       // TUPLE2
    p.short_str("torch").short_str("Size").op(0x93);  // STACK_GLOBAL torch.Size
    p.ints_tuple({4, 5}).op(0x85).op('R');            // torch.Size((4, 5))
    p.mark().short_str("k").int1(9).op('d');          // DICT {"k": 9}
    p.op('e');                                        // APPENDS
    p.op('j');
    put_u32(p.bytes, 0);  // LONG_BINGET 0: the list itself
    p.op('0');            // POP it again
    p.stop();

    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    const PickleValue* list = doc->root;
    ASSERT_EQ(list->kind, Kind::List);
    ASSERT_EQ(list->items.size(), 15u);
    const auto& it = list->items;
    EXPECT_EQ(it[0]->integer, -5);
    EXPECT_EQ(it[1]->integer, 0x1234);
    EXPECT_EQ(it[2]->integer, -32768);
    EXPECT_EQ(it[3]->integer, 0);
    EXPECT_EQ(it[4]->kind, Kind::Opaque);
    EXPECT_EQ(it[5]->number, 1.5);
    EXPECT_EQ(it[6]->kind, Kind::String);
    EXPECT_EQ(it[6]->text, "hi");
    EXPECT_EQ(it[7]->kind, Kind::Bytes);
    EXPECT_EQ(it[7]->text, "ab");
    EXPECT_EQ(it[8]->text, "z");
    EXPECT_EQ(it[9]->kind, Kind::None);
    EXPECT_TRUE(it[10]->boolean);
    EXPECT_FALSE(it[11]->boolean);
    ASSERT_EQ(it[12]->kind, Kind::Tuple);
    EXPECT_EQ(it[12]->items.size(), 2u);
    // torch.Size((4, 5)) is the tuple (4, 5); the DICT went in last.
    ASSERT_EQ(it[13]->kind, Kind::Tuple);
    ASSERT_EQ(it[13]->items.size(), 2u);
    EXPECT_EQ(it[13]->items[0]->integer, 4);
    ASSERT_EQ(it[14]->kind, Kind::Dict);
    EXPECT_EQ(it[14]->find("k")->integer, 9);
}

TEST(Pickle, TorchSizeBecomesTuple) {
    PickleBuilder p;
    p.proto().global("torch", "Size").ints_tuple({4, 5}).op(0x85).op('R').stop();
    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    ASSERT_EQ(doc->root->kind, Kind::Tuple);
    ASSERT_EQ(doc->root->items.size(), 2u);
    EXPECT_EQ(doc->root->items[1]->integer, 5);
}

TEST(Pickle, RepeatedStringKeyReplacesValue) {
    PickleBuilder p;
    p.proto().op('}').mark().str("a").int1(1).str("b").int1(2).str("a").int1(3).op('u').stop();
    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    ASSERT_EQ(doc->root->entries.size(), 2u);
    EXPECT_EQ(doc->root->entries[0].first->text, "a");
    EXPECT_EQ(doc->root->find("a")->integer, 3);
}

TEST(Pickle, SelfReferenceIsHarmless) {
    // l = []; l.append(l): a cycle, which the flat ownership tolerates.
    PickleBuilder p;
    p.proto().op(']').put(0).get(0).op('a').stop();
    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    ASSERT_EQ(doc->root->items.size(), 1u);
    EXPECT_EQ(doc->root->items[0], doc->root);
}

TEST(Pickle, InertGlobalsBecomePlaceholders) {
    // What Lightning checkpoints carry: a callbacks dict keyed by the
    // ModelCheckpoint class, numpy scalars, _codecs.encode'd bytes, sets.
    PickleBuilder p;
    p.proto().op('}').mark();
    p.global("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint").op('}').str("best").int1(1).op('s');
    p.str("score").global("numpy.core.multiarray", "scalar");
    p.global("numpy", "dtype").short_str("f8").op(0x89).op(0x88).op(0x87).op('R');  // numpy.dtype('f8', False, True)
    p.op('}').op('b');                                                              // BUILD on the placeholder
    p.global("_codecs", "encode").short_str("\x01\x02").short_str("latin1").op(0x86).op('R').op(0x86).op('R');
    p.str("set").global("__builtin__", "set").op(']').op(0x85).op('R');
    p.str("obj").global("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint").op(')').op(0x81);  // NEWOBJ
    p.op('u').stop();

    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    const PickleValue* root = doc->root;
    ASSERT_EQ(root->entries.size(), 4u);
    EXPECT_EQ(root->entries[0].first->kind, Kind::Global);
    EXPECT_EQ(root->entries[0].first->text, "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint");
    EXPECT_EQ(root->find("score")->kind, Kind::Opaque);
    EXPECT_EQ(root->find("score")->text, "numpy.core.multiarray.scalar");
    EXPECT_EQ(root->find("set")->kind, Kind::Opaque);
    EXPECT_EQ(root->find("obj")->kind, Kind::Opaque);
}

TEST(Pickle, ForbiddenGlobals) {
    {
        PickleBuilder p;
        p.proto();
        const size_t at = p.at();
        p.global("os", "system").str("echo pwned").op(0x85).op('R').stop();
        EXPECT_EQ(error_of(p), "pickle: forbidden global 'os.system' at byte " + std::to_string(at));
    }
    {
        PickleBuilder p;  // protocol 4 style: STACK_GLOBAL
        p.proto(4).short_str("builtins").short_str("eval");
        const size_t at = p.at();
        p.op(0x93).short_str("1+1").op(0x85).op('R').stop();
        EXPECT_EQ(error_of(p), "pickle: forbidden global 'builtins.eval' at byte " + std::to_string(at));
    }
    for (auto [module, name] : {std::pair{"subprocess", "Popen"}, std::pair{"posix", "system"},
                                std::pair{"torch", "load"}, std::pair{"collections", "OrderedDictX"},
                                std::pair{"torch._utils", "_rebuild_tensor"}, std::pair{"__builtin__", "getattr"}}) {
        PickleBuilder p;
        p.proto().op('}').global(module, name).stop();
        EXPECT_EQ(error_of(p), "pickle: forbidden global '" + std::string(module) + "." + name + "' at byte 3");
    }
    {
        // Binary junk in a name is escaped in the message.
        PickleBuilder p;
        p.proto().global("os", std::string("sys\x01tem", 7)).stop();
        EXPECT_EQ(error_of(p), "pickle: forbidden global 'os.sys\\x01tem' at byte 2");
    }
}

TEST(Pickle, ForbiddenOpcodes) {
    struct Case {
        uint8_t op;
        const char* expected;
    };
    const Case cases[] = {
        {0x69, "unsupported opcode INST (0x69)"},
        {0x6f, "unsupported opcode OBJ (0x6f)"},
        {0x82, "unsupported opcode EXT1 (0x82)"},
        {0x83, "unsupported opcode EXT2 (0x83)"},
        {0x84, "unsupported opcode EXT4 (0x84)"},
        {0x50, "unsupported opcode PERSID (0x50)"},
        {0x49, "unsupported opcode INT (0x49)"},
        {0x4c, "unsupported opcode LONG (0x4c)"},
        {0x46, "unsupported opcode FLOAT (0x46)"},
        {0x53, "unsupported opcode STRING (0x53)"},
        {0x56, "unsupported opcode UNICODE (0x56)"},
        {0x67, "unsupported opcode GET (0x67)"},
        {0x70, "unsupported opcode PUT (0x70)"},
        {0x97, "unsupported opcode NEXT_BUFFER (0x97)"},
        {0x98, "unsupported opcode READONLY_BUFFER (0x98)"},
        {0xff, "unknown opcode 0xff"},
        {0x00, "unknown opcode 0x00"},
    };
    for (const Case& c : cases) {
        PickleBuilder p;
        p.proto().op('}').op(c.op).op('a').op('\n').stop();
        EXPECT_EQ(error_of(p), std::string("pickle: ") + c.expected + " at byte 3");
    }
    PickleBuilder p;
    p.proto(6).stop();
    EXPECT_EQ(error_of(p), "pickle: unsupported pickle protocol 6 at byte 0");
}

TEST(Pickle, TruncatedStreams) {
    EXPECT_EQ(error_of(PickleBuilder{}), "pickle: truncated: no STOP opcode at byte 0");
    {
        PickleBuilder p;
        p.proto().op('}');
        EXPECT_EQ(error_of(p), "pickle: truncated: no STOP opcode at byte 3");
    }
    {
        PickleBuilder p;
        p.proto().op('X');
        put_u32(p.bytes, 1000);
        put_bytes(p.bytes, "abc");
        EXPECT_EQ(error_of(p), "pickle: truncated: BINUNICODE needs 1000 bytes, 3 left at byte 2");
    }
    {
        PickleBuilder p;  // a length near 2^64 must not wrap any arithmetic
        p.proto(4).op(0x8e);
        put_u64(p.bytes, ~uint64_t{0});
        EXPECT_EQ(error_of(p), "pickle: truncated: BINBYTES8 needs 18446744073709551615 bytes, 0 left at byte 2");
    }
    {
        PickleBuilder p;
        p.proto().op('c');
        put_bytes(p.bytes, "torch\nFloatStor");
        EXPECT_EQ(error_of(p), "pickle: truncated: GLOBAL argument has no end of line at byte 2");
    }
    {
        PickleBuilder p;
        p.proto().op('J').op(1);
        EXPECT_EQ(error_of(p), "pickle: truncated: BININT needs 4 bytes, 1 left at byte 2");
    }
    {
        PickleBuilder p;
        p.proto(4).op(0x95);
        put_u64(p.bytes, 100);
        EXPECT_EQ(error_of(p), "pickle: truncated: FRAME needs 100 bytes, 0 left at byte 2");
    }
    {
        PickleBuilder p;
        p.proto().op('T');
        put_u32(p.bytes, 0x80000000u);
        EXPECT_EQ(error_of(p), "pickle: negative BINSTRING length at byte 2");
    }
    // Every prefix of a valid state dict fails cleanly.
    PickleBuilder full;
    full.proto().op('}').put(0).mark().str("w").tensor("FloatStorage", "0", 4, 0, {4}, {1}).op('u').stop();
    ASSERT_TRUE(run(full).ok());
    for (size_t n = 0; n < full.bytes.size(); ++n) {
        auto r = unpickle(full.bytes.data(), n);
        ASSERT_FALSE(r.ok()) << n;
        EXPECT_NE(r.error().message.find("truncated"), std::string::npos) << r.error().message;
    }
}

TEST(Pickle, BadMemoIndex) {
    PickleBuilder p;
    p.proto().op('}').put(0).get(5).stop();
    EXPECT_EQ(error_of(p), "pickle: memo index 5 not found at byte 5");
    PickleBuilder q;
    q.proto().op('j');
    put_u32(q.bytes, 70000);
    q.stop();
    EXPECT_EQ(error_of(q), "pickle: memo index 70000 not found at byte 2");
    PickleBuilder r;  // BINPUT with nothing to store
    r.proto().put(0).stop();
    EXPECT_EQ(error_of(r), "pickle: stack underflow in BINPUT at byte 2");
}

TEST(Pickle, StackUnderflow) {
    {
        PickleBuilder p;
        p.proto().stop();
        EXPECT_EQ(error_of(p), "pickle: stack underflow in STOP at byte 2");
    }
    {
        PickleBuilder p;
        p.proto().int1(1).op(0x86).stop();
        EXPECT_EQ(error_of(p), "pickle: stack underflow in TUPLE2 at byte 4");
    }
    {
        // Items below a MARK are out of reach until the MARK is popped.
        PickleBuilder p;
        p.proto().op(']').mark().op('a').stop();
        EXPECT_EQ(error_of(p), "pickle: stack underflow in APPEND at byte 4");
    }
    {
        PickleBuilder p;
        p.proto().op('}').op('R').stop();
        EXPECT_EQ(error_of(p), "pickle: stack underflow in REDUCE at byte 3");
    }
    {
        PickleBuilder p;
        p.proto().int1(1).op('t').stop();
        EXPECT_EQ(error_of(p), "pickle: TUPLE without a MARK at byte 4");
    }
    {
        PickleBuilder p;
        p.proto().mark().int1(1).op('e').stop();
        EXPECT_EQ(error_of(p), "pickle: stack underflow in APPENDS at byte 5");
    }
}

TEST(Pickle, DeepNestingIsRejected) {
    {
        PickleBuilder p;
        p.proto();
        for (int i = 0; i < 1000; ++i) p.mark();
        EXPECT_EQ(error_of(p), "pickle: nesting deeper than 100 (MARK) at byte " + std::to_string(2 + 100));
    }
    {
        // ((((...)))) built with TUPLE1 needs no MARK.
        PickleBuilder p;
        p.proto().op(')');
        for (int i = 0; i < 100000; ++i) p.op(0x85);
        p.stop();
        EXPECT_EQ(error_of(p), "pickle: nesting deeper than 100 at byte " + std::to_string(3 + 100));
    }
    {
        // [[[...]]] through APPEND onto fresh lists: memo 0 holds the latest.
        PickleBuilder p;
        p.proto().op(']').put(0);
        for (int i = 0; i < 200; ++i) p.op(']').get(0).op('a').put(0);
        p.stop();
        EXPECT_NE(error_of(p).find("nesting deeper than 100"), std::string::npos);
    }
}

TEST(Pickle, WrongTargets) {
    {
        PickleBuilder p;
        p.proto().op(']').str("k").int1(1).op('s').stop();
        EXPECT_EQ(error_of(p), "pickle: SETITEM on a list at byte 11");
    }
    {
        PickleBuilder p;
        p.proto().op('}').int1(1).op('a').stop();
        EXPECT_EQ(error_of(p), "pickle: APPEND on a dict at byte 5");
    }
    {
        PickleBuilder p;
        p.proto().op('}').mark().int1(1).op('u').stop();
        EXPECT_EQ(error_of(p), "pickle: SETITEMS with an odd number of items at byte 6");
    }
    {
        PickleBuilder p;
        p.proto().op(')').op(')').op('R').stop();
        EXPECT_EQ(error_of(p), "pickle: REDUCE on a tuple at byte 4");
    }
    {
        PickleBuilder p;
        p.proto().global("torch", "FloatStorage").op(')').op('R').stop();
        EXPECT_EQ(error_of(p), "pickle: cannot call 'torch.FloatStorage' at byte 23");
    }
    {
        PickleBuilder p;
        p.proto().global("collections", "OrderedDict").op(']').op(0x85).op('R').stop();
        EXPECT_NE(error_of(p).find("OrderedDict with arguments is not supported"), std::string::npos);
    }
    {
        PickleBuilder p;
        p.proto().global("torch", "Size").op(')').op(0x81).stop();
        EXPECT_EQ(error_of(p), "pickle: NEWOBJ on 'torch.Size' at byte 15");
    }
    {
        PickleBuilder p;
        p.proto().op(']').op('}').op('b').stop();
        EXPECT_EQ(error_of(p), "pickle: BUILD on a list at byte 4");
    }
    {
        PickleBuilder p;
        p.proto().int1(1).short_str("x").op(0x93).stop();
        EXPECT_EQ(error_of(p), "pickle: STACK_GLOBAL needs two strings at byte 7");
    }
}

TEST(Pickle, BadPersistentIdsAndTensorArguments) {
    {
        PickleBuilder p;  // os.system can't hide as a storage type either: the global is refused first
        p.proto().mark().str("storage").global("os", "system").stop();
        EXPECT_EQ(error_of(p), "pickle: forbidden global 'os.system' at byte 15");
    }
    {
        PickleBuilder p;
        p.proto().str("storage").op(0x85).op('Q').stop();
        EXPECT_EQ(error_of(p),
                  "pickle: persistent id is not a torch storage reference ('storage', type, key, location, numel) "
                  "at byte 15");
    }
    {
        PickleBuilder p;  // a dtype is not a storage type
        p.proto().mark().str("storage").global("torch", "float32").str("0").str("cpu").int1(1).op('t').op('Q').stop();
        EXPECT_NE(error_of(p).find("persistent id is not a torch storage reference"), std::string::npos);
    }
    {
        PickleBuilder p;  // stride shorter than size
        p.proto().global("torch._utils", "_rebuild_tensor_v2").mark();
        p.mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").int1(4).op('t').op('Q');
        p.int1(0).ints_tuple({2, 2}).ints_tuple({2}).op(0x89).op('}').op('t').op('R').stop();
        EXPECT_NE(error_of(p).find("bad arguments to torch._utils._rebuild_tensor_v2"), std::string::npos);
    }
    {
        PickleBuilder p;  // negative dimension
        p.proto().tensor("FloatStorage", "0", 4, 0, {-1}, {1}).stop();
        EXPECT_NE(error_of(p).find("negative tensor dimension"), std::string::npos);
    }
    {
        PickleBuilder p;  // more than 64 dimensions
        p.proto().tensor("FloatStorage", "0", 1, 0, std::vector<int64_t>(65, 1), std::vector<int64_t>(65, 1)).stop();
        EXPECT_NE(error_of(p).find("bad arguments to torch._utils._rebuild_tensor_v2"), std::string::npos);
    }
    {
        PickleBuilder p;  // _rebuild_parameter of a non-tensor
        p.proto().global("torch._utils", "_rebuild_parameter").int1(1).op(0x89).op('}').op(0x87).op('R').stop();
        EXPECT_NE(error_of(p).find("bad arguments to torch._utils._rebuild_parameter"), std::string::npos);
    }
}

TEST(Pickle, TrailingBytesAfterStopAreIgnored) {
    PickleBuilder p;
    p.proto().int1(3).stop().op(0xff).op(0x69);
    auto doc = run(p);
    ASSERT_TRUE(doc.ok()) << doc.error().message;
    EXPECT_EQ(doc->root->integer, 3);
}

}  // namespace
}  // namespace kiln::io
