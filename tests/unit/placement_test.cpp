// --max-vram parsing, --params-backend parsing and module placement
// (explicit flags and auto-fit) over synthetic device lists.
#include "pipeline/placement.h"

#include <gtest/gtest.h>

#include "runtime/device_budget.h"

namespace kiln {
namespace {

using pipeline::ModulePlacement;
using pipeline::PlacementRequest;
using runtime::DeviceInfo;
using runtime::ParamsLocation;

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024ull * kMiB;

DeviceInfo device(const std::string& name, DeviceInfo::Type type, uint64_t free) {
    DeviceInfo d;
    d.name = name;
    d.type = type;
    d.free = d.total = free;
    return d;
}

const pipeline::ModuleBytes kSd15 = {{"diffusion", 1640 * kMiB}, {"te", 235 * kMiB}, {"vae", 160 * kMiB}};

std::map<std::string, ModulePlacement> place(const PlacementRequest& r, const std::vector<DeviceInfo>& devices,
                                             uint64_t ram = 32 * kGiB) {
    auto p = pipeline::place_modules(r, kSd15, devices, ram);
    EXPECT_TRUE(p.ok()) << p.error().message;
    std::map<std::string, ModulePlacement> out;
    for (const auto& m : *p) out[m.module] = m;
    return out;
}

TEST(MaxVram, Values) {
    auto all = runtime::parse_max_vram("6");
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->for_device("CUDA0"), 6.0);
    auto mixed = runtime::parse_max_vram("4, rpc0=0.5,cuda1=-1");
    ASSERT_TRUE(mixed.ok());
    EXPECT_EQ(mixed->for_device("rpc0"), 0.5);
    EXPECT_EQ(mixed->for_device("CUDA1"), -1.0);
    EXPECT_EQ(mixed->for_device("cuda0"), 4.0);
    auto units = runtime::parse_max_vram("rpc0=96M,cuda0=512MiB,cpu=2G");
    ASSERT_TRUE(units.ok());
    EXPECT_DOUBLE_EQ(*units->for_device("RPC0"), 96.0 / 1024);
    EXPECT_DOUBLE_EQ(*units->for_device("CUDA0"), 0.5);
    EXPECT_DOUBLE_EQ(*units->for_device("CPU"), 2.0);
    EXPECT_FALSE(units->for_device("CUDA1").has_value());
}

TEST(MaxVram, BadValuesNameTheProblem) {
    EXPECT_EQ(runtime::parse_max_vram("").error().message, "--max-vram: an empty budget");
    EXPECT_EQ(runtime::parse_max_vram("lots").error().message, "--max-vram: 'lots' is not a number of GiB");
    EXPECT_EQ(runtime::parse_max_vram("cuda0=6T").error().message,
              "--max-vram: CUDA0: '6T' has an unknown unit (use GiB numbers, or K, M, G)");
    EXPECT_EQ(runtime::parse_max_vram("cuda0=1,CUDA0=2").error().message, "--max-vram: two budgets for CUDA0");
    EXPECT_EQ(runtime::parse_max_vram("1,2").error().message, "--max-vram: two budgets for every device in '1,2'");
    EXPECT_EQ(runtime::parse_max_vram("=3").error().message, "--max-vram: '=3' names no device");
    // Huge values used to wrap to a budget of 0 B; they are refused.
    for (const char* huge : {"1e12", "17179869184", "99999999999G", "cpu=99999999999", "-1e10", "rpc0=-2e9"}) {
        auto r = runtime::parse_max_vram(huge);
        ASSERT_FALSE(r.ok()) << huge;
        EXPECT_NE(r.error().message.find("1e9 GiB"), std::string::npos) << r.error().message;
    }
    EXPECT_EQ(runtime::parse_max_vram("1e12").error().message,
              "--max-vram: '1e12' is over 1e9 GiB; a positive budget is GiB the device may hold, a negative one the "
              "GiB its free memory at start-up keeps back");
    EXPECT_EQ(runtime::parse_max_vram("1e9").value().all_gib, 1e9);
    EXPECT_EQ(runtime::parse_max_vram("cpu=-5").value().for_device("cpu"), -5.0);
    EXPECT_EQ(runtime::parse_max_vram("4,").error().message, "--max-vram: an empty entry in '4,'");
}

TEST(MaxVram, LedgerBudgetsAndPeak) {
    runtime::DeviceLedger positive(nullptr, 0.5);
    EXPECT_EQ(positive.budget(), 512 * kMiB);
    runtime::DeviceLedger none(nullptr, 0.0);
    EXPECT_FALSE(none.budget().has_value());
    runtime::DeviceLedger negative(nullptr, -1.0);  // free memory now minus 1 GiB
    ASSERT_TRUE(negative.budget().has_value());
    EXPECT_LT(*negative.budget(), runtime::device_free_bytes(nullptr));
    positive.add(100);
    positive.add(50);
    positive.release(120);
    EXPECT_EQ(positive.managed(), 30u);
    EXPECT_EQ(positive.peak(), 150u);
    EXPECT_LE(positive.limit(), 512 * kMiB);
}

TEST(ParamsBackend, ValuesAndErrors) {
    const std::vector<std::string> devices = {"CUDA0", "CPU"};
    auto all = pipeline::parse_params_backend("disk", devices);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->at("diffusion"), "disk");
    EXPECT_EQ(all->at("vae"), "disk");
    auto some = pipeline::parse_params_backend("unet=cpu,Text-Encoder=cuda0", devices);
    ASSERT_TRUE(some.ok());
    EXPECT_EQ(some->at("diffusion"), "CPU");
    EXPECT_EQ(some->at("te"), "CUDA0");
    EXPECT_EQ(some->count("vae"), 0u);
    EXPECT_EQ(pipeline::parse_params_backend("ram", devices).error().message,
              "--params-backend: unknown device 'ram' (valid values: CUDA0, CPU, disk)");
    EXPECT_EQ(pipeline::parse_params_backend("decoder=cpu", devices)
                  .error()
                  .message.rfind("--params-backend: unknown module 'decoder'", 0),
              0u);
}

