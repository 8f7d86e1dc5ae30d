// parse_ckpt: a real torch.save fixture (tests/fixtures/tiny.ckpt, written by
// training/fixtures/make_ckpt_fixtures.py), a hostile one (evil.ckpt), and
// hand-built archives for the layouts and faults torch does not easily write.
#include "io/ckpt.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ggml.h"
#include "test_files.h"

namespace kiln::io {
namespace {

using test::put_bytes;
using test::put_u16;
using test::put_u32;
using test::put_u8;

const std::string kFixtures = KILN_FIXTURES_DIR;

// ---- hand-built checkpoints ------------------------------------------------

struct FileSpec {
    std::string name;
    std::string data;
    uint16_t method = 0;
};

// A plain zip of stored entries (CRCs 0: the reader ignores them).
std::vector<uint8_t> build_zip(const std::vector<FileSpec>& files) {
    std::vector<uint8_t> out;
    std::vector<uint32_t> offsets;
    for (const FileSpec& f : files) {
        offsets.push_back(static_cast<uint32_t>(out.size()));
        put_u32(out, 0x04034b50);
        put_u16(out, 20);
        put_u16(out, 0);
        put_u16(out, f.method);
        put_u32(out, 0);
        put_u32(out, 0);
        put_u32(out, static_cast<uint32_t>(f.data.size()));
        put_u32(out, static_cast<uint32_t>(f.data.size()));
        put_u16(out, static_cast<uint16_t>(f.name.size()));
        put_u16(out, 0);
        put_bytes(out, f.name);
        put_bytes(out, f.data);
    }
    const auto cd_offset = static_cast<uint32_t>(out.size());
    for (size_t i = 0; i < files.size(); ++i) {
        put_u32(out, 0x02014b50);
        put_u16(out, 20);
        put_u16(out, 20);
        put_u16(out, 0);
        put_u16(out, files[i].method);
        put_u32(out, 0);
        put_u32(out, 0);
        put_u32(out, static_cast<uint32_t>(files[i].data.size()));
        put_u32(out, static_cast<uint32_t>(files[i].data.size()));
        put_u16(out, static_cast<uint16_t>(files[i].name.size()));
        put_u16(out, 0);
        put_u16(out, 0);
        put_u16(out, 0);
        put_u16(out, 0);
        put_u32(out, 0);
        put_u32(out, offsets[i]);
        put_bytes(out, files[i].name);
    }
    const auto cd_size = static_cast<uint32_t>(out.size() - cd_offset);
    put_u32(out, 0x06054b50);
    put_u32(out, 0);
    put_u16(out, static_cast<uint16_t>(files.size()));
    put_u16(out, static_cast<uint16_t>(files.size()));
    put_u32(out, cd_size);
    put_u32(out, cd_offset);
    put_u16(out, 0);
    return out;
}

// Just enough of a pickle writer for state dicts.
class PickleBuilder {
  public:
    PickleBuilder& op(uint8_t o) {
        put_u8(bytes_, o);
        return *this;
    }
    PickleBuilder& str(std::string_view s) {
        op('X');
        put_u32(bytes_, static_cast<uint32_t>(s.size()));
        put_bytes(bytes_, s);
        return *this;
    }
    PickleBuilder& int4(int64_t v) {
        op('J');
        put_u32(bytes_, static_cast<uint32_t>(static_cast<int32_t>(v)));
        return *this;
    }
    PickleBuilder& global(std::string_view module, std::string_view name) {
        op('c');
        put_bytes(bytes_, std::string(module) + "\n" + std::string(name) + "\n");
        return *this;
    }
    PickleBuilder& ints(const std::vector<int64_t>& v) {
        op('(');
        for (int64_t x : v) int4(x);
        return op('t');
    }
    PickleBuilder& tensor(std::string_view storage_type, std::string_view key, int64_t offset,
                          const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
        global("torch._utils", "_rebuild_tensor_v2").op('(');
        op('(').str("storage").global("torch", storage_type).str(key).str("cpu").int4(0).op('t').op('Q');
        int4(offset).ints(shape).ints(stride).op(0x89).op('}').op('t').op('R');
        return *this;
    }
    PickleBuilder& begin_dict() { return op('}').op('('); }
    PickleBuilder& end_dict() { return op('u'); }
    std::string finish() {
        std::string s = "\x80\x02";
        s.append(bytes_.begin(), bytes_.end());
        return s + ".";
    }

