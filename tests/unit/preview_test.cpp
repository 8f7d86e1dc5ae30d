// Live previews (pipeline/preview.h, --preview): the latent-to-RGB factors of
// every family against ComfyUI's comfy/latent_formats.py (the numbers sd-cli's
// latent-preview.h also has), the projection's arithmetic, a preview file
// written at each interval of a real run and replaced each time, and the C
// API's preview callback called at the right steps.
#include "pipeline/preview.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "golden.h"
#include "image/image_io.h"
#include "kiln.h"
#include "models/registry.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::run_command;
using test::TempDir;

using Factors = std::vector<std::array<float, 3>>;

// comfy/latent_formats.py, class SD15 (used for SD1.x and SD2.x): no bias.
const Factors kSd15 = {{0.3512f, 0.2297f, 0.3227f},
                       {0.3250f, 0.4974f, 0.2350f},
                       {-0.2829f, 0.1762f, 0.2721f},
                       {-0.2120f, -0.2616f, -0.7177f}};
// class SDXL.
const Factors kSdxl = {{0.3651f, 0.4232f, 0.4341f},
                       {-0.2533f, -0.0042f, 0.1068f},
                       {0.1076f, 0.1111f, -0.0362f},
                       {-0.3165f, -0.2492f, -0.2188f}};
const std::array<float, 3> kSdxlBias = {0.1084f, -0.0175f, -0.0011f};
// class Flux (sd-cli uses it for Flux, Chroma and Z-Image).
const Factors kFlux = {{-0.0346f, 0.0244f, 0.0681f},  {0.0034f, 0.0210f, 0.0687f},    {0.0275f, -0.0668f, -0.0433f},
                       {-0.0174f, 0.0160f, 0.0617f},  {0.0859f, 0.0721f, 0.0329f},    {0.0004f, 0.0383f, 0.0115f},
                       {0.0405f, 0.0861f, 0.0915f},   {-0.0236f, -0.0185f, -0.0259f}, {-0.0245f, 0.0250f, 0.1180f},
                       {0.1008f, 0.0755f, -0.0421f},  {-0.0515f, 0.0201f, 0.0011f},   {0.0428f, -0.0012f, -0.0036f},
                       {0.0817f, 0.0765f, 0.0749f},   {-0.1264f, -0.0522f, -0.1103f}, {-0.0280f, -0.0881f, -0.0499f},
                       {-0.1262f, -0.0982f, -0.0778f}};
const std::array<float, 3> kFluxBias = {-0.0329f, -0.0718f, -0.0851f};

const models::Family& family_named(const std::string& name) {
    for (const models::Family* f : models::families()) {
        if (f->name == name) return *f;
    }
    ADD_FAILURE() << "no family " << name;
    return *models::families().front();
}

TEST(PreviewFactors, EveryFamilyHasItsLatentFormatsProjection) {
    std::vector<std::string> checked;
    for (const models::Family* f : models::families()) {
        const models::LatentFormat& l = f->latent;
        ASSERT_EQ(static_cast<int>(l.rgb_factors.size()), l.channels) << f->name;
        if (f->name == "SD1.x" || f->name == "SD2.x") {
            EXPECT_EQ(l.rgb_factors, kSd15) << f->name;
            EXPECT_EQ(l.rgb_bias, (std::array<float, 3>{0, 0, 0})) << f->name;
        } else if (f->name == "SDXL") {
            EXPECT_EQ(l.rgb_factors, kSdxl);
            EXPECT_EQ(l.rgb_bias, kSdxlBias);
        } else if (f->name.rfind("FLUX.2", 0) == 0) {
            // ComfyUI's Flux2 rows (per KL channel), a quarter on each of the
            // channel's four 2x2-patch channels: channel 3's row is 0.2144,
            // 0.3009, 0.3652.
            EXPECT_EQ(l.channels, 128) << f->name;
            for (int k = 0; k < 4; ++k) {
                EXPECT_EQ(l.rgb_factors[static_cast<size_t>(3 * 4 + k)],
                          (std::array<float, 3>{0.2144f / 4, 0.3009f / 4, 0.3652f / 4}))
                    << f->name;
            }
            EXPECT_EQ(l.rgb_bias, kFluxBias) << f->name;
        } else if (f->name.rfind("Qwen-Image", 0) == 0 || f->name == "Wan") {
            // ComfyUI's Wan21 rows (Qwen-Image decodes with Wan 2.1's VAE): the first and last, and its own bias.
            EXPECT_EQ(l.channels, 16) << f->name;
            EXPECT_EQ(l.rgb_factors.front(), (std::array<float, 3>{-0.1299f, -0.1692f, 0.2932f})) << f->name;
            EXPECT_EQ(l.rgb_factors.back(), (std::array<float, 3>{0.1984f, 0.0913f, 0.1861f})) << f->name;
            EXPECT_EQ(l.rgb_bias, (std::array<float, 3>{-0.1835f, -0.0868f, -0.3360f})) << f->name;
        } else if (f->name.rfind("SD3", 0) == 0) {
            // ComfyUI's SD3 rows: the first and last, and its own bias.
            EXPECT_EQ(l.channels, 16) << f->name;
            EXPECT_EQ(l.rgb_factors.front(), (std::array<float, 3>{-0.0922f, -0.0175f, 0.0749f})) << f->name;
            EXPECT_EQ(l.rgb_factors.back(), (std::array<float, 3>{-0.1448f, -0.1463f, -0.1189f})) << f->name;
            EXPECT_EQ(l.rgb_bias, (std::array<float, 3>{0.2394f, 0.2135f, 0.1925f})) << f->name;
        } else {
            // Flux.1-dev, schnell, Chroma, Z-Image: Flux's 16-channel latent.
            EXPECT_EQ(l.channels, 16) << f->name;
            EXPECT_EQ(l.rgb_factors, kFlux) << f->name;
            EXPECT_EQ(l.rgb_bias, kFluxBias) << f->name;
        }
        checked.push_back(f->name);
    }
    EXPECT_GE(checked.size(), 6u);
    EXPECT_EQ(family_named("SDXL").latent.scale, 0.13025f);
}

