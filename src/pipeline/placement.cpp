#include "pipeline/placement.h"

#include <algorithm>

#include "pipeline/module_roles.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

using runtime::DeviceInfo;
using runtime::ParamsLocation;

// In priority order. The ControlNet runs at every step beside the diffusion
// network, so it comes next; it is placed only when the model has one.
const std::vector<std::string> kModules = {"diffusion", "control", "te", "vae"};
const std::string kOptionalModule = "control";

// Compute buffers a module needs besides its weights, as a share of them:
// the UNet's activations are small next to its weights, the VAE's decoder
// works on full-resolution images with few weights. A guide for auto-fit
// only; the executor measures the real graphs and segments or fails cleanly.
double compute_reserve_share(const std::string& module) {
    if (module == "diffusion" || module == "control") return 0.5;
    if (module == "te") return 0.25;
    return 8.0;
}

// Room an offloaded module needs on the compute device to stream its
// weights: a few of its segments at a time.
double staging_share(const std::string& module) { return module == "te" ? 0.10 : 0.15; }

uint64_t device_limit(const DeviceInfo& d, const runtime::BudgetSpec& budgets) {
    const std::optional<double> gib = budgets.for_device(d.name);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    if (!gib || *gib == 0.0) return d.free;
    if (*gib > 0) return std::min<uint64_t>(static_cast<uint64_t>(*gib * kGiB), d.free ? d.free : UINT64_MAX);
    return static_cast<uint64_t>(std::max(0.0, static_cast<double>(d.free) + *gib * kGiB));
}

Result<ParamsLocation> params_location_of(const std::string& value, const std::string& compute, std::string& device) {
    if (value == "disk") return ParamsLocation::Disk;
    if (value == compute) return ParamsLocation::ComputeDevice;
    if (value == "CPU") return ParamsLocation::Host;
    device = value;
    return ParamsLocation::OtherDevice;
}

}  // namespace

Result<std::map<std::string, std::string>> parse_params_backend(std::string_view spec,
                                                                const std::vector<std::string>& device_names) {
    std::vector<std::string> values = device_names;
    values.push_back("disk");
    return parse_module_assignments("--params-backend", spec, values);
}

Result<std::map<std::string, std::string>> parse_split_mode(std::string_view spec) {
    return parse_module_assignments("--split-mode", spec, {"layer", "row"});
}

