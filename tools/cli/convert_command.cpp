#include "convert_command.h"

#include "cli.h"
#include "io/gguf_writer.h"
#include "io/model_file.h"
#include "io/tensor_convert.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

std::vector<std::string> model_paths(const Options& o) {
    std::vector<std::string> paths;
    for (const std::string* p : {&o.model, &o.diffusion_model, &o.clip_l, &o.clip_g, &o.t5xxl, &o.vae}) {
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
    io::GgufWriteOptions write_options;
    if (!options.weight_type.empty()) {
        auto type = io::parse_weight_type(options.weight_type);
        if (!type.ok()) {
            KILN_LOG_ERROR("%s", type.error().message.c_str());
            return kExitUsage;
        }
        write_options.type = *type;
    }
    auto model = io::ModelFile::open(paths);
    if (!model.ok()) {
        KILN_LOG_ERROR("%s", model.error().message.c_str());
        return kExitFailure;
    }
    write_options.progress = [](size_t done, size_t total) {
        if (done == total || done % 64 == 0) KILN_LOG_VERBOSE("convert: %zu/%zu tensors", done, total);
    };
    KILN_LOG_INFO("convert: writing %zu tensors to %s%s%s", model->tensors().size(), options.output.c_str(),
                  write_options.type ? " as " : "", write_options.type ? ggml_type_name(*write_options.type) : "");
    if (auto status = io::write_gguf(*model, options.output, write_options); !status.ok()) {
        KILN_LOG_ERROR("%s", status.error().message.c_str());
        return kExitFailure;
    }
    KILN_LOG_INFO("convert: done");
    return kExitOk;
}

}  // namespace kiln::cli