TEST(PreviewProjection, ComputesEachPixelAsSdCliDoes) {
    // Two pixels of SDXL's latent: (1, 0, 0, 0) and (0, 0, 0, 10).
    const int64_t w = 2, h = 1;
    std::vector<float> latent(4 * w * h, 0.0f);
    latent[0 * 2 + 0] = 1.0f;
    latent[3 * 2 + 1] = 10.0f;
    auto img = pipeline::project_latent_to_rgb(latent, w, h, family_named("SDXL").latent);
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_EQ(img->width, 2);
    EXPECT_EQ(img->height, 1);
    // (0.3651 + 0.1084) / 2 + 0.5 = 0.73675 -> 187.87 truncated; (0.4232 - 0.0175) / 2 + 0.5 = 0.70285 -> 179.2;
    // (0.4341 - 0.0011) / 2 + 0.5 = 0.7165 -> 182.7.
    EXPECT_EQ(img->pixels[0], 187);
    EXPECT_EQ(img->pixels[1], 179);
    EXPECT_EQ(img->pixels[2], 182);
    // 10 * (-0.3165, -0.2492, -0.2188) + bias: far below -1, clamped to 0.
    EXPECT_EQ(img->pixels[3], 0);
    EXPECT_EQ(img->pixels[4], 0);
    EXPECT_EQ(img->pixels[5], 0);

    auto wrong = pipeline::project_latent_to_rgb(std::vector<float>(5), w, h, family_named("SDXL").latent);
    EXPECT_FALSE(wrong.ok());
}

TEST(PreviewMode, ParsesSdCliNamesAndRefusesOthers) {
    EXPECT_EQ(*pipeline::parse_preview_mode("proj"), pipeline::PreviewMode::Proj);
    EXPECT_EQ(*pipeline::parse_preview_mode("tae"), pipeline::PreviewMode::Tae);
    EXPECT_EQ(*pipeline::parse_preview_mode("vae"), pipeline::PreviewMode::Vae);
    EXPECT_EQ(*pipeline::parse_preview_mode("none"), pipeline::PreviewMode::None);
    auto bad = pipeline::parse_preview_mode("taesd");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(bad.error().message.find("proj, tae, vae"), std::string::npos);
}

std::string kiln_tiny_sd1(const std::string& args) {
    return std::string(KILN_BIN) + " -t 1 -m " + test::golden_path("models/sd1_tiny.safetensors") + " --tokenizer " +
           KILN_FIXTURES_DIR + "/tiny_tokenizer " + args;
}

// The steps at which the CLI wrote a preview, from its debug log.
std::vector<int> preview_steps(const std::string& log) {
    std::vector<int> steps;
    const std::regex line("preview of image 1 at step ([0-9]+)");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
        steps.push_back(std::stoi((*it)[1]));
    }
    return steps;
}

// Only `name` in the folder: the preview's temporary file was renamed over it.
void expect_only_file(const TempDir& dir, const std::string& name, const std::string& output) {
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
        const std::string f = entry.path().filename().string();
        EXPECT_TRUE(f == name || f == output) << "left behind: " << f;
    }
}

