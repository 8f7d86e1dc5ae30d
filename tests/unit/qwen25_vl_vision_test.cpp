// Qwen2.5-VL's vision tower and the LLM's image prompt against the PyTorch
// reference (training/reference/qwen25_vl.py, written from HF transformers'
// modeling_qwen2_5_vl.py) on the fixtures of
// training/make_qwen25_vl_vision_fixtures.py: a tiny tower (width 32, 2
// heads, 4 blocks, full attention in blocks 1 and 3) in HF's names and in
// llama.cpp's mmproj names, on an image of 2 x 2 windows (partial ones at the
// edges) and on one smaller than a window; the window order and the blocks'
// outputs; the configuration read from the weights and metadata; the tiny
// Qwen2 with image rows in its prompt and multimodal RoPE; and the files
// the tower refuses.
#include "models/nets/qwen25_vl_vision.h"

#include <gtest/gtest.h>

#include <array>
#include <map>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/llm_encoder.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "test_files.h"

namespace kiln {
namespace {

using models::QwenVisionEncoder;
using test::fixture_tensor;
using test::FixtureTensor;
using test::golden_path;
using test::relative_error;

// F32 weights; the reference runs in float64. The differences are float32
// rounding and ggml's rope angles.
constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

io::ModelFile io_file() { return open_file(golden_path("models/qwen25_vl_vision_tiny_io.safetensors")); }

// The fixture's normalised image [3, H, W] back in [0, 1], as the tower takes it.
std::vector<float> unit_image(const FixtureTensor& image) {
    std::vector<float> out(image.values.size());
    const size_t plane = static_cast<size_t>(image.shape[1] * image.shape[2]);
    for (size_t i = 0; i < out.size(); ++i) {
        const size_t ch = i / plane;
        out[i] = image.values[i] * models::kQwenVisionStd[ch] + models::kQwenVisionMean[ch];
    }
    return out;
}

struct Encoded {
    std::vector<float> out;
    std::vector<int64_t> ne;
    std::map<int, std::vector<float>> blocks;
};

Encoded encode(const QwenVisionEncoder& tower, runtime::Compute& compute, const FixtureTensor& image) {
    const std::vector<float> pixels = unit_image(image);
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::VisionEncodeShape shape;
    shape.width = image.shape[2];
    shape.height = image.shape[1];
    shape.image = pixels.data();
    const models::VisionEncoderTensors t = tower.build(inputs, shape);
    const Status status = session.run(compute, t.out, /*keep_cuts=*/true);
    EXPECT_TRUE(status.ok()) << status.error().message;
    Encoded e;
    if (!status.ok()) return e;
    e.out = runtime::GraphSession::read(t.out);
    e.ne = {t.out->ne[0], t.out->ne[1]};
    for (int i = 0; i < tower.config().blocks; ++i) {
        if (ggml_tensor* cut = session.find("cut:visual.blocks." + std::to_string(i)))
            e.blocks[i] = runtime::GraphSession::read(cut);
    }
    return e;
}

test::DeclaredNetwork<QwenVisionEncoder> load(const io::ModelFile& file, const std::string& prefix,
                                              runtime::Compute& compute) {
    auto tower = test::declare_network<QwenVisionEncoder>(file, prefix, GGML_TYPE_F32);
    if (!tower.ok()) throw std::runtime_error(tower.error().message);
    const Status status = tower->weights().load(compute.weights_backend());
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return std::move(tower).value();
}

void expect_matches_reference(const QwenVisionEncoder& tower, runtime::Compute& compute, const char* label) {
    const io::ModelFile io = io_file();
    const Encoded big = encode(tower, compute, fixture_tensor(io, "image"));
    EXPECT_EQ(big.ne, (std::vector<int64_t>{24, 48}));
    const double error = relative_error(big.out, fixture_tensor(io, "embeds").values);
    EXPECT_LT(error, kTolerance) << label;
    // Blocks 0 (windows) and 1 (whole image), in the window order.
    for (int i : {0, 1}) {
        ASSERT_TRUE(big.blocks.count(i)) << label << ": no cut after block " << i;
        EXPECT_LT(relative_error(big.blocks.at(i), fixture_tensor(io, "block." + std::to_string(i)).values), kTolerance)
            << label << ": block " << i;
    }
    const Encoded small = encode(tower, compute, fixture_tensor(io, "image_small"));
    EXPECT_EQ(small.ne, (std::vector<int64_t>{24, 6}));
    const double small_error = relative_error(small.out, fixture_tensor(io, "embeds_small").values);
    EXPECT_LT(small_error, kTolerance) << label;
    std::printf("%s: relative error %.2e (168x224), %.2e (56x84)\n", label, error, small_error);
}

TEST(QwenVision, HuggingFaceNamesMatchTheReference) {
    const io::ModelFile file = open_file(golden_path("models/qwen25_vl_vision_tiny.safetensors"));
    auto compute = test::golden_cpu();
    const auto tower = load(file, "visual.", *compute);
    const models::QwenVisionConfig& c = tower->config();
    EXPECT_EQ(c.naming, models::QwenVisionConfig::Naming::HuggingFace);
    EXPECT_EQ(c.width, 32);
    EXPECT_EQ(c.heads, 2);  // clip.vision.attention.head_count
    EXPECT_EQ(c.blocks, 4);
    EXPECT_EQ(c.mlp, 48);
    EXPECT_EQ(c.out_width, 24);
    EXPECT_EQ(c.patch, 14);
    EXPECT_EQ(c.merge, 2);
    EXPECT_EQ(c.window, 112);
    EXPECT_FALSE(c.full_attention(0));
    EXPECT_TRUE(c.full_attention(1));  // n_wa_pattern 2
    EXPECT_FALSE(c.full_attention(2));
    EXPECT_TRUE(c.full_attention(3));
    EXPECT_EQ(tower->tokens(224, 168), 48);
    expect_matches_reference(*tower, *compute, "vision tower, HF names");
}

// The window blocks attend within each window (a batch per window size:
// whole windows of 64 patches and the bottom edge's of 32 here), so only the
// full-attention blocks make scores over all 192 patches.
TEST(QwenVision, WindowBlocksMakeNoScoresAcrossWindows) {
    const io::ModelFile file = open_file(golden_path("models/qwen25_vl_vision_tiny.safetensors"));
    auto compute = test::golden_cpu();
    const auto tower = load(file, "visual.", *compute);
    const std::vector<float> pixels(static_cast<size_t>(3 * 168 * 224), 0.5f);
    runtime::GraphSession session;
    test::SessionInputs inputs(session);
    models::VisionEncodeShape shape;
    shape.width = 224;
    shape.height = 168;
    shape.image = pixels.data();
    const models::VisionEncoderTensors t = tower->build(inputs, shape);
    ggml_cgraph* graph = ggml_new_graph_custom(session.ctx(), 8192, false);
    ggml_build_forward_expand(graph, t.out);
    std::map<int64_t, int> softmaxes;  // keys -> softmax nodes
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        if (node->op == GGML_OP_SOFT_MAX) softmaxes[node->ne[0]] += 1;
    }
    EXPECT_EQ(softmaxes, (std::map<int64_t, int>{{32, 2}, {64, 2}, {192, 2}}));
}

TEST(QwenVision, LlamaCppMmprojMatchesTheReference) {
    const io::ModelFile file = open_file(golden_path("models/qwen25_vl_vision_tiny_mmproj.gguf"));
    auto compute = test::golden_cpu();
    const auto tower = load(file, "", *compute);
    EXPECT_EQ(tower->config().naming, models::QwenVisionConfig::Naming::LlamaCpp);
    EXPECT_EQ(tower->config().heads, 2);
    EXPECT_TRUE(tower->config().full_attention(1));
    expect_matches_reference(*tower, *compute, "vision tower, mmproj GGUF");
}

TEST(QwenVision, WindowOrderIsTheReferences) {
    const FixtureTensor expected = fixture_tensor(io_file(), "window_index");
    const models::QwenVisionWindows w = models::qwen_vision_windows(6, 8, 4);
    ASSERT_EQ(w.unit_order.size(), expected.values.size());
    for (size_t i = 0; i < w.unit_order.size(); ++i) EXPECT_EQ(w.unit_order[i], expected.values[i]) << i;
    EXPECT_EQ(w.window_units, (std::vector<int64_t>{16, 16, 8, 8}));
    for (size_t u = 0; u < w.unit_place.size(); ++u)
        EXPECT_EQ(w.unit_order[static_cast<size_t>(w.unit_place[u])], static_cast<int32_t>(u));
}

// The tiny Qwen2 (training/make_qwen3_fixtures.py) with 6 image rows (a grid
// of 2 x 3) in place of tokens 5..10: multimodal RoPE and the rows scattered
// in, against HF's get_rope_index and forward.
TEST(QwenVision, LlmTakesImageRowsWithMultimodalRope) {
    const io::ModelFile io = io_file();
    const std::vector<models::TokenGrid> grids = {{5, 2, 3}};
    const FixtureTensor positions = fixture_tensor(io, "llm.positions");
    const std::vector<int32_t> got = models::llm_multimodal_positions(20, grids);
    for (size_t i = 0; i < 60; ++i) EXPECT_EQ(got[i], positions.values[i]) << "position " << i;

    const io::ModelFile file = open_file(golden_path("models/qwen2_tiny.safetensors"));
    auto compute = test::golden_cpu();
    auto llm = test::declare_network<models::LlmEncoder>(file, "", GGML_TYPE_F32);
    ASSERT_TRUE(llm.ok()) << llm.error().message;
    EXPECT_EQ((*llm)->config().rope_sections, (std::array<int, 3>{4, 6, 6}));
    ASSERT_TRUE(llm->weights().load(compute->weights_backend()).ok());
    const FixtureTensor ids = fixture_tensor(io, "llm.ids");
    const std::vector<int32_t> tokens(ids.values.begin(), ids.values.end());
    const FixtureTensor rows = fixture_tensor(io, "llm.image_embeds");
    auto run = [&](const std::vector<models::TokenGrid>& image_grids) {
        runtime::GraphSession session;
        test::SessionInputs inputs(session);
        models::TextEncodeShape shape;
        shape.length = 20;
        shape.final_norm = true;
        shape.extra_embeddings = rows.values.data();
        shape.extra_rows = 6;
        shape.image_grids = image_grids;
        const models::TextEncoderTensors t = (*llm)->build(inputs, shape);
        session.set_input(t.tokens, tokens.data());
        EXPECT_TRUE(session.run(*compute, t.out).ok());
        return runtime::GraphSession::read(t.out);
    };
    const double error = relative_error(run(grids), fixture_tensor(io, "llm.hidden").values);
    EXPECT_LT(error, kTolerance);
    // The same rows as six grids of one token: 1-D positions, the reference's plain rope.
    std::vector<models::TokenGrid> singles;
    for (int64_t t = 5; t < 11; ++t) singles.push_back({t, 1, 1});
    const double plain = relative_error(run(singles), fixture_tensor(io, "llm.hidden_text_rope").values);
    EXPECT_LT(plain, kTolerance);
    EXPECT_GT(relative_error(run(grids), fixture_tensor(io, "llm.hidden_text_rope").values), 1e-3);
    std::printf("Qwen2 with image rows: relative error %.2e (multimodal RoPE), %.2e (1-D)\n", error, plain);
}

// A tower's file with one tensor renamed (or dropped: `to` empty).
io::ModelFile edited_tower(const test::TempDir& dir, const std::string& from, const std::string& to) {
    const io::ModelFile file = open_file(golden_path("models/qwen25_vl_vision_tiny.safetensors"));
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        if (t.name == from && to.empty()) continue;
        entries.push_back(test::copy_entry(file, t, t.name == from ? to : t.name));
    }
    const std::string name = (to.empty() ? "without" : "renamed") + std::to_string(entries.size()) + ".safetensors";
    return open_file(dir.write(name, test::build_safetensors(entries, {{"clip.vision.attention.head_count", "2"}})));
}

TEST(QwenVision, RefusesWhatItDoesNotRead) {
    test::TempDir dir;
    auto expect_error = [](const io::ModelFile& file, const std::string& part) {
        auto tower = test::declare_network<QwenVisionEncoder>(file, "visual.", GGML_TYPE_F32);
        ASSERT_FALSE(tower.ok());
        EXPECT_NE(tower.error().message.find(part), std::string::npos) << tower.error().message;
    };
    // Qwen2-VL's tower: fc1 / fc2 with quick GELU, no gated MLP.
    expect_error(edited_tower(dir, "visual.blocks.0.mlp.gate_proj.weight", "visual.blocks.0.mlp.fc1.weight"),
                 "blocks.0.mlp.gate_proj.weight");
    expect_error(edited_tower(dir, "visual.merger.mlp.2.weight", ""), "merger.mlp.2.weight");
    expect_error(edited_tower(dir, "visual.patch_embed.proj.weight", "visual.patch.weight"),
                 "no Qwen2.5-VL vision tower");
}

}  // namespace
}  // namespace kiln
