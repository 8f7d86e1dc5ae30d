// libFuzzer target for kiln::io::parse_safetensors.
//
// Besides crashes and sanitizer reports, every file the parser accepts is
// checked against what the parser promises its callers (safetensors.h):
// every tensor's bytes lie in the data section after the header, its byte
// length is exactly shape x dtype, names are unique, and no two non-empty
// tensors overlap. A violation traps, so the fuzzer reports it as a crash.
//
// Build and run: scripts/fuzz.sh safetensors SECONDS
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "io/dtype.h"
#include "io/safetensors.h"
#include "io/tensor_info.h"

namespace {

using kiln::io::DType;
using kiln::io::TensorInfo;

uint64_t read_u64_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void check_tensor(const TensorInfo& t, uint64_t data_start, size_t size) {
    // The byte range lies inside the data section (which follows the header).
    KILN_FUZZ_CHECK(t.offset >= data_start);
    KILN_FUZZ_CHECK(t.offset <= size);
    KILN_FUZZ_CHECK(t.nbytes <= size - t.offset);

    // A known safetensors dtype that survives a name round trip.
    const std::string name = kiln::io::dtype_name(t.dtype);
    const auto back = kiln::io::dtype_from_safetensors(name);
    KILN_FUZZ_CHECK(back.has_value() && *back == t.dtype);

    // Shape: non-negative dims; the byte length is exactly shape x dtype.
    for (int64_t d : t.shape) KILN_FUZZ_CHECK(d >= 0);
    const int64_t elements = t.element_count();
    KILN_FUZZ_CHECK(elements >= 0);
    const auto expected = kiln::io::dtype_byte_size(t.dtype, elements);
    KILN_FUZZ_CHECK(expected.has_value() && *expected == t.nbytes);

    // Touch the strings the front-ends print.
    volatile size_t sink = t.shape_string().size() + t.name.size();
    (void)sink;
    KILN_FUZZ_CHECK(t.name != "__metadata__");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parsed = kiln::io::parse_safetensors(data, size, "fuzz.safetensors");
    if (!parsed.ok()) {
        // Errors must name the file.
        KILN_FUZZ_CHECK(parsed.error().message.rfind("fuzz.safetensors: ", 0) == 0);
        return 0;
    }

    // Accepted: the file has at least the 8-byte length and the header.
    KILN_FUZZ_CHECK(size >= 8);
    const uint64_t header_len = read_u64_le(data);
    KILN_FUZZ_CHECK(header_len <= size - 8);
    KILN_FUZZ_CHECK(header_len <= kiln::io::kSafetensorsMaxHeaderBytes);
    const uint64_t data_start = 8 + header_len;
    KILN_FUZZ_CHECK(parsed->format == kiln::io::FileFormat::Safetensors);

    std::set<std::string> names;
    for (const TensorInfo& t : parsed->tensors) {
        check_tensor(t, data_start, size);
        KILN_FUZZ_CHECK(names.insert(t.name).second);  // no duplicate names
    }

    // No two non-empty tensors share a byte.
    std::vector<const TensorInfo*> by_offset;
    for (const TensorInfo& t : parsed->tensors) {
        if (t.nbytes != 0) by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        KILN_FUZZ_CHECK(by_offset[i - 1]->offset + by_offset[i - 1]->nbytes <= by_offset[i]->offset);
    }

    // safetensors metadata is strings only.
    for (const auto& [key, value] : parsed->metadata) {
        KILN_FUZZ_CHECK(value.kind == kiln::io::MetaValue::Kind::String);
        volatile size_t sink = key.size() + value.to_string().size();
        (void)sink;
    }
    return 0;
}