TEST(Placement, NoGpuRunsEverythingOnTheCpu) {
    auto p = place({}, {device("BLAS", DeviceInfo::Accelerator, 0), device("CPU", DeviceInfo::Cpu, 32 * kGiB)});
    for (const char* m : {"diffusion", "te", "vae"}) {
        EXPECT_EQ(p[m].compute_device, "CPU") << m;
        EXPECT_EQ(p[m].params, ParamsLocation::ComputeDevice) << m;
    }
}

TEST(Placement, AutoFitPutsEverythingOnAGpuWithRoom) {
    auto p = place({}, {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB), device("CPU", DeviceInfo::Cpu, 32 * kGiB)});
    for (const char* m : {"diffusion", "te", "vae"}) {
        EXPECT_EQ(p[m].compute_device, "CUDA0") << m;
        EXPECT_EQ(p[m].params, ParamsLocation::ComputeDevice) << m;
    }
}

TEST(Placement, AutoFitOffloadsInPriorityOrderUnderABudget) {
    const std::vector<DeviceInfo> devices = {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB),
                                             device("CPU", DeviceInfo::Cpu, 32 * kGiB)};
    PlacementRequest r;
    // Room for the UNet, its compute and the VAE's compute reserve, nothing more.
    r.budgets = runtime::parse_max_vram("cuda0=3").value();
    auto p = place(r, devices);
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::ComputeDevice);
    EXPECT_EQ(p["te"].params, ParamsLocation::Host);
    EXPECT_EQ(p["vae"].params, ParamsLocation::Host);
    for (const char* m : {"diffusion", "te", "vae"}) EXPECT_EQ(p[m].compute_device, "CUDA0") << m;
    // A small card: the UNet streams from RAM too.
    r.budgets = runtime::parse_max_vram("cuda0=1").value();
    p = place(r, devices);
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::Host);
    // No RAM either: another GPU, then disk. The GPU with the largest budget
    // computes the UNet (CUDA0's 1 GiB against CUDA1's 512 MiB free); the
    // text encoder fits CUDA1 whole with its compute, so CUDA1 computes it;
    // the VAE's compute (8 times its weights) does not fit there beside it,
    // so CUDA0 computes it from weights kept on CUDA1.
    p = place(r,
              {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB), device("CUDA1", DeviceInfo::Gpu, 512 * kMiB),
               device("CPU", DeviceInfo::Cpu, 0)},
              /*ram=*/0);
    EXPECT_EQ(p["diffusion"].compute_device, "CUDA0");
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::Disk);  // larger than CUDA1
    EXPECT_EQ(p["te"].compute_device, "CUDA1");
    EXPECT_EQ(p["te"].params, ParamsLocation::ComputeDevice);
    EXPECT_EQ(p["vae"].compute_device, "CUDA0");
    EXPECT_EQ(p["vae"].params, ParamsLocation::OtherDevice);
    EXPECT_EQ(p["vae"].params_device, "CUDA1");
}

