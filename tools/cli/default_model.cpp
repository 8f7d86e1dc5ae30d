#include "default_model.h"

#include <unistd.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace kiln::cli {

std::vector<std::string> default_model_candidates() {
    std::vector<std::string> candidates;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        const fs::path dir = exe.parent_path();
        candidates.push_back((dir / kDefaultModelFile).string());
        candidates.push_back((dir / "models" / kDefaultModelFile).string());
        candidates.push_back((dir.parent_path() / "share" / "kiln" / "models" / kDefaultModelFile).string());
    }
#ifdef KILN_SOURCE_DIR
    candidates.push_back((fs::path(KILN_SOURCE_DIR) / "models" / kDefaultModelFile).string());
#endif
#ifdef KILN_INSTALL_PREFIX
    candidates.push_back((fs::path(KILN_INSTALL_PREFIX) / "share" / "kiln" / "models" / kDefaultModelFile).string());
#endif
    return candidates;
}

std::optional<std::string> find_default_model() {
    for (const std::string& path : default_model_candidates()) {
        std::error_code ec;
        if (fs::is_regular_file(path, ec)) return path;
    }
    return std::nullopt;
}

}  // namespace kiln::cli
