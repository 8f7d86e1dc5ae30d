// FLUX.2 [dev] at its released sizes, without a weight read: the DiT as
// city96's GGUFs (Q4_K_S and Q8_0 from training/fixtures/make_flux2_specs.py's
// flux2_dev.spec), Mistral Small 3.2 24B as unsloth's Q4_K_M GGUF, FLUX.2's
// ae, all sparse files, and the tiny Tekken tokenizer (ids are not what a
// plan weighs). kiln plan on a loopback RPC device at 24, 16 and 12 GiB with
// this machine's RAM: the budget table of docs/flux2.md. (The loopback
// device reports this machine's memory, so larger budgets are not seen.)
#include <gtest/gtest.h>

#include <iostream>
#include <regex>

#include "golden.h"
#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/" + name; }

// city96's FLUX.2-dev GGUFs: BFL's names, the blocks' matrices quantized,
// the embedders, modulation layers, final layer and norms as released.
test::SparseGgufOptions dit_gguf_options(ggml_type quantized) {
    test::SparseGgufOptions o;
    o.type = [quantized](const std::string& name, const std::vector<int64_t>& shape, ggml_type spec_type) {
        const bool block = name.rfind("double_blocks.", 0) == 0 || name.rfind("single_blocks.", 0) == 0;
        return block && shape.size() == 2 ? quantized : spec_type;
    };
    o.metadata = {{"general.architecture", std::string("flux")}, {"general.quantization_version", uint32_t{2}}};
    return o;
}

// unsloth's Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf: llama.cpp's
// names and Q4_K_M rules, the llama architecture with Mistral's theta.
test::SparseGgufOptions mistral_gguf_options() {
    test::SparseGgufOptions o;
    o.rename = test::qwen3_llama_cpp_name;  // the same HF -> llama.cpp names, QK norms aside
    o.type = test::llama_cpp_q4_k_m(40);
    o.metadata = {
        {"general.architecture", std::string("llama")},
        {"general.name", std::string("Mistral-Small-3.2-24B-Instruct-2506")},
        {"general.file_type", uint32_t{15}},  // LLAMA_FTYPE_MOSTLY_Q4_K_M
        {"general.quantization_version", uint32_t{2}},
        {"llama.block_count", uint32_t{40}},
        {"llama.context_length", uint32_t{131072}},
        {"llama.embedding_length", uint32_t{5120}},
        {"llama.feed_forward_length", uint32_t{32768}},
        {"llama.attention.head_count", uint32_t{32}},
        {"llama.attention.head_count_kv", uint32_t{8}},
        {"llama.attention.key_length", uint32_t{128}},
        {"llama.attention.value_length", uint32_t{128}},
        {"llama.rope.freq_base", 1000000000.0f},
        {"llama.attention.layer_norm_rms_epsilon", 1e-5f},
    };
    return o;
}

class Flux2DevFullSize : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        for (const Status& written :
             {test::write_sparse_gguf(fixture("flux2_dev.spec"), dir_->file("flux2-dev-Q4_K_S.gguf"),
                                      dit_gguf_options(GGML_TYPE_Q4_K)),
              test::write_sparse_gguf(fixture("flux2_dev.spec"), dir_->file("flux2-dev-Q8_0.gguf"),
                                      dit_gguf_options(GGML_TYPE_Q8_0)),
              test::write_sparse_gguf(fixture("mistral_small_3_2_24b.spec"),
                                      dir_->file("Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf"),
                                      mistral_gguf_options()),
              test::write_sparse_model(fixture("flux2_ae.spec"), dir_->file("flux2_ae.safetensors"))}) {
            ASSERT_TRUE(written.ok()) << written.error().message;
        }
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static test::CommandResult plan(const std::string& dit, const test::RpcServer& server, int vram_gib,
                                    const std::string& flags = "") {
        const std::string command = std::string(KILN_BIN) + " plan --diffusion-model " + dir_->file(dit) + " --llm " +
                                    dir_->file("Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf") + " --vae " +
                                    dir_->file("flux2_ae.safetensors") +
                                    " --tokenizer llm=" + test::golden_path("pipeline/flux2_dev_tiny/tokenizer") +
                                    " --rpc-servers " + server.endpoint() +
                                    " --max-vram RPC0=" + std::to_string(vram_gib) +
                                    " -W 1024 -H 1024 -p 'a photo of a cat' -t 1 --diffusion-fa" + flags;
        auto r = test::run_command(command);
        std::cout << "--- " << dit << ", " << vram_gib << " GiB GPU" << flags << "\n" << r.out << r.err;
        return r;
    }
    static test::TempDir* dir_;
};
test::TempDir* Flux2DevFullSize::dir_ = nullptr;