// Two GPUs, the larger too small for everything: a module that fits the
// other one whole computes there; with --offload-to-cpu nothing moves.
TEST(Placement, AutoFitComputesAModuleOnAnotherGpuWhereItFits) {
    const std::vector<DeviceInfo> devices = {device("CUDA0", DeviceInfo::Gpu, 3 * kGiB),
                                             device("CUDA1", DeviceInfo::Gpu, 2 * kGiB),
                                             device("CPU", DeviceInfo::Cpu, 32 * kGiB)};
    auto p = place({}, devices);
    EXPECT_EQ(p["diffusion"].compute_device, "CUDA0");
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::ComputeDevice);
    // CUDA0 keeps the UNet and the largest compute reserve (the VAE's): the
    // text encoder goes to CUDA1, and the VAE (160 MiB, 1.25 GiB of compute) too.
    for (const char* m : {"te", "vae"}) {
        EXPECT_EQ(p[m].compute_device, "CUDA1") << m;
        EXPECT_EQ(p[m].params, ParamsLocation::ComputeDevice) << m;
    }
    PlacementRequest offload;
    offload.offload_to_cpu = true;
    p = place(offload, devices);
    for (const char* m : {"diffusion", "te", "vae"}) {
        EXPECT_EQ(p[m].compute_device, "CUDA0") << m;
        EXPECT_EQ(p[m].params, ParamsLocation::Host) << m;
    }
}

TEST(Placement, ExplicitFlagsTurnAutoFitOff) {
    const std::vector<DeviceInfo> devices = {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB),
                                             device("CPU", DeviceInfo::Cpu, 32 * kGiB)};
    PlacementRequest r;
    r.backend = {{"diffusion", "CUDA0"}};
    auto p = place(r, devices);
    EXPECT_EQ(p["diffusion"].compute_device, "CUDA0");
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::ComputeDevice);
    EXPECT_EQ(p["te"].compute_device, "CPU");
    EXPECT_EQ(p["vae"].compute_device, "CPU");

    PlacementRequest q;
    q.params_backend = {{"diffusion", "disk"}};
    p = place(q, devices);
    EXPECT_EQ(p["diffusion"].compute_device, "CPU");  // no --backend: the CPU computes
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::Disk);

    PlacementRequest off;
    off.auto_fit = false;
    p = place(off, devices);
    EXPECT_EQ(p["diffusion"].compute_device, "CPU");
}

TEST(Placement, OffloadToCpuKeepsWeightsInRam) {
    PlacementRequest r;
    r.offload_to_cpu = true;
    auto p = place(r, {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB), device("CPU", DeviceInfo::Cpu, 32 * kGiB)});
    for (const char* m : {"diffusion", "te", "vae"}) {
        EXPECT_EQ(p[m].compute_device, "CUDA0") << m;
        EXPECT_EQ(p[m].params, ParamsLocation::Host) << m;
    }
    // Not even short of RAM do they go to disk, as auto-fit alone would put them.
    p = place(r, {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB), device("CPU", DeviceInfo::Cpu, 32 * kGiB)}, kGiB);
    for (const char* m : {"diffusion", "te", "vae"}) EXPECT_EQ(p[m].params, ParamsLocation::Host) << m;
    r.offload_to_cpu = false;
    p = place(r, {device("CUDA0", DeviceInfo::Gpu, kGiB), device("CPU", DeviceInfo::Cpu, 32 * kGiB)}, kGiB);
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::Disk);  // what --offload-to-cpu keeps from happening
    r.offload_to_cpu = true;
    r.backend = {{"diffusion", "CUDA0"}};
    p = place(r, {device("CUDA0", DeviceInfo::Gpu, 24 * kGiB), device("CPU", DeviceInfo::Cpu, 32 * kGiB)});
    EXPECT_EQ(p["diffusion"].params, ParamsLocation::Host);
    EXPECT_EQ(p["vae"].params, ParamsLocation::ComputeDevice);  // the CPU: RAM is its memory
}

}  // namespace
}  // namespace kiln