namespace {

std::string join_devices(const std::vector<std::string>& devices) {
    std::string out;
    for (const std::string& d : devices) out += (out.empty() ? "" : "&") + d;
    return out;
}

// "A&B" from --backend: the module computes on A, and on B for a layer
// split when it is one that splits; a bare "--backend A&B" names every
// module, and those that do not split run on A.
void apply_split(ModulePlacement& p, const PlacementRequest& request) {
    if (p.compute_device.find('&') == std::string::npos) return;
    std::vector<std::string> devices = split_list(p.compute_device, '&');
    p.compute_device = devices.front();
    if (!module_can_split(p.module)) return;
    p.split_devices.assign(devices.begin() + 1, devices.end());
    if (auto mode = request.split_mode.find(p.module); mode != request.split_mode.end()) {
        p.row_split_asked = mode->second == "row";
    }
}

Result<std::vector<ModulePlacement>> place_each_module(const PlacementRequest& request, const ModuleBytes& bytes,
                                                       const std::vector<DeviceInfo>& devices,
                                                       uint64_t host_available) {
    auto bytes_of = [&](const std::string& m) {
        auto it = bytes.find(m);
        return it == bytes.end() ? uint64_t{0} : it->second;
    };
    std::vector<std::string> modules;
    for (const std::string& m : kModules) {
        if (m != kOptionalModule || bytes.count(m)) modules.push_back(m);
    }
    std::vector<ModulePlacement> out;
    const bool auto_fit = request.auto_fit && request.backend.empty() && request.params_backend.empty();
    if (!auto_fit) {
        for (const std::string& m : modules) {
            ModulePlacement p;
            p.module = m;
            if (auto it = request.backend.find(m); it != request.backend.end()) p.compute_device = it->second;
            apply_split(p, request);
            std::string value = request.offload_to_cpu ? "CPU" : p.compute_device;
            if (auto it = request.params_backend.find(m); it != request.params_backend.end()) value = it->second;
            auto where = params_location_of(value, p.compute_device, p.params_device);
            if (!where.ok()) return where.error();
            p.params = *where;
            // A split module's weights cannot all live on its first device:
            // each device holds copies of its range, staged from RAM.
            if (!p.split_devices.empty() && p.params == ParamsLocation::ComputeDevice) p.params = ParamsLocation::Host;
            out.push_back(p);
        }
        return out;
    }

    // Auto-fit: the GPU-type device with the most room computes everything.
    const DeviceInfo* gpu = nullptr;
    for (const DeviceInfo& d : devices) {
        if (d.type != DeviceInfo::Gpu) continue;  // accelerators (BLAS) assist the CPU
        if (!gpu || device_limit(d, request.budgets) > device_limit(*gpu, request.budgets)) gpu = &d;
    }
    if (!gpu) {
        KILN_LOG_INFO("auto-fit: no GPU-type device; every module runs on the CPU");
        for (const std::string& m : modules) {
            ModulePlacement p;
            p.module = m;
            out.push_back(p);
        }
        return out;
    }
    const uint64_t room = device_limit(*gpu, request.budgets);
    const uint64_t keep_free = std::max<uint64_t>(2ull << 30, host_available / 10);
    uint64_t host_room = host_available > keep_free ? host_available - keep_free : 0;
    // The other GPUs: room left, and the largest compute reserve of a
    // module that computes there (modules run one at a time).
    struct OtherGpu {
        uint64_t room = 0;
        uint64_t reserve = 0;
    };
    std::map<std::string, OtherGpu> other_room;
    for (const DeviceInfo& d : devices) {
        if (&d != gpu && d.type == DeviceInfo::Gpu) {
            other_room[d.name].room = device_limit(d, request.budgets);
        }
    }
    // Modules run one at a time: the device keeps room for the hungriest
    // one's compute, plus staging room for every offloaded module.
    uint64_t compute_reserve = 0;
    for (const std::string& m : modules) {
        compute_reserve = std::max<uint64_t>(
            compute_reserve, static_cast<uint64_t>(static_cast<double>(bytes_of(m)) * compute_reserve_share(m)));
    }
    uint64_t placed = 0, staging = 0;
    for (const std::string& m : modules) {
        ModulePlacement p;
        p.module = m;
        p.compute_device = gpu->name;
        const uint64_t w = bytes_of(m);
        const uint64_t stage = static_cast<uint64_t>(static_cast<double>(w) * staging_share(m));
        // Another GPU where the module fits whole with its compute: it
        // computes there, its weights resident, rather than streaming them
        // to the first GPU.
        const uint64_t own_reserve = static_cast<uint64_t>(static_cast<double>(w) * compute_reserve_share(m));
        auto spare_gpu = [&]() -> std::pair<const std::string, OtherGpu>* {
            for (auto& entry : other_room) {
                if (w + std::max(own_reserve, entry.second.reserve) <= entry.second.room) return &entry;
            }
            return nullptr;
        };
        // A module too large for any one GPU, split across the first and
        // the others with room beside their compute reserves (sd-cli's
        // auto-fit does the same for diffusion and te): the GPUs it takes,
        // their share of it now counted, or none when they cannot hold it.
        auto split_over_gpus = [&](uint64_t bytes, uint64_t reserve) -> std::vector<std::string> {
            if (!module_can_split(m)) return {};
            const uint64_t first_room =
                room > placed + compute_reserve + staging ? room - placed - compute_reserve - staging : 0;
            uint64_t total = first_room;
            std::vector<std::pair<std::string, uint64_t>> takers;
            for (const auto& [name, other] : other_room) {
                const uint64_t keep = std::max(reserve, other.reserve);
                if (other.room > keep) {
                    takers.emplace_back(name, other.room - keep);
                    total += other.room - keep;
                }
            }
            if (takers.empty() || bytes > total) return {};
            std::vector<std::string> names;
            for (const auto& [name, free] : takers) {
                const auto share = static_cast<uint64_t>(static_cast<double>(bytes) * static_cast<double>(free) /
                                                         static_cast<double>(total));
                other_room[name].room -= share;
                other_room[name].reserve = std::max(other_room[name].reserve, reserve);
                names.push_back(name);
            }
            placed += static_cast<uint64_t>(static_cast<double>(bytes) * static_cast<double>(first_room) /
                                            static_cast<double>(total));
            return names;
        };
        if (!request.offload_to_cpu && placed + w + compute_reserve + staging <= room) {
            p.params = ParamsLocation::ComputeDevice;
            placed += w;
        } else if (auto* other = request.offload_to_cpu ? nullptr : spare_gpu()) {
            p.compute_device = other->first;
            p.params = ParamsLocation::ComputeDevice;
            other->second.room -= w;
            other->second.reserve = std::max(other->second.reserve, own_reserve);
        } else if (auto split = request.offload_to_cpu ? std::vector<std::string>{} : split_over_gpus(w, own_reserve);
                   !split.empty()) {
            p.split_devices = split;
            p.params = w <= host_room ? ParamsLocation::Host : ParamsLocation::Disk;
            if (p.params == ParamsLocation::Host) host_room -= w;
        } else if (w <= host_room || request.offload_to_cpu) {
            // --offload-to-cpu is sd-cli's: the weights live in RAM, whatever
            // room auto-fit would keep free there (the plan says when RAM
            // cannot hold them; they are never streamed from disk).
            p.params = ParamsLocation::Host;
            host_room -= std::min(w, host_room);
            staging += stage;
        } else {
            p.params = ParamsLocation::Disk;
            for (auto& [name, other] : other_room) {
                if (w + other.reserve <= other.room) {
                    p.params = ParamsLocation::OtherDevice;
                    p.params_device = name;
                    other.room -= w;
                    break;
                }
            }
            staging += stage;
        }
        out.push_back(p);
    }
    return out;
}

}  // namespace

