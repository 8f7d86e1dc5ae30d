// SD3.5 at its released sizes, without a weight read: the files written as
// sparse files from their specs (training/fixtures/make_sd3_specs.py:
// sd3.5_large and sd3.5_medium as Stability releases them, the DiT in BF16
// with SD3's VAE; text_encoders/clip_l, clip_g and t5xxl_fp16 in F16). kiln
// info names them; kiln plan on a loopback RPC device at 24, 16, 12 and 8
// GiB: the budget table of docs/sd3.md. Also sd-cli's own SD3 command line
// (its docs/sd3.md) run unchanged on the tiny SD3.5.
#include <gtest/gtest.h>

#include <iostream>
#include <regex>

#include "golden.h"
#include "image/png_metadata.h"
#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/" + name; }
std::string tokenizers() {
    return "clip_l=" + fixture("tiny_tokenizer") + ",t5xxl=" + test::golden_path("pipeline/flux_tiny/tokenizer_2");
}

class Sd3FullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        for (const auto& [spec, file] : {std::pair<const char*, const char*>{"sd35_large.spec", "sd3.5_large"},
                                         {"sd35_medium.spec", "sd3.5_medium"},
                                         {"sd3_clip_l.spec", "clip_l"},
                                         {"sd3_clip_g.spec", "clip_g"},
                                         {"sd3_t5xxl.spec", "t5xxl_fp16"}}) {
            const Status written =
                test::write_sparse_model(fixture(spec), dir_->file(std::string(file) + ".safetensors"));
            ASSERT_TRUE(written.ok()) << written.error().message;
        }
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static std::string file(const std::string& name) { return dir_->file(name + ".safetensors"); }
    // sd-cli's docs/sd3.md parts.
    static std::string parts(const std::string& model) {
        return " -m " + file(model) + " --clip_l " + file("clip_l") + " --clip_g " + file("clip_g") + " --t5xxl " +
               file("t5xxl_fp16") + " --tokenizer " + tokenizers();
    }
    static test::CommandResult plan(const std::string& model, const test::RpcServer& server, int gib,
                                    const std::string& extra = "") {
        const std::string command = std::string(KILN_BIN) + " plan" + parts(model) + " --rpc-servers " +
                                    server.endpoint() + " --max-vram RPC0=" + std::to_string(gib) +
                                    " -W 1024 -H 1024 --cfg-scale 4.5 -p 'a photo of a cat' -t 1" + extra;
        auto r = test::run_command(command);
        std::cout << "--- " << model << ", " << gib << " GiB" << extra << "\n" << r.out << r.err;
        return r;
    }
    static test::TempDir* dir_;
};
test::TempDir* Sd3FullSize::dir_ = nullptr;

TEST_F(Sd3FullSize, InfoSeesLargeAndMedium) {
    auto large = test::run_command(std::string(KILN_BIN) + " info " + file("sd3.5_large"));
    ASSERT_EQ(large.exit_code, 0) << large.out << large.err;
    EXPECT_NE(large.out.find("SD3.5-Large"), std::string::npos) << large.out;
    auto medium = test::run_command(std::string(KILN_BIN) + " info " + file("sd3.5_medium"));
    ASSERT_EQ(medium.exit_code, 0) << medium.out << medium.err;
    EXPECT_NE(medium.out.find("SD3.5-Medium"), std::string::npos) << medium.out;
}

// SD3.5 Large (8.1B in BF16, with 5.9 GB of text encoders) fits every
// budget down to 8 GiB, the MMDiT cut into more segments as the budget
// shrinks, the forecast peak within the budget.
TEST_F(Sd3FullSize, LargePlanFitsEveryBudget) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex peak("RPC0: peak ([0-9.]+) (GiB|MiB)");
    int previous = 0;
    for (int gib : {24, 16, 12, 8}) {
        SCOPED_TRACE(std::to_string(gib) + " GiB");
        auto r = plan("sd3.5_large", server, gib);
        ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
        EXPECT_TRUE(test::plan_runs(r.out));
        const int segments = test::plan_segments(r.out, "diffusion");
        ASSERT_GT(segments, 0);
        EXPECT_GE(segments, previous) << "a smaller budget cuts the MMDiT into fewer segments";
        previous = segments;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(r.out, m, peak));
        EXPECT_LE(std::stod(m[1]) / (m[2] == "MiB" ? 1024.0 : 1.0), gib);
    }
    EXPECT_GT(previous, 1) << "8 GiB holds less than the MMDiT: it must stream";
}

