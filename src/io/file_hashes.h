// The file hashes AUTOMATIC1111's web UI writes into an image's parameters
// ("Model hash", "Lora hashes"), by which Civitai and image viewers tell which
// checkpoint and LoRAs made an image. Hashing a 30 GB checkpoint takes
// seconds to minutes, so each file is hashed once and its hash cached, as
// A1111 caches its own in cache.json:
//   in memory, for the process's later jobs, and
//   in CACHE/hashes.json (CACHE: util/kiln_cache.h's root), for later runs,
// both keyed by the file's absolute path, size and modification time, so an
// edited or replaced file is hashed again. The cache file is only a
// shortcut: missing, unreadable, unwritable or corrupt, it is ignored (and a
// corrupt one is replaced by the next hash written), never an error.
//
// hashes.json, A1111's cache.json layout with sizes and kiln's keys:
//   {"hashes":        {"/abs/model.safetensors": {"size": N, "mtime_ns": T, "sha256": "<64 hex>"}},
//    "hashes-addnet": {"/abs/lora.safetensors":  {"size": N, "mtime_ns": T, "sha256": "<64 hex>"}}}
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "util/result.h"

namespace kiln::io {

enum class FileHashKind {
    // SHA-256 of the whole file (A1111's modules/hashes.py calculate_sha256).
    Sha256,
    // kohya's "addnet" hash of a safetensors file: SHA-256 of the bytes
    // after the 8-byte little-endian header length N and the N-byte header,
    // i.e. of the tensor data alone, so editing the metadata keeps it
    // (A1111's hashes.addnet_hash_safetensors, which takes N as given: a file
    // shorter than 8 + N hashes to the SHA-256 of nothing).
    Addnet,
};

// 64 lowercase hex digits, read from the file now (no cache). BadFile naming
// the path when it cannot be read.
Result<std::string> compute_file_hash(const std::string& path, FileHashKind kind);

// Hashes computed once per file: in memory, and in `cache_file` when one is
// given. Thread-safe; processes sharing a cache file each replace it whole
// (written to a temporary file, then renamed), so a reader never sees half
// of one, and at worst an entry another process wrote meanwhile is lost and
// computed again later.
class FileHashCache {
  public:
    // `cache_file`: the JSON file hashes persist in; "" keeps them in memory only.
    explicit FileHashCache(std::string cache_file);

    // The hash of the file at `path`: from memory, else from the cache file
    // when its entry has the file's size and modification time, else
    // computed and written to both (unless the file changed while it was
    // read). BadFile when the file cannot be read; the cache file's own
    // problems are only logged (verbose).
    Result<std::string> hash(const std::string& path, FileHashKind kind);

    const std::string& cache_file() const { return cache_file_; }

  private:
    struct Entry {
        uint64_t size = 0;
        int64_t mtime_ns = 0;
        std::string sha256;
    };
    std::optional<std::string> from_cache_file(const std::string& section, const std::string& key,
                                               const Entry& file) const;
    void write_cache_file(const std::string& section, const std::string& key, const Entry& entry);

    std::string cache_file_;
    std::mutex mutex_;
    std::map<std::string, Entry> memory_;  // by section + "\n" + absolute path
};

// CACHE/hashes.json, or nullopt when there is no cache root (neither
// KILN_CACHE nor HOME set).
std::optional<std::string> file_hash_cache_path();

// FileHashCache::hash through the process's cache of file_hash_cache_path()
// as it is at the call (memory only without a cache root).
Result<std::string> cached_file_hash(const std::string& path, FileHashKind kind);

// A1111's "Model hash" of a checkpoint: its AutoV2 short hash, the first 10
// hex digits of the whole file's SHA-256 (modules/sd_models.py,
// CheckpointInfo.calculate_shorthash: shorthash = sha256[0:10]). Cached.
Result<std::string> model_short_hash(const std::string& path);

// A1111's hash of a LoRA file in "Lora hashes", the first 12 hex digits of
// (extensions-builtin/Lora/network.py, NetworkOnDisk.__init__, set_hash and
// read_hash):
//   a ".safetensors" file (by its extension, any case): the header's
//     __metadata__.sshs_model_hash when it has one (kohya's trainer stores
//     the addnet hash there; A1111 takes any value, kiln only hex digits,
//     which cannot break the "Lora hashes" list), else the addnet hash;
//   any other file: the SHA-256 of the whole file.
// Cached.
Result<std::string> lora_short_hash(const std::string& path);

}  // namespace kiln::io
