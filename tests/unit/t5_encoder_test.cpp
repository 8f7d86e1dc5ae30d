// kiln's T5 v1.1 encoder against the PyTorch reference (training/reference/t5.py)
// on the tiny random-weight model training/make_t5_fixtures.py writes: final
// output and every block, the key mask, a prompt longer than max_distance,
// the bucket table, both namings, and the errors of files that are no T5 v1.1.
#include "models/nets/t5_encoder.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "declared_network.h"
#include "golden.h"
#include "io/gguf_writer.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::FixtureTensor;
using test::ggml_ne;
using test::golden_path;
using test::relative_error;

// The weights are stored F16 and the reference runs in float64 on them;
// kiln widens them to F32 (--type f32) and computes in float32, so the
// differences are float32 rounding and summation order. Measured: about 1e-6.
constexpr double kTolerance = 1e-4;
// With the F16 weights as stored, the CPU's F16 products round the
// activations to F16 too.
constexpr double kF16Tolerance = 5e-3;

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

io::ModelFile t5_weights() { return open_file(golden_path("models/t5_tiny.safetensors")); }
io::ModelFile t5_io() { return open_file(golden_path("models/t5_tiny_io.safetensors")); }

struct Encoded {
    std::vector<float> out;
    std::map<std::string, std::vector<float>> cuts;  // "t5.blocks.<i>"
};

// encode() of the fixture's tokens (PyTorch [B, n]) with `mask` ([B, n]) or none.
Encoded encode(const models::T5Encoder& t5, runtime::Compute& compute, const FixtureTensor& tokens,
               const FixtureTensor* mask = nullptr) {
    const int64_t n = tokens.shape[1];
    std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
    const std::vector<int32_t> buckets = t5.relative_buckets(n);
    runtime::GraphSession session;
    models::T5Options options;
    options.relative_buckets = session.input(GGML_TYPE_I32, {n, n}, buckets.data());
    if (mask) options.key_mask = session.input(GGML_TYPE_F32, ggml_ne(mask->shape), mask->values.data());
    ggml_tensor* out =
        t5.encode(session.ctx(), session.input(GGML_TYPE_I32, ggml_ne(tokens.shape), ids.data()), options);
    Encoded result;
    const Status status = session.run(compute, out, /*keep_cuts=*/true);
    EXPECT_TRUE(status.ok()) << status.error().message;
    if (!status.ok()) return result;
    EXPECT_EQ(out->ne[0], t5.config().d_model);
    EXPECT_EQ(out->ne[1], n);
    EXPECT_EQ(out->ne[2], tokens.shape[0]);
    result.out = runtime::GraphSession::read(out);
    for (int64_t i = 0; i < t5.config().layers; ++i) {
        const std::string name = "t5.blocks." + std::to_string(i);
        ggml_tensor* cut = session.find("cut:" + name);
        EXPECT_NE(cut, nullptr) << name;
        if (cut) result.cuts[name] = runtime::GraphSession::read(cut);
    }
    return result;
}

test::DeclaredNetwork<models::T5Encoder> load(const io::ModelFile& file, runtime::Compute& compute,
                                              std::optional<ggml_type> type = GGML_TYPE_F32,
                                              const std::string& prefix = "") {
    auto t5 = test::declare_network<models::T5Encoder>(file, prefix, type);
    if (!t5.ok()) throw std::runtime_error(t5.error().message);
    const Status status = t5->weights().load(compute.weights_backend());
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return std::move(t5).value();
}

TEST(T5Golden, OutputAndEveryBlockMatchReference) {
    io::ModelFile weights = t5_weights(), io = t5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute);
    Encoded got = encode(*t5, *compute, fixture_tensor(io, "t5.tokens"));
    const double error = relative_error(got.out, fixture_tensor(io, "t5.out").values);
    EXPECT_LT(error, kTolerance);
    std::printf("t5.out relative error %.2e\n", error);
    for (int i = 0; i < 3; ++i) {
        const std::string cut = "t5.blocks." + std::to_string(i);
        EXPECT_LT(relative_error(got.cuts[cut], fixture_tensor(io, "t5.block." + std::to_string(i)).values), kTolerance)
            << cut;
    }
}