Result<std::vector<ModulePlacement>> place_modules(const PlacementRequest& request, const ModuleBytes& bytes,
                                                   const std::vector<DeviceInfo>& devices, uint64_t host_available) {
    auto placed = place_each_module(request, bytes, devices, host_available);
    if (!placed.ok() || request.on_cpu.empty()) return placed;
    for (ModulePlacement& p : *placed) {
        if (!request.on_cpu.count(p.module)) continue;
        p.compute_device = "CPU";
        p.split_devices.clear();
        p.params_device.clear();
        p.params = ParamsLocation::ComputeDevice;  // RAM, or the mapped file
        if (auto it = request.params_backend.find(p.module); it != request.params_backend.end()) {
            auto where = params_location_of(it->second, p.compute_device, p.params_device);
            if (!where.ok()) return where.error();
            p.params = *where;
        }
    }
    return placed;
}

std::string describe_placement(const std::vector<ModulePlacement>& placement, const ModuleBytes& bytes) {
    std::string out;
    for (const ModulePlacement& p : placement) {
        auto it = bytes.find(p.module);
        const uint64_t w = it == bytes.end() ? 0 : it->second;
        std::string where;
        switch (p.params) {
            case runtime::ParamsLocation::ComputeDevice: where = "on " + p.compute_device; break;
            case runtime::ParamsLocation::Host: where = "in RAM"; break;
            case runtime::ParamsLocation::OtherDevice: where = "on " + p.params_device; break;
            case runtime::ParamsLocation::Disk: where = "on disk"; break;
        }
        const std::string devices = p.split_devices.empty()
                                        ? p.compute_device
                                        : p.compute_device + "&" + join_devices(p.split_devices) + " (layer split)";
        out += p.module + ": computes on " + devices + ", weights " + where + " (" + human_bytes(w) + ")\n";
    }
    return out;
}

}  // namespace kiln::pipeline
