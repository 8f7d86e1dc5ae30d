#include "util/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/files.h"

namespace kiln {

struct Sha256::State {
    EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
    state_->ctx = EVP_MD_CTX_new();
    // Only fails when out of memory; update and hex_digest check for a null context.
    if (state_->ctx && EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1) {
        EVP_MD_CTX_free(state_->ctx);
        state_->ctx = nullptr;
    }
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->ctx); }

void Sha256::update(const void* data, size_t size) {
    if (state_->ctx && size > 0) EVP_DigestUpdate(state_->ctx, data, size);
}

std::string Sha256::hex_digest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (!state_->ctx || EVP_DigestFinal_ex(state_->ctx, digest, &length) != 1) return "(no digest: out of memory)";
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < length; ++i) {
        out += hex[digest[i] >> 4];
        out += hex[digest[i] & 15];
    }
    return out;
}

Status hash_file_prefix(const std::string& path, uint64_t size, Sha256& hash) {
    auto fd = open_regular_file(path);
    if (!fd.ok()) return fd.error();
    std::vector<char> buffer(1 << 20);
    uint64_t left = size;
    Status status;
    while (left > 0) {
        const ssize_t n = ::read(*fd, buffer.data(), static_cast<size_t>(std::min<uint64_t>(left, buffer.size())));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            status = Error::bad_file(path + ": " + (n < 0 ? std::strerror(errno) : "shorter than expected") +
                                     " while reading it back to check its sha256");
            break;
        }
        hash.update(buffer.data(), static_cast<size_t>(n));
        left -= static_cast<uint64_t>(n);
    }
    ::close(*fd);
    return status;
}

Status hash_file_from(const std::string& path, uint64_t offset, Sha256& hash) {
    auto fd = open_regular_file(path);
    if (!fd.ok()) return fd.error();
    // Read once, front to back: tell the kernel so it reads ahead (a model
    // file of many gigabytes is hashed at the disk's speed).
    (void)::posix_fadvise(*fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<char> buffer(1 << 20);
    Status status;
    for (off_t at = static_cast<off_t>(offset);;) {
        const ssize_t n = ::pread(*fd, buffer.data(), buffer.size(), at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            status = Error::bad_file(path + ": " + std::strerror(errno) + " while reading it to hash it");
            break;
        }
        if (n == 0) break;
        hash.update(buffer.data(), static_cast<size_t>(n));
        at += n;
    }
    ::close(*fd);
    return status;
}

}  // namespace kiln
