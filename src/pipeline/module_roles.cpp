#include "pipeline/module_roles.h"

#include <algorithm>

#include "runtime/devices.h"
#include "util/format.h"

namespace kiln::pipeline {
namespace {

// Module aliases, keyed by the normalised spelling (lower case, no '-'/'_').
const std::map<std::string, std::string>& module_aliases() {
    static const std::map<std::string, std::string> aliases = {
        {"diffusion", "diffusion"},
        {"unet", "diffusion"},
        {"dit", "diffusion"},
        {"transformer", "diffusion"},
        {"te", "te"},
        {"clip", "te"},
        {"textencoder", "te"},
        {"textencoders", "te"},
        {"condstage", "te"},
        {"vae", "vae"},
        {"clipvision", "clip_vision"},
        {"control", "control"},
        {"controlnet", "control"},
    };
    return aliases;
}

}  // namespace

const std::vector<std::string>& known_modules() {
    static const std::vector<std::string> modules = {"diffusion", "te", "vae", "clip_vision", "control"};
    return modules;
}

bool module_can_split(const std::string& module) { return module == "diffusion" || module == "te"; }

std::string normalize_module_name(std::string_view name) {
    std::string key;
    for (char c : name) {
        if (c == '-' || c == '_') continue;
        key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    const auto& aliases = module_aliases();
    const auto it = aliases.find(key);
    return it == aliases.end() ? std::string() : it->second;
}

Result<std::map<std::string, std::string>> parse_module_assignments(std::string_view flag, std::string_view spec,
                                                                    const std::vector<std::string>& device_names) {
    const std::string f(flag);
    const std::string valid_devices =
        (f == "--backend" ? "valid devices: " : "valid values: ") + join_list(device_names);
    const std::string valid_modules = "valid modules: " + join_list(known_modules()) +
                                      "; aliases: unet, dit, transformer, " +
                                      "clip, text_encoder, cond_stage, controlnet";
    const std::string noun = f == "--split-mode" ? "mode" : "device";
    auto resolve_one = [&](const std::string& name) -> Result<std::string> {
        for (const std::string& d : device_names) {
            if (ascii_lower(d) == ascii_lower(name)) return d;
        }
        if (f == "--backend" && ascii_lower(name) == "disk") {
            return Error{f + ": 'disk' holds weights (--params-backend), it computes nothing (" + valid_devices + ")"};
        }
        return Error{f + ": unknown " + noun + " '" + name + "' (" + valid_devices + ")"};
    };
    // sd-cli's "A&B" (a module's blocks split across devices, in that
    // order): each name is checked once; the value keeps the registry's
    // spellings joined by '&'.
    auto resolve_device = [&](const std::string& name) -> Result<std::string> {
        if (name.find('&') == std::string::npos) return resolve_one(name);
        if (f != "--backend") return Error{f + ": '" + name + "': takes one place per module, not a list ('&')"};
        std::vector<std::string> listed;
        for (const std::string& part : split_list(name, '&')) {
            if (trim_space(part).empty()) return Error{f + ": '" + name + "' has an empty device in its list"};
            auto device = resolve_one(trim_space(part));
            if (!device) return device.error();
            if (std::find(listed.begin(), listed.end(), *device) != listed.end()) {
                return Error{f + ": '" + name + "' lists " + *device + " twice"};
            }
            listed.push_back(*device);
        }
        std::string joined;
        for (const std::string& d : listed) joined += (joined.empty() ? "" : "&") + d;
        return joined;
    };

    const std::string whole = trim_space(spec);
    if (whole.empty()) return Error{f + ": expected a device or module=device pairs (" + valid_devices + ")"};
    std::map<std::string, std::string> out;
    if (whole.find('=') == std::string::npos) {
        if (whole.find(',') != std::string::npos) {
            return Error{f + ": '" + whole + "': give one device, or module=device pairs such as " +
                         "diffusion=cuda0,vae=cpu (" + valid_devices + ")"};
        }
        auto device = resolve_device(whole);
        if (!device) return device.error();
        for (const std::string& module : known_modules()) out[module] = *device;
        return out;
    }
    for (const std::string& pair : split_list(whole, ',')) {
        const size_t eq = pair.find('=');
        if (eq == std::string::npos) {
            return Error{f + ": '" + pair + "': expected module=device when assigning modules (" + valid_modules + ")"};
        }
        const std::string module_text = trim_space(pair.substr(0, eq));
        const std::string device_text = trim_space(pair.substr(eq + 1));
        const std::string module = normalize_module_name(module_text);
        if (module.empty()) return Error{f + ": unknown module '" + module_text + "' (" + valid_modules + ")"};
        if (out.count(module)) return Error{f + ": module '" + module + "' is assigned twice"};
        if (device_text.empty()) return Error{f + ": " + module_text + "= needs a device (" + valid_devices + ")"};
        auto device = resolve_device(device_text);
        if (!device) return device.error();
        if (device->find('&') != std::string::npos && !module_can_split(module)) {
            return Error{f + ": '" + trim_space(pair) + "': only diffusion and te can be split across devices"};
        }
        out[module] = *device;
    }
    return out;
}

Result<std::map<std::string, std::string>> parse_backend_assignments(std::string_view spec,
                                                                     const std::vector<std::string>& device_names) {
    return parse_module_assignments("--backend", spec, device_names);
}

Result<std::map<std::string, std::string>> parse_backend_assignments(std::string_view spec) {
    return parse_backend_assignments(spec, runtime::registered_device_names());
}

}  // namespace kiln::pipeline
