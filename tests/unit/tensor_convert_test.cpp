#include "io/tensor_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <tuple>

#include "gguf.h"
#include "io/gguf_writer.h"
#include "io/model_file.h"
#include "test_files.h"

namespace kiln::io {
namespace {

TEST(TensorConvert, F8E4M3DecodesExactly) {
    EXPECT_EQ(f8_e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(f8_e4m3_to_f32(0xB8), -1.0f);
    EXPECT_EQ(f8_e4m3_to_f32(0x7E), 448.0f);                // largest finite
    EXPECT_EQ(f8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_EQ(f8_e4m3_to_f32(0x3C), 1.5f);
    EXPECT_EQ(f8_e4m3_to_f32(0x00), 0.0f);
    EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7F)));
    EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0xFF)));
}

TEST(TensorConvert, F8E5M2DecodesExactly) {
    EXPECT_EQ(f8_e5m2_to_f32(0x3C), 1.0f);
    EXPECT_EQ(f8_e5m2_to_f32(0x7B), 57344.0f);
    EXPECT_EQ(f8_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
    EXPECT_TRUE(std::isinf(f8_e5m2_to_f32(0x7C)));
    EXPECT_EQ(f8_e5m2_to_f32(0xC0), -2.0f);
}

TEST(TensorConvert, ParsesWeightTypes) {
    EXPECT_EQ(parse_weight_type("q8_0").value(), GGML_TYPE_Q8_0);
    EXPECT_EQ(parse_weight_type("Q4_K").value(), GGML_TYPE_Q4_K);
    EXPECT_EQ(parse_weight_type("f16").value(), GGML_TYPE_F16);
    auto bad = parse_weight_type("q9_9");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message.rfind("--type: unknown weight type 'q9_9' (valid: f32, f16, bf16, q8_0", 0), 0u)
        << bad.error().message;
}

TEST(TensorConvert, ComputeTypeKeepsVectorsAndOddRowsUnquantized) {
    TensorInfo matrix{"w", DType::F16, {64, 64}};
    TensorInfo bias{"b", DType::F32, {64}};
    TensorInfo odd{"o", DType::F32, {4, 33}};
    TensorInfo f8{"f", DType::F8_E4M3, {4, 4}};
    EXPECT_EQ(compute_type(matrix), GGML_TYPE_F16);
    EXPECT_EQ(compute_type(matrix, GGML_TYPE_Q8_0), GGML_TYPE_Q8_0);
    EXPECT_EQ(compute_type(bias, GGML_TYPE_Q8_0), GGML_TYPE_F32);
    EXPECT_EQ(compute_type(odd, GGML_TYPE_Q4_0), GGML_TYPE_F32);
    EXPECT_EQ(compute_type(f8), GGML_TYPE_F16);  // rows of 4: no q8_0 blocks
    EXPECT_EQ(compute_type(TensorInfo{"d", DType::F64, {2}}), GGML_TYPE_F32);
    EXPECT_EQ(compute_type(TensorInfo{"h", DType::F16, {64}}), GGML_TYPE_F32);
    EXPECT_EQ(compute_type(TensorInfo{"m", DType::BOOL, {2}}), GGML_TYPE_I32);
}

TEST(TensorConvert, QuantizeRoundTripStaysClose) {
    TensorInfo t{"w", DType::F32, {4, 64}};
    std::vector<float> values(256);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i) * 0.1f);
    t.nbytes = values.size() * 4;
    auto q = convert_tensor(t, reinterpret_cast<const uint8_t*>(values.data()), GGML_TYPE_Q8_0);
    ASSERT_TRUE(q.ok()) << q.error().message;
    EXPECT_EQ(q->size(), 4 * ggml_row_size(GGML_TYPE_Q8_0, 64));
    std::vector<float> back(256);
    ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(q->data(), back.data(), 256);
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(back[i], values[i], 0.01f) << i;
}

