#include "io/safetensors.h"

#include <gtest/gtest.h>

#include "test_files.h"

namespace kiln::io {
namespace {

using test::build_safetensors;
using test::f32_bytes;
using test::raw_safetensors;

Result<ParsedFile> parse(const std::vector<uint8_t>& bytes) {
    return parse_safetensors(bytes.data(), bytes.size(), "m.safetensors");
}

// Expects a parse error whose message starts with the file label and
// contains `fragment`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& fragment) {
    auto result = parse(bytes);
    ASSERT_FALSE(result.ok()) << "expected an error containing: " << fragment;
    EXPECT_EQ(result.error().message.rfind("m.safetensors: ", 0), 0u) << result.error().message;
    EXPECT_NE(result.error().message.find(fragment), std::string::npos) << result.error().message;
}

TEST(Safetensors, ListsEveryDtypeWithShapeAndAbsoluteRange) {
    struct Case {
        const char* dtype;
        DType expected;
        size_t element_bytes;
    };
    const Case cases[] = {{"F64", DType::F64, 8},   {"F32", DType::F32, 4},         {"F16", DType::F16, 2},
                          {"BF16", DType::BF16, 2}, {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
                          {"I64", DType::I64, 8},   {"I32", DType::I32, 4},         {"I16", DType::I16, 2},
                          {"I8", DType::I8, 1},     {"U8", DType::U8, 1},           {"BOOL", DType::BOOL, 1}};
    std::vector<test::SafetensorsEntry> entries;
    for (const Case& c : cases) {
        entries.push_back({std::string("t_") + c.dtype, c.dtype, {2, 3}, std::vector<uint8_t>(6 * c.element_bytes, 1)});
    }
    const auto bytes = build_safetensors(entries, {{"format", "pt"}, {"modelspec.title", "tiny"}});
    auto parsed = parse(bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    ASSERT_EQ(parsed->tensors.size(), std::size(cases));
    EXPECT_EQ(parsed->format, FileFormat::Safetensors);
    EXPECT_EQ(parsed->metadata.at("format").str, "pt");
    EXPECT_EQ(parsed->metadata.at("modelspec.title").str, "tiny");

    const uint64_t header_len = bytes[0] | (uint64_t(bytes[1]) << 8) | (uint64_t(bytes[2]) << 16);
    uint64_t expected_offset = 8 + header_len;
    // Entries come back sorted by name; check each against its case.
    for (const Case& c : cases) {
        const TensorInfo* found = nullptr;
        for (const TensorInfo& t : parsed->tensors) {
            if (t.name == std::string("t_") + c.dtype) found = &t;
        }
        ASSERT_NE(found, nullptr) << c.dtype;
        EXPECT_EQ(found->dtype, c.expected) << c.dtype;
        EXPECT_EQ(found->shape, (std::vector<int64_t>{2, 3}));
        EXPECT_EQ(found->nbytes, 6 * c.element_bytes);
        EXPECT_EQ(dtype_name(found->dtype), c.dtype);
    }
    // The first entry written starts right after the header.
    const TensorInfo* first = nullptr;
    for (const TensorInfo& t : parsed->tensors) {
        if (t.name == "t_F64") first = &t;
    }
    EXPECT_EQ(first->offset, expected_offset);
}

TEST(Safetensors, AcceptsScalarsEmptyTensorsAndEmptyHeader) {
    auto parsed = parse(build_safetensors({{"scalar", "F32", {}, f32_bytes(1)}, {"empty", "F16", {0, 4}, {}}}));
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    EXPECT_EQ(parsed->tensors.size(), 2u);
    auto empty = parse(raw_safetensors("{}", {}));
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(empty->tensors.empty());
}

TEST(Safetensors, TruncatedFileBeforeHeaderLength) { expect_error({1, 2, 3}, "truncated: 3 bytes"); }

TEST(Safetensors, HeaderLengthLargerThanFile) {
    auto bytes = build_safetensors({{"a", "F32", {2}, f32_bytes(2)}});
    bytes[0] = 0xff;
    bytes[1] = 0xff;
    expect_error(bytes, "is larger than the file");
}

TEST(Safetensors, MalformedJson) { expect_error(raw_safetensors("{\"a\": {\"dtype\": ", {}), "malformed JSON header"); }

TEST(Safetensors, HeaderNotAnObject) { expect_error(raw_safetensors("[1, 2]", {}), "JSON header is not an object"); }

TEST(Safetensors, UnknownDtype) {
    expect_error(raw_safetensors(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", f32_bytes(1)),
                 "tensor 'w': unknown dtype 'F7'");
}

TEST(Safetensors, ShapeTimesDtypeDiffersFromByteLength) {
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", f32_bytes(5)),
                 "tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets span 20");
}

TEST(Safetensors, RangeOutOfBounds) {
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32_bytes(2)),
                 "tensor 'w': data_offsets [0, 16] are out of bounds: the data section is 8 bytes");
}

TEST(Safetensors, RangeEndsBeforeItBegins) {
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", f32_bytes(2)),
                 "end before they begin");
}

TEST(Safetensors, OverlappingRanges) {
    expect_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 f32_bytes(3)),
                 "tensors 'a' and 'b' overlap");
}

TEST(Safetensors, DuplicateNames) {
    expect_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                 f32_bytes(2)),
                 "duplicate tensor name 'a'");
}

TEST(Safetensors, NegativeOrFractionalDimension) {
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f32_bytes(1)),
                 "not a non-negative integer");
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", f32_bytes(1)),
                 "not a non-negative integer");
}

TEST(Safetensors, ShapeWhoseElementCountOverflows) {
    expect_error(
        raw_safetensors(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", f32_bytes(1)),
        "too many elements");
}

TEST(Safetensors, MissingFields) {
    expect_error(raw_safetensors(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", f32_bytes(1)),
                 "missing or non-string \"dtype\"");
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", f32_bytes(1)), "\"shape\"");
    expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", f32_bytes(1)), "\"data_offsets\"");
    expect_error(raw_safetensors(R"({"w":7})", f32_bytes(1)), "entry is not a JSON object");
}

TEST(Safetensors, NonStringMetadata) {
    expect_error(raw_safetensors(R"({"__metadata__":{"steps":20}})", {}), "__metadata__ value 'steps' is not a string");
}

}  // namespace
}  // namespace kiln::io
