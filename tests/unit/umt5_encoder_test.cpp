// kiln's T5 encoder reading umT5 (Wan's text encoder: a relative position
// table in every block) against the PyTorch reference transcribed from Wan's
// code (training/reference/umt5.py), on the tiny random-weight model
// training/make_umt5_fixtures.py writes: the output and every block, the key
// mask, each block really using its own table, the llama.cpp GGUF and Wan
// namings, and the refusal of a file with tables in some blocks only.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <regex>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/t5_encoder.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::FixtureTensor;
using test::golden_path;
using test::relative_error;

// F16 weights widened to F32 against the reference's float64 on the same
// values: float32 rounding and summation order (t5_encoder_test's bound).
constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

io::ModelFile umt5_weights() { return open_file(golden_path("models/umt5_tiny.safetensors")); }
io::ModelFile umt5_gguf() { return open_file(golden_path("models/umt5_tiny.gguf")); }
io::ModelFile umt5_io() { return open_file(golden_path("models/umt5_tiny_io.safetensors")); }

test::DeclaredNetwork<models::T5Encoder> load(const io::ModelFile& file, runtime::Compute& compute) {
    auto t5 = test::declare_network<models::T5Encoder>(file, "", GGML_TYPE_F32);
    if (!t5.ok()) throw std::runtime_error(t5.error().message);
    const Status status = t5->weights().load(compute.weights_backend());
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return std::move(t5).value();
}

struct Encoded {
    std::vector<float> out;
    std::vector<std::vector<float>> blocks;  // the "t5.blocks.<i>" cuts
};

// The fixture's tokens through build(), as the pipeline runs a text encoder,
// with the fixture's key mask when `masked`.
Encoded encode(const models::T5Encoder& t5, runtime::Compute& compute, const io::ModelFile& io, bool masked = false) {
    const FixtureTensor tokens = fixture_tensor(io, "umt5.tokens");
    const FixtureTensor mask = fixture_tensor(io, "umt5.key_mask");
    const std::vector<int32_t> ids(tokens.values.begin(), tokens.values.end());
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::TextEncodeShape shape;
    shape.batch = tokens.shape[0];
    shape.length = tokens.shape[1];
    if (masked) shape.key_mask = mask.values.data();
    const models::TextEncoderTensors g = t5.build(inputs, shape);
    session.set_input(g.tokens, ids.data());
    Encoded result;
    const Status status = session.run(compute, g.out, /*keep_cuts=*/true);
    EXPECT_TRUE(status.ok()) << status.error().message;
    if (!status.ok()) return result;
    result.out = runtime::GraphSession::read(g.out);
    for (int64_t i = 0; i < t5.config().layers; ++i) {
        ggml_tensor* cut = session.find("cut:t5.blocks." + std::to_string(i));
        EXPECT_NE(cut, nullptr) << i;
        if (cut) result.blocks.push_back(runtime::GraphSession::read(cut));
    }
    return result;
}

// `file`'s tensors renamed by `rename` ("" drops one), as a safetensors file in `dir`.
io::ModelFile rewritten(const io::ModelFile& file, const test::TempDir& dir, const std::string& name,
                        const std::function<std::string(const std::string&)>& rename) {
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        const std::string new_name = rename(t.name);
        if (!new_name.empty()) entries.push_back(test::copy_entry(file, t, new_name));
    }
    return open_file(dir.write(name, test::build_safetensors(entries)));
}

// HF's UMT5EncoderModel names to Wan's module tree (wan/modules/t5.py, as in
// models_t5_umt5-xxl-enc-bf16.pth).
std::string wan_name(const std::string& hf) {
    if (hf == "shared.weight") return "token_embedding.weight";
    if (hf == "encoder.final_layer_norm.weight") return "norm.weight";
    static const std::vector<std::pair<std::string, std::string>> parts = {
        {"layer.0.SelfAttention.relative_attention_bias", "pos_embedding.embedding"},
        {"layer.0.SelfAttention.q", "attn.q"},
        {"layer.0.SelfAttention.k", "attn.k"},
        {"layer.0.SelfAttention.v", "attn.v"},
        {"layer.0.SelfAttention.o", "attn.o"},
        {"layer.0.layer_norm", "norm1"},
        {"layer.1.DenseReluDense.wi_0", "ffn.gate.0"},
        {"layer.1.DenseReluDense.wi_1", "ffn.fc1"},
        {"layer.1.DenseReluDense.wo", "ffn.fc2"},
        {"layer.1.layer_norm", "norm2"},
    };
    std::smatch m;
    static const std::regex block(R"(encoder\.block\.(\d+)\.(.+)\.weight)");
    if (!std::regex_match(hf, m, block)) return "";
    for (const auto& [from, to] : parts) {
        if (m[2] == from) return "blocks." + m[1].str() + "." + to + ".weight";
    }
    return "";
}