// An fp8 matrix stays about a byte a weight: q8_0, each value within half a
// step (the block's largest |value| / 127) of its e4m3 value.
TEST(TensorConvert, Fp8MatricesComputeAsQ8WithinOneStep) {
    TensorInfo t{"w", DType::F8_E4M3, {2, 64}};
    ASSERT_EQ(compute_type(t), GGML_TYPE_Q8_0);
    EXPECT_EQ(compute_type(t, GGML_TYPE_F16), GGML_TYPE_F16);  // --type still decides
    std::vector<uint8_t> bytes(128);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 73 + 11) % 256 & 0xF7);
    t.nbytes = bytes.size();
    auto q = convert_tensor(t, bytes.data(), GGML_TYPE_Q8_0);
    ASSERT_TRUE(q.ok()) << q.error().message;
    EXPECT_EQ(q->size(), 2 * ggml_row_size(GGML_TYPE_Q8_0, 64));
    std::vector<float> back(128);
    ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(q->data(), back.data(), 128);
    for (size_t block = 0; block < 4; ++block) {
        float largest = 0.0f;
        for (size_t i = block * 32; i < block * 32 + 32; ++i)
            largest = std::max(largest, std::fabs(f8_e4m3_to_f32(bytes[i])));
        for (size_t i = block * 32; i < block * 32 + 32; ++i) {
            EXPECT_NEAR(back[i], f8_e4m3_to_f32(bytes[i]), largest / 127.0f * 0.51f + largest * 1e-3f) << i;
        }
    }
}

// Large matrices quantize on every core, row ranges apart; the bytes are
// those of one ggml call over the whole matrix (an odd row count, so the
// ranges differ in size).
TEST(TensorConvert, QuantizingOnManyThreadsGivesTheBytesOfOneCall) {
    const int64_t rows = 1023, row = 2304;  // 2.4 M weights, 9 q4_K blocks a row
    TensorInfo t{"w", DType::F32, {rows, row}};
    std::vector<float> values(static_cast<size_t>(rows * row));
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i) * 0.37f) * 0.02f;
    t.nbytes = values.size() * 4;
    for (ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0}) {
        SCOPED_TRACE(ggml_type_name(type));
        std::vector<uint8_t> whole(rows * ggml_row_size(type, row));
        ggml_quantize_chunk(type, values.data(), whole.data(), 0, rows, row, nullptr);
        auto threaded = convert_tensor(t, reinterpret_cast<const uint8_t*>(values.data()), type);
        ASSERT_TRUE(threaded.ok()) << threaded.error().message;
        EXPECT_TRUE(*threaded == whole);
    }
}

TEST(TensorConvert, RejectsRowsThatDoNotFillBlocks) {
    TensorInfo t{"w", DType::F32, {2, 33}};
    t.nbytes = 66 * 4;
    std::vector<float> values(66, 1.0f);
    auto q = convert_tensor(t, reinterpret_cast<const uint8_t*>(values.data()), GGML_TYPE_Q8_0);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.error().message, "tensor 'w': 66 elements do not fill whole q8_0 blocks");
}

