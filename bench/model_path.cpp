#include "model_path.h"

#include <filesystem>

#include "default_model.h"

namespace kiln::bench {

Result<std::string> resolve_model_path(const std::string& given) {
    if (given.empty()) {
        if (auto found = cli::find_default_model()) return *found;
        return Error{std::string("model file not found: ") + cli::kDefaultModelFile + " (pass -m MODEL)"};
    }
    std::error_code ec;
    if (!std::filesystem::exists(given, ec)) return Error{"model file not found: " + given};
    return given;
}

}  // namespace kiln::bench