TEST(T5Golden, KeyMaskMatchesReference) {
    io::ModelFile weights = t5_weights(), io = t5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute);
    const FixtureTensor mask = fixture_tensor(io, "t5.key_mask");
    Encoded got = encode(*t5, *compute, fixture_tensor(io, "t5.tokens"), &mask);
    const std::vector<float> expected = fixture_tensor(io, "t5.out_masked").values;
    const double error = relative_error(got.out, expected);
    EXPECT_LT(error, kTolerance);
    std::printf("t5.out_masked relative error %.2e\n", error);
    // The mask changes the padded prompt (the second) and only it.
    const std::vector<float> unmasked = fixture_tensor(io, "t5.out").values;
    const size_t half = expected.size() / 2;
    EXPECT_EQ(std::vector<float>(expected.begin(), expected.begin() + half),
              std::vector<float>(unmasked.begin(), unmasked.begin() + half));
    EXPECT_GT(relative_error(std::vector<float>(got.out.begin() + half, got.out.end()),
                             std::vector<float>(unmasked.begin() + half, unmasked.end())),
              100 * kTolerance);
}

TEST(T5Golden, PromptLongerThanMaxDistanceMatchesReference) {
    // 160 tokens: relative positions past 128 fall in each direction's last bucket.
    io::ModelFile weights = t5_weights(), io = t5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute);
    Encoded got = encode(*t5, *compute, fixture_tensor(io, "t5.long.tokens"));
    EXPECT_LT(relative_error(got.out, fixture_tensor(io, "t5.long.out").values), kTolerance);
}

TEST(T5Golden, F16WeightsMatchReferenceLoosely) {
    io::ModelFile weights = t5_weights(), io = t5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute, std::nullopt);
    Encoded got = encode(*t5, *compute, fixture_tensor(io, "t5.tokens"));
    const double error = relative_error(got.out, fixture_tensor(io, "t5.out").values);
    EXPECT_LT(error, kF16Tolerance);
    std::printf("t5.out with F16 weights: relative error %.2e\n", error);
}

