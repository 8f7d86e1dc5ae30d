#include "convert_command.h"

#include <string>
#include <vector>

#include "cli.h"
#include "kiln.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

std::vector<std::string> model_paths(const Options& o) {
    std::vector<std::string> paths;
    for (const std::string* p : {&o.model, &o.diffusion_model, &o.clip_l, &o.clip_g, &o.t5xxl, &o.llm, &o.llm_vision,
                                 &o.clip_vision, &o.vae}) {
        if (!p->empty()) paths.push_back(*p);
    }
    return paths;
}

}  // namespace

int run_convert(const Options& options) {
    const auto paths = model_paths(options);
    if (paths.empty()) {
        KILN_LOG_ERROR("convert: no model given (use -m MODEL, or --diffusion-model/--vae/--clip_l ...)");
        return kExitUsage;
    }
    // The default -o (output.png) is for images: a GGUF written there would
    // be a surprise, so convert requires its own name.
    const std::string& out = options.output;
    if (!options.output_given) {
        KILN_LOG_ERROR("convert: no output given (pass -o OUT.gguf)");
        return kExitUsage;
    }
    if (out.size() < 5 || out.compare(out.size() - 5, 5, ".gguf") != 0) {
        KILN_LOG_ERROR("-o: %s: convert writes GGUF; the name must end in .gguf", out.c_str());
        return kExitUsage;
    }
    std::vector<const char*> c_paths;
    for (const std::string& p : paths) c_paths.push_back(p.c_str());
    KILN_LOG_INFO("convert: writing %s%s%s", options.output.c_str(), options.weight_type.empty() ? "" : " as ",
                  options.weight_type.c_str());
    const auto progress = [](int done, int total, void*) {
        if (done == total || done % 64 == 0) KILN_LOG_VERBOSE("convert: %d/%d tensors", done, total);
    };
    char* error = nullptr;
    const kiln_status rc =
        kiln_model_convert(c_paths.data(), static_cast<int>(c_paths.size()), options.output.c_str(),
                           options.weight_type.empty() ? nullptr : options.weight_type.c_str(),
                           options.tensor_type_rules.empty() ? nullptr : options.tensor_type_rules.c_str(),
                           options.tokenizer.empty() ? nullptr : options.tokenizer.c_str(), progress, nullptr, &error);
    if (rc != KILN_OK) {
        const std::string message = error ? error : "unknown error";
        kiln_free_string(error);
        KILN_LOG_ERROR("%s", message.c_str());
        return exit_code_of(rc);
    }
    KILN_LOG_INFO("convert: done");
    return kExitOk;
}

}  // namespace kiln::cli
