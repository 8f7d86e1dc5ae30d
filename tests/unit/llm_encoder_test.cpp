// kiln's LLM text encoder (Qwen3, Qwen2, Llama) against the PyTorch reference
// (training/reference/qwen3.py) on the tiny random-weight model
// training/make_qwen3_fixtures.py writes (GQA: 4 query heads over 2 K/V heads;
// head_dim 32 over a width of 64): every layer's hidden state and the final
// output, in HF's names and llama.cpp's GGUF names (also re-quantised to
// q8_0), the configuration read from both, declaring only the first layers,
// the cut markers, the decoders without QK norm (Qwen2.5's and Llama's
// layouts) and the errors of files kiln does not read.
#include "models/nets/llm_encoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "declared_network.h"
#include "golden.h"
#include "io/gguf_writer.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "test_files.h"

namespace kiln {
namespace {

using models::LlmConfig;
using models::LlmEncoder;
using test::fixture_tensor;
using test::FixtureTensor;
using test::ggml_ne;
using test::golden_path;
using test::relative_error;

// The weights are stored F16 and the reference runs in float64 on them;
// kiln widens them to F32 and computes in float32, so the differences are
// float32 rounding, summation order and ggml's rope angles. Measured: 3.3e-7.
constexpr double kTolerance = 1e-4;
// With the F16 weights as stored, the CPU's F16 products round the
// activations to F16 too. Measured: 9.1e-4.
constexpr double kF16Tolerance = 5e-3;
// q8_0 weights (8 bits per weight, one scale per 32): measured 3.0e-2. The
// weights' rounding alone gives 1.5e-2 (the reference on the rounded weights,
// in float64); ggml's CPU also rounds the activations to q8_0 for the products.
constexpr double kQ8Tolerance = 6e-2;

constexpr int kLayers = 3;

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

io::ModelFile qwen3_weights() { return open_file(golden_path("models/qwen3_tiny.safetensors")); }
io::ModelFile qwen3_gguf() { return open_file(golden_path("models/qwen3_tiny.gguf")); }
io::ModelFile qwen3_io() { return open_file(golden_path("models/qwen3_tiny_io.safetensors")); }

struct Encoded {
    std::vector<float> out;
    std::map<int, std::vector<float>> layers;  // cut "llm.layers.<i>" by i
};

// encode() of the fixture's tokens (PyTorch [B, n]).
Encoded encode(const LlmEncoder& llm, runtime::Compute& compute, const FixtureTensor& tokens,
               models::LlmOptions options = {}, bool final_norm = true) {
    const int64_t n = tokens.shape[1];
    std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const std::vector<float> mask = models::llm_causal_mask(n);
    runtime::GraphSession session;
    options.final_norm = final_norm;
    options.positions = session.input(GGML_TYPE_I32, {n}, positions.data());
    options.mask = session.input(GGML_TYPE_F32, {n, n}, mask.data());
    ggml_tensor* out =
        llm.encode(session.ctx(), session.input(GGML_TYPE_I32, ggml_ne(tokens.shape), ids.data()), options);
    Encoded result;
    const Status status = session.run(compute, out, /*keep_cuts=*/true);
    EXPECT_TRUE(status.ok()) << status.error().message;
    if (!status.ok()) return result;
    EXPECT_EQ(out->ne[0], llm.config().width);
    EXPECT_EQ(out->ne[1], n);
    EXPECT_EQ(out->ne[2], tokens.shape[0]);
    result.out = runtime::GraphSession::read(out);
    const int64_t run = options.layers > 0 ? options.layers : llm.declared_layers();
    for (int64_t i = 0; i < run; ++i) {
        const std::string name = "cut:llm.layers." + std::to_string(i);
        ggml_tensor* cut = session.find(name);
        EXPECT_NE(cut, nullptr) << name;
        if (cut) result.layers[static_cast<int>(i)] = runtime::GraphSession::read(cut);
    }
    return result;
}

test::DeclaredNetwork<LlmEncoder> load(const io::ModelFile& file, runtime::Compute& compute,
                                       std::optional<ggml_type> type = GGML_TYPE_F32, const std::string& prefix = "",
                                       int unused_last_layers = 0) {
    auto llm = test::declare_network<LlmEncoder>(file, prefix, type, unused_last_layers);
    if (!llm.ok()) throw std::runtime_error(llm.error().message);
    const Status status = llm->weights().load(compute.weights_backend());
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return std::move(llm).value();
}

// Every layer and the final output against the goldens; returns the largest error.
double expect_matches_reference(const Encoded& got, const io::ModelFile& io, double tolerance, const char* label) {
    double worst = 0;
    for (int i = 0; i < kLayers; ++i) {
        const auto it = got.layers.find(i);
        if (it == got.layers.end()) {
            ADD_FAILURE() << label << ": no layer " << i;
            continue;
        }
        const double error = relative_error(it->second, fixture_tensor(io, "llm.layer." + std::to_string(i)).values);
        EXPECT_LT(error, tolerance) << label << ": layer " << i;
        worst = std::max(worst, error);
    }
    const double error = relative_error(got.out, fixture_tensor(io, "llm.out").values);
    EXPECT_LT(error, tolerance) << label << ": final output";
    worst = std::max(worst, error);
    std::printf("%s: largest relative error over the layers and the output %.2e\n", label, worst);
    return worst;
}

// The tiny model's tensors under other names: `rename` returns the new name,
// or "" to drop the tensor.
std::vector<test::SafetensorsEntry> renamed(const io::ModelFile& file,
                                            const std::function<std::string(const std::string&)>& rename) {
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        const std::string name = rename(t.name);
        if (name.empty()) continue;
        const uint8_t* data = file.data(t);
        entries.push_back({name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    return entries;
}

// The GGUF fixture rewritten by kiln's GGUF writer with `metadata` replacing its keys.
std::string gguf_with_metadata(const test::TempDir& dir, const std::string& file_name, io::Metadata metadata) {
    io::ModelFile gguf = qwen3_gguf();
    const std::string path = dir.file(file_name);
    io::GgufWriteOptions options;
    options.extra_metadata = std::move(metadata);
    const Status written = io::write_gguf(gguf, path, options);
    if (!written.ok()) throw std::runtime_error(written.error().message);
    return path;
}

Error create_error(const io::ModelFile& file, const std::string& prefix = "", int unused_last_layers = 0) {
    auto llm = test::declare_network<LlmEncoder>(file, prefix, std::nullopt, unused_last_layers);
    if (llm.ok()) {
        ADD_FAILURE() << "create() succeeded";
        return Error::bad_file("");
    }
    return llm.error();
}

// HF's hidden_states[k] by index: the output of layer k - 1, and for the
// last index the final-normed state HF returns there (its last_hidden_state).
TEST(LlmEncoderHiddenStates, TheLastIndexIsFinalNormedAsHfs) {
    auto compute = test::golden_cpu();
    auto llm = load(qwen3_weights(), *compute);
    const io::ModelFile io = qwen3_io();
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    ASSERT_EQ(llm->config().layers, kLayers);
    for (const auto& [k, golden] : {std::pair<int, std::string>{1, "llm.layer.0"}, {kLayers, "llm.out"}}) {
        models::LlmOptions options;
        options.layers = k;  // the layers after it do not run
        options.stacked_outputs = {k - 1};
        const Encoded got = encode(*llm, *compute, tokens, options, /*final_norm=*/false);
        EXPECT_LT(relative_error(got.out, fixture_tensor(io, golden).values), 1e-4) << "hidden_states[" << k << "]";
    }
}

TEST(LlmEncoderGolden, EveryLayerAndFinalOutputMatchReference) {
    io::ModelFile weights = qwen3_weights(), io = qwen3_io();
    auto compute = test::golden_cpu();
    auto llm = load(weights, *compute);
    expect_matches_reference(encode(*llm, *compute, fixture_tensor(io, "llm.tokens")), io, kTolerance,
                             "qwen3 safetensors, F32");
}

TEST(LlmEncoderGolden, BatchOfTwoPromptsMatchesReference) {
    io::ModelFile weights = qwen3_weights(), io = qwen3_io();
    auto compute = test::golden_cpu();
    auto llm = load(weights, *compute);
    const Encoded got = encode(*llm, *compute, fixture_tensor(io, "llm.batch.tokens"));
    const double error = relative_error(got.out, fixture_tensor(io, "llm.batch.out").values);
    EXPECT_LT(error, kTolerance);
    std::printf("qwen3 batch of 2: relative error %.2e\n", error);
}

TEST(LlmEncoderGolden, F16WeightsMatchReferenceLoosely) {
    io::ModelFile weights = qwen3_weights(), io = qwen3_io();
    auto compute = test::golden_cpu();
    auto llm = load(weights, *compute, std::nullopt);
    expect_matches_reference(encode(*llm, *compute, fixture_tensor(io, "llm.tokens")), io, kF16Tolerance,
                             "qwen3 safetensors, F16 weights");
}

TEST(LlmEncoderGguf, LlamaCppNamesGiveTheSameNumbers) {
    io::ModelFile weights = qwen3_weights(), gguf = qwen3_gguf(), io = qwen3_io();
    ASSERT_EQ(gguf.sources()[0].format, io::FileFormat::Gguf);
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    auto compute = test::golden_cpu();
    const Encoded reference = encode(*load(weights, *compute), *compute, tokens);
    auto llm = load(gguf, *compute);
    EXPECT_EQ(llm->config().naming, LlmConfig::Naming::LlamaCpp);
    const Encoded got = encode(*llm, *compute, tokens);
    expect_matches_reference(got, io, kTolerance, "qwen3 GGUF, F32");
    // The same values under other names: the same numbers, bit for bit.
    EXPECT_EQ(got.out, reference.out);
    EXPECT_EQ(got.layers, reference.layers);
}

TEST(LlmEncoderGguf, Q8WeightsMatchReferenceLoosely) {
    io::ModelFile gguf = qwen3_gguf(), io = qwen3_io();
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    auto compute = test::golden_cpu();
    // Re-quantised by kiln's GGUF writer, as `kiln -M convert --type q8_0` does.
    test::TempDir dir;
    const std::string path = dir.file("qwen3_q8_0.gguf");
    io::GgufWriteOptions options;
    options.type = GGML_TYPE_Q8_0;
    const Status written = io::write_gguf(gguf, path, options);
    ASSERT_TRUE(written.ok()) << written.error().message;
    io::ModelFile q8 = open_file(path);
    ASSERT_EQ(q8.find("blk.0.attn_q.weight")->dtype, static_cast<io::DType>(GGML_TYPE_Q8_0));
    auto llm = load(q8, *compute, std::nullopt);
    const double error =
        expect_matches_reference(encode(*llm, *compute, tokens), io, kQ8Tolerance, "qwen3 GGUF, q8_0 weights");
    EXPECT_GT(error, kTolerance);  // the weights really are quantised
}

TEST(LlmEncoderConfig, ReadFromBothNamings) {
    io::ModelFile weights = qwen3_weights(), gguf = qwen3_gguf();
    for (const io::ModelFile* file : {&weights, &gguf}) {
        const bool is_gguf = file == &gguf;
        SCOPED_TRACE(is_gguf ? "gguf" : "safetensors");
        EXPECT_TRUE(LlmEncoder::looks_like_llm(*file, ""));
        EXPECT_FALSE(LlmEncoder::looks_like_llm(*file, "text_encoders.qwen3_4b.transformer."));
        auto llm = test::declare_network<LlmEncoder>(*file, "", std::nullopt);
        ASSERT_TRUE(llm.ok()) << llm.error().message;
        const LlmConfig& c = (*llm)->config();
        EXPECT_EQ(c.arch, LlmConfig::Arch::Qwen3);
        EXPECT_EQ(c.arch_name(), "qwen3");
        EXPECT_EQ(c.naming, is_gguf ? LlmConfig::Naming::LlamaCpp : LlmConfig::Naming::HuggingFace);
        EXPECT_EQ(c.vocab, 300);
        EXPECT_EQ(c.width, 64);
        EXPECT_EQ(c.layers, 3);
        EXPECT_EQ(c.heads, 4);
        EXPECT_EQ(c.kv_heads, 2);
        EXPECT_EQ(c.head_dim, 32);  // not width / heads = 16
        EXPECT_EQ(c.ffn, 96);
        EXPECT_EQ(c.rope_theta, 1e6f);
        EXPECT_EQ(c.norm_eps, 1e-6f);
        EXPECT_TRUE(c.qk_norm);
        EXPECT_FALSE(c.qkv_bias);
        EXPECT_EQ((*llm)->declared_layers(), 3);
        // 3 layers x 11 + embedding and final norm.
        EXPECT_EQ(llm->weights().count(), 35u);
    }
}

TEST(LlmEncoderConfig, RopeThetaAndEpsilonFromGgufMetadata) {
    test::TempDir dir;
    io::ModelFile gguf =
        open_file(gguf_with_metadata(dir, "theta.gguf",
                                     {{"qwen3.rope.freq_base", io::MetaValue::of_float(5e5)},
                                      {"qwen3.attention.layer_norm_rms_epsilon", io::MetaValue::of_float(1e-5)}}));
    auto llm = test::declare_network<LlmEncoder>(gguf, "", std::nullopt);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    EXPECT_EQ((*llm)->config().rope_theta, 5e5f);
    EXPECT_EQ((*llm)->config().norm_eps, 1e-5f);
    // Another theta gives other numbers (the rope reads it).
    io::ModelFile io = qwen3_io();
    auto compute = test::golden_cpu();
    const Encoded got = encode(*load(gguf, *compute), *compute, fixture_tensor(io, "llm.tokens"));
    EXPECT_GT(relative_error(got.layers.at(0), fixture_tensor(io, "llm.layer.0").values), 100 * kTolerance);
}

TEST(LlmEncoderConfig, ComfyUiPrefixIgnoresLmHeadAndVisionTower) {
    io::ModelFile weights = qwen3_weights(), io = qwen3_io();
    const std::string prefix = "text_encoders.qwen3_4b.transformer.";
    test::TempDir dir;
    std::vector<test::SafetensorsEntry> entries =
        renamed(weights, [&](const std::string& name) { return prefix + name; });
    // An LM head and a vision tower tensor of odd shapes that must never be read.
    entries.push_back({prefix + "lm_head.weight", "F32", {3, 5}, test::f32_bytes(15)});
    entries.push_back({prefix + "visual.blocks.0.attn.qkv.weight", "F32", {7}, test::f32_bytes(7)});
    io::ModelFile comfy = open_file(dir.write("comfy.safetensors", test::build_safetensors(entries)));
    EXPECT_TRUE(LlmEncoder::looks_like_llm(comfy, prefix));
    EXPECT_FALSE(LlmEncoder::looks_like_llm(comfy, ""));
    auto compute = test::golden_cpu();
    auto llm = load(comfy, *compute, GGML_TYPE_F32, prefix);
    EXPECT_EQ(llm.weights().count(), 35u);
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    EXPECT_EQ(encode(*llm, *compute, tokens).out, encode(*load(weights, *compute), *compute, tokens).out);
}

TEST(LlmEncoderUsedLayers, FirstLayersOnlyGiveTheSameHiddenStates) {
    io::ModelFile weights = qwen3_weights(), io = qwen3_io();
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    auto compute = test::golden_cpu();
    const Encoded full = encode(*load(weights, *compute), *compute, tokens);

    auto llm = load(weights, *compute, GGML_TYPE_F32, "", /*unused_last_layers=*/1);
    EXPECT_EQ(llm->config().layers, kLayers);
    EXPECT_EQ(llm->declared_layers(), kLayers - 1);
    EXPECT_EQ(llm.weights().count(), 1u + 11u * (kLayers - 1));  // embedding + 2 layers, no final norm
    const Encoded got = encode(*llm, *compute, tokens, {}, /*final_norm=*/false);
    EXPECT_EQ(got.layers.size(), static_cast<size_t>(kLayers - 1));
    EXPECT_EQ(got.out, full.layers.at(kLayers - 2));
    EXPECT_LT(relative_error(got.out, fixture_tensor(io, "llm.layer.1").values), kTolerance);

    // Running fewer layers than declared does the same.
    models::LlmOptions two;
    two.layers = kLayers - 1;
    EXPECT_EQ(encode(*load(weights, *compute), *compute, tokens, two, /*final_norm=*/false).out, got.out);

    // The last layer and the final norm are never read: a file whose are
    // broken still loads for the first layers, and only for them.
    test::TempDir dir;
    std::vector<test::SafetensorsEntry> entries = renamed(weights, [](const std::string& n) {
        return n == "model.norm.weight" || n == "model.layers.2.mlp.down_proj.weight" ? std::string() : n;
    });
    entries.push_back({"model.layers.2.mlp.down_proj.weight", "F32", {2, 2}, test::f32_bytes(4)});
    io::ModelFile broken = open_file(dir.write("broken.safetensors", test::build_safetensors(entries)));
    EXPECT_EQ(
        encode(*load(broken, *compute, GGML_TYPE_F32, "", /*unused_last_layers=*/1), *compute, tokens, {}, false).out,
        got.out);
    auto all = test::declare_network<LlmEncoder>(broken, "", std::nullopt);
    ASSERT_TRUE(all.ok()) << all.error().message;
    const Status status = all->weights().load(compute->weights_backend());
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.error().message.find("model.layers.2.mlp.down_proj.weight"), std::string::npos)
        << status.error().message;
}

TEST(LlmEncoderPlan, SegmentsEndAtEveryLayer) {
    // The memory system can run the encoder a layer at a time: every leaf is
    // a weight or an input, and each layer's weights fall in its segment.
    io::ModelFile weights = qwen3_weights();
    auto llm = test::declare_network<LlmEncoder>(weights, "", std::nullopt);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    const int64_t n = 12, batch = 2;
    const std::vector<int32_t> ids(n * batch, 5);
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const std::vector<float> mask = models::llm_causal_mask(n);
    runtime::GraphSession session;
    models::LlmOptions options;
    options.final_norm = true;
    options.positions = session.input(GGML_TYPE_I32, {n}, positions.data());
    options.mask = session.input(GGML_TYPE_F32, {n, n}, mask.data());
    ggml_tensor* out = (*llm)->encode(session.ctx(), session.input(GGML_TYPE_I32, {n, batch}, ids.data()), options);
    const runtime::GraphPlan plan = runtime::build_graph_plan(session.graph(out), llm->weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    ASSERT_EQ(plan.segments.size(), 4u);
    const std::vector<size_t> weight_counts = {12, 11, 11, 1};  // + embedding; final norm
    for (size_t i = 0; i < plan.segments.size(); ++i) {
        EXPECT_EQ(plan.segments[i].name, i < 3 ? "llm.layers." + std::to_string(i) : std::string("output"));
        EXPECT_EQ(plan.segments[i].weights.size(), weight_counts[i]) << plan.segments[i].name;
    }
}

TEST(LlmEncoderMask, CausalMaskLayout) {
    const std::vector<float> m = models::llm_causal_mask(3);
    ASSERT_EQ(m.size(), 9u);
    const float inf = std::numeric_limits<float>::infinity();
    // [q * n + k]: query q sees keys 0..q.
    EXPECT_EQ(m, (std::vector<float>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}));
}

TEST(LlmEncoderErrors, OtherGgufArchitectureIsNamed) {
    test::TempDir dir;
    io::ModelFile gemma = open_file(
        gguf_with_metadata(dir, "gemma.gguf", {{"general.architecture", io::MetaValue::of_string("gemma3")}}));
    const Error error = create_error(gemma);
    EXPECT_EQ(error.kind, ErrorKind::BadFile);
    EXPECT_EQ(error.message,
              "LLM text encoder under '': general.architecture is 'gemma3'; the LLM text encoder reads qwen3, qwen2, "
              "qwen2vl and llama");
}

TEST(LlmEncoderErrors, OtherNetworksNameWhatIsMissing) {
    for (const char* fixture : {"models/t5_tiny.safetensors", "models/sd1_tiny.safetensors"}) {
        io::ModelFile file = open_file(golden_path(fixture));
        EXPECT_FALSE(LlmEncoder::looks_like_llm(file, "")) << fixture;
        const Error error = create_error(file);
        EXPECT_EQ(error.kind, ErrorKind::BadFile);
        EXPECT_EQ(error.message,
                  "no LLM text encoder under '' (no token embedding: model.embed_tokens.weight or token_embd.weight)");
    }
}

// The decoders without QK norm (training/make_qwen3_fixtures.py's qwen2_tiny:
// Qwen2.5's q/k/v biases; llama_tiny: Llama's and Mistral's layout, rope
// theta 1e9), in HF's names (their head width and theta in the safetensors
// metadata) and as GGUFs (llama's q/k rows permuted as llama.cpp's converter
// does, rotated in rope's normal mode): every layer against the reference,
// and the same numbers from both files.
class LlmEncoderArchitectures : public ::testing::TestWithParam<std::pair<const char*, LlmConfig::Arch>> {};

TEST_P(LlmEncoderArchitectures, BothNamingsMatchReference) {
    const std::string name = GetParam().first;
    io::ModelFile weights = open_file(golden_path("models/" + name + "_tiny.safetensors"));
    io::ModelFile gguf = open_file(golden_path("models/" + name + "_tiny.gguf"));
    io::ModelFile io = open_file(golden_path("models/" + name + "_tiny_io.safetensors"));
    auto compute = test::golden_cpu();
    const FixtureTensor tokens = fixture_tensor(io, "llm.tokens");
    auto hf = load(weights, *compute);
    EXPECT_EQ(hf->config().arch, GetParam().second);
    EXPECT_FALSE(hf->config().qk_norm);
    EXPECT_EQ(hf->config().qkv_bias, GetParam().second == LlmConfig::Arch::Qwen2);
    EXPECT_EQ(hf->config().head_dim, 32);
    EXPECT_EQ(hf->config().heads, 4);
    EXPECT_EQ(hf->config().kv_heads, 2);
    expect_matches_reference(encode(*hf, *compute, tokens), io, kTolerance, (name + " safetensors, F32").c_str());
    auto ll = load(gguf, *compute);
    EXPECT_EQ(ll->config().arch, GetParam().second);
    EXPECT_EQ(ll->config().rope_neox, GetParam().second != LlmConfig::Arch::Llama);
    expect_matches_reference(encode(*ll, *compute, tokens), io, kTolerance, (name + " GGUF, F32").c_str());
}

INSTANTIATE_TEST_SUITE_P(WithoutQkNorm, LlmEncoderArchitectures,
                         ::testing::Values(std::make_pair("qwen2", LlmConfig::Arch::Qwen2),
                                           std::make_pair("llama", LlmConfig::Arch::Llama)));

// Without QK norm, a head width the metadata states must be even.
TEST(LlmEncoderErrors, OddHeadWidthFromMetadataIsNamed) {
    io::ModelFile weights = open_file(golden_path("models/llama_tiny.safetensors"));
    test::TempDir dir;
    io::ModelFile file = open_file(
        dir.write("odd.safetensors", test::build_safetensors(renamed(weights, [](const std::string& n) { return n; }),
                                                             {{"llama.attention.key_length", "31"}})));
    const Error error = create_error(file);
    EXPECT_EQ(error.kind, ErrorKind::BadFile);
    EXPECT_EQ(error.message,
              "LLM text encoder under '': metadata llama.attention.key_length is 31, not an even head width");
}

TEST(LlmEncoderErrors, MissingTensorIsNamedAtLoad) {
    io::ModelFile weights = qwen3_weights();
    test::TempDir dir;
    const std::string missing = "model.layers.1.mlp.down_proj.weight";
    io::ModelFile file = open_file(dir.write(
        "missing.safetensors",
        test::build_safetensors(renamed(weights, [&](const std::string& n) { return n == missing ? "" : n; }))));
    auto llm = test::declare_network<LlmEncoder>(file, "", std::nullopt);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    auto compute = test::golden_cpu();
    const Status status = llm->weights().load(compute->weights_backend());
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.error().message.find(missing), std::string::npos) << status.error().message;
}

// The fixture with layer 0's k_proj replaced by the first `rows` rows of its q_proj.
io::ModelFile with_k_rows(const test::TempDir& dir, int64_t rows) {
    io::ModelFile weights = qwen3_weights();
    std::vector<test::SafetensorsEntry> entries = renamed(weights, [](const std::string& n) {
        return n == "model.layers.0.self_attn.k_proj.weight" ? std::string() : n;
    });
    const io::TensorInfo* q = weights.find("model.layers.0.self_attn.q_proj.weight");
    const uint8_t* data = weights.data(*q);
    const size_t bytes = static_cast<size_t>(rows * 64 * 2);  // F16 rows of 64
    entries.push_back(
        {"model.layers.0.self_attn.k_proj.weight", "F16", {rows, 64}, std::vector<uint8_t>(data, data + bytes)});
    return open_file(dir.write("k" + std::to_string(rows) + ".safetensors", test::build_safetensors(entries)));
}

TEST(LlmEncoderErrors, InconsistentHeadSizesAreNamed) {
    test::TempDir dir;
    // 48 rows are no whole number of 32-wide heads.
    const Error partial = create_error(with_k_rows(dir, 48));
    EXPECT_EQ(partial.kind, ErrorKind::BadFile);
    EXPECT_EQ(partial.message,
              "LLM text encoder under '': model.layers.0.self_attn.k_proj.weight has shape [48, 64], not "
              "[heads * 32, 64] (head_dim from model.layers.0.self_attn.q_norm.weight, width from "
              "model.embed_tokens.weight)");
    // 3 K/V heads cannot serve 4 query heads.
    const Error groups = create_error(with_k_rows(dir, 96));
    EXPECT_EQ(groups.kind, ErrorKind::BadFile);
    EXPECT_EQ(groups.message,
              "LLM text encoder under '': 4 query heads (model.layers.0.self_attn.q_proj.weight) are not a multiple "
              "of 3 K/V heads (model.layers.0.self_attn.k_proj.weight)");
}

TEST(LlmEncoderErrors, GgufMetadataThatDisagreesIsNamed) {
    test::TempDir dir;
    struct Case {
        const char* key;
        io::MetaValue value;
        std::string message;
    };
    const std::vector<Case> cases = {
        {"qwen3.attention.key_length", io::MetaValue::of_uint(16),
         "metadata qwen3.attention.key_length is 16 but blk.0.attn_q_norm.weight has shape [32]"},
        {"qwen3.attention.head_count", io::MetaValue::of_uint(8),
         "metadata qwen3.attention.head_count is 8 but blk.0.attn_q.weight gives 4"},
        {"qwen3.attention.head_count_kv", io::MetaValue::of_uint(4),
         "metadata qwen3.attention.head_count_kv is 4 but blk.0.attn_k.weight gives 2"},
        {"qwen3.block_count", io::MetaValue::of_uint(36),
         "metadata qwen3.block_count is 36 but the layers found gives 3"},
        {"qwen3.rope.freq_base", io::MetaValue::of_string("fast"),
         "metadata qwen3.rope.freq_base is 'fast', not a number"},
        {"qwen3.rope.freq_base", io::MetaValue::of_float(-1),
         "metadata qwen3.rope.freq_base is -1, not a positive number"},
        {"qwen3.attention.layer_norm_rms_epsilon", io::MetaValue::of_float(0),
         "metadata qwen3.attention.layer_norm_rms_epsilon is 0, not in (0, 1)"},
    };
    int i = 0;
    for (const Case& c : cases) {
        io::ModelFile gguf =
            open_file(gguf_with_metadata(dir, "case" + std::to_string(i++) + ".gguf", {{c.key, c.value}}));
        const Error error = create_error(gguf);
        EXPECT_EQ(error.kind, ErrorKind::BadFile) << c.key;
        EXPECT_EQ(error.message, "LLM text encoder under '': " + c.message);
    }
}

TEST(LlmEncoderErrors, UnusedLayersOfAllTheFileIsAnInvalidRequest) {
    io::ModelFile weights = qwen3_weights();
    const Error more = create_error(weights, "", 3);
    EXPECT_EQ(more.kind, ErrorKind::InvalidRequest);
    EXPECT_EQ(more.message, "LLM text encoder under '': unused_last_layers 3 but the file has 3 layers");
    EXPECT_EQ(create_error(weights, "", -1).kind, ErrorKind::InvalidRequest);
}

// FLUX.2 [dev]'s text encoder, Mistral Small 3.x in
// Mistral3ForConditionalGeneration's names (training/make_flux2_dev_fixtures.py:
// 32 Llama layers of width 16, 2 heads of 8 over one K/V head, rope theta 1e9,
// an LM head and a few vision tower and projector tensors beside): read under
// "language_model.model." with only the 30 layers hidden_states 30 needs
// declared, nothing of the vision tower, the projector or the LM head. HF's
// hidden_states 10, 20 and 30 of the fixture prompt (Tekken's ids) side by
// side, as BFL's Mistral embedder stacks them, against the reference.
TEST(LlmEncoderMistral3, Flux2DevStackedHiddenStatesMatchTheReference) {
    io::ModelFile weights = open_file(golden_path("models/flux2_dev_mistral_tiny.safetensors"));
    io::ModelFile io = open_file(golden_path("models/flux2_dev_mistral_tiny_io.safetensors"));
    const std::string prefix = "language_model.model.";
    for (const char* other :
         {"language_model.lm_head.weight", "vision_tower.patch_conv.weight", "multi_modal_projector.linear_1.weight"}) {
        ASSERT_NE(weights.find(other), nullptr) << other << ": the file has what must not be read";
    }
    EXPECT_TRUE(LlmEncoder::looks_like_llm(weights, prefix));
    auto llm = test::declare_network<LlmEncoder>(weights, prefix, GGML_TYPE_F32, /*unused_last_layers=*/0,
                                                 /*first_layers=*/30);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    const LlmConfig& c = (*llm)->config();
    EXPECT_EQ(c.arch, LlmConfig::Arch::Llama);
    EXPECT_EQ(c.naming, LlmConfig::Naming::HuggingFaceBase);
    EXPECT_EQ(c.vocab, 1406);  // the tiny Tekken's
    EXPECT_EQ(c.width, 16);
    EXPECT_EQ(c.layers, 32);
    EXPECT_EQ(c.heads, 2);
    EXPECT_EQ(c.kv_heads, 1);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.ffn, 32);
    EXPECT_EQ(c.rope_theta, 1e9f);
    EXPECT_EQ(c.norm_eps, 1e-5f);
    EXPECT_TRUE(c.rope_neox);  // HF's rotate-half pairs
    EXPECT_EQ((*llm)->declared_layers(), 30);
    EXPECT_EQ(llm->weights().count(), 1u + 9u * 30);  // the embedding and 30 layers: no final norm
    for (const auto& declared : llm->weights().declared()) {
        ASSERT_NE(declared.second, nullptr);
        const std::string& name = declared.second->name;
        EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;  // no lm_head, vision_tower.*, multi_modal_projector.*
        EXPECT_EQ(name.find("layers.30."), std::string::npos) << name;
        EXPECT_EQ(name.find("layers.31."), std::string::npos) << name;
        EXPECT_NE(name, prefix + "norm.weight");
    }
    auto compute = test::golden_cpu();
    const Status loaded = llm->weights().load(compute->weights_backend());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;

    const FixtureTensor ids = fixture_tensor(io, "ids");
    const std::vector<int32_t> tokens(ids.values.begin(), ids.values.end());
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::TextEncodeShape shape;
    shape.length = static_cast<int64_t>(tokens.size());
    shape.final_norm = false;
    shape.hidden_states = {10, 20, 30};
    const models::TextEncoderTensors t = (*llm)->build(inputs, shape);
    session.set_input(t.tokens, tokens.data());
    ASSERT_TRUE(session.run(*compute, t.out).ok());
    EXPECT_EQ(t.out->ne[0], 48);
    EXPECT_EQ(t.out->ne[1], shape.length);
    const double error = relative_error(runtime::GraphSession::read(t.out), fixture_tensor(io, "out").values);
    EXPECT_LT(error, kTolerance);
    std::printf("FLUX.2 [dev] Mistral, hidden states 10, 20, 30: relative error %.2e\n", error);
}

}  // namespace
}  // namespace kiln
