#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/files.h"

namespace kiln::io {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
    auto opened = open_regular_file(path);
    if (!opened) return opened.error();
    const int fd = *opened;
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        return Error{path + ": cannot stat: " + std::strerror(err)};
    }
    if (st.st_size == 0) {
        ::close(fd);
        return Error{path + ": file is empty"};
    }
    const auto size = static_cast<size_t>(st.st_size);
    void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (data == MAP_FAILED) {
        return Error{path + ": cannot map: " + std::strerror(err)};
    }
    return std::shared_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(data), size));
}

MappedFile::~MappedFile() { munmap(const_cast<uint8_t*>(data_), size_); }

}  // namespace kiln::io