TEST_F(Flux2DevFullSize, InfoSeesDevAndItsMistral) {
    auto dit = test::run_command(std::string(KILN_BIN) + " info " + dir_->file("flux2-dev-Q4_K_S.gguf"));
    ASSERT_EQ(dit.exit_code, 0) << dit.out << dit.err;
    EXPECT_NE(dit.out.find("FLUX.2-dev"), std::string::npos) << dit.out;
    EXPECT_EQ(dit.out.find("FLUX.2-klein"), std::string::npos) << dit.out;
    // BFL's text_encoder/ layout (language_model.*, a vision tower) is one
    // text encoder, not "other".
    auto te = test::run_command(std::string(KILN_BIN) + " info " +
                                test::golden_path("models/flux2_dev_mistral_tiny.safetensors"));
    ASSERT_EQ(te.exit_code, 0) << te.out << te.err;
    EXPECT_NE(te.out.find("text encoder: text_encoder\n    301 tensors"), std::string::npos) << te.out;
    EXPECT_EQ(te.out.find("other"), std::string::npos) << te.out;
}

// Every GPU size runs, the DiT in more segments as the budget shrinks, the
// peak within the budget; a DiT larger than RAM is read from disk at every
// step, and the plan says so.
TEST_F(Flux2DevFullSize, PlanRunsOnEveryGpuSize) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    const std::regex peak("RPC0: peak ([0-9.]+) (GiB|MiB)");
    for (const char* dit : {"flux2-dev-Q4_K_S.gguf", "flux2-dev-Q8_0.gguf"}) {
        int previous = 0;
        for (int vram : {24, 16, 12}) {
            SCOPED_TRACE(std::string(dit) + " " + std::to_string(vram) + " GiB");
            auto r = plan(dit, server, vram);
            ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
            EXPECT_TRUE(test::plan_runs(r.out)) << r.out;
            const int segments = test::plan_segments(r.out, "diffusion");
            EXPECT_GE(segments, previous) << "a smaller budget cuts the DiT into fewer segments";
            previous = segments;
            std::smatch m;
            ASSERT_TRUE(std::regex_search(r.out, m, peak)) << r.out;
            EXPECT_LE(std::stod(m[1]) / (m[2] == "MiB" ? 1024.0 : 1.0), vram);
            // Whether the DiT fits in RAM is this machine's; when it does
            // not, the plan names what each step reads.
            if (r.out.find("\nfits: only by streaming") != std::string::npos) {
                EXPECT_NE(r.out.find("diffusion on RPC0: " + std::to_string(segments) + " segments"),
                          std::string::npos);
                EXPECT_NE(r.out.find(std::string(dit) == "flux2-dev-Q8_0.gguf" ? "reads its 32.60 GiB of weights"
                                                                               : "reads its 17.97 GiB of weights"),
                          std::string::npos)
                    << r.out;
            }
        }
    }
}