  private:
    std::vector<uint8_t> bytes_;
};

// A checkpoint "<prefix>/data.pkl" + storages "<prefix>/data/<key>".
std::vector<uint8_t> build_ckpt(const std::string& pkl,
                                const std::vector<std::pair<std::string, std::string>>& storages,
                                const std::string& prefix = "archive") {
    std::vector<FileSpec> files{{prefix + "/data.pkl", pkl}};
    for (const auto& [key, data] : storages) files.push_back({prefix + "/data/" + key, data});
    files.push_back({prefix + "/version", "3\n"});
    return build_zip(files);
}

Result<ParsedFile> parse(const std::vector<uint8_t>& bytes, const std::string& label = "m.ckpt") {
    return parse_ckpt(bytes.data(), bytes.size(), label);
}

std::string error_of(const std::vector<uint8_t>& bytes) {
    auto r = parse(bytes);
    if (r.ok()) return "(no error)";
    EXPECT_EQ(r.error().message.rfind("m.ckpt: ", 0), 0u) << r.error().message;
    return r.error().message;
}

std::string floats(std::initializer_list<float> v) {
    return std::string(reinterpret_cast<const char*>(v.begin()), v.size() * sizeof(float));
}

// ---- the torch.save fixture ------------------------------------------------

struct Expected {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<double> values;
};

std::vector<Expected> read_expected(const std::string& path) {
    std::ifstream in(path);
    std::vector<Expected> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ls(line);
        Expected e;
        std::string shape;
        ls >> e.name >> e.dtype >> shape;
        if (shape != "-") {
            std::istringstream ss(shape);
            std::string dim;
            while (std::getline(ss, dim, ',')) e.shape.push_back(std::stoll(dim));
        }
        std::string v;
        while (ls >> v) e.values.push_back(std::stod(v));
        out.push_back(e);
    }
    return out;
}

// Element i of a tensor's bytes, as a double.
double decode(const std::string& dtype, const uint8_t* p, size_t i) {
    auto load = [&](auto tag) {
        decltype(tag) v;
        std::memcpy(&v, p + i * sizeof v, sizeof v);
        return v;
    };
    if (dtype == "F32") return load(float{});
    if (dtype == "F64") return load(double{});
    if (dtype == "F16") return ggml_fp16_to_fp32(load(ggml_fp16_t{}));
    if (dtype == "BF16") {
        const uint32_t bits = static_cast<uint32_t>(load(uint16_t{})) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
    if (dtype == "I64") return static_cast<double>(load(int64_t{}));
    if (dtype == "I32") return load(int32_t{});
    if (dtype == "I16") return load(int16_t{});
    if (dtype == "I8") return load(int8_t{});
    if (dtype == "U8" || dtype == "BOOL") return load(uint8_t{});
    ADD_FAILURE() << "unknown dtype " << dtype;
    return 0;
}

TEST(Ckpt, ReadsTorchSaveFixture) {
    const std::string path = kFixtures + "/tiny.ckpt";
    const std::vector<uint8_t> bytes = test::read_bytes(path);
    ASSERT_FALSE(bytes.empty());
    const std::vector<Expected> expected = read_expected(kFixtures + "/tiny_ckpt_expected.txt");
    ASSERT_EQ(expected.size(), 10u);

    auto parsed = parse_ckpt(bytes.data(), bytes.size(), path);
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    EXPECT_EQ(parsed->format, FileFormat::Ckpt);
    ASSERT_EQ(parsed->tensors.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
        const TensorInfo& t = parsed->tensors[i];
        const Expected& e = expected[i];
        SCOPED_TRACE(e.name);
        EXPECT_EQ(t.name, e.name);
        EXPECT_EQ(dtype_name(t.dtype), e.dtype);
        EXPECT_EQ(t.shape, e.shape);
        EXPECT_EQ(t.source, 0u);
        ASSERT_EQ(static_cast<size_t>(t.element_count()), e.values.size());
        EXPECT_EQ(t.nbytes, *dtype_byte_size(t.dtype, t.element_count()));
        ASSERT_LE(t.offset + t.nbytes, bytes.size());
        for (size_t k = 0; k < e.values.size(); ++k) {
            EXPECT_EQ(decode(e.dtype, bytes.data() + t.offset, k), e.values[k]) << "element " << k;
        }
    }
    // model.view = model.base[2:]: the same storage, two floats in.
    EXPECT_EQ(parsed->tensors[1].name, "model.view");
    EXPECT_EQ(parsed->tensors[1].offset, parsed->tensors[0].offset + 2 * sizeof(float));
}

TEST(Ckpt, RefusesToRunEvilPickle) {
    const char* marker = "/tmp/kiln_evil_ckpt_pwned";  // what the pickle would `touch`
    std::remove(marker);
    const std::string path = kFixtures + "/evil.ckpt";
    const std::vector<uint8_t> bytes = test::read_bytes(path);
    ASSERT_FALSE(bytes.empty());
    auto parsed = parse_ckpt(bytes.data(), bytes.size(), path);
    ASSERT_FALSE(parsed.ok());
    // os.system pickles as posix.system (its defining module) on Linux.
    EXPECT_EQ(parsed.error().message.rfind(path + ": pickle: forbidden global 'posix.system' at byte ", 0), 0u)
        << parsed.error().message;
    std::FILE* f = std::fopen(marker, "r");
    EXPECT_EQ(f, nullptr) << "the pickle's command ran";
    if (f) std::fclose(f);
}

TEST(Ckpt, ForbiddenGlobalMessageCarriesLabel) {
    PickleBuilder p;
    p.begin_dict().str("x").global("os", "system").str("echo pwned").op(0x85).op('R').end_dict();
    const std::string pkl = p.finish();
    auto r = parse(build_ckpt(pkl, {}), "model.ckpt");
    ASSERT_FALSE(r.ok());
    // PROTO(2) + EMPTY_DICT + MARK + BINUNICODE "x" (6 bytes) = byte 10.
    EXPECT_EQ(r.error().message, "model.ckpt: pickle: forbidden global 'os.system' at byte 10");
}

// ---- state dict discovery ----------------------------------------------------

TEST(Ckpt, TopLevelDictAndAnyPrefix) {
    PickleBuilder p;
    p.begin_dict().str("a").tensor("FloatStorage", "0", 0, {2}, {1});
    p.str("b").tensor("FloatStorage", "0", 1, {1}, {1}).str("n").int4(3).end_dict();
    const auto zip = build_ckpt(p.finish(), {{"0", floats({1, 2})}}, "some_name");
    auto r = parse(zip);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->tensors.size(), 2u);  // "n" is not a tensor
    EXPECT_EQ(r->tensors[0].name, "a");
    EXPECT_EQ(r->tensors[1].name, "b");
    EXPECT_EQ(r->tensors[1].offset, r->tensors[0].offset + 4);
    float v;
    std::memcpy(&v, zip.data() + r->tensors[1].offset, 4);
    EXPECT_EQ(v, 2.0f);
}

TEST(Ckpt, WrapperKeysAndNesting) {
    // {"model": {...}, "state_dict": {"x": {"y": t}}, "ema": {...}}: state_dict wins and flattens.
    PickleBuilder p;
    p.begin_dict();
    p.str("model").begin_dict().str("m").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict();
    p.str("state_dict").begin_dict().str("x").begin_dict().str("y").tensor("HalfStorage", "1", 0, {2}, {1});
    p.end_dict().end_dict();
    p.str("global_step").int4(5);
    p.end_dict();
    auto r = parse(build_ckpt(p.finish(), {{"0", floats({1})}, {"1", "abcd"}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->tensors.size(), 1u);
    EXPECT_EQ(r->tensors[0].name, "x.y");
    EXPECT_EQ(r->tensors[0].dtype, DType::F16);
    EXPECT_EQ(r->tensors[0].nbytes, 4u);

    // Without state_dict: "model" is the state dict.
    PickleBuilder q;
    q.begin_dict().str("epoch").int4(1);
    q.str("model").begin_dict().str("m").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict();
    q.str("ema").begin_dict().str("e").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict();
    q.end_dict();
    auto r2 = parse(build_ckpt(q.finish(), {{"0", floats({1})}}));
    ASSERT_TRUE(r2.ok()) << r2.error().message;
    ASSERT_EQ(r2->tensors.size(), 1u);
    EXPECT_EQ(r2->tensors[0].name, "m");

    // A top level holding tensors is the state dict even if it has "model".
    PickleBuilder s;
    s.begin_dict().str("t").tensor("FloatStorage", "0", 0, {1}, {1});
    s.str("model").begin_dict().str("m").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict().end_dict();
    auto r3 = parse(build_ckpt(s.finish(), {{"0", floats({1})}}));
    ASSERT_TRUE(r3.ok()) << r3.error().message;
    ASSERT_EQ(r3->tensors.size(), 2u);
    EXPECT_EQ(r3->tensors[1].name, "model.m");
}

TEST(Ckpt, AllStorageTypes) {
    const std::pair<const char*, DType> types[] = {
        {"FloatStorage", DType::F32},  {"HalfStorage", DType::F16}, {"BFloat16Storage", DType::BF16},
        {"DoubleStorage", DType::F64}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
        {"ShortStorage", DType::I16},  {"CharStorage", DType::I8},  {"ByteStorage", DType::U8},
        {"BoolStorage", DType::BOOL},
    };
    for (const auto& [type, dtype] : types) {
        PickleBuilder p;
        p.begin_dict().str("t").tensor(type, "0", 1, {2}, {1}).end_dict();
        auto r = parse(build_ckpt(p.finish(), {{"0", std::string(24, '\0')}}));
        ASSERT_TRUE(r.ok()) << type << ": " << r.error().message;
        ASSERT_EQ(r->tensors.size(), 1u);
        EXPECT_EQ(r->tensors[0].dtype, dtype) << type;
        const uint64_t elem = *dtype_byte_size(dtype, 1);
        EXPECT_EQ(r->tensors[0].nbytes, 2 * elem) << type;
    }
}

TEST(Ckpt, ContiguityRules) {
    auto try_layout = [](const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
        PickleBuilder p;
        p.begin_dict().str("w").tensor("FloatStorage", "0", 0, shape, stride).end_dict();
        return parse(build_ckpt(p.finish(), {{"0", std::string(4 * 6, '\0')}}));
    };
    EXPECT_TRUE(try_layout({2, 3}, {3, 1}).ok());
    EXPECT_TRUE(try_layout({}, {}).ok());          // 0-d
    EXPECT_TRUE(try_layout({3, 1}, {1, 3}).ok());  // size-1 dims take any stride
    EXPECT_TRUE(try_layout({1, 2, 1, 3}, {0, 3, 7, 1}).ok());
    EXPECT_TRUE(try_layout({0, 5}, {9, 9}).ok());  // empty: no layout
    auto t = try_layout({2, 3}, {1, 2});           // a transpose
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().message,
              "m.ckpt: tensor 'w' is not contiguous (shape [2, 3], stride [1, 2]); save it after .contiguous()");
    EXPECT_FALSE(try_layout({3}, {2}).ok());  // a strided view
}

TEST(Ckpt, TensorMustLieInsideItsStorage) {
    PickleBuilder p;
    p.begin_dict().str("big").tensor("FloatStorage", "0", 1, {4}, {1}).end_dict();
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {{"0", floats({1, 2, 3, 4})}})),
              "m.ckpt: tensor 'big' (byte offset 4, 16 bytes) lies outside its storage entry 'archive/data/0' "
              "(16 bytes)");

    PickleBuilder q;  // element count overflowing 64 bits
    q.begin_dict().str("huge").tensor("FloatStorage", "0", 0, {0x7fffffff, 0x7fffffff, 0x7fffffff}, {1, 1, 1});
    q.end_dict();
    EXPECT_EQ(error_of(build_ckpt(q.finish(), {{"0", floats({1})}})), "m.ckpt: tensor 'huge': element count overflows");

    PickleBuilder s;  // a storage offset far beyond the entry
    s.begin_dict().str("far").tensor("FloatStorage", "0", 0x7fffffff, {1}, {1}).end_dict();
    EXPECT_NE(error_of(build_ckpt(s.finish(), {{"0", floats({1})}})).find("lies outside its storage entry"),
              std::string::npos);
}

