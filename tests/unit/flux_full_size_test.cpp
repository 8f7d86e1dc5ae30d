// A full-size Flux.1-dev all-in-one checkpoint (every tensor of flux1-dev,
// T5-XXL, CLIP-L and the autoencoder: tests/fixtures/flux1_dev.spec) written
// as a sparse file, header only, 33.7 GB of which no byte is read: kiln info
// names its parts, the loader configures each network from its shapes, and
// kiln plan places a 1024x1024 job on a loopback RPC device under budgets of
// 4, 8, 12 and 24 GiB (docs/flux.md has the table these runs print).
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "models/nets/flux_dit.h"
#include "models/nets/t5_encoder.h"
#include "pipeline/model.h"
#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string tokenizers() {
    return "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer,t5xxl=" + std::string(KILN_GOLDEN_DIR) +
           "/pipeline/flux_tiny/tokenizer_2";
}

class FluxFullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        path_ = new std::string(dir_->file("flux1-dev-all-in-one.safetensors"));
        const Status written = test::write_sparse_model(std::string(KILN_FIXTURES_DIR) + "/flux1_dev.spec", *path_);
        ASSERT_TRUE(written.ok()) << written.error().message;
    }
    static void TearDownTestSuite() {
        delete path_;
        delete dir_;
    }
    static test::TempDir* dir_;
    static std::string* path_;
};
test::TempDir* FluxFullSize::dir_ = nullptr;
std::string* FluxFullSize::path_ = nullptr;

TEST_F(FluxFullSize, InfoAndLoaderSeeFlux1Dev) {
    auto info = test::run_command(std::string(KILN_BIN) + " info " + *path_);
    ASSERT_EQ(info.exit_code, 0) << info.err;
    for (const char* line : {"family: Flux.1-dev", "total: 1440 tensors"}) {
        EXPECT_NE(info.out.find(line), std::string::npos) << line << "\n" << info.out;
    }
    pipeline::ModelPaths paths;
    paths.model = {*path_};
    paths.tokenizer = tokenizers();
    pipeline::ModelOptions options;
    options.plan_only = true;
    auto model = pipeline::Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Flux.1-dev");
    EXPECT_EQ((*model)->size_stride(), 16);
    const models::FluxConfig& f = dynamic_cast<const models::FluxDit&>((*model)->diffusion()).config();
    EXPECT_EQ(f.hidden, 3072);
    EXPECT_EQ(f.heads, 24);
    EXPECT_EQ(f.mlp_hidden, 12288);
    EXPECT_EQ(f.double_blocks, 19);
    EXPECT_EQ(f.single_blocks, 38);
    EXPECT_EQ(f.context_dim, 4096);
    EXPECT_EQ(f.vec_dim, 768);
    EXPECT_TRUE(f.guidance_embed);
    EXPECT_FALSE(f.chroma);
    ASSERT_EQ((*model)->text_encoders().size(), 2u);
    const models::T5Config& t5 = dynamic_cast<const models::T5Encoder&>(*(*model)->text_encoders()[1].network).config();
    EXPECT_EQ(t5.d_model, 4096);
    EXPECT_EQ(t5.layers, 24);
    EXPECT_EQ(t5.heads, 64);
    EXPECT_EQ(t5.d_ff, 10240);
    EXPECT_EQ((*model)->vae().format().latent_channels, 16);
    EXPECT_FALSE(dynamic_cast<const models::Vae&>((*model)->vae()).config().quant_convs);
}

