#include "file_download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/files.h"
#include "util/format.h"
#include "util/sha256.h"

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

// One download of one file into its part: where the bytes go, their hash,
// and what the server said about the size. The steps of download_file().
class PartDownload {
  public:
    PartDownload(const HubFile& file, std::string part_path, uint64_t max_bytes, DownloadProgress& progress)
        : file_(file), progress_(progress), max_bytes_(max_bytes) {
        part_.path = std::move(part_path);
    }

    // Opens (creating) and locks the part; a part longer than the listed
    // file cannot be a prefix of it and is emptied. A symlink at the part's
    // name is not followed (it could point anywhere), and only a regular
    // file is written to.
    Status open() {
        part_.fd = ::open(part_.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        if (part_.fd < 0 && errno == ELOOP) {
            return Error{part_.path +
                         " is a symbolic link; kiln writes partial downloads only to files it made: "
                         "remove it"};
        }
        if (part_.fd < 0) return disk_error("opening", part_.path);
        struct stat st {};
        if (::fstat(part_.fd, &st) != 0) return disk_error("checking", part_.path);
        if (!S_ISREG(st.st_mode)) {
            return Error{part_.path +
                         " is not a regular file; kiln writes partial downloads only to files it made: "
                         "remove it"};
        }
        // Two pulls appending to one part would interleave their bytes.
        if (::flock(part_.fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) return Error{part_.path + " is being written by another kiln pull; wait for it"};
            return disk_error("locking", part_.path);
        }
        auto size = part_.size();
        if (!size.ok()) return size.error();
        offset_ = *size;
        if (file_.size && offset_ > *file_.size) KILN_TRY(restart());
        return Status::Ok();
    }

    // Fetches what the part lacks. A part that already holds the listed
    // size (a run stopped before its check) is only checked.
    Status fetch(const HubClient& hub, const std::string& repo, const std::string& revision) {
        if (file_.size && offset_ == *file_.size && offset_ > 0) return start(FetchStart{offset_, file_.size});
        BodySink sink{[this](const FetchStart& s) { return start(s); },
                      [this](const char* data, size_t n) { return write(data, n); }};
        bool range_refused = false;
        KILN_TRY(hub.fetch(repo, revision, file_.path, offset_, sink, &range_refused));
        if (!range_refused) return Status::Ok();
        // 416: the part is not a prefix of the file the server has.
        KILN_TRY(restart());
        return hub.fetch(repo, revision, file_.path, 0, sink);
    }

    // The error of a failed fetch, with what became of the part: kept for
    // the next run to resume, or deleted when it must not be resumed (a
    // size that disagrees with the list) or holds nothing.
    Error after_failed_fetch(const Error& e) {
        if (began_) progress_.abandon();
        auto kept = part_.size();
        if (e.kind == ErrorKind::BadFile || !kept.ok() || *kept == 0) {
            part_.discard();
            return e;
        }
        return Error{e.message + "; the " + grouped(*kept) + " bytes so far are kept in " + part_.path +
                         ": run the same command again to resume",
                     e.kind};
    }

    // Checks the complete part (size, then sha256 when listed) and renames
    // it to `final_path`. A part too short is kept for resuming; a wrong
    // one is deleted.
    Status verify_and_install(const std::string& final_path) {
        if (::fsync(part_.fd) != 0) return disk_error("writing", part_.path);
        auto actual = part_.size();
        if (!actual.ok()) return actual.error();
        const std::optional<uint64_t> expected = file_.size ? file_.size : server_total_;
        if (!expected) {
            return reject(file_.path + ": neither the hub's file list nor the server gave its size, so it cannot be " +
                          "checked; the download was deleted");
        }
        if (*actual < *expected) {
            if (began_) progress_.abandon();
            return Error{file_.path + ": the server sent " + grouped(*actual) + " of " + grouped(*expected) +
                         " bytes; they are kept in " + part_.path + ": run the same command again to resume"};
        }
        if (*actual > *expected) {
            return reject(file_.path + ": " + grouped(*actual) + " bytes arrived but the hub lists " +
                          grouped(*expected) + "; the download was deleted");
        }
        if (!file_.sha256.empty()) {
            const std::string got = hash_.hex_digest();
            if (got != file_.sha256) {
                return reject(file_.path + ": sha256 " + got + " does not match the hub's " + file_.sha256 +
                              "; the download was deleted (run the same command again to fetch it anew)");
            }
        }
        if (::rename(part_.path.c_str(), final_path.c_str()) != 0) {
            return Error{"renaming " + part_.path + " to " + final_path + ": " + std::strerror(errno)};
        }
        progress_.finish(file_.sha256.empty() ? "size ok" : "sha256 ok");
        return Status::Ok();
    }

  private:
    Status restart() {
        KILN_TRY(part_.truncate_to_zero());
        offset_ = 0;
        return Status::Ok();
    }

    // The body's first byte: decide where it goes (a server that ignored
    // the Range sends the whole file again), hash what is already there.
    Status start(const FetchStart& s) {
        if (s.offset != offset_) {
            if (s.offset != 0) {
                return Error{"the server sent " + file_.path + " from byte " + grouped(s.offset) + " when asked for " +
                             grouped(offset_)};
            }
            KILN_TRY(restart());
        }
        if (!file_.sha256.empty() && offset_ > 0) KILN_TRY(hash_file_prefix(part_.path, offset_, hash_));
        if (::lseek(part_.fd, static_cast<off_t>(offset_), SEEK_SET) < 0) return disk_error("seeking in", part_.path);
        server_total_ = s.total;
        if (file_.size && s.total && *s.total != *file_.size) {
            return Error::bad_file("the hub lists " + file_.path + " at " + grouped(*file_.size) +
                                   " bytes but the server sends " + grouped(*s.total));
        }
        if (!file_.size && s.total && *s.total > max_bytes_) {
            return Error::bad_file(file_.path + ": the server announces " + grouped(*s.total) +
                                   " bytes, over --max-size (" + grouped(max_bytes_) +
                                   " bytes; the hub lists no size)");
        }
        progress_.begin(file_.path, offset_, file_.size ? file_.size : s.total);
        began_ = true;
        return Status::Ok();
    }

    // Appends a chunk, stopping a server that sends more than the file
    // can hold: the listed size, else the size the server announced, else
    // --max-size. An endless body is refused as it comes, not once it ends.
    Status write(const char* data, size_t n) {
        const uint64_t limit = file_.size ? *file_.size : server_total_ ? *server_total_ : max_bytes_;
        if (offset_ + n > limit) {
            const std::string what = file_.size ? "the " + grouped(limit) + " bytes the hub lists"
                                     : server_total_
                                         ? "the " + grouped(limit) + " bytes it announced"
                                         : "--max-size, " + grouped(limit) + " bytes (the hub lists no size)";
            // BadFile: after_failed_fetch deletes the part.
            return Error::bad_file(file_.path + ": the server sends more than " + what + "; the download was deleted");
        }
        KILN_TRY(part_.append(data, n));
        offset_ += n;
        if (!file_.sha256.empty()) hash_.update(data, n);
        progress_.advance(n);
        return Status::Ok();
    }

    // Deletes the part: a BadFile error, for a download that is wrong.
    Error reject(const std::string& message) {
        if (began_) progress_.abandon();
        part_.discard();
        return Error::bad_file(message);
    }

    const HubFile& file_;
    DownloadProgress& progress_;
    PartFile part_;
    uint64_t max_bytes_;   // --max-size: the most a file of no known size may have
    uint64_t offset_ = 0;  // where the next byte goes
    Sha256 hash_;          // of bytes 0 .. offset_ (when the list gives a sha256)
    std::optional<uint64_t> server_total_;
    bool began_ = false;  // progress_ shows this file
};

}  // namespace

