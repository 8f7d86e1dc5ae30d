#include "util/kiln_cache.h"

#include <cstdlib>

namespace kiln {

std::optional<std::string> kiln_cache_root() {
    const char* cache = std::getenv("KILN_CACHE");
    if (cache && *cache) return std::string(cache);
    const char* home = std::getenv("HOME");
    if (home && *home) return std::string(home) + "/.cache/kiln";
    return std::nullopt;
}

std::optional<std::string> tokenizer_cache_folder(const std::string& name) {
    auto root = kiln_cache_root();
    if (!root) return std::nullopt;
    return *root + "/tokenizers/" + name;
}

}  // namespace kiln
