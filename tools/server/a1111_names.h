// A1111's sampler and scheduler names and kiln's. kiln writes A1111's names
// into the parameters text ("Sampler: Euler a", src/pipeline/generate.cpp
// a1111_sampler_name); clients send them back, and older ones send the
// scheduler inside the sampler's name ("DPM++ 2M Karras").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::server {

struct SamplerName {
    const char* kiln;   // "euler_a": kiln_generation_params.sampler
    const char* a1111;  // "Euler a": what /sdapi/v1/samplers lists
    std::vector<const char*> aliases;  // k-diffusion's names A1111 also accepts ("k_euler_a")
};
const std::vector<SamplerName>& sampler_names();

struct SchedulerName {
    const char* kiln;   // "karras"; "" for A1111's "automatic" (the model's default)
    const char* a1111;  // "karras": A1111's `scheduler` value
    const char* label;  // "Karras": A1111's display name
};
const std::vector<SchedulerName>& scheduler_names();

struct SamplerChoice {
    std::string sampler;    // kiln's name
    std::string scheduler;  // kiln's name when the A1111 name carried one ("DPM++ 2M Karras"), else ""
};
// A kiln name, an A1111 name or alias, case-insensitive; nullopt when unknown.
std::optional<SamplerChoice> resolve_sampler(const std::string& name);
// A kiln name or an A1111 name or label; "" for "automatic"; nullopt when unknown.
std::optional<std::string> resolve_scheduler(const std::string& name);

// A1111's display names for the parameters a job ran with ("Euler a").
std::string a1111_sampler_label(const std::string& kiln_name);

}  // namespace kiln::server
