// libFuzzer target for kiln::io::parse_gguf (ggml's gguf parser underneath;
// the fuzz build instruments ggml too, so its gguf.cpp is covered).
//
// Besides crashes and sanitizer reports, every file the parser accepts is
// checked against what callers rely on: every tensor's bytes lie inside the
// file, after the header and aligned, its byte length is exactly shape x
// dtype, names are unique, no two non-empty tensors overlap, and every
// metadata value can be printed. A violation traps, so the fuzzer reports it
// as a crash.
//
// Build and run: scripts/fuzz.sh gguf SECONDS
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "ggml.h"
#include "io/dtype.h"
#include "io/gguf_file.h"
#include "io/tensor_info.h"

namespace {

using kiln::io::MetaValue;
using kiln::io::TensorInfo;

// GGUF header: magic, u32 version, i64 n_tensors, i64 n_kv.
constexpr uint64_t kMinHeaderBytes = 4 + 4 + 8 + 8;
constexpr uint64_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

void walk_value(const MetaValue& v, int depth) {
    KILN_FUZZ_CHECK(depth <= 1);  // GGUF has no nested arrays
    volatile size_t sink = v.to_string().size();
    (void)sink;
    if (v.kind == MetaValue::Kind::Array) {
        volatile size_t all = v.to_string(v.array.size()).size();
        (void)all;
        for (const MetaValue& item : v.array) walk_value(item, depth + 1);
    }
}

void check_tensor(const TensorInfo& t, size_t size, uint64_t alignment) {
    // Data inside the file, after the fixed header, aligned.
    KILN_FUZZ_CHECK(t.offset >= kMinHeaderBytes);
    KILN_FUZZ_CHECK(t.offset <= size);
    KILN_FUZZ_CHECK(t.nbytes <= size - t.offset);
    KILN_FUZZ_CHECK(t.offset % alignment == 0);

    // Name: non-empty is not required by GGUF, but it must fit ggml's limit.
    KILN_FUZZ_CHECK(t.name.size() < GGML_MAX_NAME);

    // 1..4 non-negative dims, a real ggml type, bytes == shape x type.
    KILN_FUZZ_CHECK(!t.shape.empty() && t.shape.size() <= GGML_MAX_DIMS);
    for (int64_t d : t.shape) KILN_FUZZ_CHECK(d >= 0);
    KILN_FUZZ_CHECK(kiln::io::dtype_to_ggml(t.dtype).has_value());
    const int64_t elements = t.element_count();
    KILN_FUZZ_CHECK(elements >= 0);
    const auto expected = kiln::io::dtype_byte_size(t.dtype, elements);
    KILN_FUZZ_CHECK(expected.has_value() && *expected == t.nbytes);

    volatile size_t sink = t.shape_string().size() + kiln::io::dtype_name(t.dtype).size();
    (void)sink;
}

void silent_log(ggml_log_level, const char*, void*) {}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    ggml_log_set(silent_log, nullptr);
    setenv("GGML_NO_BACKTRACE", "1", 0);  // GGML_ABORT must not try to attach gdb
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parsed = kiln::io::parse_gguf(data, size, "fuzz.gguf");
    if (!parsed.ok()) {
        KILN_FUZZ_CHECK(parsed.error().message.rfind("fuzz.gguf: ", 0) == 0);
        return 0;
    }
    KILN_FUZZ_CHECK(kiln::io::looks_like_gguf(data, size));
    KILN_FUZZ_CHECK(size >= kMinHeaderBytes);
    KILN_FUZZ_CHECK(parsed->format == kiln::io::FileFormat::Gguf);

    uint64_t alignment = kDefaultAlignment;
    for (const auto& [key, value] : parsed->metadata) {
        KILN_FUZZ_CHECK(!key.empty());
        walk_value(value, 0);
        if (key == "general.alignment") {
            // ggml accepts only a u32 power of two here.
            KILN_FUZZ_CHECK(value.kind == MetaValue::Kind::UInt);
            KILN_FUZZ_CHECK(value.u != 0 && (value.u & (value.u - 1)) == 0);
            alignment = value.u;
        }
    }

    std::set<std::string> names;
    for (const TensorInfo& t : parsed->tensors) {
        check_tensor(t, size, alignment);
        KILN_FUZZ_CHECK(names.insert(t.name).second);
    }

    std::vector<const TensorInfo*> by_offset;
    for (const TensorInfo& t : parsed->tensors) {
        if (t.nbytes != 0) by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        KILN_FUZZ_CHECK(by_offset[i - 1]->offset + by_offset[i - 1]->nbytes <= by_offset[i]->offset);
    }
    return 0;
}
