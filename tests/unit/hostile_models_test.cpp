// Model files that parse but hold what a network cannot compute with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::run_command;
using test::TempDir;

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The golden tiny SD1 checkpoint with `tensor` relabelled as the integer
// dtype of the same width (F32 -> I32, F16/BF16 -> I16): same bytes, a
// header that says integers.
std::string with_integer_tensor(const TempDir& dir, const std::string& tensor) {
    std::vector<uint8_t> bytes = test::read_bytes(test::golden_path("models/sd1_tiny.safetensors"));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    std::string& dtype = header.at(tensor).at("dtype").get_ref<std::string&>();
    dtype = dtype == "F32" ? "I32" : "I16";
    std::vector<uint8_t> data(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end());
    return dir.write("int.safetensors", test::raw_safetensors(header.dump(), data));
}

TEST(HostileModels, IntegerWeightsAreRefusedAtLoadNamingTheTensor) {
    for (const std::string tensor : {"model.diffusion_model.out.0.weight",
                                     "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
                                     "model.diffusion_model.input_blocks.0.0.weight"}) {
        TempDir dir;
        const std::string model = with_integer_tensor(dir, tensor);
        const std::string out = dir.file("out.png");
        auto r = run_command(std::string(KILN_BIN) + " -t 1 -m " + model + " --tokenizer " + KILN_FIXTURES_DIR +
                             "/tiny_tokenizer -p x -W 32 -H 32 --steps 1 -o " + out);
        EXPECT_EQ(r.exit_code, 1) << tensor << ": " << r.err;
        EXPECT_NE(r.err.find("tensor '" + tensor + "' has dtype I"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("weights must be floating point or quantized"), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(exists(out));
    }
}

// instruct-pix2pix's UNet (the latent and the image's latent: 8 input
// channels) is not one kiln runs: one error at load, naming what it runs.
TEST(HostileModels, InstructPix2PixUnetIsRefusedByName) {
    TempDir dir;
    const std::string model = dir.write(
        "pix2pix.safetensors", test::with_tensor_shape(test::golden_path("models/sd1_tiny.safetensors"),
                                                       "model.diffusion_model.input_blocks.0.0.weight", {32, 8, 3, 3},
                                                       {{"kiln.clip.heads", "2"}, {"kiln.unet.heads", "2"}}));
    const std::string out = dir.file("out.png");
    auto r = run_command(std::string(KILN_BIN) + " -t 1 -m " + model + " --tokenizer " + KILN_FIXTURES_DIR +
                         "/tiny_tokenizer -p x -W 32 -H 32 --steps 1 -o " + out);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("it takes 8 input channels for 4 latent channels; kiln runs plain UNets and inpainting ones "
                         "(9), not instruct-pix2pix (8)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(exists(out));
}

}  // namespace
}  // namespace kiln
