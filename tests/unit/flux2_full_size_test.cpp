// FLUX.2 [klein] at its released sizes, without a weight read: the files
// written as sparse files from their specs (training/fixtures/
// make_flux2_specs.py: flux-2-klein-4b and -9b in BF16, FLUX.2's ae in F32,
// ComfyUI's qwen_3_4b and qwen_3_8b in BF16; the DiTs in Q4_K and the
// Qwen3s in llama.cpp's Q4_K_M as GGUFs) and Qwen3's real tokenizer.
// kiln plan on a loopback RPC device at 12, 8, 6 and 4 GiB: the budget
// table of docs/flux2.md.
#include <gtest/gtest.h>

#include <iostream>
#include <regex>
#include <sstream>

#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/" + name; }
std::string third_party(const std::string& path) {
    return std::string(KILN_FIXTURES_DIR) + "/../../third_party/" + path;
}
std::string qwen3_tokenizer() { return third_party("llm-tokenizer-qwen3"); }
std::string qwen2_vocab() { return third_party("llama-vocab/ggml-vocab-qwen2.gguf"); }

// flux-2-klein-4b-Q4_K.gguf as ComfyUI-GGUF's tools write a DiT: BFL's names,
// the blocks' matrices Q4_K, the embedders, modulation layers, final layer and
// norms kept as they are (BF16, F32).
test::SparseGgufOptions klein_gguf_options() {
    test::SparseGgufOptions o;
    o.type = [](const std::string& name, const std::vector<int64_t>& shape, ggml_type spec_type) {
        const bool block = name.rfind("double_blocks.", 0) == 0 || name.rfind("single_blocks.", 0) == 0;
        return block && shape.size() == 2 ? GGML_TYPE_Q4_K : spec_type;
    };
    o.metadata = {{"general.architecture", std::string("flux")}, {"general.quantization_version", uint32_t{2}}};
    return o;
}

struct Klein {
    std::string name, dit, llm;
};

class Flux2FullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        for (const auto& [spec, file] : {std::pair<const char*, const char*>{"flux2_klein_4b.spec", "flux-2-klein-4b"},
                                         {"flux2_klein_9b.spec", "flux-2-klein-9b"},
                                         {"flux2_ae.spec", "flux2_ae"},
                                         {"qwen3_4b.spec", "qwen_3_4b"},
                                         {"qwen3_8b.spec", "qwen_3_8b"}}) {
            const Status written =
                test::write_sparse_model(fixture(spec), dir_->file(std::string(file) + ".safetensors"));
            ASSERT_TRUE(written.ok()) << written.error().message;
        }
        for (const Status& written :
             {test::write_sparse_gguf(fixture("flux2_klein_4b.spec"), dir_->file("flux-2-klein-4b-Q4_K.gguf"),
                                      klein_gguf_options()),
              test::write_sparse_gguf(fixture("flux2_klein_9b.spec"), dir_->file("flux-2-klein-9b-Q4_K.gguf"),
                                      klein_gguf_options()),
              test::write_sparse_gguf(fixture("qwen3_4b.spec"), dir_->file("Qwen3-4B-Q4_K_M.gguf"),
                                      test::qwen3_4b_q4_k_m_gguf_options(qwen2_vocab())),
              test::write_sparse_gguf(fixture("qwen3_8b.spec"), dir_->file("Qwen3-8B-Q4_K_M.gguf"),
                                      test::qwen3_8b_q4_k_m_gguf_options(qwen2_vocab()))}) {
            ASSERT_TRUE(written.ok()) << written.error().message;
        }
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static Klein klein(const std::string& size) {
        if (size == "4b-q4k") {
            return {"klein 4B Q4_K", dir_->file("flux-2-klein-4b-Q4_K.gguf"), dir_->file("Qwen3-4B-Q4_K_M.gguf")};
        }
        if (size == "9b-q4k") {
            return {"klein 9B Q4_K", dir_->file("flux-2-klein-9b-Q4_K.gguf"), dir_->file("Qwen3-8B-Q4_K_M.gguf")};
        }
        return {"klein " + size, dir_->file("flux-2-klein-" + size + ".safetensors"),
                dir_->file(std::string(size == "4b" ? "qwen_3_4b" : "qwen_3_8b") + ".safetensors")};
    }
    static test::CommandResult plan(const Klein& k, const test::RpcServer& server, int gib,
                                    const std::string& extra = "") {
        const std::string command = std::string(KILN_BIN) + " plan --diffusion-model " + k.dit + " --llm " + k.llm +
                                    " --vae " + dir_->file("flux2_ae.safetensors") +
                                    " --tokenizer llm=" + qwen3_tokenizer() + " --rpc-servers " + server.endpoint() +
                                    " --max-vram RPC0=" + std::to_string(gib) +
                                    " -W 1024 -H 1024 -p 'a photo of a cat' -t 1" + extra;
        auto r = test::run_command(command);
        std::cout << "--- " << k.name << ", " << gib << " GiB" << extra << "\n" << r.out << r.err;
        return r;
    }
    static test::TempDir* dir_;
};
test::TempDir* Flux2FullSize::dir_ = nullptr;

