#include "io/zip_reader.h"

#include <algorithm>
#include <string_view>

namespace kiln::io {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;

constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kMaxCommentSize = 0xFFFF;

constexpr uint16_t kZip64ExtraId = 0x0001;

// True if [offset, offset + length) lies within a buffer of `size` bytes;
// written so that no sum can overflow.
bool in_bounds(uint64_t offset, uint64_t length, uint64_t size) { return offset <= size && length <= size - offset; }

// Little-endian reads; callers have checked the bounds.
uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t rd64(const uint8_t* p) { return static_cast<uint64_t>(rd32(p)) | (static_cast<uint64_t>(rd32(p + 4)) << 32); }

Error zip_error(const std::string& what) { return Error{"zip: " + what}; }

// Where the central directory is, from the (ZIP64) end records.
struct CentralDirectory {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t entries = 0;
};

Result<CentralDirectory> find_central_directory(const uint8_t* data, size_t size) {
    if (size < kEndSize) return zip_error("file too small to be a zip archive (" + std::to_string(size) + " bytes)");

    // The end record is the last thing in the file, followed only by a comment
    // of at most 64 KiB; search backwards for its signature.
    const size_t last = size - kEndSize;
    const size_t first = last > kMaxCommentSize ? last - kMaxCommentSize : 0;
    size_t end_pos = 0;
    bool found = false;
    for (size_t pos = last + 1; pos-- > first;) {
        if (rd32(data + pos) != kEndSig) continue;
        const uint16_t comment = rd16(data + pos + 20);
        if (comment <= size - pos - kEndSize) {
            end_pos = pos;
            found = true;
            break;
        }
    }
    if (!found) return zip_error("no end-of-central-directory record (not a zip archive, or truncated)");

    const uint8_t* e = data + end_pos;
    const uint16_t disk = rd16(e + 4);
    const uint16_t cd_disk = rd16(e + 6);
    const uint16_t disk_entries = rd16(e + 8);
    CentralDirectory cd;
    cd.entries = rd16(e + 10);
    cd.size = rd32(e + 12);
    cd.offset = rd32(e + 16);

    // A ZIP64 locator sits immediately before the end record when present.
    const bool has_locator =
        end_pos >= kZip64LocatorSize && rd32(data + end_pos - kZip64LocatorSize) == kZip64LocatorSig;
    if (has_locator) {
        const uint8_t* loc = data + end_pos - kZip64LocatorSize;
        const uint32_t z64_disk = rd32(loc + 4);
        const uint64_t z64_offset = rd64(loc + 8);
        const uint32_t total_disks = rd32(loc + 16);
        if (z64_disk != 0 || total_disks > 1) return zip_error("archives spanning several disks are not supported");
        if (!in_bounds(z64_offset, kZip64EndSize, size) || z64_offset > end_pos - kZip64LocatorSize) {
            return zip_error("ZIP64 end record offset " + std::to_string(z64_offset) + " is out of bounds");
        }
        const uint8_t* z = data + z64_offset;
        if (rd32(z) != kZip64EndSig) return zip_error("bad ZIP64 end record signature");
        const uint32_t z_disk = rd32(z + 16);
        const uint32_t z_cd_disk = rd32(z + 20);
        const uint64_t z_disk_entries = rd64(z + 24);
        cd.entries = rd64(z + 32);
        cd.size = rd64(z + 40);
        cd.offset = rd64(z + 48);
        if (z_disk != 0 || z_cd_disk != 0 || z_disk_entries != cd.entries) {
            return zip_error("archives spanning several disks are not supported");
        }
    } else {
        if (disk != 0 || cd_disk != 0 || disk_entries != cd.entries) {
            return zip_error("archives spanning several disks are not supported");
        }
        if (cd.entries == 0xFFFF || cd.size == 0xFFFFFFFF || cd.offset == 0xFFFFFFFF) {
            return zip_error("ZIP64 values in the end record but no ZIP64 locator (truncated archive?)");
        }
    }

    if (!in_bounds(cd.offset, cd.size, size)) {
        return zip_error("central directory (offset " + std::to_string(cd.offset) + ", " + std::to_string(cd.size) +
                         " bytes) lies outside the " + std::to_string(size) + "-byte file");
    }
    // Each entry needs at least a fixed-size header; rejecting impossible
    // counts here keeps a forged count from driving a huge reservation.
    if (cd.entries > cd.size / kCentralHeaderSize) {
        return zip_error("central directory claims " + std::to_string(cd.entries) + " entries in " +
                         std::to_string(cd.size) + " bytes");
    }
    return cd;
}

// Values in a central-directory header that may be replaced by the ZIP64
// extra field (when they hold their all-ones marker).
struct EntrySizes {
    uint64_t compressed = 0;
    uint64_t uncompressed = 0;
    uint64_t local_offset = 0;
    uint32_t disk = 0;
};

Status apply_zip64_extra(const uint8_t* extra, size_t extra_len, EntrySizes& s, bool need_uncompressed,
                         bool need_compressed, bool need_offset, bool need_disk, const std::string& name) {
    size_t pos = 0;
    while (extra_len - pos >= 4) {
        const uint16_t id = rd16(extra + pos);
        const uint16_t len = rd16(extra + pos + 2);
        pos += 4;
        if (len > extra_len - pos) return zip_error("entry '" + name + "': extra field overruns its header");
        if (id == kZip64ExtraId) {
            // The field holds, in this order, only the values whose 32-bit
            // (16-bit for the disk) header fields are saturated.
            const uint8_t* f = extra + pos;
            size_t used = 0;
            auto take64 = [&](uint64_t& out) {
                if (len - used < 8) return false;
                out = rd64(f + used);
                used += 8;
                return true;
            };
            if (need_uncompressed && !take64(s.uncompressed)) break;
            if (need_compressed && !take64(s.compressed)) break;
            if (need_offset && !take64(s.local_offset)) break;
            if (need_disk) {
                if (len - used < 4) break;
                s.disk = rd32(f + used);
            }
            return Status::Ok();
        }
        pos += len;
    }
    if (need_uncompressed || need_compressed || need_offset || need_disk) {
        return zip_error("entry '" + name + "': missing or short ZIP64 extra field");
    }
    return Status::Ok();
}

}  // namespace

