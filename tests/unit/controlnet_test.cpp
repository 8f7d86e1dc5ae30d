// kiln's ControlNet (models/nets/controlnet) and the UNet's control residuals
// against the PyTorch reference (training/reference/controlnet.py) on the
// tiny ControlNets training/make_controlnet_fixtures.py writes for
// tests/golden/models/sd1_tiny.safetensors' and sdxl_tiny.safetensors' UNets.
#include "models/nets/controlnet.h"

#include <gtest/gtest.h>

#include "declared_network.h"
#include "golden.h"
#include "models/nets/unet.h"
#include "runtime/graph_session.h"

namespace kiln {
namespace {

using test::fixture_tensor;
using test::ggml_ne;
using test::golden_path;
using test::relative_error;

// F16 weights loaded as F32, a float64 reference: float32 rounding only.
constexpr double kTolerance = 1e-4;

io::ModelFile open_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) throw std::runtime_error(file.error().message);
    return std::move(file).value();
}

// A ControlNet fixture: "sd1" or "sdxl" (which adds the UNet's y).
struct Fixture {
    explicit Fixture(const std::string& family = "sd1")
        : control(open_file(golden_path("models/controlnet_" + family + "_tiny.safetensors"))),
          io(open_file(golden_path("models/controlnet_" + family + "_tiny_io.safetensors"))),
          model(open_file(golden_path("models/" + family + "_tiny.safetensors"))) {
        if (io.find("y")) y = fixture_tensor(io, "y");
    }
    io::ModelFile control;
    io::ModelFile io;
    io::ModelFile model;  // the model whose UNet the ControlNet was made for
    test::FixtureTensor x = fixture_tensor(io, "x");
    test::FixtureTensor hint = fixture_tensor(io, "hint");
    test::FixtureTensor t = fixture_tensor(io, "t");
    test::FixtureTensor context = fixture_tensor(io, "context");
    std::optional<test::FixtureTensor> y;

    // The UNet's inputs in `session`.
    models::UnetInputs inputs(runtime::GraphSession& session) const {
        models::UnetInputs in;
        in.x = session.input(GGML_TYPE_F32, ggml_ne(x.shape), x.values.data());
        in.timesteps = session.input(GGML_TYPE_F32, ggml_ne(t.shape), t.values.data());
        in.context = session.input(GGML_TYPE_F32, ggml_ne(context.shape), context.values.data());
        if (y) in.y = session.input(GGML_TYPE_F32, ggml_ne(y->shape), y->values.data());
        return in;
    }
};

// The ControlNet's flat output, run on the fixture's inputs.
std::vector<float> run_controlnet(const models::ControlNet& net, const Fixture& f) {
    auto compute = test::golden_cpu();
    runtime::GraphSession session;
    const models::UnetInputs in = f.inputs(session);
    ggml_tensor* hint = session.input(GGML_TYPE_F32, ggml_ne(f.hint.shape), f.hint.values.data());
    auto out = net.build(session.ctx(), in, hint, models::UnetBuildOptions{});
    if (!out.ok()) throw std::runtime_error(out.error().message);
    auto status = session.run(*compute, *out);
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return runtime::GraphSession::read(*out);
}

test::DeclaredNetwork<models::ControlNet> load_controlnet(const io::ModelFile& file, const std::string& prefix) {
    auto net = test::declare_network<models::ControlNet>(file, prefix, GGML_TYPE_F32);
    if (!net.ok()) throw std::runtime_error(net.error().message);
    auto compute = test::golden_cpu();
    auto status = net->weights().load(compute->weights_backend());
    if (!status.ok()) throw std::runtime_error(status.error().message);
    return std::move(net).value();
}

