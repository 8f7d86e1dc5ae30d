// ESRGAN upscaling and the hires fix end to end: the real `kiln` binary, the
// tiny golden SD1 model and the small random RRDBNets of
// training/make_rrdbnet_fixtures.py; then the C API's kiln_upscaler.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "golden.h"
#include "image/image_io.h"
#include "kiln.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::kiln_with_sd1_tiny;
using test::run_command;
using test::TempDir;

std::string kiln(const std::string& args) { return std::string(KILN_BIN) + " -t 1 " + args; }

std::string upscaler(const std::string& name) { return test::golden_path("models/" + name); }

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string parameters_of(const std::string& path) {
    auto meta = run_command(std::string(KILN_BIN) + " -M metadata --metadata-format parameters -i " + path);
    EXPECT_EQ(meta.exit_code, 0) << meta.err;
    return meta.out;
}

image::Image read(const std::string& path) {
    auto img = image::read_image(path);
    EXPECT_TRUE(img.ok()) << path << ": " << (img.ok() ? "" : img.error().message);
    return img.ok() ? *img : image::Image{};
}

// A 32x32 image generated with the tiny model, with its parameters.
std::string generate_small(const TempDir& dir, const std::string& name) {
    const std::string path = dir.file(name);
    auto r = run_command(kiln_with_sd1_tiny("-p \"a red circle\" -W 32 -H 32 --steps 2 -s 7 -o " + path));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return path;
}

