#include "file_download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "sha256.h"
#include "util/files.h"
#include "util/format.h"

namespace kiln::cli {
namespace {

// "writing x.part: No space left on device": the system's reason, at once
// (before anything else can change errno).
Error disk_error(const std::string& doing, const std::string& path) {
    return Error{doing + " " + path + ": " + std::strerror(errno)};
}

Status make_parent_folders(const std::string& path) {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    if (folder.empty()) return Status::Ok();
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) return Error{"creating the folder " + folder.string() + ": " + ec.message()};
    return Status::Ok();
}

// FINAL already holds the listed file: the listed size, and the listed
// sha256 when there is one. Without a listed size nothing can be checked,
// so the file is fetched again (and replaces FINAL once verified).
Result<bool> final_is_current(const std::string& final_path, const HubFile& file) {
    const PathStatus st = path_status(final_path);
    if (st.kind != PathKind::File || !file.size || st.size != *file.size) return false;
    if (file.sha256.empty()) return true;
    Sha256 hash;
    KILN_TRY(hash_file_prefix(final_path, st.size, hash));
    return hash.hex_digest() == file.sha256;
}

// The .part file being written, closed on every way out.
struct PartFile {
    std::string path;
    int fd = -1;
    ~PartFile() {
        if (fd >= 0) ::close(fd);
    }
    Result<uint64_t> size() const {
        struct stat st {};
        if (::fstat(fd, &st) != 0) return disk_error("checking", path);
        return static_cast<uint64_t>(st.st_size);
    }
    Status truncate_to_zero() const {
        if (::ftruncate(fd, 0) != 0) return disk_error("truncating", path);
        return Status::Ok();
    }
    Status append(const char* data, size_t n) const {
        while (n > 0) {
            const ssize_t w = ::write(fd, data, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return disk_error("writing", path);
            data += w;
            n -= static_cast<size_t>(w);
        }
        return Status::Ok();
    }
    // Removes the file: what it holds must not be resumed.
    void discard() {
        ::unlink(path.c_str());  // before closing: the lock still keeps other pulls out
        ::close(fd);
        fd = -1;
    }
};

}  // namespace

Result<DownloadOutcome> download_file(const HubClient& hub, const std::string& repo, const std::string& revision,
                                      const HubFile& file, const std::string& final_path, DownloadProgress& progress) {
    KILN_TRY(make_parent_folders(final_path));
    auto current = final_is_current(final_path, file);
    if (!current.ok()) return current.error();
    if (*current) return DownloadOutcome::AlreadyThere;

    PartFile part{final_path + ".part"};
    part.fd = ::open(part.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (part.fd < 0) return disk_error("opening", part.path);
    // Two pulls appending to one part would interleave their bytes.
    if (::flock(part.fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return Error{part.path + " is being written by another kiln pull; wait for it"};
        return disk_error("locking", part.path);
    }
    auto part_size = part.size();
    if (!part_size.ok()) return part_size.error();
    uint64_t offset = *part_size;
    if (file.size && offset > *file.size) {
        // Longer than the file: not a prefix of it.
        KILN_TRY(part.truncate_to_zero());
        offset = 0;
    }

    const bool check_sha = !file.sha256.empty();
    Sha256 hash;
    std::optional<uint64_t> server_total;
    bool began = false;
    // The body's first byte: decide where it goes (a server that ignored
    // the Range sends the whole file again), hash what is already there.
    auto start = [&](const FetchStart& s) -> Status {
        if (s.offset != offset) {
            if (s.offset != 0) {
                return Error{"the server sent " + file.path + " from byte " + grouped(s.offset) + " when asked for " +
                             grouped(offset)};
            }
            KILN_TRY(part.truncate_to_zero());
            offset = 0;
        }
        if (check_sha && offset > 0) KILN_TRY(hash_file_prefix(part.path, offset, hash));
        if (::lseek(part.fd, static_cast<off_t>(offset), SEEK_SET) < 0) return disk_error("seeking in", part.path);
        server_total = s.total;
        if (file.size && s.total && *s.total != *file.size) {
            return Error::bad_file("the hub lists " + file.path + " at " + grouped(*file.size) +
                                   " bytes but the server sends " + grouped(*s.total));
        }
        progress.begin(file.path, offset, file.size ? file.size : s.total);
        began = true;
        return Status::Ok();
    };
    BodySink sink{start, [&](const char* data, size_t n) -> Status {
                      KILN_TRY(part.append(data, n));
                      if (check_sha) hash.update(data, n);
                      progress.advance(n);
                      return Status::Ok();
                  }};

    Status fetched;
    if (file.size && offset == *file.size && offset > 0) {
        // A complete part from a run stopped before its check: check it now.
        KILN_TRY(start(FetchStart{offset, file.size}));
    } else {
        bool range_refused = false;
        fetched = hub.fetch(repo, revision, file.path, offset, sink, &range_refused);
        if (fetched.ok() && range_refused) {
            // 416: the part is not a prefix of the file the server has.
            KILN_TRY(part.truncate_to_zero());
            offset = 0;
            fetched = hub.fetch(repo, revision, file.path, 0, sink);
        }
    }
    if (!fetched.ok()) {
        if (began) progress.abandon();
        const Error& e = fetched.error();
        auto kept = part.size();
        if (e.kind == ErrorKind::BadFile || !kept.ok() || *kept == 0) {
            part.discard();
            return e;
        }
        return Error{e.message + "; the " + grouped(*kept) + " bytes so far are kept in " + part.path +
                         ": run the same command again to resume",
                     e.kind};
    }
    if (::fsync(part.fd) != 0) return disk_error("writing", part.path);

    auto actual = part.size();
    if (!actual.ok()) return actual.error();
    const std::optional<uint64_t> expected = file.size ? file.size : server_total;
    if (!expected) {
        part.discard();
        return Error::bad_file(file.path + ": neither the hub's file list nor the server gave its size, so it " +
                               "cannot be checked; the download was deleted");
    }
    if (*actual < *expected) {
        if (began) progress.abandon();
        return Error{file.path + ": the server sent " + grouped(*actual) + " of " + grouped(*expected) +
                     " bytes; they are kept in " + part.path + ": run the same command again to resume"};
    }
    if (*actual > *expected) {
        part.discard();
        return Error::bad_file(file.path + ": " + grouped(*actual) + " bytes arrived but the hub lists " +
                               grouped(*expected) + "; the download was deleted");
    }
    if (check_sha) {
        const std::string got = hash.hex_digest();
        if (got != file.sha256) {
            if (began) progress.abandon();
            part.discard();
            return Error::bad_file(file.path + ": sha256 " + got + " does not match the hub's " + file.sha256 +
                                   "; the download was deleted (run the same command again to fetch it anew)");
        }
    }
    if (::rename(part.path.c_str(), final_path.c_str()) != 0) {
        return Error{"renaming " + part.path + " to " + final_path + ": " + std::strerror(errno)};
    }
    progress.finish(check_sha ? "sha256 ok" : "size ok");
    return DownloadOutcome::Fetched;
}

}  // namespace kiln::cli
