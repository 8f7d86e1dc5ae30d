// Looking at paths and folders without exceptions and without blocking.
// std::filesystem throws on the overloads without an error_code (a symlink
// loop inside a scanned folder is enough), and opening a FIFO for reading
// waits for a writer; every path kiln reads from a user goes through here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln {

enum class PathKind {
    Missing,      // nothing there (or a dangling symlink)
    File,         // a regular file
    Folder,       // a directory
    Special,      // a FIFO, socket, character or block device
    SymlinkLoop,  // too many levels of symbolic links
    Unreadable,   // stat failed for another reason (permissions, ...)
};

struct PathStatus {
    PathKind kind = PathKind::Missing;
    uint64_t size = 0;    // File only
    std::string problem;  // for Special and Unreadable: "a FIFO", "Permission denied"
};

// What `path` names, following symlinks. Never throws, never blocks.
PathStatus path_status(const std::string& path);

// `path` + ": symlink loop", ": no such file or folder", ": not a regular
// file (a FIFO)", ...: why a path that is not a regular file cannot be read
// as one.
Error path_error(const std::string& path, const PathStatus& status);

// A regular file's status, or path_error's message.
Result<PathStatus> regular_file_status(const std::string& path);

struct FolderEntry {
    std::string name;  // the file name, without the folder
    std::string path;  // folder + "/" + name
    PathStatus status;
};

// The entries of `folder` (symlinks followed), sorted by name. An entry that
// is a symlink loop is listed with that kind, so callers decide; a folder
// that cannot be listed is an error naming it.
Result<std::vector<FolderEntry>> list_folder(const std::string& folder);

// Opens a regular file for reading: refuses special files before reading a
// byte (a FIFO would block, /dev/zero never ends). Returns the descriptor;
// the caller closes it.
Result<int> open_regular_file(const std::string& path);

// The whole of a regular file of at most `max_bytes` (checked before and
// while reading, so a file that grows meanwhile is caught too). Errors are
// BadFile naming the path; a larger file is "larger than any `what` file".
Result<std::string> read_whole_file(const std::string& path, size_t max_bytes, const std::string& what);

// Where `path` leads once every symlink is resolved, when that is outside
// `folder`'s own real path ("" when it stays inside, or is the folder).
// A path that cannot be resolved (missing, a loop) counts as outside and
// is returned as given. For folders whose files must not lead elsewhere:
// --model-dir, --lora-model-dir, kiln pull's --to.
std::string real_path_outside(const std::string& folder, const std::string& path);

}  // namespace kiln
