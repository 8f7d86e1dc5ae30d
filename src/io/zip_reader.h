// A minimal, read-only ZIP reader for PyTorch checkpoints (torch.save writes
// a zip of "stored", i.e. uncompressed, entries). It only locates entries: the
// caller reads an entry's bytes straight out of its own buffer (usually an
// mmap of the file), so nothing is copied or decompressed.
//
// Supported: the end-of-central-directory record (found by searching
// backwards over at most a 64 KiB comment), ZIP64 (locator, ZIP64 EOCD record
// and the ZIP64 extra field of central-directory entries; checkpoints are
// often larger than 4 GiB), the central directory and each entry's local
// header (to find where its data begins). Not supported, each an error:
// compressed or encrypted entries, archives spanning several disks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::io {

struct ZipEntry {
    std::string name;          // as stored in the central directory ('/' separated)
    uint64_t data_offset = 0;  // offset of the entry's first data byte in the buffer
    uint64_t size = 0;         // bytes of data; data_offset + size <= buffer size
};

// Lists the entries of the zip archive held in data[0, size), in central
// directory order. Requires data to be readable for `size` bytes (it may be
// null when size is 0); the returned entries refer to offsets in that buffer
// and own nothing. Every offset and length read from the archive is checked
// against the buffer, so any bytes are safe input. Errors start with "zip: "
// and name the entry when one is at fault.
Result<std::vector<ZipEntry>> read_zip(const uint8_t* data, size_t size);

// True if the buffer starts like a zip archive (a local file header, or the
// end record of an empty archive). A cheap sniff; read_zip does the checking.
bool looks_like_zip(const uint8_t* data, size_t size);

}  // namespace kiln::io