TEST(CliUpscale, UpscaleModeWritesTheScaledImageAndExtendsItsParameters) {
    TempDir dir;
    const std::string in = generate_small(dir, "in.png");
    const std::string out = dir.file("big.png");
    auto r = run_command(
        kiln("-M upscale -i " + in + " --upscale-model " + upscaler("rrdbnet_x4.safetensors") + " -o " + out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const image::Image big = read(out);
    EXPECT_EQ(big.width, 128);
    EXPECT_EQ(big.height, 128);
    // The original text with A1111's postprocessing keys added (before
    // "Version", which kiln's A1111 text always ends with).
    auto key_line = [](const std::string& text) { return text.substr(text.find("Steps: ")); };
    std::string expected = key_line(parameters_of(in));
    expected.insert(expected.find(", Version: "), ", Postprocess upscale by: 4, Postprocess upscaler: rrdbnet_x4");
    const std::string after = parameters_of(out);
    EXPECT_EQ(after.rfind("a red circle\n", 0), 0u) << after;
    EXPECT_EQ(key_line(after), expected);
}

TEST(CliUpscale, RepeatsMultiplyTheScaleAndBasicSrPthWorks) {
    TempDir dir;
    const std::string in = generate_small(dir, "in.png");
    auto r = run_command(kiln("-M upscale -i " + in + " --upscale-model " + upscaler("rrdbnet_x2.safetensors") +
                              " --upscale-repeats 2 -o " + dir.file("x4.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read(dir.file("x4.png")).width, 128);
    EXPECT_NE(parameters_of(dir.file("x4.png")).find("Postprocess upscale by: 4,"), std::string::npos);

    // The same x4 network in ESRGAN's names and in a BasicSR .pth: the same picture.
    ASSERT_EQ(run_command(kiln("-M upscale -i " + in + " --upscale-model " + upscaler("rrdbnet_x4.safetensors") +
                               " -o " + dir.file("esrgan.png")))
                  .exit_code,
              0);
    ASSERT_EQ(run_command(kiln("-M upscale -i " + in + " --upscale-model " + upscaler("rrdbnet_x4_basicsr.pth") +
                               " -o " + dir.file("basicsr.png")))
                  .exit_code,
              0);
    EXPECT_EQ(read(dir.file("esrgan.png")).pixels, read(dir.file("basicsr.png")).pixels);
}

TEST(CliUpscale, ErrorsExitWithTheirKindAndWriteNothing) {
    TempDir dir;
    const std::string in = generate_small(dir, "in.png");
    const std::string junk = dir.write("junk.png", std::string("not an image"));
    const std::string out = dir.file("out.png");
    const std::string x4 = " --upscale-model " + upscaler("rrdbnet_x4.safetensors");
    struct Case {
        std::string args;
        int exit_code;
        std::string message;
    };
    const Case cases[] = {
        {"-M upscale -i " + in + " --upscale-model " + dir.file("absent.pth"), 1, "absent.pth"},
        {"-M upscale -i " + in + " --upscale-model " + test::golden_path("models/sd1_tiny.safetensors"), 1,
         "conv_first.weight"},
        {"-M upscale -i " + in, 2, "--upscale-model"},
        {"-M upscale" + x4, 2, "no image"},
        {"-M upscale -i " + junk + x4, 1, "junk.png"},
        {"-M upscale -i " + dir.file("absent.png") + x4, 1, "absent.png"},
        {"-M upscale -i " + in + x4 + " --upscale-repeats 0", 2, "--upscale-repeats"},
        {"-M upscale -i " + in + x4 + " --upscale-repeats 9", 2, "--upscale-repeats"},
        {"-M upscale -i " + in + x4 + " --upscale-tile-size 8", 2, "--upscale-tile-size"},
        // 32 * 4^6 pixels a side is past kiln's limit.
        {"-M upscale -i " + in + x4 + " --upscale-repeats 6", 2, "16384"},
    };
    for (const Case& c : cases) {
        auto r = run_command(kiln(c.args + " -o " + out));
        EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_FALSE(exists(out)) << c.args;
    }
}

TEST(CliUpscale, UpscaleModelAfterGeneration) {
    TempDir dir;
    auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 -b 2 --upscale-model " +
                                            upscaler("rrdbnet_x2.safetensors") + " -o " + dir.file("o_%d.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* name : {"o_0.png", "o_1.png"}) {
        EXPECT_EQ(read(dir.file(name)).width, 64) << name;
        const std::string text = parameters_of(dir.file(name));
        EXPECT_NE(text.find("Size: 32x32"), std::string::npos) << text;
        EXPECT_NE(text.find("Postprocess upscale by: 2, Postprocess upscaler: rrdbnet_x2"), std::string::npos) << text;
    }
    // A bad upscaler fails before any generation.
    auto bad = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 --upscale-model " + dir.file("absent.pth") +
                                              " -o " + dir.file("never.png")));
    EXPECT_EQ(bad.exit_code, 1) << bad.err;
    EXPECT_FALSE(exists(dir.file("never.png")));
}

TEST(CliHires, LatentHiresWritesTheHiresSizeAndA1111Parameters) {
    TempDir dir;
    auto r = run_command(
        kiln_with_sd1_tiny("-p \"a red circle\" -W 32 -H 32 --steps 2 -s 3 --hires -o " + dir.file("h.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const image::Image img = read(dir.file("h.png"));
    EXPECT_EQ(img.width, 64);
    EXPECT_EQ(img.height, 64);
    const std::string text = parameters_of(dir.file("h.png"));
    EXPECT_NE(text.find("Size: 32x32"), std::string::npos) << text;
    EXPECT_NE(text.find("Denoising strength: 0.7"), std::string::npos) << text;
    EXPECT_NE(text.find("Hires upscale: 2"), std::string::npos) << text;
    EXPECT_NE(text.find("Hires upscaler: Latent"), std::string::npos) << text;
    EXPECT_EQ(text.find("Hires steps"), std::string::npos) << text;  // A1111 records it only when given

    auto sized =
        run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 --hires --hires-width 48 --hires-steps 3 "
                                       "--hires-upscaler latent-nearest --hires-denoising-strength 0.5 -o " +
                                       dir.file("s.png")));
    ASSERT_EQ(sized.exit_code, 0) << sized.err;
    EXPECT_EQ(read(dir.file("s.png")).width, 48);
    EXPECT_EQ(read(dir.file("s.png")).height, 48);  // the aspect of the first pass
    const std::string s = parameters_of(dir.file("s.png"));
    EXPECT_NE(s.find("Denoising strength: 0.5"), std::string::npos) << s;
    EXPECT_NE(s.find("Hires resize: 48x48"), std::string::npos) << s;
    EXPECT_NE(s.find("Hires steps: 3"), std::string::npos) << s;
    EXPECT_NE(s.find("Hires upscaler: Latent (nearest)"), std::string::npos) << s;

    // A1111's own names are accepted, and the image upscaler Lanczos.
    for (const char* upscaler : {"\"Latent (nearest-exact)\"", "lanczos"}) {
        auto other =
            run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 2 --hires --hires-scale 1.5 "
                                           "--hires-upscaler " +
                                           std::string(upscaler) + " -o " + dir.file("o.png")));
        ASSERT_EQ(other.exit_code, 0) << upscaler << "\n" << other.err;
        EXPECT_EQ(read(dir.file("o.png")).width, 48) << upscaler;
        const std::string t = parameters_of(dir.file("o.png"));
        EXPECT_NE(t.find("Hires upscale: 1.5"), std::string::npos) << t;
        EXPECT_NE(t.find(std::string(upscaler) == "lanczos" ? "Hires upscaler: Lanczos"
                                                            : "Hires upscaler: Latent (nearest-exact)"),
                  std::string::npos)
            << t;
    }
}

// With a model upscaler at its own scale and denoising strength 0, the hires
// fix runs no second step: its image is the first pass upscaled, exactly what
// generating without --hires and then `kiln -M upscale` gives.
TEST(CliHires, StrengthZeroWithAModelIsThePlainUpscaleOfTheFirstPass) {
    TempDir dir;
    const std::string x2 = upscaler("rrdbnet_x2.safetensors");
    const std::string common = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 11 ";
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "-o " + dir.file("plain.png"))).exit_code, 0);
    ASSERT_EQ(run_command(kiln("-M upscale -i " + dir.file("plain.png") + " --upscale-model " + x2 + " -o " +
                               dir.file("upscaled.png")))
                  .exit_code,
              0);
    auto r = run_command(kiln_with_sd1_tiny(common + "--hires --hires-upscaler " + x2 +
                                            " --hires-denoising-strength 0 -o " + dir.file("hires0.png")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const image::Image upscaled = read(dir.file("upscaled.png"));
    const image::Image hires0 = read(dir.file("hires0.png"));
    EXPECT_EQ(hires0.width, 64);
    EXPECT_EQ(hires0.pixels, upscaled.pixels);
    EXPECT_NE(parameters_of(dir.file("hires0.png")).find("Hires upscaler: rrdbnet_x2"), std::string::npos);

    // ... and a real second pass changes it.
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "--hires --hires-upscaler " + x2 +
                                             " --hires-denoising-strength 0.6 -o " + dir.file("hires6.png")))
                  .exit_code,
              0);
    const image::Image hires6 = read(dir.file("hires6.png"));
    EXPECT_EQ(hires6.width, 64);
    EXPECT_NE(hires6.pixels, upscaled.pixels);
}

