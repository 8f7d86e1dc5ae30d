// Layer split (--backend "diffusion=RPC0&RPC1"): a module's segments cut into
// contiguous ranges, one per device, each range under the memory system of
// its own device. Two `kiln rpc-server` children on 127.0.0.1 are the
// devices (both run ggml's CPU kernels, so one device's image is the
// reference for the split's, byte for byte).
//   - Flux at full width with reduced depth (tests/fixtures/flux_medium.spec):
//     the split gives the one-device image, unconstrained and under budgets
//     that cut each device's range into segments, params in RAM; the peaks
//     stay within the budgets and kiln plan names each device's range;
//   - auto-fit splits a module no one device holds, as kiln plan says;
//   - --split-mode row: the fallback to layer split is said, the image is the
//     layer split's; a run-time LoRA on a split module;
//   - bad device lists are usage errors naming the problem.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "random_model.h"
#include "rpc_child.h"
#include "test_files.h"

namespace kiln {
namespace {

std::string kiln_cli(const std::string& args) { return std::string(KILN_BIN) + " " + args + " -t 1"; }

// "memory: RPC1 peak 1.50 MiB" -> bytes; 0 when the line is missing.
uint64_t peak_of(const std::string& out, const std::string& device) {
    const std::regex line("memory: " + device + " peak ([0-9.]+) (B|KiB|MiB|GiB)");
    std::smatch m;
    if (!std::regex_search(out, m, line)) return 0;
    const std::string unit = m[2];
    const double scale = unit == "GiB"   ? 1024.0 * 1024 * 1024
                         : unit == "MiB" ? 1024.0 * 1024
                         : unit == "KiB" ? 1024
                                         : 1;
    return static_cast<uint64_t>(std::stod(m[1]) * scale);
}

// "diffusion layer split: RPC1 ran segments 4-9 in 3 group(s)" -> 3; -1 when missing.
int groups_on(const std::string& out, const std::string& device) {
    const std::regex line("diffusion layer split: " + device + " ran segments [0-9]+-[0-9]+ in ([0-9]+) group");
    std::smatch m;
    return std::regex_search(out, m, line) ? std::stoi(m[1]) : -1;
}

// "... RPC1 ran ...; 2 weight block(s) started uploading while the device
// before it computed" -> 2; -1 when missing.
int handoff_prefetches(const std::string& out, const std::string& device) {
    const std::regex line("diffusion layer split: " + device +
                          " ran [^\\n]*; ([0-9]+) weight block\\(s\\) started uploading while the device before");
    std::smatch m;
    return std::regex_search(out, m, line) ? std::stoi(m[1]) : -1;
}

std::string kib(uint64_t bytes) { return std::to_string(bytes / 1024) + "K"; }

class LayerSplit : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(first_.ok()) << first_.log();
        ASSERT_TRUE(second_.ok()) << second_.log();
    }
    std::string servers() const { return " --rpc-servers " + first_.endpoint() + "," + second_.endpoint(); }

    test::RpcServer first_, second_;
    test::TempDir dir_;
};