// The flat output split into residuals, each compared with the reference's.
void expect_residuals_match(const models::ControlNet& net, const Fixture& f, const std::vector<float>& flat) {
    const auto shapes = net.residual_shapes(f.x.shape[3], f.x.shape[2]);
    const int64_t batch = f.x.shape[0];
    size_t offset = 0;
    for (size_t k = 0; k < shapes.size(); ++k) {
        const size_t count = static_cast<size_t>(shapes[k].values() * batch);
        ASSERT_LE(offset + count, flat.size()) << k;
        const std::vector<float> residual(flat.begin() + offset, flat.begin() + offset + count);
        EXPECT_LT(relative_error(residual, fixture_tensor(f.io, "control.residual." + std::to_string(k)).values),
                  kTolerance)
            << "residual " << k;
        offset += count;
    }
    EXPECT_EQ(offset, flat.size());
}

TEST(ControlNet, ConfiguredFromItsWeights) {
    Fixture f;
    ASSERT_EQ(models::ControlNet::find_prefix(f.control).value_or("?"), "control_model.");
    auto net = test::declare_network<models::ControlNet>(f.control, "control_model.", std::nullopt);
    ASSERT_TRUE(net.ok()) << net.error().message;
    const models::ControlNetConfig& c = (*net)->config();
    EXPECT_EQ(c.hint_channels, 3);
    EXPECT_EQ(c.hint_widths, (std::vector<int64_t>{8, 8, 16, 16, 32, 32, 32, 32}));
    EXPECT_EQ(c.unet.model_channels, 32);
    EXPECT_EQ(c.unet.level_channels, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(c.unet.context_dim, 64);
    EXPECT_EQ(c.unet.heads, 2);
    const auto shapes = (*net)->residual_shapes(8, 8);
    ASSERT_EQ(shapes.size(), 5u);  // input_blocks.0..3 and the middle block
    EXPECT_EQ(shapes[2].w, 4);
    EXPECT_EQ(shapes[3].c, 64);
    EXPECT_EQ(shapes[4].c, 64);
}

TEST(ControlNet, ResidualsMatchReference) {
    Fixture f;
    auto net = load_controlnet(f.control, "control_model.");
    expect_residuals_match(*net, f, run_controlnet(*net, f));
}

// Diffusers-converted single files and ComfyUI use the names without
// "control_model.".
TEST(ControlNet, BareNamesGiveTheSameResiduals) {
    Fixture f;
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : f.control.tensors()) {
        entries.push_back(test::copy_entry(f.control, t, t.name.substr(std::string("control_model.").size())));
    }
    test::TempDir dir;
    const std::string path =
        dir.write("bare.safetensors", test::build_safetensors(entries, {{"kiln.unet.heads", "2"}}));
    io::ModelFile bare = open_file(path);
    ASSERT_EQ(models::ControlNet::find_prefix(bare).value_or("?"), "");
    auto net = load_controlnet(bare, "");
    expect_residuals_match(*net, f, run_controlnet(*net, f));
}

TEST(ControlNet, FileWithoutControlNetIsRefused) {
    Fixture f;
    EXPECT_FALSE(models::ControlNet::find_prefix(f.model).has_value());
    auto net = test::declare_network<models::ControlNet>(f.model, "model.diffusion_model.", std::nullopt);
    ASSERT_FALSE(net.ok());
    EXPECT_NE(net.error().message.find("input_hint_block"), std::string::npos) << net.error().message;
}

