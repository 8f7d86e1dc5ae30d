// The names of the modules a placement assigns to devices (--backend,
// --params-backend, --max-vram's books): the module roles of
// models/family.h and the aliases users write for them. The runtime places
// named modules and knows nothing of what they are.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace kiln::pipeline {

// The model modules that can be placed: "diffusion", "te", "vae", "clip_vision", "control".
const std::vector<std::string>& known_modules();

// Whether a module's blocks can be split across devices (sd-cli's layer
// split takes diffusion and te).
bool module_can_split(const std::string& module);

// The canonical module name for `name`, or "" when it names no module.
// Case-insensitive and blind to '-' and '_' (clip_vision = clip-vision =
// ClipVision). Aliases: unet, dit, transformer -> diffusion; clip,
// text_encoder(s), cond_stage -> te.
std::string normalize_module_name(std::string_view name);

// Parses `--backend SPEC`: either one device name (every module on it) or
// comma-separated `module=device` pairs ("diffusion=rpc0,te=cpu,vae=cpu";
// modules not named are left out of the map). Keys are canonical module names,
// values the device names as `device_names` spells them. An unknown module or
// device, a repeated module or a malformed pair is an Error, prefixed with
// "--backend: ", that lists the valid names.
Result<std::map<std::string, std::string>> parse_backend_assignments(std::string_view spec,
                                                                     const std::vector<std::string>& device_names);
// The same for any flag that assigns modules to one of `values`
// (--params-backend adds "disk"); errors are prefixed with the flag.
Result<std::map<std::string, std::string>> parse_module_assignments(std::string_view flag, std::string_view spec,
                                                                    const std::vector<std::string>& values);
// The same over the registered devices (add RPC servers first).
Result<std::map<std::string, std::string>> parse_backend_assignments(std::string_view spec);

}  // namespace kiln::pipeline