// "... peak 12.34 MiB ..." after `key` in `text`, in bytes (0 when absent).
double bytes_after(const std::string& text, const std::string& key) {
    const size_t at = text.find(key);
    if (at == std::string::npos) return 0;
    char* end = nullptr;
    const double value = std::strtod(text.c_str() + at + key.size(), &end);
    const std::string unit(end + 1, 3);
    return value * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1);
}

// A hires fix's model upscaler is held in RAM's books for the job (its
// weights and its largest tile's buffers), and kiln plan counts it: the
// plan's RAM peak is the run's, and a RAM budget below it is a clean error.
TEST(CliHires, TheModelUpscalerIsInRamsBooksAndThePlan) {
    TempDir dir;
    const std::string job = "-p \"a red circle\" -W 32 -H 32 --steps 2 --hires --hires-upscaler " +
                            upscaler("rrdbnet_x4.safetensors") + " ";
    auto plan = run_command(kiln_with_sd1_tiny(job + "--dry-run"));
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    EXPECT_NE(plan.out.find("upscaler rrdbnet_x4 on CPU: weights "), std::string::npos) << plan.out;
    auto run = run_command(kiln_with_sd1_tiny(job + "-v -o " + dir.file("a.png")));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const double planned = bytes_after(plan.out, "CPU: peak "), measured = bytes_after(run.out, "memory: CPU peak ");
    ASSERT_GT(measured, 0) << run.out;
    EXPECT_NEAR(planned, measured, 0.15 * measured) << plan.out << run.out;
    // Half the upscaler's room: refused before the first pass.
    const double upscaler_bytes =
        bytes_after(plan.out, "upscaler rrdbnet_x4 on CPU: weights ") + bytes_after(plan.out, ", compute ");
    ASSERT_GT(upscaler_bytes, 0) << plan.out;
    const std::string budget = " --max-vram cpu=" + std::to_string(static_cast<int>(upscaler_bytes / 2 / 1024)) + "K ";
    auto small = run_command(kiln_with_sd1_tiny(job + budget + "-o " + dir.file("b.png")));
    EXPECT_EQ(small.exit_code, 1) << small.err;
    EXPECT_NE(small.err.find("out of memory: the hires upscaler rrdbnet_x4"), std::string::npos) << small.err;
    EXPECT_FALSE(exists(dir.file("b.png")));
    auto small_plan = run_command(kiln_with_sd1_tiny(job + budget + "--dry-run"));
    EXPECT_NE(small_plan.out.find("fits: no"), std::string::npos) << small_plan.out;
    // --upscale-model runs after the job, outside the model's books: the plan says what it takes.
    auto after = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --dry-run --upscale-model " +
                                                upscaler("rrdbnet_x4.safetensors")));
    ASSERT_EQ(after.exit_code, 0) << after.err;
    EXPECT_GT(bytes_after(after.out, "then --upscale-model on CPU (outside the model's books): weights "), 0)
        << after.out;
}

