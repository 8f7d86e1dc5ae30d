#include "a1111_names.h"

#include <algorithm>
#include <cctype>

namespace kiln::server {
namespace {

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

const std::vector<SamplerName>& sampler_names() {
    static const std::vector<SamplerName> names = {
        {"euler_a", "Euler a", {"k_euler_a", "k_euler_ancestral"}},
        {"euler", "Euler", {"k_euler"}},
        {"heun", "Heun", {"k_heun"}},
        {"dpm2", "DPM2", {"k_dpm_2"}},
        {"dpm++2s_a", "DPM++ 2S a", {"k_dpmpp_2s_a"}},
        {"dpm++2m", "DPM++ 2M", {"k_dpmpp_2m"}},
        {"dpm++2mv2", "DPM++ 2M v2", {}},
        {"ipndm", "iPNDM", {}},
        {"lcm", "LCM", {"k_lcm"}},
        {"ddim_trailing", "DDIM", {"ddim"}},
        {"tcd", "TCD", {}},
    };
    return names;
}

const std::vector<SchedulerName>& scheduler_names() {
    static const std::vector<SchedulerName> names = {
        {"", "automatic", "Automatic"},
        {"discrete", "uniform", "Uniform"},
        {"karras", "karras", "Karras"},
        {"exponential", "exponential", "Exponential"},
        {"ays", "align_your_steps", "Align Your Steps"},
        {"sgm_uniform", "sgm_uniform", "SGM Uniform"},
        {"simple", "simple", "Simple"},
    };
    return names;
}

std::optional<SamplerChoice> resolve_sampler(const std::string& name) {
    const std::string wanted = lower(name);
    for (const SamplerName& s : sampler_names()) {
        if (wanted == s.kiln || wanted == lower(s.a1111)) return SamplerChoice{s.kiln, ""};
        for (const char* alias : s.aliases) {
            if (wanted == alias) return SamplerChoice{s.kiln, ""};
        }
    }
    // "DPM++ 2M Karras": A1111 before 1.9 named the schedule in the sampler.
    for (const SchedulerName& sch : scheduler_names()) {
        const std::string suffix = " " + lower(sch.label);
        if (*sch.kiln == '\0' || wanted.size() <= suffix.size() ||
            wanted.compare(wanted.size() - suffix.size(), suffix.size(), suffix) != 0) {
            continue;
        }
        auto base = resolve_sampler(name.substr(0, name.size() - suffix.size()));
        if (base && base->scheduler.empty()) return SamplerChoice{base->sampler, sch.kiln};
    }
    return std::nullopt;
}

std::optional<std::string> resolve_scheduler(const std::string& name) {
    const std::string wanted = lower(name);
    for (const SchedulerName& s : scheduler_names()) {
        if (wanted == s.kiln || wanted == s.a1111 || wanted == lower(s.label)) return std::string(s.kiln);
    }
    if (wanted == "normal") return std::string("discrete");  // A1111's "Normal" is the model's own spacing
    return std::nullopt;
}

std::string a1111_sampler_label(const std::string& kiln_name) {
    for (const SamplerName& s : sampler_names()) {
        if (kiln_name == s.kiln) return s.a1111;
    }
    return kiln_name;
}

}  // namespace kiln::server
