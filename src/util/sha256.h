// SHA-256 of a byte stream (OpenSSL's, which uses the CPU's SHA extensions
// where present: hashing a 10 GB file is a matter of seconds), for `kiln
// pull`'s checks against the hub's lfs.sha256 and the model and LoRA hashes
// of an image's parameters (io/file_hashes.h).
#pragma once

#include <memory>
#include <string>

#include "util/result.h"

namespace kiln {

class Sha256 {
  public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;

    void update(const void* data, size_t size);
    // The digest as 64 lowercase hex digits. Ends the stream: call once.
    std::string hex_digest();

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// Feeds the first `size` bytes of the file at `path` to `hash` (resuming a
// download hashes the part already on disk). BadFile naming the path when
// the file cannot be read or is shorter.
Status hash_file_prefix(const std::string& path, uint64_t size, Sha256& hash);

// Feeds the file's bytes from `offset` to its end to `hash` (nothing when
// the file is shorter; A1111's addnet hash skips a safetensors header this
// way). BadFile naming the path when the file cannot be read.
Status hash_file_from(const std::string& path, uint64_t offset, Sha256& hash);

}  // namespace kiln