TEST(CliPreview, VaePreviewOfTheTinySd1ModelIsReplacedAtEachInterval) {
    TempDir dir;
    const std::string preview = dir.file("live.png");
    auto r =
        run_command(kiln_tiny_sd1("--log-level debug -p \"a red circle\" -W 48 -H 32 --steps 5 "
                                  "--preview vae --preview-interval 2 --preview-path " +
                                  preview + " -o " + dir.file("out.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(preview_steps(r.out), (std::vector<int>{2, 4})) << r.out;
    auto img = image::read_image(preview);
    ASSERT_TRUE(img.ok()) << img.error().message;
    // The VAE's preview is the image's size: the latent's (24x16) times the tiny VAE's 2.
    EXPECT_EQ(img->width, 48);
    EXPECT_EQ(img->height, 32);
    // Replaced, not appended: the file is exactly one PNG (its IEND chunk ends it).
    std::ifstream in(preview, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(bytes.size(), 12u);
    EXPECT_EQ(bytes.find("IEND"), bytes.size() - 8);
    EXPECT_EQ(bytes.find("\x89PNG", 1), std::string::npos);
    expect_only_file(dir, "live.png", "out.png");
}

TEST(CliPreview, DefaultModelWritesProjectionAndVaePreviews) {
    TempDir dir;
    const std::string base = std::string(KILN_BIN) +
                             " -t 1 --log-level debug -p \"a red circle\" -W 64 -H 64 "
                             "--steps 3 -o " +
                             dir.file("out.png");
    // proj: one pixel per latent pixel (the default model's VAE is 4x: 16x16), as sd-cli's projection.
    auto proj = run_command(base + " --preview proj --preview-path " + dir.file("proj.png"));
    ASSERT_EQ(proj.exit_code, 0) << proj.err;
    EXPECT_EQ(preview_steps(proj.out), (std::vector<int>{1, 2, 3})) << proj.out;
    auto small = image::read_image(dir.file("proj.png"));
    ASSERT_TRUE(small.ok()) << small.error().message;
    EXPECT_EQ(small->width, 16);
    EXPECT_EQ(small->height, 16);
    // vae with --preview-noisy: the latent size times the VAE's 4.
    auto vae = run_command(base + " --preview vae --preview-noisy --preview-interval 3 --preview-path " +
                           dir.file("vae.webp"));
    ASSERT_EQ(vae.exit_code, 0) << vae.err;
    EXPECT_EQ(preview_steps(vae.out), (std::vector<int>{3})) << vae.out;
    auto full = image::read_image(dir.file("vae.webp"));
    ASSERT_TRUE(full.ok()) << full.error().message;
    EXPECT_EQ(full->width, 64);
    EXPECT_EQ(full->height, 64);
}

TEST(CliPreview, BadPreviewFlagsAreUsageErrors) {
    TempDir dir;
    auto mode = run_command(kiln_tiny_sd1("-p x --preview fast -o " + dir.file("o.png")));
    EXPECT_EQ(mode.exit_code, 2);
    EXPECT_NE(mode.err.find("--preview"), std::string::npos) << mode.err;
    auto interval = run_command(kiln_tiny_sd1("-p x --preview proj --preview-interval 0 -o " + dir.file("o.png")));
    EXPECT_EQ(interval.exit_code, 2);
    EXPECT_NE(interval.err.find("--preview-interval"), std::string::npos) << interval.err;
    auto path = run_command(
        kiln_tiny_sd1("-p x --preview proj --preview-path " + dir.file("p.txt") + " -o " + dir.file("o.png")));
    EXPECT_EQ(path.exit_code, 2);
    EXPECT_NE(path.err.find("--preview-path"), std::string::npos) << path.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.png")));
}

// What the C API's callbacks saw.
struct Seen {
    std::vector<std::pair<int, int>> previews;  // (image, step)
    std::vector<std::pair<uint32_t, uint32_t>> sizes;
    bool any_colour = false;
};

void on_preview(int image, int step, const kiln_image* preview, void* user_data) {
    auto* seen = static_cast<Seen*>(user_data);
    seen->previews.push_back({image, step});
    seen->sizes.push_back({preview->width, preview->height});
    EXPECT_EQ(preview->channels, 3u);
    EXPECT_EQ(preview->parameters, nullptr);
    for (uint32_t i = 0; i < preview->width * preview->height * 3; ++i) {
        if (preview->data[i] != preview->data[0]) seen->any_colour = true;
    }
}

TEST(CApiPreview, CallbackGetsEachImagesStepsAtTheInterval) {
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    const std::string model = test::golden_path("models/sd1_tiny.safetensors");
    const std::string tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    cp.model_path = model.c_str();
    cp.tokenizer_path = tokenizer.c_str();
    cp.n_threads = 1;
    kiln_context* ctx = nullptr;
    char* error = nullptr;
    ASSERT_EQ(kiln_context_create(&cp, &ctx, &error), KILN_OK) << (error ? error : "");
    kiln_model_info info;
    kiln_context_info(ctx, &info);
    EXPECT_EQ(info.latent_preview, 1);  // SD1's projection fits the tiny model's 4-channel latent

    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle";
    gp.width = 48;
    gp.height = 32;
    gp.steps = 7;
    gp.batch_count = 2;
    gp.preview_mode = KILN_PREVIEW_PROJ;
    gp.preview_interval = 3;
    Seen seen;
    gp.preview = &on_preview;
    gp.preview_user_data = &seen;
    kiln_image* images = nullptr;
    int n = 0;
    ASSERT_EQ(kiln_generate(ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    kiln_images_free(images, n);
    EXPECT_EQ(seen.previews, (std::vector<std::pair<int, int>>{{0, 3}, {0, 6}, {1, 3}, {1, 6}}));
    for (const auto& size : seen.sizes) EXPECT_EQ(size, (std::pair<uint32_t, uint32_t>{24, 16}));
    EXPECT_TRUE(seen.any_colour);

    // A mode without a callback makes no previews; a bad mode or interval is an invalid request.
    gp.preview = nullptr;
    seen = Seen{};
    ASSERT_EQ(kiln_generate(ctx, &gp, &images, &n, &error), KILN_OK);
    kiln_images_free(images, n);
    EXPECT_TRUE(seen.previews.empty());
    gp.preview = &on_preview;
    gp.preview_interval = 10001;
    EXPECT_EQ(kiln_generate(ctx, &gp, &images, &n, &error), KILN_ERROR_INVALID_REQUEST);
    EXPECT_NE(std::string(error).find("--preview-interval"), std::string::npos) << error;
    kiln_free_string(error);
    error = nullptr;
    gp.preview_interval = 1;
    gp.preview_mode = static_cast<kiln_preview_mode>(7);
    EXPECT_EQ(kiln_generate(ctx, &gp, &images, &n, &error), KILN_ERROR_INVALID_REQUEST);
    kiln_free_string(error);
    kiln_context_free(ctx);
}

// --taesd on the default model: --preview tae decodes with it at the
// image's size, it decodes the final image unless --taesd-preview-only
// (then the image is the VAE's, byte for byte), and a tiny autoencoder of
// another latent is refused naming the file.
TEST(CliTaesd, DecodesPreviewsAndTheFinalImageUnlessPreviewOnly) {
    TempDir dir;
    // A 4x tiny autoencoder, as the default model's VAE is 4x.
    const std::string taesd = test::golden_path("models/taesd_x4_tiny.safetensors");
    const std::string base =
        std::string(KILN_BIN) + " -t 1 --log-level debug -p \"a red circle\" -W 64 -H 64 --steps 2 -s 3 ";
    ASSERT_EQ(run_command(base + "-o " + dir.file("vae.png")).exit_code, 0);
    auto tae = run_command(base + "--taesd " + taesd + " --preview tae --preview-path " + dir.file("p.png") + " -o " +
                           dir.file("tae.png"));
    ASSERT_EQ(tae.exit_code, 0) << tae.err;
    EXPECT_EQ(preview_steps(tae.out), (std::vector<int>{1, 2})) << tae.out;
    auto preview = image::read_image(dir.file("p.png"));
    ASSERT_TRUE(preview.ok()) << preview.error().message;
    EXPECT_EQ(preview->width, 64);
    EXPECT_EQ(preview->height, 64);
    auto only = run_command(base + "--taesd " + taesd + " --taesd-preview-only -o " + dir.file("only.png"));
    ASSERT_EQ(only.exit_code, 0) << only.err;

    auto vae = image::read_image(dir.file("vae.png"));
    auto by_tae = image::read_image(dir.file("tae.png"));
    auto preview_only = image::read_image(dir.file("only.png"));
    ASSERT_TRUE(vae.ok() && by_tae.ok() && preview_only.ok());
    EXPECT_EQ(by_tae->width, 64);
    EXPECT_NE(by_tae->pixels, vae->pixels);
    EXPECT_EQ(preview_only->pixels, vae->pixels);

    auto wrong = run_command(base + "--taesd " + test::golden_path("models/taef1_tiny.safetensors") + " -o " +
                             dir.file("wrong.png"));
    EXPECT_EQ(wrong.exit_code, 1);
    EXPECT_NE(wrong.err.find("taef1_tiny.safetensors (--taesd): a tiny autoencoder for 16-channel latents"),
              std::string::npos)
        << wrong.err;
    auto upscale = run_command(base + "--taesd " + test::golden_path("models/taesd_tiny.safetensors") + " -o " +
                               dir.file("wrong.png"));
    EXPECT_EQ(upscale.exit_code, 1);
    EXPECT_NE(upscale.err.find("(--taesd): it upscales 8x, the model's VAE 4x"), std::string::npos) << upscale.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("wrong.png")));
}

}  // namespace
}  // namespace kiln