TEST_F(Flux2FullSize, InfoSeesKlein) {
    auto r = test::run_command(std::string(KILN_BIN) + " info " + klein("4b").dit);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("FLUX.2-klein"), std::string::npos) << r.out;
    // Every tensor is the DiT's: its embedders and shared modulation layers included.
    EXPECT_NE(r.out.find("diffusion model: diffusion_model\n    149 tensors"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("other: other"), std::string::npos) << r.out;
}

// klein 4B, bf16 and Q4_K (with Qwen3-4B Q4_K_M), and klein 9B Q4_K with
// llama.cpp's Qwen3-8B Q4_K_M (the GGUFs users of small cards run) fit
// every budget down to 4 GiB, the DiT cut into more segments as the budget
// shrinks, the forecast peak within the budget.
class Flux2FullSizeForms : public Flux2FullSize, public ::testing::WithParamInterface<const char*> {};

TEST_P(Flux2FullSizeForms, PlanFitsEveryBudget) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex peak("RPC0: peak ([0-9.]+) (GiB|MiB)");
    int previous = 0;
    for (int gib : {12, 8, 6, 4}) {
        SCOPED_TRACE(std::to_string(gib) + " GiB");
        auto r = plan(klein(GetParam()), server, gib);
        ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
        EXPECT_TRUE(test::plan_runs(r.out));
        const int segments = test::plan_segments(r.out, "diffusion");
        ASSERT_GT(segments, 0);
        EXPECT_GE(segments, previous) << "a smaller budget cuts the DiT into fewer segments";
        previous = segments;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(r.out, m, peak));
        EXPECT_LE(std::stod(m[1]) / (m[2] == "MiB" ? 1024.0 : 1.0), gib);
    }
    EXPECT_GT(previous, 1) << "4 GiB holds less than the DiT: it must stream";
}

INSTANTIATE_TEST_SUITE_P(Klein, Flux2FullSizeForms, ::testing::Values("4b", "4b-q4k", "9b-q4k"));

// klein 9B at 4 GiB: the first double block with its 1024x1024 attention
// does not fit, and kiln plan names it; with flash attention it fits.
TEST_F(Flux2FullSize, Klein9bNamesTheBlockThatDoesNotFitAndFlashAttentionFitsIt) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    auto fits = plan(klein("9b"), server, 6);
    EXPECT_EQ(fits.exit_code, 0) << fits.out << fits.err;
    EXPECT_TRUE(test::plan_runs(fits.out));
    auto r = plan(klein("9b"), server, 4);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("fits: no"), std::string::npos);
    EXPECT_NE(r.out.find("(double_blocks.0) - DOES NOT FIT"), std::string::npos) << r.out;
    auto flash = plan(klein("9b"), server, 4, " --diffusion-fa");
    EXPECT_EQ(flash.exit_code, 0) << flash.out << flash.err;
    EXPECT_TRUE(test::plan_runs(flash.out));
}

}  // namespace
}  // namespace kiln
