#include "io/gguf_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "gguf.h"
#include "io/model_file.h"
#include "io/tensor_convert.h"
#include "test_files.h"

namespace kiln::io {
namespace {

struct GgufTensorSpec {
    const char* name;
    ggml_type type;
    std::vector<int64_t> ne;  // ggml order, innermost first
};

// Writes a GGUF with the given tensors (data byte i of tensor t = t + i) and
// one metadata key of every GGUF type, through ggml's own writer.
std::string write_gguf_file(const test::TempDir& dir, const std::vector<GgufTensorSpec>& specs) {
    ggml_init_params params{16 * 1024 * 1024, nullptr, false};
    std::unique_ptr<ggml_context, void (*)(ggml_context*)> ctx(ggml_init(params), ggml_free);
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> gguf(gguf_init_empty(), gguf_free);
    gguf_set_val_u8(gguf.get(), "k.u8", 200);
    gguf_set_val_i8(gguf.get(), "k.i8", -100);
    gguf_set_val_u16(gguf.get(), "k.u16", 60000);
    gguf_set_val_i16(gguf.get(), "k.i16", -30000);
    gguf_set_val_u32(gguf.get(), "k.u32", 4000000000u);
    gguf_set_val_i32(gguf.get(), "k.i32", -2000000000);
    gguf_set_val_f32(gguf.get(), "k.f32", 0.5f);
    gguf_set_val_u64(gguf.get(), "k.u64", 18000000000000000000ull);
    gguf_set_val_i64(gguf.get(), "k.i64", -9000000000000000000ll);
    gguf_set_val_f64(gguf.get(), "k.f64", 0.25);
    gguf_set_val_bool(gguf.get(), "k.bool", true);
    gguf_set_val_str(gguf.get(), "general.name", "tiny");
    const char* vocab[] = {"a</w>", "red</w>", "circle</w>"};
    gguf_set_arr_str(gguf.get(), "tokenizer.vocab", vocab, 3);
    const int32_t ints[] = {7, 8, 9};
    gguf_set_arr_data(gguf.get(), "k.ints", GGUF_TYPE_INT32, ints, 3);
    for (size_t t = 0; t < specs.size(); ++t) {
        const auto& s = specs[t];
        ggml_tensor* tensor = ggml_new_tensor(ctx.get(), s.type, static_cast<int>(s.ne.size()), s.ne.data());
        ggml_set_name(tensor, s.name);
        auto* bytes = static_cast<uint8_t*>(tensor->data);
        for (size_t i = 0; i < ggml_nbytes(tensor); ++i) bytes[i] = static_cast<uint8_t>(t + i);
        // Keep f16/quant scales finite: the bytes are only compared, never decoded.
        gguf_add_tensor(gguf.get(), tensor);
    }
    const std::string path = dir.file("model.gguf");
    EXPECT_TRUE(gguf_write_to_file(gguf.get(), path.c_str(), false));
    return path;
}

TEST(Gguf, ListsQuantizedTensorsWithReversedShapeAndAllMetadata) {
    test::TempDir dir;
    const std::vector<GgufTensorSpec> specs = {
        {"model.diffusion_model.input_blocks.0.0.weight", GGML_TYPE_F16, {3, 3, 4, 32}},
        {"a.q4_0", GGML_TYPE_Q4_0, {64, 2}},
        {"a.q8_0", GGML_TYPE_Q8_0, {32, 3}},
        {"a.q4_k", GGML_TYPE_Q4_K, {256, 2}},
        {"a.f32", GGML_TYPE_F32, {5}},
    };
    const std::string path = write_gguf_file(dir, specs);
    auto model = ModelFile::open({path});
    ASSERT_TRUE(model.ok()) << model.error().message;
    ASSERT_EQ(model->tensors().size(), specs.size());
    EXPECT_EQ(model->sources()[0].format, FileFormat::Gguf);

    const TensorInfo* conv = model->find("model.diffusion_model.input_blocks.0.0.weight");
    ASSERT_NE(conv, nullptr);
    EXPECT_EQ(conv->dtype, DType::F16);
    EXPECT_EQ(conv->shape, (std::vector<int64_t>{32, 4, 3, 3}));
    EXPECT_EQ(conv->nbytes, 32u * 4 * 3 * 3 * 2);

    const TensorInfo* q4k = model->find("a.q4_k");
    ASSERT_NE(q4k, nullptr);
    EXPECT_EQ(dtype_name(q4k->dtype), "Q4_K");
    EXPECT_EQ(q4k->shape, (std::vector<int64_t>{2, 256}));
    EXPECT_EQ(q4k->nbytes, 2 * ggml_row_size(GGML_TYPE_Q4_K, 256));
    EXPECT_EQ(dtype_name(model->find("a.q4_0")->dtype), "Q4_0");

    // Bytes served through the mapping are the ones written (tensor index 3 -> bytes 3, 4, ...).
    const uint8_t* data = model->data(*q4k);
    for (size_t i = 0; i < q4k->nbytes; ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(3 + i)) << i;

    const Metadata& m = model->metadata();
    EXPECT_EQ(m.at("k.u8").u, 200u);
    EXPECT_EQ(m.at("k.i8").i, -100);
    EXPECT_EQ(m.at("k.u16").u, 60000u);
    EXPECT_EQ(m.at("k.i16").i, -30000);
    EXPECT_EQ(m.at("k.u32").u, 4000000000u);
    EXPECT_EQ(m.at("k.i32").i, -2000000000);
    EXPECT_FLOAT_EQ(static_cast<float>(m.at("k.f32").f), 0.5f);
    EXPECT_EQ(m.at("k.u64").u, 18000000000000000000ull);
    EXPECT_EQ(m.at("k.i64").i, -9000000000000000000ll);
    EXPECT_DOUBLE_EQ(m.at("k.f64").f, 0.25);
    EXPECT_TRUE(m.at("k.bool").b);
    EXPECT_EQ(m.at("general.name").str, "tiny");
    ASSERT_EQ(m.at("tokenizer.vocab").array.size(), 3u);
    EXPECT_EQ(m.at("tokenizer.vocab").array[2].str, "circle</w>");
    EXPECT_EQ(m.at("tokenizer.vocab").to_string(), "[\"a</w>\", \"red</w>\", \"circle</w>\"]");
    EXPECT_EQ(m.at("k.ints").to_string(), "[7, 8, 9]");
}

TEST(Gguf, TruncatedFileIsAnErrorNamingTheFile) {
    test::TempDir dir;
    const std::string path = write_gguf_file(dir, {{"w", GGML_TYPE_F32, {1024}}});
    auto bytes = test::read_bytes(path);
    bytes.resize(bytes.size() - 100);
    auto result = parse_gguf(bytes.data(), bytes.size(), "cut.gguf");
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().message.rfind("cut.gguf: ", 0), 0u) << result.error().message;