TEST(T5Buckets, MatchReference) {
    io::ModelFile io = t5_io();
    const FixtureTensor table = fixture_tensor(io, "t5.buckets");  // relative positions -199..199
    ASSERT_EQ(table.values.size(), 399u);
    for (int64_t r = -199; r <= 199; ++r) {
        EXPECT_EQ(models::T5Encoder::relative_bucket(r, 32, 128), static_cast<int32_t>(table.values[r + 199]))
            << "relative position " << r;
    }
    // The layout T5Options::relative_buckets expects: [q * n + k] is the bucket of k - q.
    io::ModelFile weights = t5_weights();
    auto t5 = test::declare_network<models::T5Encoder>(weights, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    const std::vector<int32_t> b = (*t5)->relative_buckets(40);
    ASSERT_EQ(b.size(), 1600u);
    EXPECT_EQ(b[0 * 40 + 0], 0);
    EXPECT_EQ(b[0 * 40 + 1], 17);   // key after the query: upper half
    EXPECT_EQ(b[1 * 40 + 0], 1);    // key before the query
    EXPECT_EQ(b[0 * 40 + 16], 26);  // distance 16: log-spaced bucket 10 of the upper half
    EXPECT_EQ(b[39 * 40 + 0], 12);
}

TEST(T5Config, ReadFromWeights) {
    io::ModelFile weights = t5_weights();
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(weights, ""));
    EXPECT_FALSE(models::T5Encoder::looks_like_t5(weights, "text_encoders.t5xxl.transformer."));
    auto t5 = test::declare_network<models::T5Encoder>(weights, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    const models::T5Config& c = (*t5)->config();
    EXPECT_EQ(c.naming, models::T5Config::Naming::HuggingFace);
    EXPECT_EQ(c.vocab, 128);
    EXPECT_EQ(c.d_model, 64);
    EXPECT_EQ(c.d_kv, 12);
    EXPECT_EQ(c.heads, 4);
    EXPECT_EQ(c.d_ff, 96);
    EXPECT_EQ(c.layers, 3);
    EXPECT_EQ(c.buckets, 32);
    EXPECT_EQ(c.max_distance, 128);
    // 3 blocks x 9 + embedding, position table, final norm.
    EXPECT_EQ(t5->weights().count(), 30u);
}

TEST(T5Plan, SegmentsEndAtEveryBlock) {
    // The memory system can run the encoder a block at a time: every leaf is
    // a weight or an input, and each block's weights fall in its segment.
    io::ModelFile weights = t5_weights();
    auto t5 = test::declare_network<models::T5Encoder>(weights, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    const int64_t n = 12, batch = 2;
    const std::vector<int32_t> ids(n * batch, 5), buckets = (*t5)->relative_buckets(n);
    const std::vector<float> mask(n * batch, 1.0f);
    runtime::GraphSession session;
    models::T5Options options;
    options.relative_buckets = session.input(GGML_TYPE_I32, {n, n}, buckets.data());
    options.key_mask = session.input(GGML_TYPE_F32, {n, batch}, mask.data());
    ggml_tensor* out = (*t5)->encode(session.ctx(), session.input(GGML_TYPE_I32, {n, batch}, ids.data()), options);
    const runtime::GraphPlan plan = runtime::build_graph_plan(session.graph(out), t5->weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    ASSERT_EQ(plan.segments.size(), 4u);
    const std::vector<size_t> weight_counts = {11, 9, 9, 1};  // + embedding and position table; final norm
    for (size_t i = 0; i < plan.segments.size(); ++i) {
        EXPECT_EQ(plan.segments[i].name, i < 3 ? "t5.blocks." + std::to_string(i) : std::string("output"));
        EXPECT_EQ(plan.segments[i].weights.size(), weight_counts[i]) << plan.segments[i].name;
    }
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

std::string replace(std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
}

// HF names to llama.cpp's (convert_hf_to_gguf.py's T5 encoder map).
std::string llama_cpp_name(const std::string& hf) {
    if (hf == "shared.weight") return "token_embd.weight";
    if (hf == "encoder.final_layer_norm.weight") return "enc.output_norm.weight";
    std::string s = replace(hf, "encoder.block.", "enc.blk.");
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {".layer.0.SelfAttention.relative_attention_bias.", ".attn_rel_b."},
             {".layer.0.SelfAttention.q.", ".attn_q."},
             {".layer.0.SelfAttention.k.", ".attn_k."},
             {".layer.0.SelfAttention.v.", ".attn_v."},
             {".layer.0.SelfAttention.o.", ".attn_o."},
             {".layer.0.layer_norm.", ".attn_norm."},
             {".layer.1.DenseReluDense.wi_0.", ".ffn_gate."},
             {".layer.1.DenseReluDense.wi_1.", ".ffn_up."},
             {".layer.1.DenseReluDense.wo.", ".ffn_down."},
             {".layer.1.layer_norm.", ".ffn_norm."}}) {
        if (s.find(from) != std::string::npos) return replace(s, from, to);
    }
    return s;
}

TEST(T5Naming, LlamaCppGgufAndPrefixedHfGiveTheSameOutput) {
    io::ModelFile weights = t5_weights(), io = t5_io();
    const FixtureTensor tokens = fixture_tensor(io, "t5.tokens");
    auto compute = test::golden_cpu();
    const std::vector<float> reference = encode(*load(weights, *compute), *compute, tokens).out;

    test::TempDir dir;
    // llama.cpp's names, as a GGUF written by kiln's converter.
    const std::string renamed_path =
        dir.write("t5_llama_names.safetensors", test::build_safetensors(renamed(weights, llama_cpp_name)));
    io::ModelFile llama_names = open_file(renamed_path);
    const std::string gguf_path = dir.file("t5_tiny.gguf");
    const Status written = io::write_gguf(llama_names, gguf_path, {});
    ASSERT_TRUE(written.ok()) << written.error().message;
    io::ModelFile gguf = open_file(gguf_path);
    ASSERT_EQ(gguf.sources()[0].format, io::FileFormat::Gguf);
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(gguf, ""));
    {
        auto t5 = load(gguf, *compute);
        EXPECT_EQ(t5->config().naming, models::T5Config::Naming::LlamaCpp);
        EXPECT_EQ(t5->config().d_kv, 12);
        EXPECT_EQ(t5->config().layers, 3);
        EXPECT_EQ(encode(*t5, *compute, tokens).out, reference);
    }

    // ComfyUI's all-in-one prefix, with the embedding as encoder.embed_tokens.
    const std::string prefix = "text_encoders.t5xxl.transformer.";
    const std::string comfy_path =
        dir.write("comfy.safetensors", test::build_safetensors(renamed(weights, [&](const std::string& name) {
                      return prefix + (name == "shared.weight" ? "encoder.embed_tokens.weight" : name);
                  })));
    io::ModelFile comfy = open_file(comfy_path);
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(comfy, prefix));
    EXPECT_FALSE(models::T5Encoder::looks_like_t5(comfy, ""));
    EXPECT_EQ(encode(*load(comfy, *compute, GGML_TYPE_F32, prefix), *compute, tokens).out, reference);
}