// SD3.5 Medium (MMDiT-X, 2.5B in BF16): 8 GiB holds the whole MMDiT; 4 GiB
// cuts it into segments, and it still fits.
TEST_F(Sd3FullSize, MediumPlanFitsSmallBudgets) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    auto whole = plan("sd3.5_medium", server, 8);
    ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
    EXPECT_TRUE(test::plan_runs(whole.out));
    EXPECT_EQ(whole.err.find("neither a weight nor an input"), std::string::npos) << whole.err;
    auto cut = plan("sd3.5_medium", server, 4);
    ASSERT_EQ(cut.exit_code, 0) << cut.out << cut.err;
    EXPECT_TRUE(test::plan_runs(cut.out));
    EXPECT_GT(test::plan_segments(cut.out, "diffusion"), test::plan_segments(whole.out, "diffusion"));
}

// The position embedding covers 192 patches a side: 3072 pixels.
TEST_F(Sd3FullSize, LargerThanThePositionEmbeddingIsRefusedByThePlan) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    auto r = test::run_command(std::string(KILN_BIN) + " plan" + parts("sd3.5_large") + " --rpc-servers " +
                               server.endpoint() + " -W 3200 -H 1024 -p x");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("at most 3072 a side for this model (SD3.5-Large"), std::string::npos) << r.err;
}

// sd-cli's docs/sd3.md command, unchanged but for the paths and kiln's
// tokenizers (and 2 steps), on the tiny SD3.5: an image with the job's
// parameters in it.
TEST(Sd3Cli, SdCliDocsCommandRuns) {
    test::TempDir dir;
    const std::string out = dir.file("output.png");
    const std::string command =
        std::string(KILN_BIN) + " -m " + test::golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors") + " --clip_l " +
        test::golden_path("pipeline/flux_tiny/clip_l.safetensors") + " --clip_g " +
        test::golden_path("pipeline/sd3_tiny/clip_g.safetensors") + " --t5xxl " +
        test::golden_path("pipeline/flux_tiny/t5xxl.safetensors") +
        " -H 32 -W 32 -p 'a lovely cat holding a sign says \"Stable diffusion 3.5 Large\"' --cfg-scale 4.5 "
        "--sampling-method euler -v --clip-on-cpu --steps 2 --tokenizer clip_l=" +
        fixture("tiny_tokenizer") + " -o " + out;
    auto r = test::run_command(command);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto text = image::read_image_text(out);
    ASSERT_TRUE(text.ok()) << text.error().message;
    const std::string& parameters = (*text)["parameters"];
    EXPECT_NE(parameters.find("Steps: 2, Sampler: Euler"), std::string::npos) << parameters;
    EXPECT_NE(parameters.find("CFG scale: 4.5"), std::string::npos) << parameters;
}

// A file whose tensor has the wrong shape: kiln plan and a job refuse it
// alike, naming the tensor, before anything runs (a plan used to warn and
// plan the network as one graph).
TEST(Sd3Cli, AWrongShapeIsRefusedAlikeByPlanAndJob) {
    test::TempDir dir;
    auto source = io::ModelFile::open({test::golden_path("pipeline/sd3_tiny/sd3.5_tiny.safetensors")});
    ASSERT_TRUE(source.ok()) << source.error().message;
    const std::string bad = "model.diffusion_model.joint_blocks.0.x_block.mlp.fc1.bias";
    std::vector<test::SafetensorsEntry> entries;
    for (const io::TensorInfo& t : source->tensors()) {
        entries.push_back(test::copy_entry(*source, t, t.name));
        if (t.name == bad) entries.back().shape = {2, t.shape[0] / 2};  // the same bytes, another shape
    }
    const std::string model = dir.write("sd3.5_broken.safetensors", test::build_safetensors(entries));
    const std::string parts = " -m " + model + " --clip_l " +
                              test::golden_path("pipeline/flux_tiny/clip_l.safetensors") + " --clip_g " +
                              test::golden_path("pipeline/sd3_tiny/clip_g.safetensors") + " --tokenizer clip_l=" +
                              fixture("tiny_tokenizer") + " -W 32 -H 32 -p x";
    const std::string want = "tensor '" + bad + "' has shape [2, 128], expected [256]";
    auto planned = test::run_command(std::string(KILN_BIN) + " plan" + parts);
    EXPECT_EQ(planned.exit_code, 1) << planned.out << planned.err;
    EXPECT_NE(planned.err.find(want), std::string::npos) << planned.err;
    auto job = test::run_command(std::string(KILN_BIN) + parts + " -o " + dir.file("out.png"));
    EXPECT_EQ(job.exit_code, 1) << job.out << job.err;
    EXPECT_NE(job.err.find(want), std::string::npos) << job.err;
}

}  // namespace
}  // namespace kiln
