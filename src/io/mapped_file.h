// A read-only memory mapping of a whole file. Tensor data is served straight
// from the mapping, so listing a model reads only its headers and reading a
// tensor touches only that tensor's pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/result.h"

namespace kiln::io {

class MappedFile {
  public:
    // Maps `path`. Errors name the path: missing, a symlink loop, not a
    // regular file (a FIFO or device is refused before any read, so it never
    // blocks), empty, unreadable.
    static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const std::string& path() const { return path_; }
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

  private:
    MappedFile(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
    std::string path_;
    const uint8_t* data_;
    size_t size_;
};

}  // namespace kiln::io
