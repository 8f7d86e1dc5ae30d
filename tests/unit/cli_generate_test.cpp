// `kiln` generating images end to end: the real binary, the tiny golden SD1
// model, the tokenizer fixture, real image files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "golden.h"
#include "image/image_io.h"
#include "pixel_difference.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::kiln_with_sd1_tiny;
using test::run_command;
using test::TempDir;

bool exists(const std::string& path) { return std::ifstream(path).good(); }

TEST(CliGenerate, WritesAnImageOfTheRequestedSizeWithItsParameters) {
    TempDir dir;
    const std::string out = dir.file("out.png");
    auto r = run_command(
        kiln_with_sd1_tiny("-p \"a red circle\" -n blurry -W 48 -H 32 --steps 3 -s 5 --cfg-scale 4 -o " + out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto img = image::read_image(out);
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_EQ(img->width, 48);
    EXPECT_EQ(img->height, 32);
    EXPECT_EQ(img->channels, 3);

    auto meta = run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + out);
    ASSERT_EQ(meta.exit_code, 0) << meta.err;
    // "Model hash": the model file's SHA-256, first 10 hex digits (A1111's AutoV2).
    auto sha = run_command("sha256sum " + test::golden_path("models/sd1_tiny.safetensors"));
    ASSERT_EQ(sha.exit_code, 0) << sha.err;
    EXPECT_EQ(meta.out,
              "a red circle\nNegative prompt: blurry\nSteps: 3, Sampler: Euler a, Schedule type: discrete, CFG scale: "
              "4, Seed: 5, Size: 48x32, Model hash: " +
                  sha.out.substr(0, 10) + ", Model: sd1_tiny, RNG: cuda, Version: kiln " KILN_VERSION "\n");
}

// Every sampling step runs the same UNet graph: it is built and allocated
// once, then only its inputs change (docs/architecture.md: no per-step rebuilds).
TEST(CliGenerate, UnetGraphIsBuiltOncePerSamplingRun) {
    TempDir dir;
    auto r =
        run_command(kiln_with_sd1_tiny("-v -p x -W 32 -H 32 --steps 6 --sampling-method heun -o " + dir.file("o.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Heun evaluates the UNet twice per step but the last: 11 evaluations.
    EXPECT_NE(r.out.find("diffusion graph: built once, allocated 1 time(s) for 11 evaluation(s)"), std::string::npos)
        << r.out;
}

TEST(CliGenerate, SameSeedSameImageOtherSeedOtherImage) {
    TempDir dir;
    const std::string common = "-p \"a red circle\" -W 32 -H 32 --steps 2 --sampling-method euler ";
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "-s 1 -o " + dir.file("a.png"))).exit_code, 0);
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "-s 1 -o " + dir.file("b.png"))).exit_code, 0);
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "-s 2 -o " + dir.file("c.png"))).exit_code, 0);
    auto a = image::read_image(dir.file("a.png"));
    auto b = image::read_image(dir.file("b.png"));
    auto c = image::read_image(dir.file("c.png"));
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->pixels, b->pixels);
    EXPECT_NE(a->pixels, c->pixels);
}

TEST(CliGenerate, BatchesNumberTheirFilesAndSeeds) {
    TempDir dir;
    auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -b 2 -s 10 -o " + dir.file("img_%03d.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(exists(dir.file("img_000.png")));
    ASSERT_TRUE(exists(dir.file("img_001.png")));
    auto meta =
        run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + dir.file("img_001.png"));
    EXPECT_NE(meta.out.find("Seed: 11,"), std::string::npos) << meta.out;
    // sd-cli's names without a field: NAME_<n> from --output-begin-idx; .png for a name without an image format.
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -b 2 -o " + dir.file("b.png"))).exit_code, 0);
    EXPECT_TRUE(exists(dir.file("b_0.png")) && exists(dir.file("b_1.png")) && !exists(dir.file("b.png")));
    ASSERT_EQ(
        run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -b 2 --output-begin-idx 7 -o " + dir.file("c")))
            .exit_code,
        0);
    EXPECT_TRUE(exists(dir.file("c_7.png")) && exists(dir.file("c_8.png")));
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -o " + dir.file("d.bmp"))).exit_code, 0);
    EXPECT_TRUE(exists(dir.file("d.bmp.png")));
}

