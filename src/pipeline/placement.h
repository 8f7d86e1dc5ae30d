// Where each module computes and where its weights live between uses
// (docs/architecture.md, "The memory system"): from --backend / --params-backend /
// --offload-to-cpu, or chosen by auto-fit.
//
// Auto-fit (on unless --backend or --params-backend is given): the GPU-type
// device with the largest budget computes the modules. They are placed in
// priority order diffusion, ControlNet, text encoder, VAE; each one goes to
// the first place with room: that GPU (leaving its compute reserve and
// staging room for the higher-priority modules already offloaded); another
// GPU where its weights and compute reserve fit, which then computes it;
// for diffusion and te, a layer split over the first GPU and the others
// whose rooms together hold it (weights in RAM, or on disk when RAM cannot
// hold them); else the first GPU computes it with its weights in RAM
// (keeping max(2 GiB, 10% of what is available) free), on another GPU, or
// on disk. With no GPU-type device everything runs on the CPU.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/device_budget.h"
#include "runtime/devices.h"
#include "runtime/module_weights.h"
#include "util/result.h"

namespace kiln::pipeline {

struct ModulePlacement {
    std::string module;                  // "diffusion", "control", "te", "vae"
    std::string compute_device = "CPU";  // ggml's device name
    runtime::ParamsLocation params = runtime::ParamsLocation::ComputeDevice;
    std::string params_device;  // for ParamsLocation::OtherDevice
    // Layer split (--backend diffusion=A&B): the devices after
    // compute_device that run the later ranges of the module's blocks. The
    // params then live off the devices (RAM unless --params-backend says
    // disk or another device) and each device holds copies of its range.
    std::vector<std::string> split_devices;
    bool row_split_asked = false;  // --split-mode row (runs as a layer split: docs/devices.md)
};

struct PlacementRequest {
    std::map<std::string, std::string> backend;         // --backend: module -> device, or "A&B" (split)
    std::map<std::string, std::string> split_mode;      // --split-mode: module -> "layer" | "row"
    std::map<std::string, std::string> params_backend;  // --params-backend: module -> cpu|disk|device
    bool offload_to_cpu = false;                        // --offload-to-cpu: every module's params in RAM
    bool auto_fit = true;                               // --auto-fit (off when backend/params_backend given)
    runtime::BudgetSpec budgets;                        // --max-vram
    // sd-cli's --clip-on-cpu (te), --vae-on-cpu (vae) and --control-net-cpu
    // (control): these compute on the CPU whatever --backend or auto-fit
    // chose for them; the other modules are placed as without them.
    std::set<std::string> on_cpu;
};

// Weight bytes of each module ("diffusion", "te", "vae", and "control" when
// the model has a ControlNet) in compute types.
using ModuleBytes = std::map<std::string, uint64_t>;

// The placement of "diffusion", "control" (only when `bytes` has it), "te"
// and "vae" in that order. `devices` is
// the registry (runtime::list_devices()); `host_available` the RAM kiln may
// use. Errors name the flag and the bad value.
Result<std::vector<ModulePlacement>> place_modules(const PlacementRequest& request, const ModuleBytes& bytes,
                                                   const std::vector<runtime::DeviceInfo>& devices,
                                                   uint64_t host_available);

// Parses --split-mode: "layer" or "row" for every module, or module=mode
// pairs ("diffusion=row,te=layer").
Result<std::map<std::string, std::string>> parse_split_mode(std::string_view spec);

// Parses --params-backend: "cpu", "disk" or a device for every module, or
// module=value pairs (module names as for --backend).
Result<std::map<std::string, std::string>> parse_params_backend(std::string_view spec,
                                                                const std::vector<std::string>& device_names);

// One line per module: "diffusion: computes on RPC0, weights in RAM (1.6 GiB)".
std::string describe_placement(const std::vector<ModulePlacement>& placement, const ModuleBytes& bytes);

}  // namespace kiln::pipeline
