// `kiln info` and the command line, end to end: the real binary on files the
// test writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "test_files.h"

namespace kiln {
namespace {

using test::build_safetensors;
using test::run_command;
using test::TempDir;

std::string kiln(const std::string& args) { return std::string(KILN_BIN) + " " + args; }

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// A miniature SD1 single-file checkpoint: real tensor names, tiny shapes.
std::vector<uint8_t> tiny_sd1_checkpoint() {
    return build_safetensors(
        {{"model.diffusion_model.input_blocks.0.0.weight", "F16", {8, 4, 3, 3}, std::vector<uint8_t>(8 * 4 * 9 * 2)},
         {"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
          "F16",
          {8, 768},
          std::vector<uint8_t>(8 * 768 * 2)},
         {"model.diffusion_model.out.2.bias", "F32", {4}, std::vector<uint8_t>(16)},
         {"cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
          "F32",
          {10, 768},
          std::vector<uint8_t>(10 * 768 * 4)},
         {"first_stage_model.decoder.conv_out.weight", "BF16", {3, 4, 3, 3}, std::vector<uint8_t>(3 * 4 * 9 * 2)},
         {"first_stage_model.decoder.conv_out.bias", "F32", {3}, std::vector<uint8_t>(12)}},
        {{"format", "pt"}});
}

TEST(CliInfo, SingleFileCheckpointNamesComponentsAndSizes) {
    TempDir dir;
    const std::string path = dir.write("sd1.safetensors", tiny_sd1_checkpoint());
    auto r = run_command(kiln("info " + path));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("model: " + path), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(safetensors, "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("format = pt"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("family: SD1.x"), std::string::npos) << r.out;
    // 576 + 12288 + 16 bytes of UNet, in 3 tensors.
    EXPECT_NE(r.out.find("diffusion model: diffusion_model (model.diffusion_model.*)\n    3 tensors, 6,436 parameters, "
                         "12.58 KiB (12,880 bytes); dtypes: F16 x2 F32 x1"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("text encoder: clip_l (cond_stage_model.transformer.*)\n    1 tensor, 7,680 parameters, "
                         "30.00 KiB (30,720 bytes); dtypes: F32 x1"),
              std::string::npos)
        << r.out;
    EXPECT_NE(
        r.out.find(
            "VAE: vae (first_stage_model.*)\n    2 tensors, 111 parameters, 228 B (228 bytes); dtypes: BF16 x1 F32 x1"),
        std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("total: 6 tensors"), std::string::npos) << r.out;
}

TEST(CliInfo, WithoutAFileShowsTheDefaultModel) {
    auto r = run_command(kiln("info"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("models/kiln-tiny.gguf (gguf, "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("general.name = kiln-tiny"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("family: SD1.x"), std::string::npos) << r.out;
}

TEST(CliInfo, TensorListing) {
    TempDir dir;
    const std::string path = dir.write("sd1.safetensors", tiny_sd1_checkpoint());
    auto r = run_command(kiln("info --tensors " + path));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("  first_stage_model.decoder.conv_out.weight  BF16 [3, 4, 3, 3]  bytes "), std::string::npos)
        << r.out;
}

TEST(CliInfo, CheckpointFixture) {
    auto r = run_command(kiln(std::string("info ") + KILN_FIXTURES_DIR + "/tiny.ckpt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(ckpt, "), std::string::npos) << r.out;
}

TEST(CliInfo, BadFilesGiveOneErrorLineAndExitOne) {
    TempDir dir;
    std::vector<uint8_t> truncated = tiny_sd1_checkpoint();
    truncated.resize(truncated.size() - 100);
    const std::string cut = dir.write("cut.safetensors", truncated);
    auto r = run_command(kiln("info " + cut));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("error: " + cut + ": tensor '", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("out of bounds"), std::string::npos) << r.err;

    r = run_command(kiln("info " + dir.file("missing.gguf")));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "error: " + dir.file("missing.gguf") + ": no such file or folder\n");

    r = run_command(kiln(std::string("info ") + KILN_FIXTURES_DIR + "/evil.ckpt"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("forbidden global"), std::string::npos) << r.err;
}

TEST(Cli, UsageErrorsExitTwoWithAHint) {
    auto r = run_command(kiln("--vea x"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "error: unknown option '--vea' (did you mean '--vae'?)\n");
    r = run_command(kiln("--steps many"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "error: --steps: expected an integer, got 'many' (see 'kiln --help')\n");
    r = run_command(kiln("-M convert -m x.safetensors -o x.gguf --type q9"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("error: --type: unknown weight type 'q9'", 0), 0u) << r.err;
}

// -M convert writes GGUF only where -o says, under a .gguf name; the image
// default (output.png) is never used for it.
TEST(Cli, ConvertRequiresAGgufOutputName) {
    TempDir dir;
    const std::string in = dir.write("sd1.safetensors", tiny_sd1_checkpoint());
    auto r = run_command("cd " + dir.path() + " && " + kiln("-M convert -m " + in));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "error: convert: no output given (pass -o OUT.gguf)\n");
    EXPECT_FALSE(std::ifstream(dir.file("output.png")).good());
    r = run_command(kiln("-M convert -m " + in + " -o " + dir.file("model.png")));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "error: -o: " + dir.file("model.png") + ": convert writes GGUF; the name must end in .gguf\n");
    EXPECT_FALSE(std::ifstream(dir.file("model.png")).good());
}

TEST(Cli, ConvertWritesAGgufThatInfoReads) {
    TempDir dir;
    const std::string in = dir.write("sd1.safetensors", tiny_sd1_checkpoint());
    const std::string out = dir.file("sd1-f16.gguf");
    auto r = run_command(kiln("-M convert -m " + in + " -o " + out + " --type f16"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_command(kiln("info " + out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(gguf, "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("family: SD1.x"), std::string::npos) << r.out;
    // Matrices became F16; biases stayed F32.
    EXPECT_NE(
        r.out.find(
            "VAE: vae (first_stage_model.*)\n    2 tensors, 111 parameters, 228 B (228 bytes); dtypes: F16 x1 F32 x1"),
        std::string::npos)
        << r.out;
}

TEST(Cli, FailedConvertLeavesNoOutput) {
    TempDir dir;
    std::vector<uint8_t> bad = tiny_sd1_checkpoint();
    bad[8] = '[';  // the JSON header is no longer an object
    const std::string in = dir.write("bad.safetensors", bad);
    const std::string out = dir.file("out.gguf");
    auto r = run_command(kiln("-M convert -m " + in + " -o " + out));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_FALSE(std::ifstream(out).good());
    EXPECT_FALSE(std::ifstream(out + ".part").good());
}

TEST(Cli, VersionNamesTheGgmlCommit) {
    auto r = run_command(kiln("--version"));
    ASSERT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("(ggml "), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
