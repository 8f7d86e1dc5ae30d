#include "info_command.h"

#include "default_model.h"
#include "kiln.h"
#include "util/log.h"

namespace kiln::cli {

int run_info(const Options& options, std::ostream& out) {
    std::vector<std::string> paths = options.info_paths;
    if (paths.empty()) {
        auto found = find_default_model();
        if (!found) {
            KILN_LOG_ERROR("info: no file given and the default model %s was not found", kDefaultModelFile);
            return 1;
        }
        paths.push_back(*found);
    }
    int exit_code = 0;
    // Each argument is one model: several files of one model are passed as a
    // folder or as a split file's first part.
    bool first = true;
    for (const std::string& path : paths) {
        char* text = nullptr;
        char* error = nullptr;
        if (kiln_model_describe(path.c_str(), options.info_list_tensors ? 1 : 0, &text, &error) != 0) {
            KILN_LOG_ERROR("%s", error ? error : "unknown error");
            kiln_free_string(error);
            exit_code = 1;
            continue;
        }
        if (!first) out << '\n';
        first = false;
        out << text;
        kiln_free_string(text);
    }
    out.flush();
    return exit_code;
}

}  // namespace kiln::cli