bool looks_like_zip(const uint8_t* data, size_t size) {
    return size >= 4 && (rd32(data) == kLocalHeaderSig || rd32(data) == kEndSig);
}

Result<std::vector<ZipEntry>> read_zip(const uint8_t* data, size_t size) {
    auto cd_result = find_central_directory(data, size);
    if (!cd_result) return cd_result.error();
    const CentralDirectory cd = cd_result.value();

    std::vector<ZipEntry> entries;
    entries.reserve(static_cast<size_t>(cd.entries));
    const uint64_t cd_end = cd.offset + cd.size;  // in bounds, checked above
    uint64_t pos = cd.offset;
    for (uint64_t index = 0; index < cd.entries; ++index) {
        if (!in_bounds(pos, kCentralHeaderSize, cd_end)) {
            return zip_error("central directory entry " + std::to_string(index) + " is truncated");
        }
        const uint8_t* h = data + pos;
        if (rd32(h) != kCentralHeaderSig) {
            return zip_error("bad central directory signature at offset " + std::to_string(pos));
        }
        const uint16_t flags = rd16(h + 8);
        const uint16_t method = rd16(h + 10);
        EntrySizes s;
        s.compressed = rd32(h + 20);
        s.uncompressed = rd32(h + 24);
        const uint16_t name_len = rd16(h + 28);
        const uint16_t extra_len = rd16(h + 30);
        const uint16_t comment_len = rd16(h + 32);
        s.disk = rd16(h + 34);
        s.local_offset = rd32(h + 42);
        const uint64_t var_len = uint64_t{name_len} + extra_len + comment_len;
        if (!in_bounds(pos + kCentralHeaderSize, var_len, cd_end)) {
            return zip_error("central directory entry " + std::to_string(index) + " overruns the directory");
        }
        std::string name(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
        auto z64 = apply_zip64_extra(h + kCentralHeaderSize + name_len, extra_len, s, s.uncompressed == 0xFFFFFFFF,
                                     s.compressed == 0xFFFFFFFF, s.local_offset == 0xFFFFFFFF, s.disk == 0xFFFF, name);
        if (!z64) return z64.error();
        pos += kCentralHeaderSize + var_len;

        if (flags & 0x1) return zip_error("entry '" + name + "' is encrypted");
        if (method != 0) {
            return zip_error("entry '" + name + "' is compressed (method " + std::to_string(method) +
                             "); only stored entries can be read (torch.save writes stored entries)");
        }
        if (s.compressed != s.uncompressed) {
            return zip_error("entry '" + name + "' is stored but its compressed and uncompressed sizes differ");
        }
        if (s.disk != 0) return zip_error("entry '" + name + "' is on another disk (spanned archive)");

        if (!in_bounds(s.local_offset, kLocalHeaderSize, size)) {
            return zip_error("entry '" + name + "': local header offset " + std::to_string(s.local_offset) +
                             " is out of bounds");
        }
        const uint8_t* l = data + s.local_offset;
        if (rd32(l) != kLocalHeaderSig) {
            return zip_error("entry '" + name + "': bad local header signature at offset " +
                             std::to_string(s.local_offset));
        }
        // The local header's name and extra field may differ in length from
        // the central ones (torch pads the local extra field to align data).
        const uint64_t local_var = uint64_t{rd16(l + 26)} + rd16(l + 28);
        const uint64_t data_offset = s.local_offset + kLocalHeaderSize + local_var;  // < 2^64: offset <= size
        if (!in_bounds(data_offset, s.uncompressed, size)) {
            return zip_error("entry '" + name + "': data (offset " + std::to_string(data_offset) + ", " +
                             std::to_string(s.uncompressed) + " bytes) lies outside the " + std::to_string(size) +
                             "-byte file");
        }
        entries.push_back(ZipEntry{std::move(name), data_offset, s.uncompressed});
    }
    return entries;
}

}  // namespace kiln::io