    bytes.resize(40);  // inside the metadata
    result = parse_gguf(bytes.data(), bytes.size(), "cut.gguf");
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.error().message.find("cut.gguf: invalid GGUF file"), std::string::npos) << result.error().message;
}

TEST(Gguf, WrongMagicAndBadVersion) {
    std::vector<uint8_t> bytes = {'G', 'G', 'U', 'X', 3, 0, 0, 0};
    auto result = parse_gguf(bytes.data(), bytes.size(), "x.gguf");
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().message, "x.gguf: not a GGUF file (no GGUF magic)");

    bytes = {'G', 'G', 'U', 'F'};
    test::put_u32(bytes, 99);  // version
    test::put_u64(bytes, 0);
    test::put_u64(bytes, 0);
    result = parse_gguf(bytes.data(), bytes.size(), "x.gguf");
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.error().message.find("version"), std::string::npos) << result.error().message;
}

TEST(Gguf, ImplausibleTensorCountIsRejectedWithoutAllocating) {
    std::vector<uint8_t> bytes = {'G', 'G', 'U', 'F'};
    test::put_u32(bytes, 3);
    test::put_u64(bytes, 1ull << 60);  // tensors
    test::put_u64(bytes, 0);           // kv
    auto result = parse_gguf(bytes.data(), bytes.size(), "x.gguf");
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().message.rfind("x.gguf: invalid GGUF file", 0), 0u) << result.error().message;

    // 2^63 and 2^64-1 are the numbers the file holds, not negative ones.
    for (const uint64_t count : {1ull << 63, ~0ull}) {
        for (const bool tensors : {true, false}) {
            std::vector<uint8_t> lie = {'G', 'G', 'U', 'F'};
            test::put_u32(lie, 3);
            test::put_u64(lie, tensors ? count : 0);
            test::put_u64(lie, tensors ? 0 : count);
            auto r = parse_gguf(lie.data(), lie.size(), "x.gguf");
            ASSERT_FALSE(r.ok());
            const std::string expected = std::string(tensors ? "tensor count " : "key/value count ") +
                                         std::to_string(count) + " cannot fit in the file";
            EXPECT_NE(r.error().message.find(expected), std::string::npos) << r.error().message;
            EXPECT_EQ(r.error().message.find('-'), std::string::npos) << r.error().message;
        }
    }
}

