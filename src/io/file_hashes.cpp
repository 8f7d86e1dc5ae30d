#include "io/file_hashes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "util/files.h"
#include "util/kiln_cache.h"
#include "util/log.h"
#include "util/sha256.h"

namespace kiln::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A1111's cache.json subsections, one per kind of hash.
const char* section_of(FileHashKind kind) { return kind == FileHashKind::Addnet ? "hashes-addnet" : "hashes"; }

// The cache file is a few hundred bytes per file ever hashed; anything much
// larger is not one of ours.
constexpr size_t kMaxCacheFileBytes = 64u << 20;

// Files this large get an info line before they are hashed: the pause
// before the first image is otherwise unexplained.
constexpr uint64_t kAnnouncedHashBytes = 1ull << 30;

bool is_hex(const std::string& s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

bool is_sha256_hex(const std::string& s) {
    return s.size() == 64 &&
           std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// What identifies a version of a file: where it is, its size and its
// modification time (nanoseconds, so a rewrite within the same second that
// keeps the size still counts as a change where the file system records it).
struct FileIdentity {
    std::string absolute;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
};

Result<FileIdentity> identify(const std::string& path) {
    auto status = regular_file_status(path);
    if (!status.ok()) return status.error().as(ErrorKind::BadFile);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Error::bad_file(path + ": " + std::strerror(errno));
    FileIdentity id;
    std::error_code ec;
    const fs::path absolute = fs::absolute(path, ec);
    id.absolute = ec ? path : absolute.lexically_normal().string();
    id.size = static_cast<uint64_t>(st.st_size);
    id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + static_cast<int64_t>(st.st_mtim.tv_nsec);
    return id;
}

// The 8-byte little-endian header length of a safetensors file, as A1111's
// addnet_hash_safetensors reads it (int.from_bytes of what is there, so a
// file shorter than 8 bytes gives the length of fewer bytes).
Result<uint64_t> safetensors_header_length(const std::string& path) {
    auto fd = open_regular_file(path);
    if (!fd.ok()) return fd.error().as(ErrorKind::BadFile);
    uint8_t bytes[8] = {};
    ssize_t n = 0;
    do {
        n = ::pread(*fd, bytes, sizeof bytes, 0);
    } while (n < 0 && errno == EINTR);
    const std::string why = n < 0 ? std::strerror(errno) : "";
    ::close(*fd);
    if (n < 0) return Error::bad_file(path + ": " + why);
    uint64_t length = 0;
    for (ssize_t i = n - 1; i >= 0; --i) length = (length << 8) | bytes[i];
    return length;
}

// The safetensors header's __metadata__ (A1111's
// sd_models.read_metadata_from_safetensors); an empty object when the file
// has no readable header.
json safetensors_metadata(const std::string& path) {
    auto length = safetensors_header_length(path);
    if (!length.ok() || *length < 2 || *length > kSafetensorsMaxHeaderBytes) return json::object();
    auto fd = open_regular_file(path);
    if (!fd.ok()) return json::object();
    std::string header(static_cast<size_t>(*length), '\0');
    size_t got = 0;
    while (got < header.size()) {
        const ssize_t n = ::pread(*fd, header.data() + got, header.size() - got, static_cast<off_t>(8 + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    ::close(*fd);
    if (got < header.size()) return json::object();
    json parsed = json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) return json::object();
    auto it = parsed.find("__metadata__");
    return it != parsed.end() && it->is_object() ? *it : json::object();
}

// The cache file's JSON; an empty object when it is missing or not ours
// (a corrupt file is then replaced by the next write).
json read_cache_json(const std::string& file) {
    if (path_status(file).kind != PathKind::File) return json::object();
    auto text = read_whole_file(file, kMaxCacheFileBytes, "hash cache");
    if (!text.ok()) {
        KILN_LOG_VERBOSE("hash cache: %s (ignored)", text.error().message.c_str());
        return json::object();
    }
    json parsed = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) {
        KILN_LOG_VERBOSE("hash cache: %s is not a JSON object (ignored; rewritten with the next hash)", file.c_str());
        return json::object();
    }
    return parsed;
}

}  // namespace

Result<std::string> compute_file_hash(const std::string& path, FileHashKind kind) {
    uint64_t offset = 0;
    if (kind == FileHashKind::Addnet) {
        auto length = safetensors_header_length(path);
        if (!length.ok()) return length.error();
        // A1111 seeks to n + 8 whatever n is; past the end it hashes nothing.
        offset = *length > UINT64_MAX - 8 ? UINT64_MAX : *length + 8;
        if (offset > static_cast<uint64_t>(INT64_MAX)) {
            Sha256 empty;
            return empty.hex_digest();
        }
    }
    Sha256 hash;
    KILN_TRY(hash_file_from(path, offset, hash));
    return hash.hex_digest();
}

FileHashCache::FileHashCache(std::string cache_file) : cache_file_(std::move(cache_file)) {}

Result<std::string> FileHashCache::hash(const std::string& path, FileHashKind kind) {
    auto before = identify(path);
    if (!before.ok()) return before.error();
    const std::string section = section_of(kind);
    const std::string key = section + "\n" + before->absolute;
    Entry entry{before->size, before->mtime_ns, ""};
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = memory_.find(key);
        if (it != memory_.end() && it->second.size == entry.size && it->second.mtime_ns == entry.mtime_ns) {
            return it->second.sha256;
        }
    }
    if (!cache_file_.empty()) {
        if (auto cached = from_cache_file(section, before->absolute, entry)) {
            std::lock_guard<std::mutex> lock(mutex_);
            entry.sha256 = *cached;
            memory_[key] = entry;
            return *cached;
        }
    }

    if (before->size >= kAnnouncedHashBytes) {
        KILN_LOG_INFO("hashing %s for the images' parameters (once: the hash is cached)", path.c_str());
    } else {
        KILN_LOG_VERBOSE("hashing %s for the images' parameters", path.c_str());
    }
    auto computed = compute_file_hash(path, kind);
    if (!computed.ok()) return computed.error();
    entry.sha256 = *computed;

    // A file written to while it was read has no one hash: use this one for
    // now, but remember none.
    auto after = identify(path);
    if (!after.ok() || after->size != before->size || after->mtime_ns != before->mtime_ns) return entry.sha256;
    std::lock_guard<std::mutex> lock(mutex_);
    memory_[key] = entry;
    if (!cache_file_.empty()) write_cache_file(section, before->absolute, entry);
    return entry.sha256;
}

std::optional<std::string> FileHashCache::from_cache_file(const std::string& section, const std::string& key,
                                                          const Entry& file) const {
    const json cache = read_cache_json(cache_file_);
    auto sec = cache.find(section);
    if (sec == cache.end() || !sec->is_object()) return std::nullopt;
    auto it = sec->find(key);
    if (it == sec->end() || !it->is_object()) return std::nullopt;
    const json& e = *it;
    const auto size = e.find("size"), mtime = e.find("mtime_ns"), sha = e.find("sha256");
    if (size == e.end() || mtime == e.end() || sha == e.end() || !size->is_number_unsigned() ||
        !mtime->is_number_integer() || !sha->is_string()) {
        return std::nullopt;
    }
    if (size->get<uint64_t>() != file.size || mtime->get<int64_t>() != file.mtime_ns) return std::nullopt;
    const std::string value = sha->get<std::string>();
    if (!is_sha256_hex(value)) return std::nullopt;
    return value;
}

void FileHashCache::write_cache_file(const std::string& section, const std::string& key, const Entry& entry) {
    // Read again just before writing: another process may have added
    // entries since this one last looked.
    json cache = read_cache_json(cache_file_);
    if (!cache[section].is_object()) cache[section] = json::object();
    cache[section][key] = {{"size", entry.size}, {"mtime_ns", entry.mtime_ns}, {"sha256", entry.sha256}};

    const fs::path target(cache_file_);
    std::error_code ec;
    if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
    if (ec) {
        KILN_LOG_VERBOSE("hash cache: cannot create %s: %s (hashes not kept)", target.parent_path().c_str(),
                         ec.message().c_str());
        return;
    }
    // A name no other process or thread writes, in the same folder so that
    // rename() replaces the file in one step.
    static std::atomic<unsigned> counter{0};
    const std::string temp =
        cache_file_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    {
        std::ofstream out(temp, std::ios::binary | std::ios::trunc);
        out << cache.dump(2) << '\n';
        out.flush();
        if (!out) {
            KILN_LOG_VERBOSE("hash cache: cannot write %s (hashes not kept)", temp.c_str());
            out.close();
            fs::remove(temp, ec);
            return;
        }
    }
    if (std::rename(temp.c_str(), cache_file_.c_str()) != 0) {
        KILN_LOG_VERBOSE("hash cache: cannot replace %s: %s (hashes not kept)", cache_file_.c_str(),
                         std::strerror(errno));
        fs::remove(temp, ec);
    }
}

std::optional<std::string> file_hash_cache_path() {
    auto root = kiln_cache_root();
    if (!root) return std::nullopt;
    return *root + "/hashes.json";
}

Result<std::string> cached_file_hash(const std::string& path, FileHashKind kind) {
    // One cache per cache file: tests (and embedders) may point KILN_CACHE
    // elsewhere between jobs.
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<FileHashCache>> caches;
    const std::string file = file_hash_cache_path().value_or("");
    FileHashCache* cache = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex);
        std::unique_ptr<FileHashCache>& slot = caches[file];
        if (!slot) slot = std::make_unique<FileHashCache>(file);
        cache = slot.get();
    }
    return cache->hash(path, kind);
}

Result<std::string> model_short_hash(const std::string& path) {
    auto sha256 = cached_file_hash(path, FileHashKind::Sha256);
    if (!sha256.ok()) return sha256.error();
    return sha256->substr(0, 10);
}

Result<std::string> lora_short_hash(const std::string& path) {
    std::string extension = fs::path(path).extension().string();
    std::transform(extension.begin(), extension.end(), extension.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (extension != ".safetensors") {
        auto sha256 = cached_file_hash(path, FileHashKind::Sha256);
        if (!sha256.ok()) return sha256.error();
        return sha256->substr(0, 12);
    }
    // NetworkOnDisk takes the metadata's hash before any it would compute.
    // A1111 takes any value; kiln only hex digits, since the value lands in
    // the parameters text where a ',' or ':' would break the "Lora hashes"
    // list.
    const json metadata = safetensors_metadata(path);
    auto given = metadata.find("sshs_model_hash");
    if (given != metadata.end() && given->is_string() && is_hex(given->get<std::string>())) {
        return given->get<std::string>().substr(0, 12);
    }
    auto addnet = cached_file_hash(path, FileHashKind::Addnet);
    if (!addnet.ok()) return addnet.error();
    return addnet->substr(0, 12);
}

}  // namespace kiln::io