TEST(Ckpt, MissingStorageEntry) {
    PickleBuilder p;
    p.begin_dict().str("w").tensor("FloatStorage", "7", 0, {1}, {1}).end_dict();
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {{"0", floats({1})}})),
              "m.ckpt: tensor 'w': storage entry 'archive/data/7' is missing from the archive");
}

TEST(Ckpt, DuplicateNamesAfterFlattening) {
    PickleBuilder p;
    p.begin_dict().str("a.b").tensor("FloatStorage", "0", 0, {1}, {1});
    p.str("a").begin_dict().str("b").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict().end_dict();
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {{"0", floats({1})}})), "m.ckpt: duplicate tensor name 'a.b'");
}

TEST(Ckpt, CyclicStateDictIsRejected) {
    // d = {}; d["self"] = d
    PickleBuilder p;
    p.op('}').op('q').op(0).str("self").op('h').op(0).op('s');
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {})),
              "m.ckpt: the state dict holds one dict under several names (at 'self')");
}

TEST(Ckpt, SharedSubDictIsRejected) {
    // {"a": d, "b": d}: walking d twice would let a small pickle name
    // quadratically many tensors.
    PickleBuilder p;
    p.begin_dict().str("a").begin_dict().str("t").tensor("FloatStorage", "0", 0, {1}, {1}).end_dict();
    p.op('q').op(7).str("b").op('h').op(7).end_dict();
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {{"0", floats({1})}})),
              "m.ckpt: the state dict holds one dict under several names (at 'b')");
}

