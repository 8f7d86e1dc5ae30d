// `kiln` with a ControlNet end to end: the real binary, the tiny golden SD1
// model and the tiny ControlNet written for its UNet
// (training/make_controlnet_fixtures.py), real image files.
#include <gtest/gtest.h>

#include <fstream>

#include "golden.h"
#include "image/canny.h"
#include "image/image_io.h"
#include "io/model_file.h"
#include "io/name_map.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::run_command;
using test::TempDir;

std::string kiln_with_model(const std::string& args) {
    return test::kiln_with_sd1_tiny("-p \"a red circle\" --steps 3 -s 9 " + args);
}

std::string controlnet() { return test::golden_path("models/controlnet_sd1_tiny.safetensors"); }

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// A white disc on black, as an edge or mask condition would be.
std::string write_condition(const TempDir& dir, const std::string& name, int width, int height) {
    image::Image img = image::make_image(width, height, 3, 0);
    for (int y = 0; y < height; ++y) {
        for (int x = 0; x < width; ++x) {
            const int dx = x - width / 2, dy = y - height / 2;
            if (dx * dx + dy * dy < width * height / 16) std::fill(img.pixel(x, y), img.pixel(x, y) + 3, 255);
        }
    }
    const std::string path = dir.file(name);
    EXPECT_TRUE(image::write_image(path, img).ok());
    return path;
}

std::vector<uint8_t> pixels(const std::string& path) {
    auto img = image::read_image(path);
    EXPECT_TRUE(img.ok()) << path;
    return img.ok() ? img->pixels : std::vector<uint8_t>{};
}

// The image `kiln ARGS -o DIR/NAME` makes; a failed run fails the test.
std::vector<uint8_t> image_of(const TempDir& dir, const std::string& args, const std::string& name) {
    auto r = run_command(kiln_with_model(args + " -o " + dir.file(name)));
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    return r.exit_code == 0 ? pixels(dir.file(name)) : std::vector<uint8_t>{};
}

TEST(CliControlNet, ChangesTheImageAndStrengthZeroChangesNothing) {
    TempDir dir;
    const std::string condition = write_condition(dir, "disc.png", 64, 64);
    auto plain = run_command(kiln_with_model("-W 32 -H 32 -o " + dir.file("plain.png")));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const std::string control = "-W 32 -H 32 --control-net " + controlnet() + " --control-image " + condition;
    auto controlled = run_command(kiln_with_model(control + " -o " + dir.file("controlled.png")));
    ASSERT_EQ(controlled.exit_code, 0) << controlled.err;
    auto zero = run_command(kiln_with_model(control + " --control-strength 0 -o " + dir.file("zero.png")));
    ASSERT_EQ(zero.exit_code, 0) << zero.err;
    EXPECT_NE(pixels(dir.file("controlled.png")), pixels(dir.file("plain.png")));
    EXPECT_EQ(pixels(dir.file("zero.png")), pixels(dir.file("plain.png")));

    auto meta = run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " +
                            dir.file("controlled.png"));
    EXPECT_NE(meta.out.find("ControlNet: controlnet_sd1_tiny, ControlNet weight: 0.9,"), std::string::npos) << meta.out;
}

// A condition of the output's aspect ratio at another size is resized: the
// same disc at 128x128 steers a 32x32 image as it does at 64x64 (the tiny
// VAE halves, so the ControlNet sees 8x the 16x16 latent).
TEST(CliControlNet, ConditionOfTheSameAspectIsResized) {
    TempDir dir;
    const std::string common = "-W 32 -H 32 --control-net " + controlnet() + " --control-image ";
    auto a =
        run_command(kiln_with_model(common + write_condition(dir, "a.png", 64, 64) + " -o " + dir.file("a_out.png")));
    auto b =
        run_command(kiln_with_model(common + write_condition(dir, "b.png", 128, 128) + " -o " + dir.file("b_out.png")));
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    auto plain = run_command(kiln_with_model("-W 32 -H 32 -o " + dir.file("plain.png")));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(pixels(dir.file("a_out.png")).size(), 32u * 32u * 3u);
    EXPECT_NE(pixels(dir.file("b_out.png")), pixels(dir.file("plain.png")));
}