// A GGUF header written by hand: `keys` u32 key/value pairs, then one-element
// F32 tensors named `names` at the given offsets (alignment 32).
std::vector<uint8_t> hand_gguf(const std::vector<std::string>& keys, const std::vector<std::string>& names,
                               const std::vector<uint64_t>& offsets) {
    std::vector<uint8_t> bytes = {'G', 'G', 'U', 'F'};
    test::put_u32(bytes, 3);
    test::put_u64(bytes, names.size());
    test::put_u64(bytes, keys.size());
    for (const std::string& k : keys) {
        test::put_u64(bytes, k.size());
        test::put_bytes(bytes, k);
        test::put_u32(bytes, GGUF_TYPE_UINT32);
        test::put_u32(bytes, 64);
    }
    for (size_t i = 0; i < names.size(); ++i) {
        test::put_u64(bytes, names[i].size());
        test::put_bytes(bytes, names[i]);
        test::put_u32(bytes, 1);
        test::put_u64(bytes, 1);
        test::put_u32(bytes, GGML_TYPE_F32);
        test::put_u64(bytes, offsets[i]);
    }
    bytes.resize((bytes.size() + 63) / 64 * 64 + 64 * names.size(), 0);
    return bytes;
}

// kiln reads GGUF headers itself (linear in the tensor count) and keeps
// ggml's rules: unique names and keys, tensors in order at aligned offsets,
// general.alignment a power-of-two u32.
TEST(Gguf, OwnHeaderReaderKeepsGgmlsRules) {
    auto error_of = [](const std::vector<uint8_t>& bytes) {
        auto r = parse_gguf(bytes.data(), bytes.size(), "x.gguf");
        return r.ok() ? std::string("(no error)") : r.error().message;
    };
    auto ok = hand_gguf({"general.alignment", "k"}, {"a", "b"}, {0, 64});
    auto parsed = parse_gguf(ok.data(), ok.size(), "x.gguf");
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    ASSERT_EQ(parsed->tensors.size(), 2u);
    const uint64_t data_start = parsed->tensors[0].offset;
    EXPECT_EQ(data_start % 64, 0u);
    EXPECT_EQ(parsed->tensors[1].offset, data_start + 64);
    EXPECT_EQ(parsed->metadata.at("general.alignment").gguf_type, GGUF_TYPE_UINT32);

    EXPECT_EQ(error_of(hand_gguf({}, {"a", "b", "a"}, {0, 32, 64})),
              "x.gguf: invalid GGUF file: duplicate tensor name 'a'");
    EXPECT_EQ(error_of(hand_gguf({"k", "k"}, {}, {})), "x.gguf: invalid GGUF file: duplicate key 'k'");
    EXPECT_EQ(error_of(hand_gguf({}, {"a", "b"}, {0, 0})),
              "x.gguf: invalid GGUF file: tensor 'b' has data offset 0, expected 32");
    EXPECT_EQ(error_of(hand_gguf({}, {"a\x1b[31m"}, {0})), "(no error)");
    const std::string long_name = error_of(hand_gguf({}, {std::string(GGML_MAX_NAME, 'n')}, {0}));
    EXPECT_EQ(long_name.rfind("x.gguf: invalid GGUF file: tensor 'nnn", 0), 0u) << long_name;
}

// city96's fix_5d_tensors.py writes Wan's patch_embedding with rank 5, which
// ggml's own parser refuses; kiln reads ranks up to 8 (a header written by
// hand, one F32 tensor of ne [2, 2, 1, 3, 4]).
TEST(Gguf, TensorsOfMoreThanFourDimensionsKeepTheirShape) {
    auto file_with_rank = [](const std::vector<uint64_t>& ne) {
        std::vector<uint8_t> bytes = {'G', 'G', 'U', 'F'};
        test::put_u32(bytes, 3);
        test::put_u64(bytes, 1);
        test::put_u64(bytes, 0);
        test::put_u64(bytes, 1);
        test::put_bytes(bytes, "w");
        test::put_u32(bytes, static_cast<uint32_t>(ne.size()));
        uint64_t count = 1;
        for (uint64_t n : ne) {
            test::put_u64(bytes, n);
            count *= n;
        }
        test::put_u32(bytes, GGML_TYPE_F32);
        test::put_u64(bytes, 0);
        bytes.resize((bytes.size() + 31) / 32 * 32 + count * 4, 0);
        return bytes;
    };
    const auto five = file_with_rank({2, 2, 1, 3, 4});
    auto parsed = parse_gguf(five.data(), five.size(), "x.gguf");
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    EXPECT_EQ(parsed->tensors[0].shape, (std::vector<int64_t>{4, 3, 1, 2, 2}));
    EXPECT_EQ(parsed->tensors[0].nbytes, 48u * 4);
    const auto nine = file_with_rank({1, 1, 1, 1, 1, 1, 1, 1, 2});
    auto refused = parse_gguf(nine.data(), nine.size(), "x.gguf");
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().message, "x.gguf: invalid GGUF file: tensor 'w' has 9 dimensions (at most 8)");
}