bool is_table(const std::string& name) {
    return name.find("relative_attention_bias") != std::string::npos || name.find("attn_rel_b") != std::string::npos;
}

TEST(Umt5Config, EveryBlockHasItsOwnTable) {
    io::ModelFile weights = umt5_weights();
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(weights, ""));
    auto t5 = test::declare_network<models::T5Encoder>(weights, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    const models::T5Config& c = (*t5)->config();
    EXPECT_EQ(c.naming, models::T5Config::Naming::HuggingFace);
    EXPECT_TRUE(c.per_block_position_bias);
    EXPECT_EQ((*t5)->label(), "umT5");
    EXPECT_EQ(c.vocab, 300);
    EXPECT_EQ(c.d_model, 32);
    EXPECT_EQ(c.d_kv, 8);
    EXPECT_EQ(c.heads, 4);
    EXPECT_EQ(c.d_ff, 48);
    EXPECT_EQ(c.layers, 3);
    EXPECT_EQ(c.buckets, 32);
    // 3 blocks x (9 + their table) + embedding and final norm.
    EXPECT_EQ(t5->weights().count(), 32u);
}

TEST(Umt5Golden, OutputAndEveryBlockMatchReference) {
    io::ModelFile weights = umt5_weights(), io = umt5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute);
    const Encoded got = encode(*t5, *compute, io);
    const double error = relative_error(got.out, fixture_tensor(io, "umt5.out").values);
    EXPECT_LT(error, kTolerance);
    std::printf("umt5.out relative error %.2e\n", error);
    ASSERT_EQ(got.blocks.size(), 3u);
    for (size_t i = 0; i < got.blocks.size(); ++i) {
        EXPECT_LT(relative_error(got.blocks[i], fixture_tensor(io, "umt5.block." + std::to_string(i)).values),
                  kTolerance)
            << "block " << i;
    }
}

TEST(Umt5Golden, KeyMaskMatchesReference) {
    io::ModelFile weights = umt5_weights(), io = umt5_io();
    auto compute = test::golden_cpu();
    auto t5 = load(weights, *compute);
    const std::vector<float> got = encode(*t5, *compute, io, /*masked=*/true).out;
    const std::vector<float> expected = fixture_tensor(io, "umt5.out_masked").values;
    EXPECT_LT(relative_error(got, expected), kTolerance);
    // The second prompt is padded: the mask must have changed it.
    const std::vector<float> unmasked = fixture_tensor(io, "umt5.out").values;
    const size_t half = expected.size() / 2;
    EXPECT_GT(relative_error(std::vector<float>(got.begin() + half, got.end()),
                             std::vector<float>(unmasked.begin() + half, unmasked.end())),
              100 * kTolerance);
}

// The reference's output with block 0's table in every block (what T5's
// sharing computes) is far from umT5's, so an encoder that read block 0's
// table alone would fail here; and kiln's T5 reading of the same file
// without the other blocks' tables is exactly that output.
TEST(Umt5Golden, EachBlockAddsItsOwnTable) {
    io::ModelFile weights = umt5_weights(), io = umt5_io();
    auto compute = test::golden_cpu();
    const std::vector<float> block0_everywhere = fixture_tensor(io, "umt5.out_block0_table").values;
    const std::vector<float> umt5 = encode(*load(weights, *compute), *compute, io).out;
    EXPECT_GT(relative_error(umt5, block0_everywhere), 100 * kTolerance);

    test::TempDir dir;
    io::ModelFile t5_file = rewritten(weights, dir, "t5_like.safetensors", [](const std::string& n) {
        return is_table(n) && n.rfind("encoder.block.0.", 0) != 0 ? std::string() : n;
    });
    auto t5 = load(t5_file, *compute);
    EXPECT_FALSE(t5->config().per_block_position_bias);
    EXPECT_EQ(t5->label(), "T5");
    EXPECT_LT(relative_error(encode(*t5, *compute, io).out, block0_everywhere), kTolerance);
}

