// SHA-256 of a byte stream (OpenSSL's, which uses the CPU's SHA extensions
// where present: checking a 10 GB download is a matter of seconds), for
// `kiln pull`'s checks against the hub's lfs.sha256.
#pragma once

#include <memory>
#include <string>

#include "util/result.h"

namespace kiln::cli {

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

}  // namespace kiln::cli