// sd-cli's --canny: the control image, resized to the size the ControlNet
// sees (8x the latent), is replaced by its edges (image/canny.h, checked
// against sd-cli's code in Canny.IsSdClisEdgeImage). The job equals one
// given those edges as its control image, and differs from one given the
// picture itself.
TEST(CliControlNet, CannyConditionsOnTheEdgesOfTheControlImage) {
    TempDir dir;
    image::Image picture = image::make_image(96, 96, 3, 70);  // a grey disc on darker grey, resized to 128
    for (int y = 0; y < 96; ++y) {
        for (int x = 0; x < 96; ++x) {
            if ((x - 40) * (x - 40) + (y - 50) * (y - 50) < 26 * 26)
                std::fill(picture.pixel(x, y), picture.pixel(x, y) + 3, 180);
        }
    }
    const std::string photo = dir.file("photo.png");
    ASSERT_TRUE(image::write_image(photo, picture).ok());
    auto resized = image::resize_image(picture, 128, 128);
    ASSERT_TRUE(resized.ok());
    const std::string edges = dir.file("edges.png");
    ASSERT_TRUE(image::write_image(edges, image::canny_edges(*resized)).ok());

    const std::string common = "-W 32 -H 32 --control-net " + controlnet() + " --control-image ";
    const auto canny = image_of(dir, common + photo + " --canny", "canny.png");
    ASSERT_FALSE(canny.empty());
    EXPECT_EQ(canny, image_of(dir, common + edges, "given.png"));
    EXPECT_NE(canny, image_of(dir, common + photo, "raw.png"));
    auto meta =
        run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + dir.file("canny.png"));
    EXPECT_NE(meta.out.find("ControlNet preprocessor: canny"), std::string::npos) << meta.out;

    // Without a control image there is nothing to preprocess: a warning, as
    // sd-cli takes the flag.
    auto alone = run_command(kiln_with_model("-W 32 -H 32 --canny -o " + dir.file("alone.png")));
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_NE(alone.out.find("--canny without --control-image"), std::string::npos) << alone.out;
}

// The tiny ControlNet rewritten in diffusers' ControlNetModel names (as its
// diffusion_pytorch_model.safetensors, and as that file in a folder): the
// UNet encoder's names through the UNet name map run backwards, the rest as
// diffusers' conversion script pairs them. Same image as the original names.
TEST(CliControlNet, DiffusersControlNetGivesTheSameImage) {
    TempDir dir;
    auto tiny = io::ModelFile::open({controlnet()});
    ASSERT_TRUE(tiny.ok());
    io::UnetLayout layout;  // the tiny UNet's: 2 levels of 1 resnet, attention on both
    layout.levels = 2;
    layout.layers_per_block = 1;
    layout.attention_levels = 0b11;
    const io::NameMap map(io::ModelFamily::SD1, layout);
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : tiny->tensors()) {
        std::string name = t.name.substr(std::string("control_model.").size());
        const size_t dot = name.find('.', name.find('.') + 1);
        const std::string head = name.substr(0, name.find('.')),
                          index = name.substr(head.size() + 1, dot - head.size() - 1);
        const std::string param = name.substr(name.rfind('.') + 1);
        if (head == "input_hint_block") {
            const int k = std::stoi(index);
            name = k == 0    ? "controlnet_cond_embedding.conv_in." + param
                   : k == 14 ? "controlnet_cond_embedding.conv_out." + param
                             : "controlnet_cond_embedding.blocks." + std::to_string(k / 2 - 1) + "." + param;
        } else if (head == "zero_convs") {
            name = "controlnet_down_blocks." + index + "." + param;
        } else if (head == "middle_block_out") {
            name = "controlnet_mid_block." + param;
        } else {
            auto names = map.ldm_to_diffusers("model.diffusion_model." + name);
            ASSERT_TRUE(names && names->tensors.size() == 1) << t.name;
            name = names->tensors[0].name;
        }
        entries.push_back(test::copy_entry(*tiny, t, name));
    }
    const auto bytes = test::build_safetensors(entries, {{"kiln.unet.heads", "2"}});
    const std::string file = dir.write("diffusion_pytorch_model.safetensors", bytes);
    const std::string folder = dir.file("controlnet");
    dir.write("controlnet/diffusion_pytorch_model.safetensors", bytes);

    const std::string condition = write_condition(dir, "disc.png", 64, 64);
    const std::string common = "-W 32 -H 32 --control-image " + condition + " --control-net ";
    const auto ldm = image_of(dir, common + controlnet(), "ldm.png");
    ASSERT_FALSE(ldm.empty());
    EXPECT_EQ(image_of(dir, common + file, "single.png"), ldm);
    EXPECT_EQ(image_of(dir, common + folder, "folder.png"), ldm);
}

