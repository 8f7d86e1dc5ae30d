#include "output_target.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace kiln::cli {

std::optional<std::string> output_path_problem(const std::string& path) {
    namespace fs = std::filesystem;
    if (path.empty()) return std::string("no file name");
    if (path.back() == '/') return std::string("ends with '/': name a file in that folder");
    std::error_code ec;
    if (fs::is_directory(path, ec)) return std::string("is a folder: name a file in it");
    const fs::path parent = fs::path(path).parent_path();
    const std::string folder = parent.empty() ? "." : parent.string();
    const fs::file_status st = fs::status(folder, ec);
    if (!fs::exists(st)) return "the folder " + folder + " does not exist";
    if (!fs::is_directory(st)) return folder + " is not a folder";
    if (::access(folder.c_str(), W_OK | X_OK) != 0) {
        return "the folder " + folder + " cannot be written to (" + std::strerror(errno) + ")";
    }
    return std::nullopt;
}

}  // namespace kiln::cli
