#include "util/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/format.h"

namespace kiln {
namespace {

std::string special_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "not a file or folder";
}

PathStatus status_of(const struct stat& st) {
    PathStatus s;
    if (S_ISREG(st.st_mode)) {
        s.kind = PathKind::File;
        s.size = static_cast<uint64_t>(st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
        s.kind = PathKind::Folder;
    } else {
        s.kind = PathKind::Special;
        s.problem = special_kind(st.st_mode);
    }
    return s;
}

PathStatus status_of_errno(int err) {
    PathStatus s;
    if (err == ENOENT || err == ENOTDIR) {
        s.kind = PathKind::Missing;
    } else if (err == ELOOP) {
        s.kind = PathKind::SymlinkLoop;
    } else {
        s.kind = PathKind::Unreadable;
        s.problem = std::strerror(err);
    }
    return s;
}

}  // namespace

PathStatus path_status(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return status_of_errno(errno);
    return status_of(st);
}

Error path_error(const std::string& path, const PathStatus& status) {
    switch (status.kind) {
        case PathKind::Missing: return Error{path + ": no such file or folder"};
        case PathKind::File: return Error{path + ": is a file"};
        case PathKind::Folder: return Error{path + ": is a folder, not a file"};
        case PathKind::Special: return Error{path + ": not a regular file (" + status.problem + ")"};
        case PathKind::SymlinkLoop: return Error{path + ": symlink loop (too many levels of symbolic links)"};
        case PathKind::Unreadable: return Error{path + ": cannot read: " + status.problem};
    }
    return Error{path + ": cannot read"};
}

Result<PathStatus> regular_file_status(const std::string& path) {
    PathStatus s = path_status(path);
    if (s.kind != PathKind::File) return path_error(path, s);
    return s;
}

Result<std::vector<FolderEntry>> list_folder(const std::string& folder) {
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) {
        const PathStatus s = status_of_errno(errno);
        return Error{path_error(folder, s).message + " (listing the folder)"};
    }
    std::vector<FolderEntry> entries;
    errno = 0;
    while (const dirent* e = ::readdir(dir)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        FolderEntry entry;
        entry.name = name;
        entry.path = folder + "/" + name;
        entry.status = path_status(entry.path);
        entries.push_back(std::move(entry));
        errno = 0;
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return Error{folder + ": cannot list folder: " + std::strerror(err)};
    std::sort(entries.begin(), entries.end(),
              [](const FolderEntry& a, const FolderEntry& b) { return a.name < b.name; });
    return entries;
}

Result<int> open_regular_file(const std::string& path) {
    // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
    // writer; the descriptor's own fstat then refuses it (no race with a
    // stat of the name).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return path_error(path, status_of_errno(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        return path_error(path, status_of_errno(err));
    }
    const PathStatus s = status_of(st);
    if (s.kind != PathKind::File) {
        ::close(fd);
        return path_error(path, s);
    }
    // Reads of a regular file never block; clear the flag anyway so the
    // descriptor behaves as an ordinary one.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

Result<std::string> read_whole_file(const std::string& path, size_t max_bytes, const std::string& what) {
    auto status = regular_file_status(path);
    if (!status.ok()) return status.error().as(ErrorKind::BadFile);
    if (status->size > max_bytes) {
        return Error::bad_file(path + ": is " + human_bytes(status->size) + ", larger than any " + what + " file (" +
                               human_bytes(max_bytes) + " at most)");
    }
    auto fd = open_regular_file(path);
    if (!fd.ok()) return fd.error().as(ErrorKind::BadFile);
    std::string bytes;
    bytes.reserve(static_cast<size_t>(status->size));
    char buffer[1 << 16];
    for (;;) {
        const ssize_t n = ::read(*fd, buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const std::string why = std::strerror(errno);
            ::close(*fd);
            return Error::bad_file(path + ": read error: " + why);
        }
        if (n == 0) break;
        bytes.append(buffer, static_cast<size_t>(n));
        if (bytes.size() > max_bytes) {
            ::close(*fd);
            return Error::bad_file(path + ": larger than any " + what + " file (" + human_bytes(max_bytes) +
                                   " at most)");
        }
    }
    ::close(*fd);
    return bytes;
}

std::string real_path_outside(const std::string& folder, const std::string& path) {
    std::error_code ec;
    const std::filesystem::path root = std::filesystem::canonical(folder, ec);
    if (ec) return path;
    const std::filesystem::path real = std::filesystem::canonical(path, ec);
    if (ec) return path;
    const std::string relative = real.lexically_relative(root).generic_string();
    const bool inside = !relative.empty() && relative != ".." && relative.rfind("../", 0) != 0;
    return inside ? "" : real.string();
}

}  // namespace kiln