TEST(Ckpt, DeepStateDictIsRejected) {
    // Dicts linked top-down after creation escape the unpickler's build-time
    // depth count; the walker still stops. d0 = {}; d1 = {}; ... d0["k"] = d1; ...
    PickleBuilder p;
    const int n = 40;
    for (int i = 0; i < n; ++i) p.op('}').op('q').op(static_cast<uint8_t>(i)).op('0');  // EMPTY_DICT, BINPUT i, POP
    for (int i = 0; i + 1 < n; ++i) {
        p.op('h').op(static_cast<uint8_t>(i)).str("k").op('h').op(static_cast<uint8_t>(i + 1)).op('s').op('0');
    }
    p.op('h').op(0);
    EXPECT_NE(error_of(build_ckpt(p.finish(), {})).find("state dict nested deeper than 32 levels at 'k.k.k"),
              std::string::npos)
        << error_of(build_ckpt(p.finish(), {}));
}

TEST(Ckpt, OverlongNamesAreRejected) {
    PickleBuilder p;
    p.begin_dict().str(std::string(2000, 'n')).tensor("FloatStorage", "0", 0, {1}, {1}).end_dict();
    EXPECT_EQ(error_of(build_ckpt(p.finish(), {{"0", floats({1})}})),
              "m.ckpt: tensor name longer than 1024 bytes under ''");
}