// A 32 GiB card, which this machine does not have: the loopback server
// reports 40 GiB (kiln rpc-server --mem) and the budget is 32. The Q4_K_S
// DiT (17.97 GiB) stays on the card; the Q8_0 one (32.60 GiB) does not fit
// beside its compute and streams.
TEST_F(Flux2DevFullSize, PlanForAThirtyTwoGibCard) {
    test::RpcServer server({"--mem", "40G"});
    ASSERT_TRUE(server.ok()) << server.log();
    auto devices = test::run_command(std::string(KILN_BIN) + " --list-devices --rpc-servers " + server.endpoint());
    EXPECT_NE(devices.out.find("40.00 GiB"), std::string::npos) << devices.out << devices.err;
    auto q4 = plan("flux2-dev-Q4_K_S.gguf", server, 32);
    ASSERT_EQ(q4.exit_code, 0) << q4.out << q4.err;
    EXPECT_TRUE(test::plan_runs(q4.out)) << q4.out;
    EXPECT_NE(q4.out.find("diffusion: computes on RPC0, weights on RPC0"), std::string::npos) << q4.out;
    auto q8 = plan("flux2-dev-Q8_0.gguf", server, 32);
    ASSERT_EQ(q8.exit_code, 0) << q8.out << q8.err;
    EXPECT_EQ(q8.out.find("diffusion: computes on RPC0, weights on RPC0"), std::string::npos) << q8.out;
}

// Machines with 32 and 64 GiB of RAM, which this one is not (kiln plan
// --ram), beside a 24 GiB card: with 32 GiB available the Q8_0 DiT (32.60
// GiB) does not stay in RAM and every step reads it from disk; with 64 GiB it
// is read once and stays. The Q4_K_S DiT stays in RAM on both. A bad size is
// one usage error, and --ram is kiln plan's alone.
TEST_F(Flux2DevFullSize, PlanForThirtyTwoAndSixtyFourGibOfRam) {
    test::RpcServer server;
    ASSERT_TRUE(server.ok()) << server.log();
    auto q8_32 = plan("flux2-dev-Q8_0.gguf", server, 24, " --ram 32G");
    ASSERT_EQ(q8_32.exit_code, 0) << q8_32.out << q8_32.err;
    EXPECT_NE((q8_32.out + q8_32.err).find("planning for a machine with 32.00 GiB of RAM available"), std::string::npos)
        << q8_32.out;
    EXPECT_NE(q8_32.out.find("diffusion: computes on RPC0, weights on disk (32.60 GiB)"), std::string::npos)
        << q8_32.out;
    EXPECT_NE(q8_32.out.find("\nfits: only by streaming"), std::string::npos) << q8_32.out;
    auto q8_64 = plan("flux2-dev-Q8_0.gguf", server, 24, " --ram 64G");
    ASSERT_EQ(q8_64.exit_code, 0) << q8_64.out << q8_64.err;
    EXPECT_TRUE(test::plan_runs(q8_64.out)) << q8_64.out;
    EXPECT_NE(q8_64.out.find("diffusion: computes on RPC0, weights in RAM (32.60 GiB)"), std::string::npos)
        << q8_64.out;
    EXPECT_EQ(q8_64.out.find("only by streaming"), std::string::npos) << q8_64.out;
    auto q4_32 = plan("flux2-dev-Q4_K_S.gguf", server, 24, " --ram 32G");
    ASSERT_EQ(q4_32.exit_code, 0) << q4_32.out << q4_32.err;
    EXPECT_EQ(q4_32.out.find("weights on disk (17.97 GiB)"), std::string::npos) << q4_32.out;
    EXPECT_EQ(q4_32.out.find("only by streaming"), std::string::npos) << q4_32.out;

    for (const char* bad : {"plan --ram lots", "plan --ram 0", "--ram 32G"}) {
        auto r = test::run_command(std::string(KILN_BIN) + " " + bad + " -p x");
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
        EXPECT_NE(r.err.find("--ram"), std::string::npos) << bad << ": " << r.err;
    }
}

}  // namespace
}  // namespace kiln
