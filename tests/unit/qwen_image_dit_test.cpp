// Qwen-Image's DiT against the PyTorch reference (training/reference/
// qwen_image.py, transcribed from diffusers' transformer_qwenimage.py), on the
// tiny random-weight model training/make_qwen_image_fixtures.py writes with
// diffusers' tensor names: block by block on a latent of 4 x 3 patches (an
// odd side, centred as diffusers centres it) with a batch of two timesteps,
// with one and two reference latents of other sizes, and with
// Qwen-Image-Edit-2511's zero_cond_t; its RoPE table; a block-level cache's
// stages. Also the config read from the weights, the segments the memory
// system sees, the registry's marker, and the errors for conditioning,
// inputs and files that do not fit.
#include "models/nets/qwen_image_dit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/registry.h"
#include "runtime/device_budget.h"
#include "runtime/graph_plan.h"
#include "runtime/graph_session.h"
#include "session_inputs.h"
#include "test_files.h"

namespace kiln {
namespace {

// F32 weights against a float64 reference: float32 rounding and summation
// order (timestep embeddings and RoPE angles are float32 here).
constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& name) {
    auto file = io::ModelFile::open({test::golden_path("models/" + name)});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// The tiny model's tensors as build_safetensors entries, with its metadata.
std::vector<test::SafetensorsEntry> entries_of(const io::ModelFile& file) {
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : file.tensors()) {
        const uint8_t* data = file.data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    return entries;
}
const std::vector<std::pair<std::string, std::string>> kAxes = {{"kiln.qwen_image.axes_dim", "4,14,14"}};

struct QwenImageTiny : ::testing::Test {
    io::ModelFile weights = open_file("qwen_image_tiny.safetensors");
    io::ModelFile io = open_file("qwen_image_tiny_io.safetensors");
    std::unique_ptr<runtime::Compute> compute = test::golden_cpu();

    test::DeclaredNetwork<models::QwenImageDit> dit(bool zero_cond_t = false) {
        auto d = test::declare_network<models::QwenImageDit>(weights, "", GGML_TYPE_F32, zero_cond_t);
        if (!d.ok()) throw std::runtime_error(d.error().message);
        auto status = d->weights().load(compute->weights_backend());
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return std::move(d).value();
    }

    ggml_tensor* input(runtime::GraphSession& session, const std::string& name) {
        const auto v = test::fixture_tensor(io, name);
        return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
    }

    // The fixture's inputs as the network takes them, the RoPE table made by kiln.
    models::QwenImageInputs inputs(const models::QwenImageDit& d, runtime::GraphSession& session,
                                   const std::vector<std::string>& refs) {
        const int64_t p = d.config().patch;
        models::QwenImageInputs in;
        in.x = input(session, "x");
        in.timesteps = input(session, "timesteps");
        in.context = input(session, "context");
        std::vector<models::QwenImageGrid> grids;
        for (const std::string& r : refs) {
            in.refs.push_back(input(session, r));
            grids.push_back({in.refs.back()->ne[0] / p, in.refs.back()->ne[1] / p});
        }
        const int64_t T = in.context->ne[1];
        const models::QwenImageGrid grid{in.x->ne[0] / p, in.x->ne[1] / p};
        const auto rope = models::qwen_image_rope_table(d.config(), T, grid, grids);
        in.rope = session.input(GGML_TYPE_F32, models::qwen_image_rope_shape(d.config(), T, grid, grids), rope.data());
        return in;
    }

    // Runs the case; checks `<prefix>out` and every `<prefix>block.<cut>`;
    // returns the number of blocks compared.
    int expect_matches(const std::string& prefix, const std::vector<std::string>& refs, bool zero_cond_t = false) {
        auto d = dit(zero_cond_t);
        runtime::GraphSession session;
        auto out = d->build(session.ctx(), inputs(*d, session, refs), {});
        EXPECT_TRUE(out.ok()) << out.error().message;
        if (!out.ok()) return -1;
        EXPECT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        EXPECT_LT(
            test::relative_error(runtime::GraphSession::read(*out), test::fixture_tensor(io, prefix + "out").values),
            kTolerance)
            << prefix << "out";
        int blocks = 0;
        const std::string block_prefix = prefix + "block.";
        for (const io::TensorInfo& ref : io.tensors()) {
            if (ref.name.rfind(block_prefix, 0) != 0) continue;
            const std::string block = ref.name.substr(block_prefix.size());
            ggml_tensor* cut = session.find("cut:" + block);
            EXPECT_NE(cut, nullptr) << block;
            if (!cut) continue;
            EXPECT_LT(test::relative_error(runtime::GraphSession::read(cut), test::fixture_tensor(io, ref.name).values),
                      kTolerance)
                << prefix << block;
            ++blocks;
        }
        return blocks;
    }
};

TEST_F(QwenImageTiny, ConfigIsReadFromTheWeights) {
    auto d = test::declare_network<models::QwenImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_TRUE(d->weights().declaration_status().ok());
    const models::QwenImageConfig& c = (*d)->config();
    EXPECT_EQ(c.channels, 16);
    EXPECT_EQ(c.patch, 2);
    EXPECT_EQ(c.hidden, 64);
    EXPECT_EQ(c.heads, 2);
    EXPECT_EQ(c.head_dim(), 32);
    EXPECT_EQ(c.mlp_hidden, 256);
    EXPECT_EQ(c.context_dim, 48);
    EXPECT_EQ(c.depth, 2);
    EXPECT_EQ(c.axes_dim, (std::vector<int>{4, 14, 14}));
    EXPECT_FLOAT_EQ(c.theta, 10000.0f);
    EXPECT_FALSE(c.zero_cond_t);
    const models::DiffusionCapabilities& can = (*d)->capabilities();
    EXPECT_EQ(can.in_channels, 16);
    EXPECT_EQ(can.out_channels, 16);
    EXPECT_EQ(can.context_width, 48);
    EXPECT_EQ(can.size_stride, 2);
    EXPECT_EQ(can.vector_width, 0);
    EXPECT_EQ(can.cache_blocks, 2);
    EXPECT_TRUE(can.joint_attention && can.reference_images);
    EXPECT_FALSE(can.guidance || can.skip_layers || can.text_mask || can.control_residuals);

    auto edit = test::declare_network<models::QwenImageDit>(weights, "", std::nullopt, true);
    ASSERT_TRUE(edit.ok()) << edit.error().message;
    EXPECT_TRUE((*edit)->config().zero_cond_t);
}

// The table against the reference's cos and sin of every pair: text first,
// then 4 x 3 patches (rows -2..0, columns -2..1), and with two references
// (frames 1 and 2; the first 6 patches tall, so the text starts at 3).
TEST_F(QwenImageTiny, RopeTableIsDiffusersCentredLayout) {
    auto d = test::declare_network<models::QwenImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    for (const std::string prefix : {"", "ref2."}) {
        const auto cos = test::fixture_tensor(io, prefix + "rope.cos");
        const auto sin = test::fixture_tensor(io, prefix + "rope.sin");
        std::vector<models::QwenImageGrid> refs;
        if (!prefix.empty()) refs = {{2, 6}, {3, 1}};
        const auto table = models::qwen_image_rope_table((*d)->config(), 7, {4, 3}, refs);
        const int64_t D = (*d)->config().head_dim(), n = cos.shape[0];
        ASSERT_EQ(table.size(), static_cast<size_t>(2 * D * n)) << prefix;
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
        EXPECT_LT(worst, 1e-6) << prefix;
    }
}

// A batch of two at sigma 1 and 0.35, on 4 x 3 patches.
TEST_F(QwenImageTiny, MatchesReferenceBlockByBlock) { EXPECT_EQ(expect_matches("", {}), 2); }

TEST_F(QwenImageTiny, ReferenceLatentsMatchReference) {
    // One reference latent (2 x 6 patches), taller than the image: its
    // tokens are in every block's output and dropped from the velocity.
    EXPECT_EQ(expect_matches("ref1.", {"ref1.ref0"}), 2);
    // Two, of different sizes, at frames 1 and 2.
    expect_matches("ref2.", {"ref1.ref0", "ref2.ref1"});
}

// Qwen-Image-Edit-2511: the references' tokens take the modulation of
// timestep 0 in every block; without references nothing changes.
TEST_F(QwenImageTiny, ZeroCondTModulatesReferencesAtTimestepZero) {
    EXPECT_EQ(expect_matches("zero_cond.", {"ref1.ref0", "ref2.ref1"}, /*zero_cond_t=*/true), 2);
    expect_matches("", {}, /*zero_cond_t=*/true);
}

TEST_F(QwenImageTiny, EachBlockIsASegmentWithItsOwnWeights) {
    auto d = dit();
    runtime::GraphSession session;
    auto out = d->build(session.ctx(), inputs(*d, session, {"ref1.ref0"}), {});
    ASSERT_TRUE(out.ok()) << out.error().message;
    ggml_cgraph* graph = session.graph(*out);
    const runtime::GraphPlan plan = runtime::build_graph_plan(graph, d.weights());
    ASSERT_TRUE(plan.valid) << plan.invalid_reason;
    std::vector<std::string> names;
    for (const runtime::PlanSegment& segment : plan.segments) names.push_back(segment.name);
    EXPECT_EQ(names, (std::vector<std::string>{"transformer_blocks.0", "transformer_blocks.1", "output"}));
    const std::vector<ggml_tensor*> leafs = runtime::graph_leafs(graph);
    size_t weights = 0;
    for (size_t k = 0; k < plan.segments.size(); ++k) {
        for (int leaf : plan.segments[k].weights) {
            const std::string name = ggml_get_name(leafs[static_cast<size_t>(leaf)]);
            ++weights;
            if (name.rfind("transformer_blocks.", 0) == 0) {
                EXPECT_EQ(name.substr(0, name.find('.', name.find('.') + 1)), plan.segments[k].name) << name;
            }
        }
    }
    EXPECT_EQ(weights, d.weights().count());
}

// The stages a block-level step cache builds, through the network's own
// inputs (DiffusionNetwork::build) with both references and zero_cond_t:
// Whole is the reference's output, Front then Rest is the Whole evaluation
// exactly, and Cached on the stream and the middle residual Rest gave
// reproduces it.
TEST_F(QwenImageTiny, BlockStagesAddUpToTheWholeEvaluation) {
    auto d = dit(/*zero_cond_t=*/true);
    EXPECT_EQ(d->capabilities().cache_blocks, 2);
    models::DiffusionShape shape{8, 6, 2, 7};
    shape.refs = {{4, 12}, {6, 2}};
    const int64_t tokens = 7 + 4 * 3 + 2 * 6 + 3 * 1;
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
        set(t->x, test::fixture_tensor(io, "x").values);
        set(t->refs[0], test::fixture_tensor(io, "ref1.ref0").values);
        set(t->refs[1], test::fixture_tensor(io, "ref2.ref1").values);
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
    EXPECT_LT(test::relative_error(whole, test::fixture_tensor(io, "zero_cond.out").values), kTolerance);
    const size_t stream_values = static_cast<size_t>(d->config().hidden * tokens * 2);
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

TEST_F(QwenImageTiny, ConditioningThatDoesNotFitIsRefused) {
    auto d = test::declare_network<models::QwenImageDit>(weights, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    models::ConditioningShape shape;
    shape.family = shape.family_label = "Qwen-Image";
    shape.encoders.push_back({"llm", "Qwen2.5-VL", 48, 0, true, false});
    shape.latent_channels = 16;
    EXPECT_TRUE((*d)->check_conditioning(shape).ok());
    shape.encoders[0].width = 40;
    const Status wrong_width = (*d)->check_conditioning(shape);
    ASSERT_FALSE(wrong_width.ok());
    EXPECT_EQ(wrong_width.error().kind, ErrorKind::BadFile);
    EXPECT_NE(wrong_width.error().message.find("the llm text encoder (Qwen2.5-VL) gives 40 features per token but "
                                               "the Qwen-Image DiT's txt_in takes 48"),
              std::string::npos)
        << wrong_width.error().message;
    shape.encoders[0].width = 48;
    shape.latent_channels = 4;
    const Status wrong_vae = (*d)->check_conditioning(shape);
    ASSERT_FALSE(wrong_vae.ok());
    EXPECT_NE(wrong_vae.error().message.find("the VAE gives 4-channel latents but the Qwen-Image DiT takes 16"),
              std::string::npos)
        << wrong_vae.error().message;
}

TEST_F(QwenImageTiny, InputsThatDoNotFitAreRefused) {
    auto d = dit();
    runtime::GraphSession session;
    models::QwenImageInputs in = inputs(*d, session, {"ref1.ref0"});
    in.refs.clear();  // the RoPE table still counts the reference's tokens
    auto wrong_rope = d->build(session.ctx(), in, {});
    ASSERT_FALSE(wrong_rope.ok());
    EXPECT_NE(wrong_rope.error().message.find("rope is [32, 31, 2], these tokens need F32 [32, 19, 2]"),
              std::string::npos)
        << wrong_rope.error().message;
    in = inputs(*d, session, {});
    in.x = ggml_new_tensor_4d(session.ctx(), GGML_TYPE_F32, 7, 6, 16, 2);  // not whole patches
    auto odd = d->build(session.ctx(), in, {});
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.error().message.find("x is [7, 6, 16, 2], expected [W, H, 16, 2] with W and H multiples of 2"),
              std::string::npos)
        << odd.error().message;
}

// Bad files are clean errors naming the tensor, never an assert: create()
// refuses what it configures itself from; the declarations report the rest
// (the loader asks right after create, before any graph).
TEST_F(QwenImageTiny, BadFilesNameTheTensor) {
    test::TempDir dir;
    auto write = [&](const std::string& name, std::vector<test::SafetensorsEntry> entries,
                     const std::vector<std::pair<std::string, std::string>>& metadata = kAxes) {
        auto file = io::ModelFile::open({dir.write(name, test::build_safetensors(entries, metadata))});
        if (!file.ok()) throw std::runtime_error(file.error().message);
        return std::move(file).value();
    };
    auto without = [&](const std::string& tensor) {
        std::vector<test::SafetensorsEntry> entries = entries_of(weights);
        entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const auto& e) { return e.name == tensor; }),
                      entries.end());
        return entries;
    };