// ---- not a (supported) checkpoint ----------------------------------------------

TEST(Ckpt, LegacyFormatSaysHowToResave) {
    // torch < 1.6: PROTO 2, LONG1 of the magic number 0x1950a86a20f9469cfc6c, ...
    const std::vector<uint8_t> legacy = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                         0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
    const std::string msg = error_of(legacy);
    EXPECT_NE(msg.find("legacy PyTorch checkpoint format (torch < 1.6"), std::string::npos) << msg;
    EXPECT_NE(msg.find("torch.save(torch.load(path, weights_only=True), new_path)"), std::string::npos) << msg;
}

TEST(Ckpt, NotACheckpoint) {
    EXPECT_EQ(error_of({}), "m.ckpt: not a PyTorch checkpoint (no zip archive)");
    EXPECT_EQ(error_of(std::vector<uint8_t>(100, 'z')), "m.ckpt: not a PyTorch checkpoint (no zip archive)");
    EXPECT_EQ(error_of(build_zip({{"readme.txt", "hi"}})),
              "m.ckpt: no <folder>/data.pkl in the zip archive (not a torch.save checkpoint)");
    EXPECT_EQ(error_of(build_zip({{"archive/data.pkl", "\x80\x02K\x05.", 8}})),
              "m.ckpt: zip: entry 'archive/data.pkl' is compressed (method 8); only stored entries can be read "
              "(torch.save writes stored entries)");
    EXPECT_EQ(error_of(build_ckpt("\x80\x02K\x05.", {})),
              "m.ckpt: archive/data.pkl holds a int, not a dict of tensors");
    EXPECT_EQ(error_of(build_zip({{"archive/data.pkl", "\x80\x02}."}, {"archive/byteorder", "big"}})),
              "m.ckpt: big-endian checkpoints are not supported");
    auto truncated = build_ckpt("\x80\x02}", {});
    EXPECT_EQ(error_of(truncated), "m.ckpt: pickle: truncated: no STOP opcode at byte 3");
}

TEST(Ckpt, EmptyStateDict) {
    auto r = parse(build_ckpt("\x80\x02}.", {}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->tensors.empty());
    EXPECT_EQ(r->format, FileFormat::Ckpt);
}

TEST(Ckpt, DamagedFixtureNeverCrashes) {
    // Flip bytes all over the real fixture; every outcome must be a value, and
    // every tensor reported must lie inside the buffer.
    const std::vector<uint8_t> good = test::read_bytes(kFixtures + "/tiny.ckpt");
    ASSERT_FALSE(good.empty());
    uint32_t state = 99;
    for (int round = 0; round < 2000; ++round) {
        auto bytes = good;
        for (int k = 0; k < 2; ++k) {
            state = state * 1664525u + 1013904223u;
            const size_t at = (state >> 8) % bytes.size();
            state = state * 1664525u + 1013904223u;
            bytes[at] = static_cast<uint8_t>(state >> 24);
        }
        auto r = parse(bytes);
        if (!r.ok()) {
            EXPECT_EQ(r.error().message.rfind("m.ckpt: ", 0), 0u);
            continue;
        }
        for (const TensorInfo& t : r->tensors) {
            EXPECT_LE(t.offset, bytes.size());
            EXPECT_LE(t.nbytes, bytes.size() - t.offset);
        }
    }
}

}  // namespace
}  // namespace kiln::io