TEST(T5Errors, ClipFileNamesWhatIsMissing) {
    io::ModelFile clip = open_file(golden_path("models/sd1_tiny.safetensors"));
    EXPECT_FALSE(models::T5Encoder::looks_like_t5(clip, ""));
    EXPECT_FALSE(models::T5Encoder::looks_like_t5(clip, "cond_stage_model.transformer."));
    auto t5 = test::declare_network<models::T5Encoder>(clip, "cond_stage_model.transformer.", std::nullopt);
    ASSERT_FALSE(t5.ok());
    EXPECT_EQ(t5.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(t5.error().message,
              "no T5 encoder under 'cond_stage_model.transformer.' (no token embedding: shared.weight, "
              "encoder.embed_tokens.weight or token_embd.weight)");
}

TEST(T5Errors, VersionOneFeedForwardIsAnError) {
    // T5 v1.0: DenseReluDense.wi (ReLU) instead of wi_0 and wi_1.
    io::ModelFile weights = t5_weights();
    test::TempDir dir;
    const std::string path =
        dir.write("t5_v10.safetensors", test::build_safetensors(renamed(weights, [](const std::string& n) {
                      if (n.find(".DenseReluDense.wi_1.") != std::string::npos) return std::string();
                      return replace(n, ".DenseReluDense.wi_0.", ".DenseReluDense.wi.");
                  })));
    io::ModelFile v10 = open_file(path);
    auto t5 = test::declare_network<models::T5Encoder>(v10, "", std::nullopt);
    ASSERT_FALSE(t5.ok());
    EXPECT_EQ(t5.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(t5.error().message,
              "T5 encoder under '': encoder.block.0.layer.1.DenseReluDense.wi.weight is a T5 v1.0 (ReLU) "
              "feed-forward; only v1.1's gated-GELU one (wi_0, wi_1) is supported");

    // The same in llama.cpp's names: ffn_up without ffn_gate.
    const std::string gguf_names =
        dir.write("t5_v10_llama.safetensors", test::build_safetensors(renamed(weights, [](const std::string& n) {
                      if (n.find(".DenseReluDense.wi_0.") != std::string::npos) return std::string();
                      return llama_cpp_name(n);
                  })));
    io::ModelFile v10_llama = open_file(gguf_names);
    auto t5_llama = test::declare_network<models::T5Encoder>(v10_llama, "", std::nullopt);
    ASSERT_FALSE(t5_llama.ok());
    EXPECT_NE(t5_llama.error().message.find("enc.blk.0.ffn_up.weight without enc.blk.0.ffn_gate.weight is a T5 v1.0"),
              std::string::npos)
        << t5_llama.error().message;
}

TEST(T5Errors, MissingBlockTensorIsNamedAtLoad) {
    io::ModelFile weights = t5_weights();
    test::TempDir dir;
    const std::string missing = "encoder.block.1.layer.1.DenseReluDense.wo.weight";
    const std::string path =
        dir.write("t5_missing.safetensors", test::build_safetensors(renamed(weights, [&](const std::string& n) {
                      return n == missing ? std::string() : n;
                  })));
    io::ModelFile file = open_file(path);
    auto t5 = test::declare_network<models::T5Encoder>(file, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    auto compute = test::golden_cpu();
    const Status status = t5->weights().load(compute->weights_backend());
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.error().message.find(missing), std::string::npos) << status.error().message;
}

}  // namespace
}  // namespace kiln