TEST(CliHires, BadValuesExit2AndWriteNothing) {
    TempDir dir;
    const std::string out = dir.file("out.png");
    struct Case {
        std::string args;
        std::string message;
    };
    const Case cases[] = {
        {"--hires --hires-scale 0", "--hires-scale"},
        {"--hires --hires-scale -1", "--hires-scale"},
        {"--hires --hires-scale 100", "--hires-scale"},
        {"--hires --hires-width 33 --hires-height 48", "must be multiples of"},
        {"--hires --hires-width -16", "--hires-width"},
        {"--hires --hires-steps -1", "--hires-steps"},
        {"--hires --hires-denoising-strength 1.5", "--hires-denoising-strength"},
        {"--hires --hires-upscaler bicubic", "--hires-upscaler"},
        {"--hires --hires-upscaler " + upscaler("rrdbnet_x2.safetensors") + " --hires-upscale-tile-size 4",
         "--hires-upscale-tile-size"},
        {"--hires --hires-scale x", "--hires-scale"},
    };
    for (const Case& c : cases) {
        auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 " + c.args + " -o " + out));
        EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_FALSE(exists(out)) << c.args;
    }
    // A file that is no upscaler is a bad file (exit 1).
    auto r = run_command(kiln_with_sd1_tiny("-p x -W 32 -H 32 --steps 1 --hires --hires-upscaler " +
                                            test::golden_path("models/sd1_tiny.safetensors") + " -o " + out));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_FALSE(exists(out));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The C API's upscaler directly: status codes by kind, the result's size and
// parameters, nothing returned on failure.
struct ApiError {
    char* text = nullptr;
    ~ApiError() { kiln_free_string(text); }
    std::string str() const { return text ? text : ""; }
};

TEST(UpscalerApi, CreateReportsErrorsByKind) {
    kiln_upscaler_params params;
    kiln_upscaler_params_init(&params);
    EXPECT_EQ(params.tile_size, 128);
    kiln_upscaler* up = reinterpret_cast<kiln_upscaler*>(&params);  // must be reset to NULL on failure
    {
        ApiError e;
        EXPECT_EQ(kiln_upscaler_create(&params, &up, &e.text), KILN_ERROR_INVALID_REQUEST);  // no model path
        EXPECT_EQ(up, nullptr);
    }
    const std::string absent = test::golden_path("models/absent.pth");
    params.model_path = absent.c_str();
    {
        ApiError e;
        EXPECT_EQ(kiln_upscaler_create(&params, &up, &e.text), KILN_ERROR_BAD_FILE);
        EXPECT_NE(e.str().find("absent.pth"), std::string::npos) << e.str();
    }
    const std::string x4 = test::golden_path("models/rrdbnet_x4.safetensors");
    params.model_path = x4.c_str();
    params.tile_size = 16;
    {
        ApiError e;
        EXPECT_EQ(kiln_upscaler_create(&params, &up, &e.text), KILN_ERROR_INVALID_REQUEST);
        EXPECT_NE(e.str().find("--upscale-tile-size"), std::string::npos) << e.str();
        EXPECT_EQ(up, nullptr);
    }
}

TEST(UpscalerApi, UpscaleReturnsTheImageWithPostprocessParameters) {
    kiln_upscaler_params params;
    kiln_upscaler_params_init(&params);
    const std::string x4 = test::golden_path("models/rrdbnet_x4.safetensors");
    params.model_path = x4.c_str();
    params.n_threads = 1;
    kiln_upscaler* up = nullptr;
    ApiError create_error;
    ASSERT_EQ(kiln_upscaler_create(&params, &up, &create_error.text), KILN_OK) << create_error.str();
    EXPECT_EQ(kiln_upscaler_scale(up), 4);

    std::vector<uint8_t> pixels(12 * 8 * 3, 90);
    kiln_image image{12, 8, 3, pixels.data(), nullptr};
    kiln_image* result = nullptr;
    ApiError e;
    ASSERT_EQ(kiln_upscale(up, &image, 1, &result, &e.text), KILN_OK) << e.str();
    EXPECT_EQ(result->width, 48u);
    EXPECT_EQ(result->height, 32u);
    EXPECT_EQ(result->channels, 3u);
    ASSERT_NE(result->parameters, nullptr);
    EXPECT_EQ(std::string(result->parameters), "Postprocess upscale by: 4, Postprocess upscaler: rrdbnet_x4");
    kiln_images_free(result, 1);

    result = reinterpret_cast<kiln_image*>(&image);
    {
        ApiError bad;
        EXPECT_EQ(kiln_upscale(up, &image, 0, &result, &bad.text), KILN_ERROR_INVALID_REQUEST);
        EXPECT_EQ(result, nullptr);
    }
    kiln_image empty{12, 8, 3, nullptr, nullptr};
    {
        ApiError bad;
        EXPECT_EQ(kiln_upscale(up, &empty, 1, &result, &bad.text), KILN_ERROR_INVALID_REQUEST);
        EXPECT_EQ(result, nullptr);
    }
    kiln_upscaler_free(up);
}

TEST(UpscalerApi, GenerationParamsDefaultToSdCliHiresDefaults) {
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    EXPECT_EQ(gp.hires, 0);
    EXPECT_EQ(gp.hires_scale, 2.0f);
    EXPECT_EQ(gp.hires_denoising_strength, 0.7f);
    EXPECT_EQ(gp.hires_steps, 0);
    EXPECT_EQ(gp.hires_upscaler, nullptr);  // "latent"
    EXPECT_EQ(gp.hires_upscale_tile_size, 128);
}

// sd-cli's --hires-upscalers-dir: --hires-upscaler names a model in it by its
// file name, with or without the extension, and runs as that file's path does.
TEST(CliHires, UpscalersDirFindsAModelByName) {
    TempDir dir;
    const std::string folder = dir.file("upscalers");
    std::filesystem::create_directory(folder);
    std::filesystem::copy_file(upscaler("rrdbnet_x2.safetensors"), folder + "/rrdbnet_x2.safetensors");
    const std::string common = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 11 --hires --hires-denoising-strength 0 ";
    ASSERT_EQ(run_command(kiln_with_sd1_tiny(common + "--hires-upscaler " + upscaler("rrdbnet_x2.safetensors") +
                                             " -o " + dir.file("by_path.png")))
                  .exit_code,
              0);
    for (const char* name : {"rrdbnet_x2", "rrdbnet_x2.safetensors"}) {
        const std::string out = dir.file(std::string("by_name_") + name + ".png");
        auto r = run_command(kiln_with_sd1_tiny(common + "--hires-upscalers-dir " + folder + " --hires-upscaler " +
                                                name + " -o " + out));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(read(out).pixels, read(dir.file("by_path.png")).pixels) << name;
    }
    auto absent = run_command(kiln_with_sd1_tiny(common + "--hires-upscalers-dir " + folder +
                                                 " --hires-upscaler rrdbnet_x9 -o " + dir.file("absent.png")));
    EXPECT_EQ(absent.exit_code, 2);
    EXPECT_NE(absent.err.find("--hires-upscaler: 'rrdbnet_x9'"), std::string::npos) << absent.err;
    EXPECT_FALSE(exists(dir.file("absent.png")));
}

// sd-cli's --hires-sigmas: the second pass's schedule as it runs. It replaces
// --hires-steps and --hires-denoising-strength, so those change nothing
// beside it; other sigmas give another image; a schedule no sampler can run
// is refused by name before anything is written.
TEST(CliHires, HiresSigmasAreTheSecondPassAsItRuns) {
    TempDir dir;
    const std::string common = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 11 --hires ";
    auto run = [&](const std::string& extra, const std::string& name) {
        auto r = run_command(kiln_with_sd1_tiny(common + extra + " -o " + dir.file(name)));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return read(dir.file(name));
    };
    const image::Image a = run("--hires-sigmas 3,1.5,0 --hires-steps 7 --hires-denoising-strength 0.2", "a.png");
    const image::Image b =
        run("--hires-sigmas \"[3, 1.5, 0]\" --hires-steps 2 --hires-denoising-strength 0.9", "b.png");
    const image::Image c = run("--hires-sigmas 6,1.5,0", "c.png");
    const image::Image plain = run("", "plain.png");
    EXPECT_EQ(a.width, 64);
    EXPECT_EQ(a.pixels, b.pixels);
    EXPECT_NE(a.pixels, c.pixels);
    EXPECT_NE(a.pixels, plain.pixels);
    EXPECT_NE(parameters_of(dir.file("a.png")).find("Hires steps: 2"), std::string::npos)
        << parameters_of(dir.file("a.png"));

    auto rising = run_command(kiln_with_sd1_tiny(common + "--hires-sigmas 1,3,0 -o " + dir.file("rising.png")));
    EXPECT_EQ(rising.exit_code, 2);
    EXPECT_NE(rising.err.find("--hires-sigmas: values must descend"), std::string::npos) << rising.err;
    EXPECT_FALSE(exists(dir.file("rising.png")));
}

}  // namespace
}  // namespace kiln