    const io::ModelFile missing = write("missing.safetensors", without("transformer_blocks.1.attn.add_k_proj.weight"));
    auto d = test::declare_network<models::QwenImageDit>(missing, "", std::nullopt);
    ASSERT_TRUE(d.ok()) << d.error().message;
    const Status declared = d->weights().declaration_status();
    ASSERT_FALSE(declared.ok());
    EXPECT_EQ(declared.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(declared.error().message, "missing tensor 'transformer_blocks.1.attn.add_k_proj.weight'");

    std::vector<test::SafetensorsEntry> entries = entries_of(weights);
    for (auto& e : entries) {
        if (e.name != "transformer_blocks.1.txt_mlp.net.2.weight") continue;
        e.shape = {64, 128};  // half its rows
        e.data.resize(64 * 128 * 4);
    }
    const io::ModelFile reshaped = write("reshaped.safetensors", entries);
    auto r = test::declare_network<models::QwenImageDit>(reshaped, "", std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_FALSE(r->weights().declaration_status().ok());
    EXPECT_EQ(r->weights().declaration_status().error().message,
              "tensor 'transformer_blocks.1.txt_mlp.net.2.weight' has shape [64, 128], expected [64, 256]");

    const io::ModelFile no_norm = write("no_norm.safetensors", without("transformer_blocks.0.attn.norm_q.weight"));
    auto n = test::declare_network<models::QwenImageDit>(no_norm, "", std::nullopt);
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.error().kind, ErrorKind::BadFile);
    EXPECT_EQ(n.error().message, "Qwen-Image DiT under '': missing transformer_blocks.0.attn.norm_q.weight");

    const io::ModelFile no_axes = write("no_axes.safetensors", entries_of(weights), {});
    auto a = test::declare_network<models::QwenImageDit>(no_axes, "", std::nullopt);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().message,
              "Qwen-Image DiT under '': heads 32 wide need RoPE axes (Qwen-Image's are for 128); set metadata "
              "kiln.qwen_image.axes_dim");

