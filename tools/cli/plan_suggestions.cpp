#include "plan_suggestions.h"

#include <vector>

namespace kiln::cli {
namespace {

struct Candidate {
    std::string flags;  // what the user adds to the command line
    std::function<void(Options&)> apply;
};

// In order of what they cost the image: none for placement and tiling, a
// little for q8_0, more for q4_0.
std::vector<Candidate> candidates(const Options& options, bool uses_gpu) {
    std::vector<Candidate> out;
    if (!options.vae_tiling) out.push_back({"--vae-tiling", [](Options& o) { o.vae_tiling = true; }});
    if (uses_gpu) {
        out.push_back(
            {"--vae-on-cpu", [](Options& o) { o.modules_on_cpu += o.modules_on_cpu.empty() ? "vae" : ",vae"; }});
        out.push_back(
            {"--clip-on-cpu", [](Options& o) { o.modules_on_cpu += o.modules_on_cpu.empty() ? "te" : ",te"; }});
    }
    if (options.weight_type.empty()) {
        for (const char* type : {"q8_0", "q4_0"}) {
            out.push_back({std::string("--type ") + type, [type](Options& o) { o.weight_type = type; }});
        }
    }
    return out;
}

}  // namespace

std::string plan_suggestions(const Options& options, int verdict, bool uses_gpu, const PlanVerdict& plan) {
    if (verdict == 1) return "";
    std::string fitting, tried;
    for (const Candidate& c : candidates(options, uses_gpu)) {
        Options changed = options;
        c.apply(changed);
        const int v = plan(changed);
        tried += (tried.empty() ? "" : ", ") + c.flags;
        if (v == 1) fitting += "  " + c.flags + ": fits (checked: kiln plan with it)\n";
        if (v == 2 && verdict == 0) fitting += "  " + c.flags + ": fits by streaming from disk (checked)\n";
    }
    if (tried.empty()) return "suggestions: none to try (a larger --max-vram budget, or a machine with more memory)\n";
    if (fitting.empty()) return "suggestions: none of " + tried + " makes it fit; a machine with more memory does\n";
    return "suggestions:\n" + fitting;
}

}  // namespace kiln::cli
