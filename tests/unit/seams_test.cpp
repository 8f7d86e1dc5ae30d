// Seamless images (nn/seams.h; sd-cli's --circular, --circularx): the tiny
// SD1 model's UNet and VAE across seams against PyTorch's reference modules
// with circular padding (training/make_seams_fixtures.py); the UNet's
// evaluation turning with its input on the torus, as a network of circular
// convolutions must; the RoPE tables repeating with the image's period; each
// DiT building its positions from the seams; VAE tiling across seams; and the
// networks that cannot wrap refusing them.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "flux_tiny.h"
#include "golden.h"
#include "io/model_file.h"
#include "models/nets/flux_dit.h"
#include "models/nets/wan_dit.h"
#include "nn/rope.h"
#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "pipeline/request.h"
#include "pipeline/vae_tiling.h"
#include "runtime/graph_session.h"
#include "wan_tiny.h"

namespace kiln {
namespace {

using models::DiffusionShape;
using nn::Seams;
using pipeline::Model;
using pipeline::ModelPaths;
using pipeline::SeamsScope;
using test::golden_path;

std::unique_ptr<Model> load(const ModelPaths& paths) {
    auto loaded = Model::load(paths, test::golden_model_options());
    EXPECT_TRUE(loaded.ok()) << loaded.error().message;
    return loaded.ok() ? std::move(loaded).value() : nullptr;
}

std::unique_ptr<Model> load_sd1() {
    ModelPaths paths;
    paths.model = {golden_path("models/sd1_tiny.safetensors")};
    paths.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return load(paths);
}

// One evaluation of the diffusion network on x, t and context (ggml's order,
// batch items one after the other).
std::vector<float> evaluate(Model& model, DiffusionShape shape, const std::vector<float>& x,
                            const std::vector<float>& t, const std::vector<float>& context) {
    auto g = pipeline::build_diffusion_graph(model, shape);
    EXPECT_TRUE(g.ok()) << g.error().message;
    if (!g.ok()) return {};
    g->session->set_input(g->x, x.data());
    g->session->set_input(g->timesteps, t.data());
    g->session->set_input(g->context, context.data());
    const Status ran = g->session->run(model.diffusion_compute(), g->out);
    EXPECT_TRUE(ran.ok()) << ran.error().message;
    return ran.ok() ? runtime::GraphSession::read(g->out) : std::vector<float>{};
}

std::vector<float> read_graph(Model& model, pipeline::VaeGraph g) {
    const Status ran = g.session->run(model.vae_compute(), g.out);
    EXPECT_TRUE(ran.ok()) << ran.error().message;
    return ran.ok() ? runtime::GraphSession::read(g.out) : std::vector<float>{};
}

TEST(Seams, Sd1UnetAndVaeMatchPyTorchsCircularPadding) {
    auto model = load_sd1();
    ASSERT_TRUE(model);
    auto in = io::ModelFile::open({golden_path("models/sd1_tiny_io.safetensors")});
    auto want = io::ModelFile::open({golden_path("pipeline/sd1_tiny_seams.safetensors")});
    ASSERT_TRUE(in.ok() && want.ok());
    const auto x = test::fixture_tensor(*in, "unet.x"), t = test::fixture_tensor(*in, "unet.t"),
               context = test::fixture_tensor(*in, "unet.context"), z = test::fixture_tensor(*in, "vae.z"),
               image = test::fixture_tensor(*in, "vae.image");
    for (const auto& [name, seams] : {std::pair{"xy", Seams{true, true}}, std::pair{"x", Seams{true, false}}}) {
        const SeamsScope scope(*model, seams);
        const DiffusionShape shape{16, 16, 2, 77};
        const std::vector<float> unet = evaluate(*model, shape, x.values, t.values, context.values);
        const std::vector<float> plain_unet = test::fixture_tensor(*in, "unet.out").values;
        const std::vector<float> golden_unet = test::fixture_tensor(*want, std::string("unet.out.") + name).values;
        ASSERT_EQ(unet.size(), golden_unet.size()) << name;
        EXPECT_LT(test::relative_error(unet, golden_unet), 1e-5) << name;
        EXPECT_GT(test::relative_error(plain_unet, golden_unet), 1e-2) << name << ": the seams change the UNet";

        const std::vector<float> decoded = read_graph(*model, pipeline::build_vae_decode_graph(*model, 8, 8, z.values.data()));
        EXPECT_LT(test::relative_error(decoded, test::fixture_tensor(*want, std::string("vae.decoded.") + name).values),
                  1e-5)
            << name;
        const std::vector<float> encoded =
            read_graph(*model, pipeline::build_vae_encode_graph(*model, 16, 16, image.values.data()));
        EXPECT_LT(test::relative_error(encoded, test::fixture_tensor(*want, std::string("vae.encoded.") + name).values),
                  1e-5)
            << name;
    }
    // The scope ends: the next job's graphs pad with zeros again.
    const std::vector<float> after = evaluate(*model, DiffusionShape{16, 16, 2, 77}, x.values, t.values, context.values);
    EXPECT_LT(test::relative_error(after, test::fixture_tensor(*in, "unet.out").values), 1e-5);
}

// x ne [W, H, C, N] rolled by (dx, dy): pixel (w, h) moves to (w + dx, h + dy) mod the size.
std::vector<float> rolled(const std::vector<float>& x, int64_t W, int64_t H, int64_t dx, int64_t dy) {
    std::vector<float> out(x.size());
    const int64_t planes = static_cast<int64_t>(x.size()) / (W * H);
    for (int64_t p = 0; p < planes; ++p)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t w = 0; w < W; ++w)
                out[static_cast<size_t>((p * H + (h + dy) % H) * W + (w + dx) % W)] =
                    x[static_cast<size_t>((p * H + h) * W + w)];
    return out;
}

// Circular convolutions, position-free attention and group norms over the
// whole image: on the torus the UNet's prediction for a rolled latent is its
// prediction rolled (by whole steps of its downsampling). Not so across an
// edge that is no seam.
TEST(Seams, UnetPredictionTurnsWithItsInputOnTheTorus) {
    auto model = load_sd1();
    ASSERT_TRUE(model);
    auto in = io::ModelFile::open({golden_path("models/sd1_tiny_io.safetensors")});
    ASSERT_TRUE(in.ok());
    const auto x = test::fixture_tensor(*in, "unet.x"), t = test::fixture_tensor(*in, "unet.t"),
               context = test::fixture_tensor(*in, "unet.context");
    const DiffusionShape shape{16, 16, 2, 77};
    auto roll_error = [&](Seams seams, int64_t dx, int64_t dy) {
        const SeamsScope scope(*model, seams);
        const std::vector<float> out = evaluate(*model, shape, x.values, t.values, context.values);
        const std::vector<float> out_of_rolled =
            evaluate(*model, shape, rolled(x.values, 16, 16, dx, dy), t.values, context.values);
        return test::relative_error(out_of_rolled, rolled(out, 16, 16, dx, dy));
    };
    EXPECT_LT(roll_error(Seams{true, true}, 6, 4), 1e-5);
    EXPECT_LT(roll_error(Seams{true, false}, 6, 0), 1e-5);
    EXPECT_GT(roll_error(Seams{true, false}, 0, 4), 1e-2) << "the top and bottom are no seam";
    EXPECT_GT(roll_error(Seams{}, 6, 0), 1e-2);
}

// Each frequency of an axis with a period makes whole turns over it: a
// position and the one a period on rotate alike, so the last column is the
// first one's neighbour as any two adjacent columns are.
TEST(Seams, RopeRepeatsWithThePeriod) {
    const std::vector<int> axes = {4, 8};
    const int64_t period = 6;
    std::vector<int64_t> positions, periods;
    for (int64_t p = 0; p <= 2 * period; ++p) {
        positions.insert(positions.end(), {3, p});
        periods.insert(periods.end(), {0, period});
    }
    const int64_t n = 2 * period + 1, D = 12;
    const std::vector<float> table = nn::rope_axes_table(positions, axes, 10000.0f, periods);
    const std::vector<float> plain = nn::rope_axes_table(positions, axes, 10000.0f);
    auto value = [&](const std::vector<float>& tb, int64_t plane, int64_t token, int64_t d) {
        return tb[static_cast<size_t>((plane * n + token) * D + d)];
    };
    for (int64_t token = 0; token < n - period; ++token)
        for (int64_t d = 0; d < D; ++d)
            for (int64_t plane = 0; plane < 2; ++plane)
                EXPECT_NEAR(value(table, plane, token, d), value(table, plane, token + period, d), 1e-5)
                    << token << " " << d;
    for (int64_t d = 0; d < 4; ++d)  // the axis without a period is untouched
        EXPECT_EQ(value(table, 0, 5, d), value(plain, 0, 5, d));
    EXPECT_GT(std::abs(value(table, 1, period, 4 + 2) - value(plain, 1, period, 4 + 2)), 1e-3)
        << "the plain table does not repeat";
    // Each frequency is a whole number of turns over the period.
    for (double omega : {1.0, 0.1, 0.01, 0.3}) {
        const double turns = nn::periodic_frequency(omega, period) * period / (2 * M_PI);
        EXPECT_NEAR(turns, std::round(turns), 1e-9) << omega;
        EXPECT_EQ(nn::periodic_frequency(omega, 0), omega);
    }
}

// A DiT's image tokens take the seams (its RoPE table, built by the network
// from the shape), the text tokens not: Flux's table of a 4x3 grid.
TEST(Seams, FluxRopeTableWrapsTheImageTokensOnly) {
    models::FluxConfig c;
    c.axes_dim = {4, 6, 6};
    c.hidden = 16 * 4;
    c.heads = 4;
    const models::FluxTokenGrid grid{3, 4};
    const int64_t text = 5, tokens = text + 12, D = 16;
    const std::vector<float> plain = models::flux_rope_table(c, text, grid, {});
    const std::vector<float> wrapped = models::flux_rope_table(c, text, grid, {}, false, Seams{true, false});
    ASSERT_EQ(plain.size(), static_cast<size_t>(2 * D * tokens));
    ASSERT_EQ(wrapped.size(), plain.size());
    for (int64_t token = 0; token < text; ++token)
        for (int64_t d = 0; d < D; ++d)
            EXPECT_EQ(wrapped[static_cast<size_t>(token * D + d)], plain[static_cast<size_t>(token * D + d)]);
    // The columns' pairs (axis 2) differ once wrapped; the rows' (axis 1) do not.
    const int64_t last_token = tokens - 1;
    bool columns_differ = false;
    for (int64_t d = 0; d < 10; ++d)
        EXPECT_EQ(wrapped[static_cast<size_t>(last_token * D + d)], plain[static_cast<size_t>(last_token * D + d)]);
    for (int64_t d = 10; d < D; ++d)
        columns_differ |= wrapped[static_cast<size_t>(last_token * D + d)] != plain[static_cast<size_t>(last_token * D + d)];
    EXPECT_TRUE(columns_differ);
}

// Wan's video tokens wrap across the rows and columns of each frame, never
// across frames: a clip is no loop.
TEST(Seams, WanRopeTableWrapsRowsAndColumnsNotFrames) {
    models::WanDitConfig c;
    c.dim = 4 * 24;
    c.heads = 4;  // head_dim 24: axes 8, 8, 8
    const models::WanGrid grid{3, 2, 4};
    ASSERT_EQ(grid.tokens(), 24);
    const std::vector<int> axes = c.rope_axes();
    ASSERT_EQ(axes, (std::vector<int>{8, 8, 8}));
    const std::vector<float> plain = models::wan_rope_table(c, grid);
    const std::vector<float> wrapped = models::wan_rope_table(c, grid, Seams{true, true});
    ASSERT_EQ(wrapped.size(), plain.size());
    const int64_t D = 24, last = grid.tokens() - 1;  // frame 2, row 1, column 3
    for (int64_t d = 0; d < 8; ++d)
        EXPECT_EQ(wrapped[static_cast<size_t>(last * D + d)], plain[static_cast<size_t>(last * D + d)]);
    bool rows = false, columns = false;
    for (int64_t d = 8; d < 16; ++d)
        rows |= wrapped[static_cast<size_t>(last * D + d)] != plain[static_cast<size_t>(last * D + d)];
    for (int64_t d = 16; d < 24; ++d)
        columns |= wrapped[static_cast<size_t>(last * D + d)] != plain[static_cast<size_t>(last * D + d)];
    EXPECT_TRUE(rows && columns);
}

// One evaluation of the model's diffusion network at `shape` on fixed
// inputs (a pattern for the latent, text, vectors and references; sigma
// 0.6, guidance 3.5).
std::vector<float> evaluate_pattern(Model& model, const DiffusionShape& shape) {
    auto g = pipeline::build_diffusion_graph(model, shape);
    EXPECT_TRUE(g.ok()) << g.error().message;
    if (!g.ok()) return {};
    uint32_t seed = 1;
    auto fill = [&](ggml_tensor* t) {
        if (!t) return;
        std::vector<float> v(static_cast<size_t>(ggml_nelements(t)));
        uint32_t state = seed++ * 2654435761u;
        for (float& f : v) {
            state = state * 1664525u + 1013904223u;
            f = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
        }
        g->session->set_input(t, v.data());
    };
    fill(g->x);
    fill(g->context);
    fill(g->y);
    for (ggml_tensor* r : g->refs) fill(r);
    for (auto [t, value] : {std::pair{g->timesteps, 0.6f}, std::pair{g->guidance, 3.5f}}) {
        if (!t) continue;
        const std::vector<float> v(static_cast<size_t>(ggml_nelements(t)), value);
        g->session->set_input(t, v.data());
    }
    const Status ran = g->session->run(model.diffusion_compute(), g->out);
    EXPECT_TRUE(ran.ok()) << ran.error().message;
    return ran.ok() ? runtime::GraphSession::read(g->out) : std::vector<float>{};
}

// Each DiT that takes the seams builds its positions from them: the
// evaluation differs across seams and is the plain one without them. (The
// tables themselves are checked above; this is the network reading them.)
TEST(Seams, EveryDitThatTakesThemBuildsItsPositionsFromThem) {
    struct Case {
        const char* family;
        ModelPaths paths;
        DiffusionShape shape;
    };
    std::vector<Case> cases;
    {
        Case c{"Flux", test::flux_tiny_parts(), DiffusionShape{8, 8, 1, 6}};
        c.shape.refs = {{4, 4}};  // Kontext's reference tokens wrap with their own grid
        cases.push_back(c);
    }
    {
        Case c{"FLUX.2", {}, DiffusionShape{4, 4, 1, 6}};
        c.paths.diffusion_model = golden_path("models/flux2_tiny.safetensors");
        c.paths.vae = golden_path("models/flux2_ae_tiny.safetensors");
        c.paths.llm = golden_path("models/flux2_klein_qwen3_tiny.safetensors");
        c.paths.tokenizer = "llm=" + golden_path("pipeline/z_image_tiny/tokenizer");
        cases.push_back(c);
    }
    {
        Case c{"Z-Image", {}, DiffusionShape{8, 8, 1, 5}};
        c.paths.diffusion_model = golden_path("pipeline/z_image_tiny/z_image_turbo_dit.safetensors");
        c.paths.vae = golden_path("pipeline/flux_tiny/ae.safetensors");
        c.paths.llm = golden_path("pipeline/z_image_tiny/qwen3.safetensors");
        cases.push_back(c);
    }
    {
        Case c{"Qwen-Image", {}, DiffusionShape{8, 6, 1, 7}};
        c.paths.diffusion_model = golden_path("pipeline/qwen_image_tiny/qwen_image_dit.safetensors");
        c.paths.llm = golden_path("pipeline/qwen_image_tiny/qwen_2.5_vl.safetensors");
        c.paths.vae = golden_path("pipeline/qwen_image_tiny/qwen_image_vae.safetensors");
        c.paths.tokenizer = "llm=" + golden_path("pipeline/qwen_image_tiny/tokenizer");
        cases.push_back(c);
    }
    {
        Case c{"Wan", test::wan_tiny_parts(), DiffusionShape{8, 6, 1, 5}};
        c.shape.frames = 2;
        cases.push_back(c);
    }
    for (const Case& c : cases) {
        auto model = load(c.paths);
        ASSERT_TRUE(model) << c.family;
        EXPECT_TRUE(model->diffusion().capabilities().seams) << c.family;
        const std::vector<float> plain = evaluate_pattern(*model, c.shape);
        std::vector<float> wrapped, plain_again;
        {
            const SeamsScope scope(*model, Seams{true, true});
            wrapped = evaluate_pattern(*model, c.shape);
        }
        plain_again = evaluate_pattern(*model, c.shape);
        ASSERT_FALSE(plain.empty()) << c.family;
        ASSERT_EQ(wrapped.size(), plain.size()) << c.family;
        // Deterministic graphs: any difference is the positions' (Flux's tiny 4x4 grid: 4.6e-4).
        EXPECT_GT(test::relative_error(wrapped, plain), 1e-5) << c.family << ": the seams did not reach the positions";
        EXPECT_EQ(plain_again, plain) << c.family << ": the seams outlived their scope";
    }
}

// The networks that cannot wrap their edges refuse the seams by name: SD3's
// MMDiT (positions from a learned table) here.
TEST(Seams, NetworksThatCannotWrapRefuseThem) {
    ModelPaths paths;
    paths.model = {golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors")};
    paths.clip_l = golden_path("pipeline/flux_tiny/clip_l.safetensors");
    paths.clip_g = golden_path("pipeline/sd3_tiny/clip_g.safetensors");
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    auto model = load(paths);
    ASSERT_TRUE(model);
    pipeline::GenerationRequest request;
    request.prompt = "a cat";
    request.width = request.height = 32;
    request.seams = Seams{false, true};
    auto validated = pipeline::validate_request(*model, request);
    ASSERT_FALSE(validated.ok());
    EXPECT_NE(validated.error().message.find("--circular"), std::string::npos) << validated.error().message;
    EXPECT_NE(validated.error().message.find("cannot"), std::string::npos) << validated.error().message;
    request.seams = Seams{};
    EXPECT_TRUE(pipeline::validate_request(*model, request).ok());
}

// With --vae-tiling the tiles pad with zeros, and the image is extended
// across each seam by what lies beyond it first: its edges meet as the whole
// circular decode's do, where tiles that never see the other side leave a
// jump.
TEST(Seams, TiledDecodeMakesTheEdgesWithTheOtherSide) {
    auto model = load_sd1();
    ASSERT_TRUE(model);
    const int64_t w = 16, h = 16, W = 32, H = 32;
    std::vector<float> z(static_cast<size_t>(4 * w * h));
    for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    const pipeline::VaeTiling tiling{8, 0.5f};
    const SeamsScope scope(*model, Seams{true, false});
    const std::vector<float> whole = read_graph(*model, pipeline::build_vae_decode_graph(*model, w, h, z.data()));
    auto tiled = pipeline::decode_tiled(*model, z, w, h, tiling);
    ASSERT_TRUE(tiled.ok()) << tiled.error().message;
    std::vector<float> unaware;
    {
        const SeamsScope plain(*model, Seams{});
        auto t = pipeline::decode_tiled(*model, z, w, h, tiling);
        ASSERT_TRUE(t.ok());
        unaware = *t;
    }
    // How far the image jumps from its last column to its first, against its
    // mean step between neighbouring columns.
    auto seam_jump = [&](const std::vector<float>& image) {
        double jump = 0, step = 0;
        for (int64_t c = 0; c < 3; ++c)
            for (int64_t y = 0; y < H; ++y) {
                const float* row = image.data() + (c * H + y) * W;
                jump += std::abs(row[W - 1] - row[0]);
                for (int64_t x = 0; x + 1 < W; ++x) step += std::abs(row[x + 1] - row[x]) / static_cast<double>(W - 1);
            }
        return jump / step;
    };
    // The whole circular decode's edges meet as its columns do (about 0.95);
    // the tiles extended across the seam keep that, tiles that never see
    // the other side jump (about 1.42).
    EXPECT_LT(std::abs(seam_jump(*tiled) - seam_jump(whole)), 0.1 * seam_jump(whole));
    EXPECT_GT(seam_jump(unaware), 1.3 * seam_jump(whole));
    EXPECT_EQ(model->seams(), (Seams{true, false})) << "the job's seams are back after the tiles";
}

}  // namespace
}  // namespace kiln