    const io::ModelFile flux2 = open_file("flux2_tiny.safetensors");
    auto other = test::declare_network<models::QwenImageDit>(flux2, "", std::nullopt);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.error().message,
              "Qwen-Image DiT under '': no transformer_blocks.0.img_mod.1 / txt_norm (not a Qwen-Image DiT)");
}

// The registry's line: the marker finds the tiny model and no other DiT's
// file, and the other DiTs' markers do not find it.
TEST_F(QwenImageTiny, RegistryMarksQwenImageAlone) {
    const models::NetworkEntry& entry = models::network_entry(models::NetworkKind::QwenImageDit);
    EXPECT_EQ(entry.kind, models::NetworkKind::QwenImageDit);
    auto marked = [](const io::ModelFile& file, const models::NetworkEntry& e) {
        for (const std::string& probe : e.probes)
            for (const io::TensorInfo& t : file.tensors())
                if (t.name.size() >= probe.size() &&
                    t.name.compare(t.name.size() - probe.size(), probe.size(), probe) == 0)
                    return true;
        return false;
    };
    EXPECT_TRUE(marked(weights, entry));
    for (const char* name : {"flux_tiny", "flux2_tiny", "z_image_tiny", "z_image_tiny_diffusers", "sd35_tiny",
                             "sd3_tiny", "chroma_tiny", "sdxl_tiny"}) {
        EXPECT_FALSE(marked(open_file(std::string(name) + ".safetensors"), entry)) << name;
    }
    for (models::NetworkKind other :
         {models::NetworkKind::Unet, models::NetworkKind::FluxDit, models::NetworkKind::ZImageDit,
          models::NetworkKind::Flux2Dit, models::NetworkKind::Mmdit}) {
        EXPECT_FALSE(marked(weights, models::network_entry(other))) << static_cast<int>(other);
    }
    runtime::ModuleWeights params(weights, "", std::nullopt);
    auto net = entry.create(params, {});
    ASSERT_TRUE(net.ok()) << net.error().message;
    ASSERT_NE((*net)->as_diffusion(), nullptr);
    EXPECT_TRUE((*net)->as_diffusion()->capabilities().reference_images);
}

}  // namespace
}  // namespace kiln