// -M convert's writer: F8 widens to F16 exactly, matrices quantize, biases
// stay F32, and the file reads back through the GGUF parser.
TEST(GgufWriter, ConvertsTensorByTensorAndReadsBack) {
    test::TempDir dir;
    std::vector<uint8_t> f8 = {0x38, 0xB8, 0x7E, 0x01};
    std::vector<uint8_t> weight = test::f32_bytes(64 * 32);
    const std::string in =
        dir.write("in.safetensors",
                  test::build_safetensors({{"first_stage_model.decoder.conv_in.weight", "F32", {32, 64}, weight},
                                           {"first_stage_model.decoder.conv_in.bias", "F32", {32}, test::f32_bytes(32)},
                                           {"scale", "F8_E4M3", {2, 2}, f8}},
                                          {{"modelspec.title", "tiny"}}));
    auto model = ModelFile::open({in});
    ASSERT_TRUE(model.ok()) << model.error().message;
    const std::string out = dir.file("out.gguf");
    size_t last_progress = 0;
    GgufWriteOptions options;
    options.type = GGML_TYPE_Q8_0;
    options.progress = [&](size_t done, size_t total) {
        EXPECT_EQ(total, 3u);
        last_progress = done;
    };
    auto status = write_gguf(*model, out, options);
    ASSERT_TRUE(status.ok()) << status.error().message;
    EXPECT_EQ(last_progress, 3u);

    auto converted = ModelFile::open({out});
    ASSERT_TRUE(converted.ok()) << converted.error().message;
    EXPECT_EQ(converted->metadata().at("modelspec.title").str, "tiny");
    const TensorInfo* w = converted->find("first_stage_model.decoder.conv_in.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->dtype, DType(GGML_TYPE_Q8_0));
    EXPECT_EQ(w->shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(converted->find("first_stage_model.decoder.conv_in.bias")->dtype, DType::F32);
    const TensorInfo* scale = converted->find("scale");
    ASSERT_EQ(scale->dtype, DType::F16);
    const auto* halves = reinterpret_cast<const ggml_fp16_t*>(converted->data(*scale));
    EXPECT_EQ(ggml_fp16_to_fp32(halves[0]), 1.0f);
    EXPECT_EQ(ggml_fp16_to_fp32(halves[1]), -1.0f);
    EXPECT_EQ(ggml_fp16_to_fp32(halves[2]), 448.0f);
    EXPECT_EQ(ggml_fp16_to_fp32(halves[3]), std::ldexp(1.0f, -9));
    EXPECT_FALSE(std::ifstream(out + ".part").good());
}

// ComfyUI's *_fp8_scaled.safetensors: an F8 weight's values times its
// X.scale_weight, in every conversion (here to F32 and to kiln's default
// Q8_0 for F8 matrices); the marker and other tensors untouched.
TEST(ScaledFp8, WeightsAreScaledByTheirScaleWeight) {
    test::TempDir dir;
    const std::vector<uint8_t> ones(32 * 2, 0x38);  // e4m3 1.0
    const std::string in =
        dir.write("m_fp8_scaled.safetensors",
                  test::build_safetensors({{"scaled_fp8", "F8_E4M3", {0}, {}},
                                           {"blocks.0.linear.weight", "F8_E4M3", {2, 32}, ones},
                                           {"blocks.0.linear.scale_weight", "F32", {}, test::f32_bytes(1, 0.25f)},
                                           {"blocks.1.linear.weight", "F8_E4M3", {2, 32}, ones}}));
    auto model = ModelFile::open({in});
    ASSERT_TRUE(model.ok()) << model.error().message;
    const TensorInfo* scaled = model->find("blocks.0.linear.weight");
    EXPECT_EQ(scaled->scale, 0.25f);
    EXPECT_EQ(model->find("blocks.1.linear.weight")->scale, 1.0f);
    for (ggml_type target : {GGML_TYPE_F32, GGML_TYPE_Q8_0}) {
        auto bytes = convert_tensor(*scaled, model->data(*scaled), target);
        ASSERT_TRUE(bytes.ok()) << bytes.error().message;
        std::vector<float> values(64);
        if (target == GGML_TYPE_F32) {
            std::memcpy(values.data(), bytes->data(), 64 * sizeof(float));
        } else {
            ggml_get_type_traits(target)->to_float(bytes->data(), values.data(), 64);
        }
        for (float v : values) EXPECT_NEAR(v, 0.25f, 1e-4) << ggml_type_name(target);  // Q8_0: an F16 block scale
    }
    // A scale that is not one number is one clear error naming it.
    const std::string bad = dir.write("bad_fp8_scaled.safetensors",
                                      test::build_safetensors({{"l.weight", "F8_E4M3", {2, 32}, ones},
                                                               {"l.scale_weight", "F32", {2}, test::f32_bytes(2)}}));
    auto refused = ModelFile::open({bad});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("l.scale_weight ([2] F32) is not one finite number"), std::string::npos)
        << refused.error().message;
}

TEST(GgufWriter, UnwritableOutputLeavesNoFile) {
    test::TempDir dir;
    const std::string in =
        dir.write("in.safetensors", test::build_safetensors({{"a", "F32", {2}, test::f32_bytes(2)}}));
    auto model = ModelFile::open({in});
    ASSERT_TRUE(model.ok());
    const std::string out = dir.file("no/such/dir") + "/x/out.gguf";
    auto status = write_gguf(*model, out, {});
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.error().message.rfind(out + ": cannot create: ", 0), 0u) << status.error().message;
}

