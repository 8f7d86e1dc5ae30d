// The zip reader, on archives built by hand (plain and ZIP64) and damaged in
// known ways.
#include "io/zip_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_files.h"

namespace kiln::io {
namespace {

using test::put_bytes;
using test::put_u16;
using test::put_u32;
using test::put_u64;

struct FileSpec {
    std::string name;
    std::string data;
    uint16_t method = 0;
    uint16_t flags = 0;
    uint16_t local_extra = 0;  // padding bytes in the local header's extra field
};

struct BuildOptions {
    bool zip64 = false;
    std::string comment;
};

// Writes a zip archive of `files` (CRCs are left 0: the reader ignores them).
// With zip64, every size and offset in the central directory is saturated and
// given in a ZIP64 extra field, and the end record points to a ZIP64 record.
std::vector<uint8_t> build_zip(const std::vector<FileSpec>& files, const BuildOptions& opt = {}) {
    std::vector<uint8_t> out;
    std::vector<uint64_t> local_offsets;
    for (const FileSpec& f : files) {
        local_offsets.push_back(out.size());
        put_u32(out, 0x04034b50);
        put_u16(out, 20);
        put_u16(out, f.flags);
        put_u16(out, f.method);
        put_u32(out, 0);  // time, date
        put_u32(out, 0);  // crc
        put_u32(out, static_cast<uint32_t>(f.data.size()));
        put_u32(out, static_cast<uint32_t>(f.data.size()));
        put_u16(out, static_cast<uint16_t>(f.name.size()));
        put_u16(out, f.local_extra);
        put_bytes(out, f.name);
        out.insert(out.end(), f.local_extra, 0);
        put_bytes(out, f.data);
    }
    const uint64_t cd_offset = out.size();
    for (size_t i = 0; i < files.size(); ++i) {
        const FileSpec& f = files[i];
        put_u32(out, 0x02014b50);
        put_u16(out, 45);
        put_u16(out, 45);
        put_u16(out, f.flags);
        put_u16(out, f.method);
        put_u32(out, 0);
        put_u32(out, 0);
        const uint32_t size32 = opt.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(f.data.size());
        put_u32(out, size32);
        put_u32(out, size32);
        put_u16(out, static_cast<uint16_t>(f.name.size()));
        put_u16(out, opt.zip64 ? 28 : 0);
        put_u16(out, 0);  // comment
        put_u16(out, 0);  // disk
        put_u16(out, 0);
        put_u32(out, 0);
        put_u32(out, opt.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(local_offsets[i]));
        put_bytes(out, f.name);
        if (opt.zip64) {
            put_u16(out, 0x0001);
            put_u16(out, 24);
            put_u64(out, f.data.size());  // uncompressed
            put_u64(out, f.data.size());  // compressed
            put_u64(out, local_offsets[i]);
        }
    }
    const uint64_t cd_size = out.size() - cd_offset;
    if (opt.zip64) {
        const uint64_t z64_offset = out.size();
        put_u32(out, 0x06064b50);
        put_u64(out, 44);
        put_u16(out, 45);
        put_u16(out, 45);
        put_u32(out, 0);
        put_u32(out, 0);
        put_u64(out, files.size());
        put_u64(out, files.size());
        put_u64(out, cd_size);
        put_u64(out, cd_offset);
        put_u32(out, 0x07064b50);
        put_u32(out, 0);
        put_u64(out, z64_offset);
        put_u32(out, 1);
    }
    put_u32(out, 0x06054b50);
    put_u16(out, 0);
    put_u16(out, 0);
    put_u16(out, opt.zip64 ? 0xFFFF : static_cast<uint16_t>(files.size()));
    put_u16(out, opt.zip64 ? 0xFFFF : static_cast<uint16_t>(files.size()));
    put_u32(out, opt.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(cd_size));
    put_u32(out, opt.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(cd_offset));
    put_u16(out, static_cast<uint16_t>(opt.comment.size()));
    put_bytes(out, opt.comment);
    return out;
}

std::string entry_data(const std::vector<uint8_t>& zip, const ZipEntry& e) {
    return std::string(reinterpret_cast<const char*>(zip.data() + e.data_offset), e.size);
}

std::string error_of(const std::vector<uint8_t>& zip) {
    auto r = read_zip(zip.data(), zip.size());
    return r.ok() ? std::string("(no error)") : r.error().message;
}

const std::vector<FileSpec> kFiles = {
    {"archive/data.pkl", "\x80\x02}q\x01.", 0, 0, 0},
    {"archive/data/0", std::string(16, '\x11'), 0, 0, 13},  // padded like torch aligns data
    {"archive/version", "3\n", 0, 0, 0},
    {"archive/empty", "", 0, 0, 0},
};

TEST(ZipReader, ReadsStoredEntries) {
    const auto zip = build_zip(kFiles);
    EXPECT_TRUE(looks_like_zip(zip.data(), zip.size()));
    auto entries = read_zip(zip.data(), zip.size());
    ASSERT_TRUE(entries.ok()) << entries.error().message;
    ASSERT_EQ(entries->size(), kFiles.size());
    for (size_t i = 0; i < kFiles.size(); ++i) {
        EXPECT_EQ((*entries)[i].name, kFiles[i].name);
        EXPECT_EQ((*entries)[i].size, kFiles[i].data.size());
        EXPECT_EQ(entry_data(zip, (*entries)[i]), kFiles[i].data);
    }
    // The local header's padding is skipped: entry 1's header starts at
    // 30 + 16 + 6 = 52 and holds 30 fixed bytes, a 14-byte name, 13 of padding.
    EXPECT_EQ((*entries)[0].data_offset, 46u);
    EXPECT_EQ((*entries)[1].data_offset, 52u + 30u + 14u + 13u);
}

TEST(ZipReader, ArchiveCommentIsSkipped) {
    const auto zip = build_zip(kFiles, {false, std::string(3000, 'c')});
    auto entries = read_zip(zip.data(), zip.size());
    ASSERT_TRUE(entries.ok()) << entries.error().message;
    EXPECT_EQ(entries->size(), kFiles.size());
}

TEST(ZipReader, ReadsZip64) {
    const auto zip = build_zip(kFiles, {true, ""});
    auto entries = read_zip(zip.data(), zip.size());
    ASSERT_TRUE(entries.ok()) << entries.error().message;
    ASSERT_EQ(entries->size(), kFiles.size());
    for (size_t i = 0; i < kFiles.size(); ++i) {
        EXPECT_EQ((*entries)[i].name, kFiles[i].name);
        EXPECT_EQ(entry_data(zip, (*entries)[i]), kFiles[i].data);
    }
}

TEST(ZipReader, EmptyArchive) {
    const auto zip = build_zip({});
    EXPECT_TRUE(looks_like_zip(zip.data(), zip.size()));
    auto entries = read_zip(zip.data(), zip.size());
    ASSERT_TRUE(entries.ok()) << entries.error().message;
    EXPECT_TRUE(entries->empty());
}

TEST(ZipReader, TooSmallOrNotAZip) {
    EXPECT_EQ(error_of({}), "zip: file too small to be a zip archive (0 bytes)");
    EXPECT_FALSE(looks_like_zip(nullptr, 0));
    std::vector<uint8_t> junk(1000, 'x');
    EXPECT_EQ(error_of(junk), "zip: no end-of-central-directory record (not a zip archive, or truncated)");
    EXPECT_FALSE(looks_like_zip(junk.data(), junk.size()));
}

TEST(ZipReader, TruncatedArchivesFailCleanly) {
    for (bool zip64 : {false, true}) {
        const auto zip = build_zip(kFiles, {zip64, ""});
        for (size_t n = 0; n < zip.size(); ++n) {
            std::vector<uint8_t> cut(zip.begin(), zip.begin() + static_cast<std::ptrdiff_t>(n));
            auto r = read_zip(cut.data(), cut.size());
            EXPECT_FALSE(r.ok()) << "zip64=" << zip64 << " n=" << n;
        }
    }
    // Cutting the end record off leaves no end record to find.
    auto zip = build_zip(kFiles);
    zip.resize(zip.size() - 5);
    EXPECT_EQ(error_of(zip), "zip: no end-of-central-directory record (not a zip archive, or truncated)");
}

TEST(ZipReader, CompressedEntryIsAnError) {
    auto files = kFiles;
    files[2].method = 8;
    EXPECT_EQ(error_of(build_zip(files)),
              "zip: entry 'archive/version' is compressed (method 8); only stored entries can be read "
              "(torch.save writes stored entries)");
}

TEST(ZipReader, EncryptedEntryIsAnError) {
    auto files = kFiles;
    files[0].flags = 1;
    EXPECT_EQ(error_of(build_zip(files)), "zip: entry 'archive/data.pkl' is encrypted");
}

// Offsets of fields in the plain archive built from kFiles.
size_t end_record(const std::vector<uint8_t>& zip) { return zip.size() - 22; }
size_t central_directory(const std::vector<uint8_t>& zip) {
    const uint8_t* e = zip.data() + end_record(zip) + 16;
    return static_cast<size_t>(e[0] | (e[1] << 8) | (e[2] << 16) | (e[3] << 24));
}
void poke32(std::vector<uint8_t>& zip, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) zip[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}
void poke16(std::vector<uint8_t>& zip, size_t at, uint16_t v) {
    zip[at] = static_cast<uint8_t>(v);
    zip[at + 1] = static_cast<uint8_t>(v >> 8);
}

TEST(ZipReader, BadOffsetsAreErrors) {
    const auto good = build_zip(kFiles);
    {
        auto zip = good;  // central directory beyond the file
        poke32(zip, end_record(zip) + 16, 0x7FFFFFF0);
        EXPECT_NE(error_of(zip).find("zip: central directory (offset 2147483632"), std::string::npos) << error_of(zip);
    }
    {
        auto zip = good;  // more entries than the directory can hold
        poke16(zip, end_record(zip) + 8, 5000);
        poke16(zip, end_record(zip) + 10, 5000);
        EXPECT_NE(error_of(zip).find("claims 5000 entries"), std::string::npos) << error_of(zip);
    }
    {
        auto zip = good;  // first entry's local header beyond the file
        poke32(zip, central_directory(zip) + 42, 0xFFFFFF00);
        EXPECT_EQ(error_of(zip), "zip: entry 'archive/data.pkl': local header offset 4294967040 is out of bounds");
    }
    {
        auto zip = good;  // local header offset pointing at the wrong thing
        poke32(zip, central_directory(zip) + 42, 1);
        EXPECT_EQ(error_of(zip), "zip: entry 'archive/data.pkl': bad local header signature at offset 1");
    }
    {
        auto zip = good;  // data size running past the end
        poke32(zip, central_directory(zip) + 20, 0xFFFFFFF0);
        poke32(zip, central_directory(zip) + 24, 0xFFFFFFF0);
        EXPECT_NE(error_of(zip).find("zip: entry 'archive/data.pkl': data (offset 46, 4294967280 bytes) lies outside"),
                  std::string::npos)
            << error_of(zip);
    }
    {
        auto zip = good;  // stored sizes disagreeing
        poke32(zip, central_directory(zip) + 20, 3);
        EXPECT_NE(error_of(zip).find("compressed and uncompressed sizes differ"), std::string::npos);
    }
    {
        auto zip = good;  // a name running past the directory
        poke16(zip, central_directory(zip) + 28, 0xFFFF);
        EXPECT_EQ(error_of(zip), "zip: central directory entry 0 overruns the directory");
    }
    {
        auto zip = good;  // broken central header signature
        zip[central_directory(zip)] = 'X';
        EXPECT_NE(error_of(zip).find("bad central directory signature"), std::string::npos);
    }
    {
        auto zip = good;  // spanned archive
        poke16(zip, end_record(zip) + 4, 1);
        EXPECT_EQ(error_of(zip), "zip: archives spanning several disks are not supported");
    }
    {
        auto zip = good;  // saturated values without a ZIP64 locator
        poke32(zip, end_record(zip) + 16, 0xFFFFFFFF);
        EXPECT_NE(error_of(zip).find("no ZIP64 locator"), std::string::npos);
    }
}

TEST(ZipReader, BadZip64ValuesAreErrors) {
    const auto good = build_zip(kFiles, {true, ""});
    const size_t locator = good.size() - 22 - 20;
    const size_t record = locator - 56;
    {
        auto zip = good;  // ZIP64 record offset far beyond the file
        poke32(zip, locator + 8, 0xFFFFFF00);
        poke32(zip, locator + 12, 0xFFFFFFFF);
        EXPECT_EQ(error_of(zip), "zip: ZIP64 end record offset 18446744073709551360 is out of bounds");
    }
    {
        auto zip = good;
        zip[record] = 'X';
        EXPECT_EQ(error_of(zip), "zip: bad ZIP64 end record signature");
    }
    {
        auto zip = good;  // a central directory offset near 2^64 must not wrap
        poke32(zip, record + 48, 0xFFFFFFF0);
        poke32(zip, record + 52, 0xFFFFFFFF);
        EXPECT_NE(error_of(zip).find("lies outside the"), std::string::npos) << error_of(zip);
    }
    // The first entry's ZIP64 extra field: uncompressed, compressed, offset.
    size_t cd = 0;
    for (int i = 0; i < 8; ++i) cd |= static_cast<size_t>(good[record + 48 + static_cast<size_t>(i)]) << (8 * i);
    const size_t extra = cd + 46 + kFiles[0].name.size() + 4;
    {
        auto zip = good;  // sizes near 2^64
        for (size_t at : {extra, extra + 8}) {
            poke32(zip, at, 0xFFFFFFFF);
            poke32(zip, at + 4, 0xFFFFFFFF);
        }
        EXPECT_NE(error_of(zip).find("zip: entry 'archive/data.pkl': data (offset"), std::string::npos)
            << error_of(zip);
    }
    {
        auto zip = good;  // local header offset near 2^64
        poke32(zip, extra + 16, 0xFFFFFFFF);
        poke32(zip, extra + 20, 0xFFFFFFFF);
        EXPECT_NE(error_of(zip).find("local header offset 18446744073709551615 is out of bounds"), std::string::npos)
            << error_of(zip);
    }
    {
        auto zip = good;  // ZIP64 field too short for what the header needs
        poke16(zip, extra - 2, 8);
        EXPECT_NE(error_of(zip).find("missing or short ZIP64 extra field"), std::string::npos) << error_of(zip);
    }
}

TEST(ZipReader, CorruptedBytesNeverCrash) {
    // Deterministic corruption of every region; the reader must return (ok or
    // an error) and every entry it returns must lie inside the buffer.
    for (bool zip64 : {false, true}) {
        const auto good = build_zip(kFiles, {zip64, ""});
        uint32_t state = 12345;
        for (int round = 0; round < 3000; ++round) {
            auto zip = good;
            for (int k = 0; k < 3; ++k) {
                state = state * 1664525u + 1013904223u;
                const size_t at = (state >> 8) % zip.size();
                state = state * 1664525u + 1013904223u;
                zip[at] = static_cast<uint8_t>(state >> 24);
            }
            auto r = read_zip(zip.data(), zip.size());
            if (!r.ok()) continue;
            for (const ZipEntry& e : *r) {
                EXPECT_LE(e.data_offset, zip.size());
                EXPECT_LE(e.size, zip.size() - e.data_offset);
            }
        }
    }
}

}  // namespace
}  // namespace kiln::io
