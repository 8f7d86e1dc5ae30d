// Wan's text-to-video DiT against the PyTorch reference (training/reference/
// wan_dit.py, transcribed from Wan's wan/modules/model.py), on the tiny
// random-weight model training/make_wan_dit_fixtures.py writes with the
// original tensor names: block by block on a clip of 2 latent frames of 2 x 3
// patches, a batch of two timesteps and two prompts of different lengths (the
// shorter padded with zero rows); on one frame (text-to-image); with flash
// attention; its RoPE table; a block-level cache's stages through the
// network's own inputs. Also the config read from the weights (the tiny model
// and declared-only files of the released widths), the segments the memory
// system sees, the registry's marker, and the errors for image-to-video
// files, conditioning, inputs and files that do not fit.
#include "models/nets/wan_dit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "declared_network.h"
#include "golden.h"
#include "io/gguf_writer.h"
#include "models/nets/registry.h"
#include "random_model.h"
#include "runtime/device_budget.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "test_files.h"

namespace kiln {
namespace {

// F32 weights against a float64 reference: float32 rounding and summation
// order (the timestep embedding and the RoPE angles are float32 here).
constexpr double kTolerance = 1e-4;
// ggml's CPU flash kernel rounds Q, K and V to F16 and sums the values in
// F16; Wan's q and k, RMS-normed over the width, make scores of several units
// that the softmax magnifies this rounding in (about 7e-3 after two blocks).
constexpr double kFlashTolerance = 1e-2;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// The tiny model's tensors as build_safetensors entries.
std::vector<test::SafetensorsEntry> entries_of(const io::ModelFile& file) {
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        const uint8_t* data = file.data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    return entries;
}
const std::vector<std::pair<std::string, std::string>> kHeads = {{"kiln.wan.heads", "3"}};

// A released configuration's tensors as a random_model spec (the names of
// training/reference/wan_dit.py's wan_dit_tensor_shapes), under `prefix`.
std::string wan_spec(const std::string& prefix, int64_t in, int64_t dim, int64_t ffn, int64_t out, int layers) {
    std::ostringstream s;
    auto tensor = [&](const std::string& name, std::vector<int64_t> shape) {
        s << prefix << name << " BF16";
        for (int64_t d : shape) s << ' ' << d;
        s << '\n';
    };
    auto linear = [&](const std::string& name, int64_t n_in, int64_t n_out) {
        tensor(name + ".weight", {n_out, n_in});
        tensor(name + ".bias", {n_out});
    };
    tensor("patch_embedding.weight", {dim, in, 1, 2, 2});
    tensor("patch_embedding.bias", {dim});
    linear("text_embedding.0", 4096, dim);
    linear("text_embedding.2", dim, dim);
    linear("time_embedding.0", 256, dim);
    linear("time_embedding.2", dim, dim);
    linear("time_projection.1", dim, 6 * dim);
    for (int i = 0; i < layers; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        tensor(b + "modulation", {1, 6, dim});
        for (const char* attn : {"self_attn.", "cross_attn."}) {
            for (const char* proj : {"q", "k", "v", "o"}) linear(b + attn + proj, dim, dim);
            tensor(b + attn + "norm_q.weight", {dim});
            tensor(b + attn + "norm_k.weight", {dim});
        }
        tensor(b + "norm3.weight", {dim});
        tensor(b + "norm3.bias", {dim});
        linear(b + "ffn.0", dim, ffn);
        linear(b + "ffn.2", ffn, dim);
    }
    linear("head.head", dim, 4 * out);
    tensor("head.modulation", {1, 2, dim});
    return s.str();
}

// Whether one of the entry's markers ends a tensor name of `file` (as the
// pipeline's prefix search matches them).
bool marked(const io::ModelFile& file, const models::NetworkEntry& e) {
    for (const std::string& probe : e.probes)
        for (const io::TensorInfo& t : file.tensors())
            if (t.name.size() >= probe.size() && t.name.compare(t.name.size() - probe.size(), probe.size(), probe) == 0)
                return true;
    return false;
}

struct WanDitTiny : ::testing::Test {
    io::ModelFile weights = open_file("wan_dit_tiny.safetensors");
    io::ModelFile io = open_file("wan_dit_tiny_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::WanDit> dit() {
        auto d = test::declare_network<models::WanDit>(weights, "", GGML_TYPE_F32);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name) {
        const auto v = test::fixture_tensor(io, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    // The fixture's inputs `<prefix>x` ... as the network takes them, the RoPE table made by kiln.
    models::WanDitInputs inputs(const models::WanDit& d, runtime::GraphSession& session, const std::string& prefix) {
        const models::WanDitConfig& c = d.config();
        models::WanDitInputs in;
        in.x = input(session, prefix + "x");
        in.timesteps = input(session, prefix + "timesteps");
        in.context = input(session, prefix + "context");
        const models::WanGrid grid{in.x->ne[2] / c.in_channels, in.x->ne[1] / c.patch, in.x->ne[0] / c.patch};
        const auto rope = models::wan_rope_table(c, grid);
        in.rope = session.input(GGML_TYPE_F32, models::wan_rope_shape(c, grid), rope.data());
        return in;
    }

    // Runs the case; checks `<prefix>out` and every `<prefix>block.<cut>`;
    // returns the number of blocks compared.
    int expect_matches(const std::string& prefix, bool flash, double tolerance) {
        auto d = dit();
        runtime::GraphSession session;
        models::WanDitBuildOptions options;
        options.flash_attention = flash;
        auto out = d->build(session.ctx(), inputs(*d, session, prefix), options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        const auto want = test::fixture_tensor(io, prefix + "out");
        EXPECT_EQ(test::ggml_ne(want.shape), std::vector<int64_t>((*out)->ne, (*out)->ne + want.shape.size()));
        EXPECT_LT(test::relative_error(runtime::GraphSession::read(*out), want.values), tolerance) << prefix << "out";
        int blocks = 0;
        const std::string block_prefix = prefix + "block.";
        for (const io::TensorInfo& ref : io.tensors()) {
            if (ref.name.rfind(block_prefix, 0) != 0) continue;
            const std::string block = ref.name.substr(block_prefix.size());
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                      tolerance)
                << prefix << block;
            ++blocks;
        }
        return blocks;
    }

    io::ModelFile write(const test::TempDir& dir, const std::string& name,
                        const std::vector<test::SafetensorsEntry>& entries,
                        const std::vector<std::pair<std::string, std::string>>& metadata = kHeads) {
        auto file = io::ModelFile::open({dir.write(name, test::build_safetensors(entries, metadata))});
        if (!file.ok()) throw std::runtime_error(file.error().message);
        return std::move(file).value();
    }
};

TEST_F(WanDitTiny, ConfigIsReadFromTheWeights) {
    auto d = test::declare_network<models::WanDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_TRUE(d->weights().declaration_status().ok());
    const models::WanDitConfig& c = (*d)->config();
    EXPECT_EQ(c.in_channels, 4);
    EXPECT_EQ(c.out_channels, 4);
    EXPECT_EQ(c.patch, 2);
    EXPECT_EQ(c.dim, 48);
    EXPECT_EQ(c.heads, 3);
    EXPECT_EQ(c.head_dim(), 16);
    EXPECT_EQ(c.rope_axes(), (std::vector<int>{8, 4, 4}));
    EXPECT_EQ(c.ffn_dim, 128);
    EXPECT_EQ(c.text_dim, 32);
    EXPECT_EQ(c.freq_dim, 256);
    EXPECT_EQ(c.layers, 2);
    const models::DiffusionCapabilities& can = (*d)->capabilities();
    EXPECT_STREQ(can.label, "Wan DiT");
    EXPECT_TRUE(can.video);
    EXPECT_EQ(can.in_channels, 4);
    EXPECT_EQ(can.out_channels, 4);
    EXPECT_EQ(can.context_width, 32);
    EXPECT_EQ(can.vector_width, 0);
    EXPECT_EQ(can.size_stride, 2);
    EXPECT_EQ(can.max_latent_side, 2048);
    EXPECT_EQ(can.cache_blocks, 2);
    // The 512-row padding is attended: contexts of different lengths run apart.
    EXPECT_TRUE(can.joint_attention);
    EXPECT_FALSE(can.guidance || can.skip_layers || can.text_mask || can.reference_images || can.control_residuals);
    EXPECT_TRUE((*d)->takes_lora());
}

// Declared-only files (names and shapes, no data) of the released widths:
// Wan 2.1 T2V-1.3B as ComfyUI prefixes it, and Wan 2.2 TI2V-5B's 48 channels.
TEST_F(WanDitTiny, ReleasedWidthsAreReadFromTheirNames) {
    test::TempDir dir;
    struct Case {
        const char* prefix;
        int64_t channels, dim, heads, ffn;
        int layers;
    };
    for (const Case& k : {Case{"model.diffusion_model.", 16, 1536, 12, 8960, 30}, Case{"", 48, 3072, 24, 14336, 30}}) {
        const std::string spec =
            dir.write("wan.spec", wan_spec(k.prefix, k.channels, k.dim, k.ffn, k.channels, k.layers));
        const std::string path = dir.file("wan_" + std::to_string(k.dim) + ".safetensors");
        ASSERT_TRUE(test::write_sparse_model(spec, path).ok());
        auto file = io::ModelFile::open({path});
        ASSERT_TRUE(file.ok()) << file.error().message;
        const models::NetworkEntry& entry = models::network_entry(models::NetworkKind::WanDit);
        EXPECT_TRUE(marked(*file, entry));
        auto d = test::declare_network<models::WanDit>(*file, k.prefix, std::nullopt);
        ASSERT_TRUE(d.ok()) << d.error().message;
        EXPECT_TRUE(d->weights().declaration_status().ok()) << d->weights().declaration_status().error().message;
        const models::WanDitConfig& c = (*d)->config();
        EXPECT_EQ(c.dim, k.dim);
        EXPECT_EQ(c.heads, k.heads);
        EXPECT_EQ(c.head_dim(), 128);
        EXPECT_EQ(c.rope_axes(), (std::vector<int>{44, 42, 42}));
        EXPECT_EQ(c.ffn_dim, k.ffn);
        EXPECT_EQ(c.layers, k.layers);
        EXPECT_EQ(c.in_channels, k.channels);
        EXPECT_EQ(c.out_channels, k.channels);
        EXPECT_EQ(c.text_dim, 4096);
        EXPECT_EQ(c.freq_dim, 256);
        EXPECT_EQ(c.patch, 2);
    }
}

// The table against the reference's factor of every pair, for the 2 x 2 x 3
// grid in (frame, row, column) order.
TEST_F(WanDitTiny, RopeTableIsTheOriginals) {
    auto d = test::declare_network<models::WanDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const auto cos = test::fixture_tensor(io, "rope.cos");
    const auto sin = test::fixture_tensor(io, "rope.sin");
    const auto table = models::wan_rope_table((*d)->config(), {2, 2, 3});
    const int64_t D = (*d)->config().head_dim(), n = cos.shape[0];
    ASSERT_EQ(n, 12);
    ASSERT_EQ(table.size(), static_cast<size_t>(2 * D * n));
    double worst = 0;
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < D / 2; ++j) {
            const size_t at = static_cast<size_t>(t * D + 2 * j), ref = static_cast<size_t>(t * D / 2 + j);
            worst = std::max({worst, std::fabs(double(table[at]) - cos.values[ref]),
                              std::fabs(double(table[at + 1]) - cos.values[ref]),
                              std::fabs(double(table[D * n + at]) + sin.values[ref]),
                              std::fabs(double(table[D * n + at + 1]) - sin.values[ref])});
        }
    }
    EXPECT_LT(worst, 1e-6);
}

// Two latent frames of 2 x 3 patches, a batch of two at sigma 0.875 and
// 0.3125, prompts of 5 and of 3 rows (then 2 zero rows).
TEST_F(WanDitTiny, ClipMatchesReferenceBlockByBlock) { EXPECT_EQ(expect_matches("", false, kTolerance), 2); }

// One frame of 2 x 3 patches (a 4 x 6 latent, taller than wide): text-to-image.
TEST_F(WanDitTiny, OneFrameMatchesReference) { EXPECT_EQ(expect_matches("image.", false, kTolerance), 2); }

// GGUF has no 5-D tensors in ggml's writer: kiln's folds the patch
// embedding's kernel to 4-D and records its shape as ComfyUI-GGUF does
// (comfy.gguf.orig_shape.*), and reads it back 5-D, as it reads city96's
// rank-5 tensors (GgufFile tests).
TEST_F(WanDitTiny, GgufWrittenByKilnGivesTheReference) {
    test::TempDir dir;
    const std::string path = dir.file("wan.gguf");
    ASSERT_TRUE(io::write_gguf(weights, path, {}).ok());
    auto gguf = io::ModelFile::open({path});
    ASSERT_TRUE(gguf.ok()) << gguf.error().message;
    EXPECT_EQ(gguf->find("patch_embedding.weight")->shape, weights.find("patch_embedding.weight")->shape);
    EXPECT_EQ(gguf->metadata().count("comfy.gguf.orig_shape.patch_embedding.weight"), 1u);
    weights = std::move(gguf).value();
    EXPECT_EQ(expect_matches("", false, kTolerance), 2);
}

TEST_F(WanDitTiny, FlashAttentionMatchesReference) {
    EXPECT_EQ(expect_matches("", true, kFlashTolerance), 2);
    EXPECT_EQ(expect_matches("image.", true, kFlashTolerance), 2);
}

TEST_F(WanDitTiny, EachBlockIsASegmentWithItsOwnWeights) {
    auto d = dit();
    runtime::GraphSession session;
    auto out = d->build(session.ctx(), inputs(*d, session, ""), {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    ggml_cgraph* graph = session.graph(*out);
    const runtime::GraphPlan plan = runtime::build_graph_plan(graph, d.weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    std::vector<std::string> names;
    for (const runtime::PlanSegment& segment : plan.segments) names.push_back(segment.name);
    EXPECT_EQ(names, (std::vector<std::string>{"blocks.0", "blocks.1", "output"}));
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    size_t weights_used = 0;
    for (size_t k = 0; k < plan.segments.size(); ++k) {
        for (int leaf : plan.segments[k].weights) {
            const std::string name = ggml_get_name(leafs[static_cast<size_t>(leaf)]);
            ++weights_used;
            if (name.rfind("blocks.", 0) == 0) {
                EXPECT_EQ(name.substr(0, name.find('.', name.find('.') + 1)), plan.segments[k].name) << name;
            }
        }
    }
    EXPECT_EQ(weights_used, d.weights().count());
}

// The stages a block-level step cache builds, through the network's own
// inputs (DiffusionNetwork::build with shape.frames = 2): Whole is the
// reference's output, Front then Rest is the Whole evaluation exactly, and
// Cached on the stream and the middle residual Rest gave reproduces it.
TEST_F(WanDitTiny, NetworkInputsAndBlockStagesGiveTheReference) {
    auto d = dit();
    models::DiffusionShape shape{6, 4, 2, 5};
    shape.frames = 2;
    const int64_t tokens = 2 * 2 * 3;
    auto evaluate = [&](models::BlockStage stage, const std::vector<float>* stream,
                        const std::vector<float>* residual) {
        shape.split = {stage, 1, 0};
        runtime::DeviceLedger ledger(nullptr, std::nullopt);
        runtime::GraphSession session;
        test::SessionInputs inputs(session);
        auto t = d->build(inputs, shape);
        EXPECT_TRUE(t.ok()) << t.error().message;
        if (!t.ok()) return std::vector<float>{};
        auto set = [&](ggml_tensor* tensor, const std::vector<float>& values) {
            ASSERT_EQ(static_cast<int64_t>(values.size()), ggml_nelements(tensor));
            session.set_input(tensor, values.data());
        };
        EXPECT_EQ(std::vector<int64_t>(t->x->ne, t->x->ne + 4), (std::vector<int64_t>{6, 4, 8, 2}));
        set(t->x, test::fixture_tensor(io, "x").values);
        set(t->timesteps, test::fixture_tensor(io, "timesteps").values);
        set(t->context, test::fixture_tensor(io, "context").values);
        if (t->stream) set(t->stream, *stream);
        if (t->residual) set(t->residual, *residual);
        // Every input placed, as the pipeline's executor places them: a
        // stage leaves some out of its graph (Rest and Cached the latent's).
        Status ran = session.bind_inputs(compute->buffer_type(), ledger);
        if (ran.ok()) ran = session.run(*compute, t->out);
        EXPECT_TRUE(ran.ok()) << ran.error().message;
        return ran.ok() ? runtime::GraphSession::read(t->out) : std::vector<float>{};
    };
    const std::vector<float> whole = evaluate(models::BlockStage::Whole, nullptr, nullptr);
    EXPECT_LT(test::relative_error(whole, test::fixture_tensor(io, "out").values), kTolerance);
    const size_t stream_values = static_cast<size_t>(d->config().dim * tokens * 2);
    const std::vector<float> front = evaluate(models::BlockStage::Front, nullptr, nullptr);
    ASSERT_EQ(front.size(), 2 * stream_values) << "Front: the stream, then its residual";
    const std::vector<float> stream(front.begin(), front.begin() + static_cast<std::ptrdiff_t>(stream_values));
    const std::vector<float> rest = evaluate(models::BlockStage::Rest, &stream, nullptr);
    ASSERT_EQ(rest.size(), whole.size() + stream_values) << "Rest: the prediction, then the middle residual";
    EXPECT_EQ(std::vector<float>(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(whole.size())), whole);
    const std::vector<float> middle(rest.begin() + static_cast<std::ptrdiff_t>(whole.size()), rest.end());
    const std::vector<float> cached = evaluate(models::BlockStage::Cached, &stream, &middle);
    EXPECT_LT(test::relative_error(cached, whole), 1e-5);
}

// A clip long enough that its scores (2304 tokens: 61 MiB a self-attention)
// go a block of queries at a time on the CPU (nn::kCpuScoresBlockBytes):
// each self-attention's softmax is then several, where a device's graph has
// one. The blocks' exactness is nn::attention's (attention_test.cpp); here
// the CPU's clip agrees with the device graph's up to its GELU table.
TEST_F(WanDitTiny, ALongClipOnTheCpuAttendsInBlocks) {
    auto d = dit();
    const models::WanDitConfig& c = d->config();
    const models::WanGrid grid{3, 24, 32};
    std::vector<float> x(static_cast<size_t>(grid.w * c.patch * grid.h * c.patch * grid.frames * c.in_channels));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    const auto context = test::fixture_tensor(io, "context");  // [2, tokens, text_dim]
    const float sigma = 0.6f;
    auto run = [&](nn::ComputeTarget target, int& softmaxes) {
        runtime::GraphSession session;
        models::WanDitInputs in;
        in.x = session.input(GGML_TYPE_F32, {grid.w * c.patch, grid.h * c.patch, grid.frames * c.in_channels, 1},
                             x.data());
        in.timesteps = session.input(GGML_TYPE_F32, {1}, &sigma);
        in.context = session.input(GGML_TYPE_F32, {context.shape[2], context.shape[1], 1}, context.values.data());
        const auto rope = models::wan_rope_table(c, grid);
        in.rope = session.input(GGML_TYPE_F32, models::wan_rope_shape(c, grid), rope.data());
        models::WanDitBuildOptions options;
        options.target = target;
        auto out = d->build(session.ctx(), in, options);
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return std::vector<float>{};
        ggml_cgraph* graph = session.graph(*out);
        softmaxes = 0;
        for (int i = 0; i < ggml_graph_n_nodes(graph); ++i)
            softmaxes += ggml_graph_node(graph, i)->op == GGML_OP_SOFT_MAX;
        EXPECT_TRUE(session.run(*compute, *out).ok());
        return runtime::GraphSession::read(*out);
    };
    int cpu_softmaxes = 0, device_softmaxes = 0;
    const std::vector<float> cpu = run(nn::ComputeTarget::Cpu, cpu_softmaxes);
    const std::vector<float> device = run(nn::ComputeTarget::Device, device_softmaxes);
    EXPECT_EQ(device_softmaxes, 2 * c.layers) << "a self- and a cross-attention per block";
    EXPECT_GT(cpu_softmaxes, 2 * device_softmaxes) << "the CPU's self-attentions in blocks of queries";
    ASSERT_EQ(cpu.size(), device.size());
    EXPECT_LT(test::relative_error(cpu, device), 1e-2);
}

// Wan 2.1's I2V and FLF2V files (a CLIP image projection, image keys and
// values in every cross-attention) read an image context of img_emb's
// width; a file with half of them, or an emb_pos of an odd row count, is refused.
TEST_F(WanDitTiny, ImageToVideoFilesReadAnImageContext) {
    test::TempDir dir;
    auto with = [&](const std::vector<std::pair<std::string, std::vector<int64_t>>>& extra) {
        std::vector<test::SafetensorsEntry> entries = entries_of(weights);
        for (const auto& [name, shape] : extra) {
            int64_t n = 1;
            for (int64_t s : shape) n *= s;
            entries.push_back({name, "F32", shape, test::f32_bytes(static_cast<size_t>(n))});
        }
        return entries;
    };
    std::vector<std::pair<std::string, std::vector<int64_t>>> image_parts = {
        {"img_emb.proj.0.weight", {1280}},       {"img_emb.proj.0.bias", {1280}},
        {"img_emb.proj.1.weight", {1280, 1280}}, {"img_emb.proj.1.bias", {1280}},
        {"img_emb.proj.3.weight", {48, 1280}},   {"img_emb.proj.3.bias", {48}},
        {"img_emb.proj.4.weight", {48}},         {"img_emb.proj.4.bias", {48}}};
    for (int i = 0; i < 2; ++i) {
        const std::string stem = "blocks." + std::to_string(i) + ".cross_attn.";
        for (const char* proj : {"k_img", "v_img"}) {
            image_parts.push_back({stem + proj + ".weight", {48, 48}});
            image_parts.push_back({stem + proj + ".bias", {48}});
        }
        image_parts.push_back({stem + "norm_k_img.weight", {48}});
    }
    const io::ModelFile i2v = write(dir, "i2v.safetensors", with(image_parts));
    EXPECT_TRUE(marked(i2v, models::network_entry(models::NetworkKind::WanDit)));
    auto dit = test::declare_network<models::WanDit>(i2v, "", std::nullopt);
    ASSERT_TRUE(dit.ok()) << dit.error().message;
    EXPECT_EQ((*dit)->capabilities().image_context_width, 1280);
    EXPECT_EQ((*dit)->capabilities().image_context_images, 1);

    auto flf2v_parts = image_parts;
    flf2v_parts.push_back({"img_emb.emb_pos", {1, 514, 1280}});
    auto flf2v =
        test::declare_network<models::WanDit>(write(dir, "flf2v.safetensors", with(flf2v_parts)), "", std::nullopt);
    ASSERT_TRUE(flf2v.ok()) << flf2v.error().message;
    EXPECT_EQ((*flf2v)->capabilities().image_context_images, 2);
    EXPECT_EQ((*flf2v)->config().image_context_rows, 514);

    auto odd_parts = image_parts;
    odd_parts.push_back({"img_emb.emb_pos", {1, 257, 1280}});
    auto odd = test::declare_network<models::WanDit>(write(dir, "odd.safetensors", with(odd_parts)), "", std::nullopt);
    ASSERT_FALSE(odd.ok());
    EXPECT_EQ(odd.error().kind, ErrorKind::BadFile);
    EXPECT_NE(odd.error().message.find("img_emb.emb_pos is [1, 257, 1280], expected [1, an even number of rows"),
              std::string::npos)
        << odd.error().message;
    const io::ModelFile keys_only =
        write(dir, "k_img.safetensors", with({{"blocks.0.cross_attn.k_img.weight", {48, 48}}}));
    auto half = test::declare_network<models::WanDit>(keys_only, "", std::nullopt);
    ASSERT_FALSE(half.ok());
    EXPECT_EQ(half.error().message,
              "Wan DiT under '': img_emb and blocks.N.cross_attn.k_img come together (Wan 2.1 I2V, FLF2V); it has "
              "one of them");
}

TEST_F(WanDitTiny, ConditioningThatDoesNotFitIsRefused) {
    auto d = test::declare_network<models::WanDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    models::ConditioningShape shape;
    shape.family = shape.family_label = "Wan";
    shape.encoders.push_back({"t5xxl", "umT5-XXL", 32, 0, true, false});
    shape.latent_channels = 4;
    EXPECT_TRUE((*d)->check_conditioning(shape).ok());
    shape.encoders[0].width = 40;
    const Status wrong_width = (*d)->check_conditioning(shape);
    ASSERT_FALSE(wrong_width.ok());
    EXPECT_EQ(wrong_width.error().kind, ErrorKind::BadFile);
    EXPECT_NE(wrong_width.error().message.find("the t5xxl text encoder (umT5-XXL) gives 40 features per token but "
                                               "the Wan DiT's text_embedding takes 32"),
              std::string::npos)
        << wrong_width.error().message;
    shape.encoders[0].width = 32;
    shape.latent_channels = 16;
    const Status wrong_vae = (*d)->check_conditioning(shape);
    ASSERT_FALSE(wrong_vae.ok());
    EXPECT_NE(wrong_vae.error().message.find("the VAE gives 16-channel latents but the Wan DiT predicts 4"),
              std::string::npos)
        << wrong_vae.error().message;
}

TEST_F(WanDitTiny, InputsThatDoNotFitAreRefused) {
    auto d = dit();
    runtime::GraphSession session;
    models::WanDitInputs in = inputs(*d, session, "");
    in.context = ggml_new_tensor_3d(session.ctx(), GGML_TYPE_F32, 32, 513, 2);  // past the 512 rows
    auto long_text = d->build(session.ctx(), in, {});
    ASSERT_FALSE(long_text.ok());
    EXPECT_NE(long_text.error().message.find("context is [32, 513, 2], expected [32, tokens, 2] with 1 to 512 tokens"),
              std::string::npos)
        << long_text.error().message;
    in = inputs(*d, session, "");
    in.x = ggml_new_tensor_4d(session.ctx(), GGML_TYPE_F32, 6, 4, 12, 2);  // three frames: the table has two
    auto frames = d->build(session.ctx(), in, {});
    ASSERT_FALSE(frames.ok());
    EXPECT_NE(frames.error().message.find("rope is [16, 12, 2], these tokens need F32 [16, 18, 2]"), std::string::npos)
        << frames.error().message;
    in.x = ggml_new_tensor_4d(session.ctx(), GGML_TYPE_F32, 6, 4, 6, 2);  // not whole frames of 4 channels
    auto partial = d->build(session.ctx(), in, {});
    ASSERT_FALSE(partial.ok());
    EXPECT_NE(partial.error().message.find("x is [6, 4, 6, 2], expected [W, H, frames x 4, B]"), std::string::npos)
        << partial.error().message;
}

// Bad files are clean errors naming what is wrong, never an assert.
TEST_F(WanDitTiny, BadFilesNameTheTensor) {
    test::TempDir dir;
    auto without = [&](const std::string& tensor) {
        std::vector<test::SafetensorsEntry> entries = entries_of(weights);
        entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const auto& e) { return e.name == tensor; }),
                      entries.end());
        return entries;
    };
    const io::ModelFile missing = write(dir, "missing.safetensors", without("blocks.1.cross_attn.v.bias"));
    auto d = test::declare_network<models::WanDit>(missing, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const Status declared = d->weights().declaration_status();
    ASSERT_FALSE(declared.ok());
    EXPECT_EQ(declared.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(declared.error().message, "missing tensor 'blocks.1.cross_attn.v.bias'");

    const io::ModelFile no_heads = write(dir, "no_heads.safetensors", entries_of(weights), {});
    auto h = test::declare_network<models::WanDit>(no_heads, "", std::nullopt);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(h.error().message,
              "Wan DiT under '': width 48 is not a whole number of Wan's heads of 128; set metadata kiln.wan.heads");
    const io::ModelFile odd_heads = write(dir, "odd_heads.safetensors", entries_of(weights), {{"kiln.wan.heads", "5"}});
    auto o = test::declare_network<models::WanDit>(odd_heads, "", std::nullopt);
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.error().message,
              "Wan DiT under '': 5 heads do not split the width 48 into heads of an even width of at least 6");

    const io::ModelFile no_ffn = write(dir, "no_ffn.safetensors", without("blocks.0.ffn.0.weight"));
    auto f = test::declare_network<models::WanDit>(no_ffn, "", std::nullopt);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error().message, "Wan DiT under '': missing blocks.0.ffn.0.weight");

    const io::ModelFile qwen = open_file("qwen_image_tiny.safetensors");
    auto other = test::declare_network<models::WanDit>(qwen, "", std::nullopt);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.error().message,
              "Wan DiT under '': no patch_embedding / blocks.0.cross_attn.norm_k (not a Wan DiT)");
}

// The registry's line: the marker finds the tiny model and no other DiT's
// file, and the other DiTs' markers do not find it.
TEST_F(WanDitTiny, RegistryMarksWanAlone) {
    const models::NetworkEntry& entry = models::network_entry(models::NetworkKind::WanDit);
    EXPECT_EQ(entry.kind, models::NetworkKind::WanDit);
    EXPECT_TRUE(marked(weights, entry));
    for (const char* name : {"flux_tiny", "flux2_tiny", "z_image_tiny", "z_image_tiny_diffusers", "sd35_tiny",
                             "sd3_tiny", "chroma_tiny", "sdxl_tiny", "qwen_image_tiny", "wan_vae_tiny", "t5_tiny"}) {
        EXPECT_FALSE(marked(open_file(std::string(name) + ".safetensors"), entry)) << name;
    }
    for (models::NetworkKind other :
         {models::NetworkKind::Unet, models::NetworkKind::FluxDit, models::NetworkKind::ZImageDit,
          models::NetworkKind::Flux2Dit, models::NetworkKind::Mmdit, models::NetworkKind::QwenImageDit,
          models::NetworkKind::WanVae, models::NetworkKind::QwenVision}) {
        EXPECT_FALSE(marked(weights, models::network_entry(other))) << static_cast<int>(other);
    }
    runtime::ModuleWeights params(weights, "", std::nullopt);
    auto net = entry.create(params, {});
    ASSERT_TRUE(net.ok()) << net.error().message;
    ASSERT_NE((*net)->as_diffusion(), nullptr);
    EXPECT_TRUE((*net)->as_diffusion()->capabilities().video);
}

}  // namespace
}  // namespace kiln