// The UNet with the reference's residuals at strength 0.9 (ldm's
// ControlledUnetModel), with kiln's own residuals, and at strength 0, which
// must be the plain UNet's output bit for bit.
void expect_controlled_unet_matches_reference(const std::string& family) {
    Fixture f(family);
    auto unet = test::declare_network<models::Unet>(f.model, "model.diffusion_model.", GGML_TYPE_F32);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    auto compute = test::golden_cpu();
    ASSERT_TRUE(unet->weights().load(compute->weights_backend()).ok());
    auto net = load_controlnet(f.control, "control_model.");
    const std::vector<float> kiln_residuals = run_controlnet(*net, f);
    const auto shapes = net->residual_shapes(f.x.shape[3], f.x.shape[2]);
    const float strength = fixture_tensor(f.io, "strength").values.at(0);

    auto run_unet = [&](const std::vector<float>* residuals, float s) {
        runtime::GraphSession session;
        models::UnetInputs in = f.inputs(session);
        size_t offset = 0;
        for (size_t k = 0; residuals && k < shapes.size(); ++k) {
            const auto& r = shapes[k];
            in.control.push_back(
                session.input(GGML_TYPE_F32, {r.w, r.h, r.c, f.x.shape[0]}, residuals->data() + offset));
            offset += static_cast<size_t>(r.values() * f.x.shape[0]);
        }
        in.control_strength = s;
        auto out = (*unet)->build(session.ctx(), in, models::UnetBuildOptions{});
        if (!out.ok()) throw std::runtime_error(out.error().message);
        auto status = session.run(*compute, *out);
        if (!status.ok()) throw std::runtime_error(status.error().message);
        return runtime::GraphSession::read(*out);
    };
    std::vector<float> reference_residuals;
    for (size_t k = 0; k < shapes.size(); ++k) {
        const auto r = fixture_tensor(f.io, "control.residual." + std::to_string(k)).values;
        reference_residuals.insert(reference_residuals.end(), r.begin(), r.end());
    }
    const auto expected = fixture_tensor(f.io, "unet.controlled").values;
    EXPECT_LT(relative_error(run_unet(&reference_residuals, strength), expected), kTolerance);
    EXPECT_LT(relative_error(run_unet(&kiln_residuals, strength), expected), kTolerance);
    const std::vector<float> plain = run_unet(nullptr, 1.0f);
    EXPECT_EQ(run_unet(&kiln_residuals, 0.0f), plain);
    EXPECT_GT(relative_error(plain, expected), 1e-2);  // the control matters
}

TEST(ControlNet, ControlledUnetMatchesReference) { expect_controlled_unet_matches_reference("sd1"); }

// sgm's SDXL layout: label_emb takes y, per-level transformer depths (none
// at the first level), linear projections, 16-wide heads from the metadata.
TEST(ControlNet, SdxlResidualsAndControlledUnetMatchReference) {
    Fixture f("sdxl");
    auto net = load_controlnet(f.control, "control_model.");
    EXPECT_GT(net->config().unet.adm_in_channels, 0);
    EXPECT_TRUE(net->config().unet.linear_projection);
    EXPECT_EQ(net->config().unet.input_depth, (std::vector<int>{0, 0, 2}));
    expect_residuals_match(*net, f, run_controlnet(*net, f));
    expect_controlled_unet_matches_reference("sdxl");
}

TEST(ControlNet, UnetRefusesResidualsOfTheWrongShape) {
    Fixture f;
    auto unet = test::declare_network<models::Unet>(f.model, "model.diffusion_model.", std::nullopt);
    ASSERT_TRUE(unet.ok()) << unet.error().message;
    runtime::GraphSession session;
    const std::vector<float> zeros(64 * 77);
    models::UnetInputs in;
    in.x = session.input(GGML_TYPE_F32, {8, 8, 4, 1}, zeros.data());
    in.timesteps = session.input(GGML_TYPE_F32, {1}, zeros.data());
    in.context = session.input(GGML_TYPE_F32, {64, 77, 1}, zeros.data());
    for (int k = 0; k < 5; ++k) in.control.push_back(session.input(GGML_TYPE_F32, {8, 8, 32, 1}, zeros.data()));
    auto out = (*unet)->build(session.ctx(), in, models::UnetBuildOptions{});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().message, "UNet: control residual 2 does not have the shape of input_blocks.2's output");
    in.control.pop_back();
    auto fewer = (*unet)->build(session.ctx(), in, models::UnetBuildOptions{});
    ASSERT_FALSE(fewer.ok());
    EXPECT_EQ(fewer.error().message, "UNet: 4 control residuals, the network takes 5");
}

}  // namespace
}  // namespace kiln