TEST_F(LayerSplit, FluxOverTwoDevicesIsTheOneDeviceImageUnderEveryBudget) {
    const std::string model = dir_.file("flux_medium.safetensors");
    ASSERT_TRUE(test::write_random_model(std::string(KILN_FIXTURES_DIR) + "/flux_medium.spec", model).ok());
    const std::string job = servers() + " -m " + model + " --tokenizer clip_l=" + KILN_FIXTURES_DIR +
                            "/tiny_tokenizer,t5xxl=" + KILN_GOLDEN_DIR +
                            "/pipeline/flux_tiny/tokenizer_2 -W 64 -H 64 --steps 1 --cfg-scale 1 --seed 5 -v -p " +
                            "'a red circle'";
    const std::string split = " --backend 'diffusion=RPC0&RPC1,te=CPU,vae=CPU'";

    auto one = test::run_command(kiln_cli(job +
                                          " --backend diffusion=RPC0,te=CPU,vae=CPU --params-backend "
                                          "diffusion=cpu -o " +
                                          dir_.file("one.png")));
    ASSERT_EQ(one.exit_code, 0) << one.err;

    auto whole = test::run_command(kiln_cli(job + split + " -o " + dir_.file("split.png")));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    EXPECT_NE(whole.out.find("diffusion: computes on RPC0&RPC1 (layer split), weights in RAM"), std::string::npos)
        << whole.out;
    EXPECT_EQ(test::read_bytes(dir_.file("one.png")), test::read_bytes(dir_.file("split.png")));
    EXPECT_EQ(groups_on(whole.out, "RPC0"), 1) << whole.out;
    EXPECT_EQ(groups_on(whole.out, "RPC1"), 1) << whole.out;
    const uint64_t peak0 = peak_of(whole.out, "RPC0"), peak1 = peak_of(whole.out, "RPC1");
    ASSERT_GT(peak0, 0u) << whole.out;
    ASSERT_GT(peak1, 0u) << whole.out;
    // Each device holds its own range, not the whole DiT (2.5 GB as F16).
    const uint64_t dit = peak_of(one.out, "RPC0");
    EXPECT_LT(peak0, dit * 3 / 4) << whole.out;
    EXPECT_LT(peak1, dit * 3 / 4) << whole.out;

    // Budgets that cut each range into segments (60% of each device's
    // unconstrained peak holds its largest block): the same image, and no
    // device's managed peak above its budget.
    const uint64_t budget0 = peak0 * 6 / 10, budget1 = peak1 * 6 / 10;
    const std::string budgets = " --max-vram RPC0=" + kib(budget0) + ",RPC1=" + kib(budget1);
    auto plan = test::run_command(kiln_cli("plan" + job + split + budgets));
    EXPECT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    for (const char* device : {"RPC0", "RPC1"}) {
        const std::regex share(std::string("layer split: ") + device +
                               " runs '[^']+'\\.\\.'[^']+', [0-9.]+ [KMG]iB of "
                               "weights, [0-9]+ segments");
        EXPECT_TRUE(std::regex_search(plan.out, share)) << device << "\n" << plan.out;
    }
    EXPECT_NE(plan.out.find("fits: yes"), std::string::npos) << plan.out;

    auto cut = test::run_command(kiln_cli(job + split + budgets + " -o " + dir_.file("cut.png")));
    ASSERT_EQ(cut.exit_code, 0) << cut.err;
    EXPECT_EQ(test::read_bytes(dir_.file("one.png")), test::read_bytes(dir_.file("cut.png")));
    EXPECT_GT(groups_on(cut.out, "RPC0"), 1) << cut.out;
    EXPECT_GT(groups_on(cut.out, "RPC1"), 1) << cut.out;
    // Each device of the split reports its own compute buffers.
    for (const char* device : {"RPC0", "RPC1"}) {
        const std::regex buffers(std::string("diffusion compute buffers peak [0-9.]+ [KMG]iB on ") + device);
        EXPECT_TRUE(std::regex_search(cut.out, buffers)) << device << "\n" << cut.out;
    }
    // RPC1's first segment starts uploading while RPC0 computes its last
    // group (RPC0 has nobody before it); without prefetch, nothing does.
    EXPECT_GT(handoff_prefetches(cut.out, "RPC1"), 0) << cut.out;
    EXPECT_EQ(handoff_prefetches(cut.out, "RPC0"), 0) << cut.out;
    auto serial =
        test::run_command(kiln_cli(job + split + budgets + " --disable-prefetch -o " + dir_.file("serial.png")));
    ASSERT_EQ(serial.exit_code, 0) << serial.err;
    EXPECT_EQ(handoff_prefetches(serial.out, "RPC1"), 0) << serial.out;
    EXPECT_EQ(test::read_bytes(dir_.file("one.png")), test::read_bytes(dir_.file("serial.png")));
    // (The log rounds to 0.01 MiB.)
    EXPECT_LE(peak_of(cut.out, "RPC0"), budget0 + 8192) << cut.out;
    EXPECT_LE(peak_of(cut.out, "RPC1"), budget1 + 8192) << cut.out;
}

// The ranges a text names for `device`: kiln plan's "layer split: RPC1 runs
// 'a'..'b'" and the run's "layer split: RPC1 runs segments 'a'..'b'".
std::string range_of(const std::string& text, const std::string& device) {
    const std::regex line("layer split: " + device + " runs (segments )?('[^']+'\\.\\.'[^']+')");
    std::smatch m;
    return std::regex_search(text, m, line) ? m[2].str() : std::string("(none)");
}

// Auto-fit with two devices of different budgets, neither of which holds the
// default model's UNet (3.36 MiB) beside the compute it keeps free (the
// VAE's, 14.6 MiB): the UNet is split between them with its weights in RAM.
// kiln plan says so and names each device's range, the run takes the same
// ranges, and the image is the one a single device makes.
TEST_F(LayerSplit, AutoFitSplitsAModuleNoOneDeviceHolds) {
    auto one = test::run_command(kiln_cli(" --rpc-servers " + first_.endpoint() + " -p x -o " + dir_.file("one.png")));
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const std::string two = servers() + " --max-vram RPC0=16M,RPC1=4M -p x";
    auto plan = test::run_command(kiln_cli("plan" + two));
    ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    for (const char* line : {"diffusion: computes on RPC0&RPC1 (layer split), weights in RAM", "fits: yes"}) {
        EXPECT_NE(plan.out.find(line), std::string::npos) << line << "\n" << plan.out;
    }
    auto run = test::run_command(kiln_cli(two + " -v -o " + dir_.file("two.png")));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    for (const char* device : {"RPC0", "RPC1"}) {
        EXPECT_NE(range_of(plan.out, device), "(none)") << plan.out;
        EXPECT_EQ(range_of(plan.out, device), range_of(run.out, device)) << plan.out << run.out;
    }
    EXPECT_EQ(test::read_bytes(dir_.file("one.png")), test::read_bytes(dir_.file("two.png")));
}