// The placement and segments kiln plan predicts at each budget, without
// reading a weight: the DiT is cut at its blocks to fit, and every budget
// the job fits in is respected by the forecast peak.
TEST_F(FluxFullSize, PlanFitsTheJobUnderEveryBudget) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex diffusion_segments("diffusion on RPC0: (\\d+) segments");
    const std::regex peak("RPC0: peak ([0-9.]+) GiB");
    const std::regex needed("needs at least ([0-9.]+ [GM]iB)");
    std::set<std::string> needs;
    int previous_segments = 0;
    for (int gib : {24, 12, 8, 4}) {
        SCOPED_TRACE(std::to_string(gib) + " GiB");
        auto plan = test::run_command(std::string(KILN_BIN) + " plan -m " + *path_ + " --tokenizer " + tokenizers() +
                                      " --rpc-servers " + server.endpoint() +
                                      " --max-vram RPC0=" + std::to_string(gib) + " -W 1024 -H 1024 -p x -t 1");
        ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
        std::cout << "--- " << gib << " GiB\n" << plan.out;
        std::smatch m;
        // Where RAM cannot hold the DiT's weights either, auto-fit leaves them on disk: every step reads them.
        EXPECT_TRUE(test::plan_runs(plan.out)) << plan.out;
        ASSERT_TRUE(std::regex_search(plan.out, m, needed)) << plan.out;
        needs.insert(m[1]);
        ASSERT_TRUE(std::regex_search(plan.out, m, diffusion_segments)) << plan.out;
        const int segments = std::stoi(m[1]);
        EXPECT_GE(segments, previous_segments) << "a smaller budget cuts the DiT into fewer segments";
        previous_segments = segments;
        if (std::regex_search(plan.out, m, peak)) EXPECT_LE(std::stod(m[1]), gib) << plan.out;
    }
    EXPECT_GT(previous_segments, 1) << "4 GiB holds a fifth of flux1-dev's weights: the DiT must stream";
    EXPECT_GE(needs.size(), 3u) << "the least each budget needs is the job's, not the budget";
}

// On the CPU the weights are the mapped model file: 22 GiB of DiT do not stay
// in RAM held to 20 GiB beside the job, so every step reads them from disk
// again. The plan says so, with what it costs a step, and suggests what makes
// the job fit, each suggestion planned again (--type q8_0 or q4_0 here).
TEST_F(FluxFullSize, PlanOnTheCpuSaysItStreamsAndWhatWouldFit) {
    auto plan = test::run_command(std::string(KILN_BIN) + " plan -m " + *path_ + " --tokenizer " + tokenizers() +
                                  " --max-vram cpu=20 -W 1024 -H 1024 -p x -t 1");
    ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    EXPECT_NE(plan.out.find("diffusion on CPU: whole graph"), std::string::npos) << plan.out;
    EXPECT_NE(plan.out.find("reads its 22.17 GiB of weights from disk"), std::string::npos) << plan.out;
    EXPECT_NE(plan.out.find("fits: only by streaming: every step reads 22.17 GiB of the diffusion model's weights "
                            "from disk again, about 12 s a step at 2 GB/s"),
              std::string::npos)
        << plan.out;
    EXPECT_EQ(plan.out.find("fits: yes"), std::string::npos) << plan.out;
    EXPECT_TRUE(std::regex_search(plan.out, std::regex("suggestions:\n(  .*\n)*  --type q[48]_0: fits \\(checked")))
        << plan.out;
    // Each line once: the placement is the report's, not the log's too.
    size_t placements = 0;
    for (size_t at = plan.out.find("diffusion: computes on"); at != std::string::npos;
         at = plan.out.find("diffusion: computes on", at + 1))
        ++placements;
    EXPECT_EQ(placements, 1u) << plan.out;

    // The quantization it suggests, planned: no streaming.
    auto q8 = test::run_command(std::string(KILN_BIN) + " plan -m " + *path_ + " --tokenizer " + tokenizers() +
                                " --max-vram cpu=20 --type q4_0 -W 1024 -H 1024 -p x -t 1");
    ASSERT_EQ(q8.exit_code, 0) << q8.out << q8.err;
    EXPECT_NE(q8.out.find("fits: yes\n"), std::string::npos) << q8.out;
    EXPECT_EQ(q8.out.find("suggestions"), std::string::npos) << q8.out;
}

}  // namespace
}  // namespace kiln