TEST(Umt5Plan, EachBlockSegmentHoldsItsOwnTable) {
    io::ModelFile weights = umt5_weights();
    auto t5 = test::declare_network<models::T5Encoder>(weights, "", std::nullopt);
    ASSERT_TRUE(t5.ok()) << t5.error().message;
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::TextEncodeShape shape;
    shape.length = 12;
    shape.batch = 2;
    const std::vector<float> mask(24, 1.0f);
    shape.key_mask = mask.data();
    const models::TextEncoderTensors g = (*t5)->build(inputs, shape);
    const runtime::GraphPlan plan = runtime::build_graph_plan(session.graph(g.out), t5->weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    ASSERT_EQ(plan.segments.size(), 4u);
    const std::vector<size_t> weight_counts = {11, 10, 10, 1};  // 9 + the block's table (+ embedding); final norm
    for (size_t i = 0; i < plan.segments.size(); ++i) {
        EXPECT_EQ(plan.segments[i].weights.size(), weight_counts[i]) << plan.segments[i].name;
    }
}

// city96's umt5-xxl-encoder GGUFs use llama.cpp's names; the fixture's were
// written by the Python generator's own name map.
TEST(Umt5Naming, LlamaCppGgufGivesTheSameOutput) {
    io::ModelFile weights = umt5_weights(), gguf = umt5_gguf(), io = umt5_io();
    ASSERT_EQ(gguf.sources()[0].format, io::FileFormat::Gguf);
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(gguf, ""));
    auto compute = test::golden_cpu();
    auto t5 = load(gguf, *compute);
    EXPECT_EQ(t5->config().naming, models::T5Config::Naming::LlamaCpp);
    EXPECT_TRUE(t5->config().per_block_position_bias);
    EXPECT_EQ(t5->label(), "umT5");
    const std::vector<float> got = encode(*t5, *compute, io).out;
    EXPECT_EQ(got, encode(*load(weights, *compute), *compute, io).out);
    EXPECT_LT(relative_error(got, fixture_tensor(io, "umt5.out").values), kTolerance);
}

TEST(Umt5Naming, WanOriginalNamesGiveTheSameOutput) {
    io::ModelFile weights = umt5_weights(), io = umt5_io();
    test::TempDir dir;
    io::ModelFile wan = rewritten(weights, dir, "umt5_wan.safetensors", wan_name);
    ASSERT_EQ(wan.tensors().size(), weights.tensors().size());
    EXPECT_TRUE(models::T5Encoder::looks_like_t5(wan, ""));
    auto compute = test::golden_cpu();
    auto t5 = load(wan, *compute);
    EXPECT_EQ(t5->config().naming, models::T5Config::Naming::Wan);
    EXPECT_EQ(t5->label(), "umT5");
    EXPECT_EQ(encode(*t5, *compute, io).out, encode(*load(weights, *compute), *compute, io).out);

    // Wan's embedding name is OpenCLIP's too: without block 0's table beside
    // it, it is no T5, and the error names the namings looked for.
    io::ModelFile no_tables = rewritten(wan, dir, "no_tables.safetensors", [](const std::string& n) {
        return n.find("pos_embedding") != std::string::npos ? std::string() : n;
    });
    EXPECT_FALSE(models::T5Encoder::looks_like_t5(no_tables, ""));
    auto refused = test::declare_network<models::T5Encoder>(no_tables, "", std::nullopt);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("no T5 encoder under ''"), std::string::npos) << refused.error().message;
}

TEST(Umt5Errors, TablesInSomeBlocksOnlyAreRefusedNamingTheBlock) {
    io::ModelFile weights = umt5_weights();
    test::TempDir dir;
    io::ModelFile hf = rewritten(weights, dir, "mixed.safetensors", [](const std::string& n) {
        return n == "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" ? std::string() : n;
    });
    auto t5 = test::declare_network<models::T5Encoder>(hf, "", std::nullopt);
    ASSERT_FALSE(t5.ok());
    EXPECT_EQ(t5.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(t5.error().message,
              "T5 encoder under '': block 1 has no relative position table "
              "(encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight) but blocks 0 and 2 have "
              "their own: umT5 has one in every block, T5 in block 0 alone");

    // The same in llama.cpp's names, the last block's table missing.
    io::ModelFile gguf = umt5_gguf();
    io::ModelFile llama = rewritten(gguf, dir, "mixed_llama.safetensors", [](const std::string& n) {
        return n == "enc.blk.2.attn_rel_b.weight" ? std::string() : n;
    });
    auto t5_llama = test::declare_network<models::T5Encoder>(llama, "", std::nullopt);
    ASSERT_FALSE(t5_llama.ok());
    EXPECT_EQ(t5_llama.error().message,
              "T5 encoder under '': block 2 has no relative position table (enc.blk.2.attn_rel_b.weight) but "
              "blocks 0 and 1 have their own: umT5 has one in every block, T5 in block 0 alone");
}

}  // namespace
}  // namespace kiln