// ComfyUI-GGUF's SD1.x and SDXL files keep a convolution of 320 x 4 x 3 x 3
// as Q8_0 rows of 256 and its shape under comfy.gguf.orig_shape.<name>: kiln
// reads it in that shape and dequantizes it (its rows are not Q8_0's).
TEST(Gguf, ComfyOriginalShapesAreAppliedAndSuchTensorsDequantized) {
    auto write = [](const test::TempDir& dir, const std::vector<int32_t>& shape, std::vector<float>& values) {
        ggml_init_params params{1 << 20, nullptr, false};
        std::unique_ptr<ggml_context, void (*)(ggml_context*)> ctx(ggml_init(params), ggml_free);
        std::unique_ptr<gguf_context, void (*)(gguf_context*)> gguf(gguf_init_empty(), gguf_free);
        ggml_tensor* t = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 256, 45);
        ggml_set_name(t, "conv_in.weight");
        values.resize(256 * 45);
        for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * static_cast<float>(i));
        ggml_quantize_chunk(GGML_TYPE_Q8_0, values.data(), t->data, 0, 45, 256, nullptr);
        ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(t->data, values.data(), 256 * 45);  // what Q8_0 holds
        gguf_set_arr_data(gguf.get(), "comfy.gguf.orig_shape.conv_in.weight", GGUF_TYPE_INT32, shape.data(),
                          shape.size());
        gguf_add_tensor(gguf.get(), t);
        const std::string path = dir.file("sdxl.gguf");
        EXPECT_TRUE(gguf_write_to_file(gguf.get(), path.c_str(), false));
        return path;
    };
    test::TempDir dir;
    std::vector<float> values;
    auto model = ModelFile::open({write(dir, {320, 4, 3, 3}, values)});
    ASSERT_TRUE(model.ok()) << model.error().message;
    const TensorInfo* conv = model->find("conv_in.weight");
    ASSERT_NE(conv, nullptr);
    EXPECT_EQ(conv->shape, (std::vector<int64_t>{320, 4, 3, 3}));
    EXPECT_EQ(dtype_name(conv->dtype), "Q8_0");
    ASSERT_EQ(compute_type(*conv), GGML_TYPE_F16);
    auto converted = convert_tensor(*conv, model->data(*conv), GGML_TYPE_F16);
    ASSERT_TRUE(converted.ok()) << converted.error().message;
    ASSERT_EQ(converted->size(), values.size() * 2);
    const auto* half = reinterpret_cast<const ggml_fp16_t*>(converted->data());
    for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_EQ(ggml_fp16_to_fp32(half[i]), ggml_fp16_to_fp32(ggml_fp32_to_fp16(values[i]))) << i;
    }

    auto error_of = [&](const std::vector<int32_t>& shape) {
        test::TempDir bad_dir;
        std::vector<float> unused;
        auto bad = ModelFile::open({write(bad_dir, shape, unused)});
        return bad.ok() ? std::string("(no error)") : bad.error().message;
    };
    const std::string wrong_count = error_of({320, 4, 3, 4});
    EXPECT_NE(wrong_count.find("invalid GGUF file: comfy.gguf.orig_shape.conv_in.weight gives [320, 4, 3, 4] "
                               "(15360 values) for tensor 'conv_in.weight', which holds [45, 256] (11520 values)"),
              std::string::npos)
        << wrong_count;
    const std::string negative = error_of({-320, -4, 3, 3});
    EXPECT_NE(negative.find("comfy.gguf.orig_shape.conv_in.weight is not a shape of positive integers"),
              std::string::npos)
        << negative;
}

}  // namespace
}  // namespace kiln::io