// A run without -m says which model it uses.
TEST(CliGenerate, TheDefaultModelIsNamed) {
    TempDir dir;
    auto r = run_command(std::string(KILN_BIN) + " -t 1 -p x -W 32 -H 32 --steps 1 -o " + dir.file("o.png"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("model: " + std::string(KILN_DEFAULT_MODEL) + " (the default; -m chooses another)"),
              std::string::npos)
        << "out: " << r.out << "\nerr: " << r.err;
}

TEST(CliGenerate, JpegAndWebpOutputs) {
    TempDir dir;
    for (const char* name : {"o.jpg", "o.webp"}) {
        auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -o " + dir.file(name)));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        auto img = image::read_image(dir.file(name));
        ASSERT_TRUE(img.ok()) << img.error().message;
        EXPECT_EQ(img->width, 32);
    }
}

TEST(CliGenerate, ImageToImageStartsFromTheGivenImage) {
    TempDir dir;
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 -o " + dir.file("init.png"))).exit_code, 0);
    auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 4 --strength 0.5 -i " + dir.file("init.png") +
                                            " -o " + dir.file("out.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto meta =
        run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + dir.file("out.png"));
    EXPECT_NE(meta.out.find("Denoising strength: 0.5"), std::string::npos) << meta.out;
}

std::string write_mask(const TempDir& dir, const std::string& name, uint8_t value) {
    image::Image mask = image::make_image(32, 32, 1, value);
    const std::string path = dir.file(name);
    EXPECT_TRUE(image::write_image(path, mask).ok());
    return path;
}

// --vae-tiling: a 64x64 latent in 16-pixel tiles decodes to an image of the
// right size that stays close to the untiled one (the tiny VAE sees far, so
// tiles differ a little: tests/unit/vae_tiling_test.cpp measures by how much).
TEST(CliGenerate, VaeTilingMakesTheSameSizeOfImage) {
    TempDir dir;
    const std::string common = "-p x -W 64 -H 64 --steps 1 -s 3 ";
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "-o " + dir.file("whole.png"))).exit_code, 0);
    auto r = run_command(kiln_with_sd1_tiny(common + "--vae-tiling --vae-tile-size 16x16 --vae-tile-overlap 0.5 -o " +
                                            dir.file("tiled.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto whole = image::read_image(dir.file("whole.png"));
    auto tiled = image::read_image(dir.file("tiled.png"));
    ASSERT_TRUE(whole.ok() && tiled.ok());
    ASSERT_EQ(tiled->width, 64);
    const double diff = test::pixel_difference(*whole, *tiled).mean;
    EXPECT_GT(diff, 0.0) << "tiling must have run";
    EXPECT_LT(diff, 20.0) << "mean absolute pixel difference";
    r = run_command(kiln_with_sd1_tiny(common + "--vae-tiling --vae-tile-size 16x8 -o " + dir.file("x.png")));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("only square tiles are supported"), std::string::npos) << r.err;
}

// Latent masking with a regular UNet: an all-black mask keeps everything, the
// init image's latent sample at the job's seed (as sd-cli and A1111 keep it),
// so neither the prompt nor the steps can matter; an all-white one repaints
// everything, so the seed must.
TEST(CliGenerate, InpaintingWithARegularUnetKeepsTheBlackArea) {
    TempDir dir;
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 -o " + dir.file("init.png"))).exit_code, 0);
    const std::string keep = write_mask(dir, "keep.png", 0);
    const std::string repaint = write_mask(dir, "repaint.png", 255);
    auto run = [&](const std::string& mask, const std::string& prompt, int steps, int seed, const std::string& out) {
        auto r = run_command(kiln_with_sd1_tiny("-p \"" + prompt + "\" -W 32 -H 32 --steps " + std::to_string(steps) +
                                                " --strength 1 -i " + dir.file("init.png") + " --mask " + mask +
                                                " -s " + std::to_string(seed) + " -o " + dir.file(out)));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return image::read_image(dir.file(out)).value().pixels;
    };
    EXPECT_EQ(run(keep, "x", 3, 1, "k1.png"), run(keep, "a red cat", 2, 1, "k2.png"));
    EXPECT_NE(run(repaint, "x", 3, 1, "r1.png"), run(repaint, "x", 3, 2, "r2.png"));
}

TEST(CliGenerate, InpaintingUnetTakesTheMaskAndMaskedImage) {
    TempDir dir;
    ASSERT_EQ(run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 -o " + dir.file("init.png"))).exit_code, 0);
    const std::string inpaint_unet = test::golden_path("models/sd1_inpaint_tiny.safetensors");
    auto r = run_command(kiln_with_sd1_tiny("--diffusion-model " + inpaint_unet +
                                            " -p x -W 32 -H 32 --steps 2 --strength 1 -i " + dir.file("init.png") +
                                            " --mask " + write_mask(dir, "m.png", 255) + " -o " + dir.file("out.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(image::read_image(dir.file("out.png")).ok());
    r = run_command(
        kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 --mask " + dir.file("m.png") + " -o " + dir.file("x.png")));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--mask needs an init image (-i)"), std::string::npos) << r.err;
}

// Each bad request: one error line naming the problem, a non-zero exit, no file.
TEST(CliGenerate, BadRequestsFailCleanlyWithoutOutput) {
    TempDir dir;
    const std::string out = dir.file("out.png");
    ASSERT_TRUE(image::write_image(dir.file("small.png"), image::make_image(16, 16, 3, 128)).ok());
    ASSERT_TRUE(image::write_image(dir.file("init.png"), image::make_image(32, 32, 3, 128)).ok());
    dir.write("notes.png", std::string("this is not an image"));
    struct Case {
        std::string args;
        int exit_code;
        std::string message;
    };
    const std::vector<Case> cases = {
        {"-W 30 -H 32", 2, "width and height must be multiples of 4 for this model (SD1.x), got 30x32"},
        {"--steps 0", 2, "--steps: expected an integer from 1 to 10000, got 0"},
        {"--cfg-scale -1", 2, "--cfg-scale: expected a number from 0 to 1000, got '-1'"},
        {"--cfg-scale 1e39", 2, "--cfg-scale: expected a number from 0 to 1000, got '1e39'"},
        {"-s 18446744073709551615", 2, "--seed: expected an integer from -1 to 9223372036854775807"},
        {"--sampling-method fast", 2, "euler, euler_a, heun"},
        {"--scheduler weird", 2, "discrete, karras"},
        {"--rng gpu", 2, "--rng: unknown RNG 'gpu' (valid: cpu, cuda, std_default)"},
        {"--max-vram bogus=1", 2, "--max-vram: unknown device 'BOGUS' (valid: "},
        {"-i " + dir.file("missing.png"), 1, "missing.png"},
        {"-i " + dir.file("small.png"), 2, "init image is 16x16 but the requested size is 32x32"},
        {"-i " + dir.file("init.png") + " --mask " + dir.file("small.png"), 2,
         "mask is 16x16 but the init image is 32x32"},
        {"-i " + dir.file("notes.png"), 1, "notes.png"},
        {"--strength 1.5", 2, "--strength: expected a number in (0, 1], got '1.5'"},
        {"--max-sequence-length 256", 2, "--max-sequence-length is T5's token count, and SD1.x has no T5"},
        {"--max-sequence-length 0", 2, "--max-sequence-length: expected an integer from 1 to 512, got 0"},
        // Self-attention over 2048 x 2048 latent pixels cannot be allocated: a clean error, not a crash.
        {"-W 8192 -H 8192", 1, "out of memory: diffusion segment"},
    };
    for (const Case& c : cases) {
        auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -b 2 " + c.args + " -o " + out));
        EXPECT_EQ(r.exit_code, c.exit_code) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
        EXPECT_FALSE(exists(dir.file("out_0.png")) || exists(dir.file("out_1.png"))) << c.args;
    }
}

// A place the image cannot go is found before the model loads: the model
// here does not exist, so an error naming it would mean it was loaded first.
TEST(CliGenerate, AnOutputThatCannotBeWrittenIsRefusedBeforeTheModelLoads) {
    TempDir dir;
    std::filesystem::create_directories(dir.file("taken.png"));
    dir.write("plain", std::string("a file"));
    struct Case {
        std::string output, message;
    };
    for (const Case& c : std::vector<Case>{
             {"/no/such/dir/o.png", "the folder /no/such/dir does not exist"},
             {dir.file("taken.png"), "is a folder"},
             {dir.file("plain") + "/o.png", dir.file("plain") + " is not a folder"},
             {dir.file("nowhere") + "/img_%03d.png", "the folder " + dir.file("nowhere") + " does not exist"},
         }) {
        auto r = run_command(std::string(KILN_BIN) + " -m " + dir.file("missing.safetensors") + " -p x -o '" +
                             c.output + "'");
        EXPECT_EQ(r.exit_code, 2) << c.output << ": " << r.err;
        EXPECT_NE(r.err.find("-o " + c.output + ": " + c.message), std::string::npos) << r.err;
        EXPECT_EQ(r.err.find("missing.safetensors"), std::string::npos) << "the model was loaded first: " << r.err;
    }
    auto upscale = run_command(std::string(KILN_BIN) + " -M upscale -i " + dir.file("in.png") + " --upscale-model " +
                               dir.file("missing.pth") + " -o /no/such/dir/up.png");
    EXPECT_EQ(upscale.exit_code, 2) << upscale.err;
    EXPECT_NE(upscale.err.find("the folder /no/such/dir does not exist"), std::string::npos) << upscale.err;
}

// An unclosed <lora:... is kept as prompt text, as A1111 keeps it, with a
// warning: it is almost always a tag that lost its '>'.
TEST(CliGenerate, AnUnclosedLoraTagIsWarnedAbout) {
    TempDir dir;
    auto r = run_command(kiln_with_sd1_tiny("-p 'a cat <lora:cat:1' -W 32 -H 32 --steps 1 -o " + dir.file("o.png")));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string log = r.out + r.err;  // warnings go to stdout with the other messages
    EXPECT_NE(log.find("warn: prompt: '<lora:cat:1' has no closing '>'"), std::string::npos) << log;
}

// kiln plan runs generation's validation: what a run refuses, the plan refuses.
TEST(CliGenerate, PlanRefusesWhatGenerationRefuses) {
    TempDir dir;
    ASSERT_TRUE(image::write_image(dir.file("small.png"), image::make_image(16, 16, 3, 128)).ok());
    ASSERT_TRUE(image::write_image(dir.file("init.png"), image::make_image(32, 32, 3, 128)).ok());
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"-W 34 -H 32", "width and height must be multiples of 4 for this model (SD1.x), got 34x32"},
        {"-i " + dir.file("init.png") + " --mask " + dir.file("small.png"),
         "mask is 16x16 but the init image is 32x32"},
        {"-i " + dir.file("small.png") + " -W 32 -H 32", "init image is 16x16 but the requested size is 32x32"},
    };
    for (const auto& [args, message] : cases) {
        for (const std::string& mode : {std::string("--dry-run "), std::string("")}) {
            auto r = run_command(kiln_with_sd1_tiny(mode + "-p x --steps 1 " + args + " -o " + dir.file("out.png")));
            EXPECT_EQ(r.exit_code, 2) << mode << args << ": " << r.err;
            EXPECT_EQ(r.err, "error: " + message + "\n") << mode << args;
            EXPECT_FALSE(exists(dir.file("out.png")));
        }
    }
}

// A BREAK storm is refused before the model loads: exit 2, one line, no file.
TEST(CliGenerate, BreakStormIsAUsageError) {
    TempDir dir;
    std::string storm = "a";
    for (int i = 0; i < 5000; ++i) storm += " BREAK a";
    const std::string out = dir.file("out.png");
    for (const char* flag : {"-p", "-n"}) {
        auto r =
            run_command(kiln_with_sd1_tiny(std::string(flag) + " \"" + storm + "\" -W 32 -H 32 --steps 1 -o " + out));
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find("5000 BREAKs make at least 5001 chunks; at most 64"), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(exists(out));
    }
}

TEST(CliGenerate, ModelThatIsNoKnownFamilyIsAClearError) {
    TempDir dir;
    const std::string junk =
        dir.write("junk.safetensors", test::build_safetensors({{"foo.weight", "F32", {2}, test::f32_bytes(2)}}));
    auto r = run_command(std::string(KILN_BIN) + " -m " + junk + " -p x -o " + dir.file("out.png"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(
        r.err,
        "error: " + junk +
            ": not a model family kiln runs (found: unknown; runs: SD1.x, SD2.x, SDXL, Flux.1-dev, Flux.1-Fill-dev, "
            "Flux.1-schnell, Chroma, Z-Image-Turbo, Z-Image, FLUX.2-klein, FLUX.2-klein-base, FLUX.2-dev, "
            "SD3.5-Large, SD3.5-Large-Turbo, SD3.5-Medium, SD3-Medium, Qwen-Image, Qwen-Image-Edit, Wan)\n");
    EXPECT_FALSE(exists(dir.file("out.png")));
}

TEST(CliGenerate, CheckpointWithoutTokenizerSaysWhatToPass) {
    TempDir dir;
    auto r = run_command(std::string(KILN_BIN) + " -m " + test::golden_path("models/sd1_tiny.safetensors") +
                         " -p x -o " + dir.file("out.png"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("pass --tokenizer PATH"), std::string::npos) << r.err;
}

// Off a terminal (here a pipe) a run says each phase besides sampling on a
// line of its own, in order: the prompt's encoding, then per image its
// hires fix or its decode.
TEST(CliGenerate, PhasesAreLinesOffATerminal) {
    TempDir dir;
    auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 -b 2 -o " + dir.file("p.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const size_t encoding = r.out.find("encoding the prompt\n");
    const size_t first = r.out.find("image 1/2: decoding\n");
    const size_t second = r.out.find("image 2/2: decoding\n");
    ASSERT_NE(encoding, std::string::npos) << r.out;
    ASSERT_NE(first, std::string::npos) << r.out;
    ASSERT_NE(second, std::string::npos) << r.out;
    EXPECT_LT(encoding, first);
    EXPECT_LT(first, second);
    auto hires = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 --hires --hires-scale 1.5 -o " +
                                                dir.file("h.png")));
    ASSERT_EQ(hires.exit_code, 0) << hires.err;
    EXPECT_NE(hires.out.find("image 1/1: hires fix\n"), std::string::npos) << hires.out;
    EXPECT_EQ(hires.out.find("decoding"), std::string::npos) << hires.out;
}

// -q: a run that goes well prints nothing; the image is written all the same.
TEST(CliGenerate, QuietPrintsNothingButWritesTheImage) {
    TempDir dir;
    auto r = run_command(kiln_with_sd1_tiny("-q -p \"a red circle\" -W 32 -H 32 --steps 2 -o " + dir.file("q.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "");
    EXPECT_TRUE(exists(dir.file("q.png")));
}

}  // namespace
}  // namespace kiln