bool is_part_name(const std::string& path) {
    return path.size() >= std::strlen(kPartSuffix) &&
           path.compare(path.size() - std::strlen(kPartSuffix), std::string::npos, kPartSuffix) == 0;
}

Result<DownloadOutcome> download_file(const HubClient& hub, const std::string& repo, const std::string& revision,
                                      const HubFile& file, const std::string& folder, uint64_t max_bytes,
                                      DownloadProgress& progress) {
    if (is_part_name(file.path)) {
        return Error::bad_file("the hub lists " + file.path + ", a name kiln keeps for its partial downloads (" +
                               kPartSuffix + ")");
    }
    const std::string final_path = folder + "/" + file.path;
    KILN_TRY(make_parent_folders(final_path));
    // The file's folder must be inside `folder` once symlinks are resolved:
    // a linked subfolder would carry the download (and its part) elsewhere.
    const std::string parent = std::filesystem::path(final_path).parent_path().string();
    if (const std::string outside = real_path_outside(folder, parent); !outside.empty()) {
        return Error{parent + " leads out of " + folder + " (to " + outside +
                     ") through a symbolic link; kiln writes only inside " + folder};
    }
    auto current = final_is_current(final_path, file);
    if (!current.ok()) return current.error();
    if (*current) return DownloadOutcome::AlreadyThere;

    PartDownload download(file, final_path + kPartSuffix, max_bytes, progress);
    KILN_TRY(download.open());
    if (Status fetched = download.fetch(hub, repo, revision); !fetched.ok()) {
        return download.after_failed_fetch(fetched.error());
    }
    KILN_TRY(download.verify_and_install(final_path));
    return DownloadOutcome::Fetched;
}

}  // namespace kiln::cli