TEST(CliControlNet, BadInputFailsCleanlyWithoutOutput) {
    TempDir dir;
    const std::string condition = write_condition(dir, "disc.png", 64, 64);
    const std::string wide = write_condition(dir, "wide.png", 64, 32);
    // An SDXL-wide ControlNet: the tiny one with 2048-wide cross-attention keys.
    auto tiny = io::ModelFile::open({controlnet()});
    ASSERT_TRUE(tiny.ok());
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : tiny->tensors()) {
        const bool kv =
            t.name.find("attn2.to_k.") != std::string::npos || t.name.find("attn2.to_v.") != std::string::npos;
        if (!kv) {
            entries.push_back(test::copy_entry(*tiny, t, t.name));
            continue;
        }
        entries.push_back({t.name, "F32", {t.shape[0], 2048}, std::vector<uint8_t>(t.shape[0] * 2048 * 4, 0)});
    }
    const std::string sdxl_wide =
        dir.write("sdxl_wide.safetensors", test::build_safetensors(entries, {{"kiln.unet.heads", "2"}}));
    const std::string out = dir.file("out.png");
    struct Case {
        std::string args;
        int exit_code;
        std::string message;
    };
    const Case cases[] = {
        {"-W 32 -H 32 --control-net " + controlnet() + " --control-image " + wide, 2,
         "error: --control-image is 64x32, another aspect ratio than the 32x32 output"},
        {"-W 32 -H 32 --control-image " + condition, 2,
         "error: --control-image needs a ControlNet: pass --control-net FILE"},
        {"-W 32 -H 32 --control-net " + test::golden_path("models/sd1_tiny.safetensors") + " --control-image " +
             condition,
         1, "not a ControlNet (no input_hint_block; found: SD1.x)"},
        {"-W 32 -H 32 --control-net " + sdxl_wide + " --control-image " + condition, 1,
         "a ControlNet for SDXL (context width 2048), the model is SD1.x (its UNet's context width is 64)"},
        {"-W 32 -H 32 --control-net " + dir.file("missing.safetensors") + " --control-image " + condition, 1,
         "missing.safetensors"},
        {"-W 32 -H 32 --control-net " + controlnet() + " --control-image " + dir.file("missing.png"), 1,
         "--control-image: "},
        {"-W 32 -H 32 --control-net " + controlnet() + " --control-strength -1", 2,
         "--control-strength: expected a number from 0 to 10, got '-1'"},
    };
    for (const Case& c : cases) {
        auto r = run_command(kiln_with_model(c.args + " -o " + out));
        EXPECT_EQ(r.exit_code, c.exit_code) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
        EXPECT_FALSE(exists(out)) << c.args;
    }
}

// kiln plan counts the ControlNet as a module of its own.
TEST(CliControlNet, PlanCountsTheControlNet) {
    auto r =
        run_command(std::string(KILN_BIN) + " plan -t 1 -m " + test::golden_path("models/sd1_tiny.safetensors") +
                    " --tokenizer " + KILN_FIXTURES_DIR + "/tiny_tokenizer -W 32 -H 32 --control-net " + controlnet());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("control: computes on CPU"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("  control on CPU: "), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