// Converting a GGUF carries every key over with the type it had: the default
// model holds general.alignment (u32), which ggml refuses in any other type.
TEST(GgufWriter, ConvertingAGgufKeepsEveryKeyAndItsType) {
    test::TempDir dir;
    const std::string out = dir.file("out.gguf");
    auto r = test::run_command(std::string(KILN_BIN) + " -M convert -m " + KILN_DEFAULT_MODEL + " -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;

    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> before(gguf_init_from_file(KILN_DEFAULT_MODEL, params),
                                                                  gguf_free);
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> after(gguf_init_from_file(out.c_str(), params), gguf_free);
    ASSERT_TRUE(before && after);
    ASSERT_GE(gguf_find_key(before.get(), GGUF_KEY_GENERAL_ALIGNMENT), 0);
    EXPECT_EQ(gguf_get_n_kv(after.get()), gguf_get_n_kv(before.get()));
    for (int64_t k = 0; k < gguf_get_n_kv(before.get()); ++k) {
        const char* key = gguf_get_key(before.get(), k);
        const int64_t k2 = gguf_find_key(after.get(), key);
        ASSERT_GE(k2, 0) << key;
        EXPECT_EQ(gguf_get_kv_type(after.get(), k2), gguf_get_kv_type(before.get(), k)) << key;
        if (gguf_get_kv_type(before.get(), k) == GGUF_TYPE_ARRAY) {
            EXPECT_EQ(gguf_get_arr_type(after.get(), k2), gguf_get_arr_type(before.get(), k)) << key;
            EXPECT_EQ(gguf_get_arr_n(after.get(), k2), gguf_get_arr_n(before.get(), k)) << key;
        }
    }
    EXPECT_EQ(gguf_get_alignment(after.get()), gguf_get_alignment(before.get()));
    EXPECT_EQ(gguf_get_n_tensors(after.get()), gguf_get_n_tensors(before.get()));
}

// Metadata ggml would abort on is refused with the key named, and no file appears.
TEST(GgufWriter, MetadataGgufCannotHoldIsAnErrorNamingTheKey) {
    test::TempDir dir;
    const std::string out = dir.file("out.gguf");
    for (const auto& [key, value, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"general.alignment", "64", "general.alignment must be a power of two (u32)"},
             {"", "x", "metadata key '' cannot be written"}}) {
        const std::string in = dir.write(
            "in.safetensors", test::build_safetensors({{"a", "F32", {2}, test::f32_bytes(2)}}, {{key, value}}));
        auto model = ModelFile::open({in});
        ASSERT_TRUE(model.ok()) << model.error().message;
        auto status = write_gguf(*model, out, {});
        ASSERT_FALSE(status.ok()) << key;
        EXPECT_NE(status.error().message.find(message), std::string::npos) << status.error().message;
        EXPECT_FALSE(std::ifstream(out).good());
        EXPECT_FALSE(std::ifstream(out + ".part").good());
    }
}

}  // namespace
}  // namespace kiln::io