// No RPC or CPU device offers ggml's split buffers: row split is said to run
// as a layer split, and gives its image.
TEST_F(LayerSplit, RowSplitFallsBackToLayerSplit) {
    const std::string job = servers() + " --steps 2 --seed 3 -p 'a red circle' --backend 'diffusion=RPC0&RPC1,te=CPU'";
    auto layer = test::run_command(kiln_cli(job + " -o " + dir_.file("layer.png")));
    ASSERT_EQ(layer.exit_code, 0) << layer.err;
    auto row = test::run_command(kiln_cli(job + " --split-mode diffusion=row -o " + dir_.file("row.png")));
    ASSERT_EQ(row.exit_code, 0) << row.err;
    EXPECT_NE((row.out + row.err)
                  .find("warn: --split-mode row: none of the listed devices offers a split buffer type (ggml has one "
                        "for CUDA); diffusion runs as a layer split"),
              std::string::npos)
        << row.out << row.err;
    EXPECT_EQ((layer.out + layer.err).find("--split-mode"), std::string::npos) << layer.out << layer.err;
    EXPECT_EQ(test::read_bytes(dir_.file("layer.png")), test::read_bytes(dir_.file("row.png")));
}

// A LoRA applied at run time adds weights the split module's devices hold
// like its own: each device takes the adapters its range reads, and the
// image is the one-device image (which the LoRA changes). --split-mode row
// asks for the same.
TEST_F(LayerSplit, RuntimeLoraOnASplitModule) {
    const std::string job = servers() + " -m " + KILN_GOLDEN_DIR + "/models/sd1_tiny.safetensors --tokenizer " +
                            KILN_FIXTURES_DIR + "/tiny_tokenizer --lora-model-dir " + KILN_GOLDEN_DIR +
                            "/lora --lora-apply-mode at_runtime -W 32 -H 32 --steps 2 --seed 4 --backend ";
    const std::string lora = " -p '<lora:sd1_lora_kohya:1> a red circle' -o ";
    auto plain = test::run_command(kiln_cli(job + "diffusion=RPC0,te=CPU -p 'a red circle' -o " + dir_.file("0.png")));
    auto one = test::run_command(
        kiln_cli(job + "diffusion=RPC0,te=CPU --params-backend diffusion=cpu" + lora + dir_.file("1.png")));
    auto split =
        test::run_command(kiln_cli(job + "'diffusion=RPC0&RPC1,te=CPU' --split-mode row" + lora + dir_.file("2.png")));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_EQ(split.exit_code, 0) << split.err;
    EXPECT_NE(test::read_bytes(dir_.file("0.png")), test::read_bytes(dir_.file("1.png"))) << "the LoRA changed nothing";
    EXPECT_EQ(test::read_bytes(dir_.file("1.png")), test::read_bytes(dir_.file("2.png")));
}

TEST_F(LayerSplit, BadDeviceListsAreUsageErrors) {
    struct Case {
        std::string args, message;
    } cases[] = {
        {"--backend 'diffusion=rpc0&rpc0'", "--backend: 'rpc0&rpc0' lists RPC0 twice"},
        {"--backend 'diffusion=rpc0&disk'", "--backend: 'disk' holds weights (--params-backend), it computes nothing"},
        {"--backend 'diffusion=rpc0&rpc7'", "--backend: unknown device 'rpc7' (valid devices: "},
        {"--backend 'vae=rpc0&rpc1'", "--backend: 'vae=rpc0&rpc1': only diffusion and te can be split across devices"},
        {"--params-backend 'diffusion=cpu&disk'", "--params-backend: 'cpu&disk': takes one place per module"},
        {"--split-mode diagonal", "--split-mode: unknown mode 'diagonal' (valid values: layer, row)"},
    };
    for (const Case& c : cases) {
        const std::string out = dir_.file("never.png");
        auto r = test::run_command(kiln_cli(servers() + " " + c.args + " -p x -o " + out));
        EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
        EXPECT_FALSE(std::ifstream(out).good()) << c.args;
    }
}

}  // namespace
}  // namespace kiln
