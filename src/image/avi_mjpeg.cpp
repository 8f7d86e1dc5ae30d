#include "image/avi_mjpeg.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "image/image_io.h"
#include "util/files.h"
#include "util/format.h"

namespace kiln::image {

namespace {

// sd-cli's JPEG quality for video frames.
constexpr int kJpegQuality = 90;
// Largest INFO list read back: far beyond any parameters text, and finite
// so that a corrupt size cannot make the reader allocate gigabytes.
constexpr uint32_t kMaxInfoBytes = 16u << 20;

// AVIF_HASINDEX | AVIF_ISINTERLEAVED, as sd-cli and ffmpeg set them.
constexpr uint32_t kAviFlags = 0x10 | 0x100;
// idx1 flag of a frame that decodes on its own (every JPEG does).
constexpr uint32_t kIndexKeyFrame = 0x10;

void put_fourcc(std::vector<uint8_t>& out, const char* fourcc) { out.insert(out.end(), fourcc, fourcc + 4); }

void put_u16(std::vector<uint8_t>& out, uint32_t v) {
    out.push_back(static_cast<uint8_t>(v));
    out.push_back(static_cast<uint8_t>(v >> 8));
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    put_u16(out, v & 0xFFFF);
    put_u16(out, v >> 16);
}

void set_u32(std::vector<uint8_t>& out, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t get_u32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }

// Writes a chunk's id and a size to be filled in by end_chunk; returns where
// the size goes.
size_t begin_chunk(std::vector<uint8_t>& out, const char* id) {
    put_fourcc(out, id);
    const size_t size_at = out.size();
    put_u32(out, 0);
    return size_at;
}

size_t begin_list(std::vector<uint8_t>& out, const char* list_type) {
    const size_t size_at = begin_chunk(out, "LIST");
    put_fourcc(out, list_type);
    return size_at;
}

// The size excludes the pad byte RIFF adds after an odd-sized body.
void end_chunk(std::vector<uint8_t>& out, size_t size_at) {
    const size_t size = out.size() - size_at - 4;
    set_u32(out, size_at, static_cast<uint32_t>(size));
    if (size & 1) out.push_back(0);
}

// A zero-terminated INFO string (RIFF's ZSTR).
void put_info_text(std::vector<uint8_t>& out, const char* id, const std::string& text) {
    const size_t at = begin_chunk(out, id);
    out.insert(out.end(), text.begin(), text.end());
    out.push_back(0);
    end_chunk(out, at);
}

void put_main_header(std::vector<uint8_t>& out, int fps, uint32_t frames, uint32_t width, uint32_t height) {
    const size_t at = begin_chunk(out, "avih");
    put_u32(out, static_cast<uint32_t>(std::lround(1e6 / fps)));  // dwMicroSecPerFrame
    put_u32(out, 0);                                              // dwMaxBytesPerSec, filled in at the end
    put_u32(out, 0);                                              // dwPaddingGranularity
    put_u32(out, kAviFlags);
    put_u32(out, frames);  // dwTotalFrames
    put_u32(out, 0);       // dwInitialFrames
    put_u32(out, 1);       // dwStreams
    put_u32(out, 0);       // dwSuggestedBufferSize, filled in at the end
    put_u32(out, width);
    put_u32(out, height);
    for (int i = 0; i < 4; ++i) put_u32(out, 0);  // dwReserved
    end_chunk(out, at);
}

void put_stream_header(std::vector<uint8_t>& out, int fps, uint32_t frames, uint32_t width, uint32_t height) {
    const size_t at = begin_chunk(out, "strh");
    put_fourcc(out, "vids");
    put_fourcc(out, "MJPG");
    put_u32(out, 0);  // dwFlags
    put_u16(out, 0);  // wPriority
    put_u16(out, 0);  // wLanguage
    put_u32(out, 0);  // dwInitialFrames
    put_u32(out, 1);  // dwScale: with dwRate, fps frames a second exactly
    put_u32(out, static_cast<uint32_t>(fps));
    put_u32(out, 0);  // dwStart
    put_u32(out, frames);
    put_u32(out, 0);           // dwSuggestedBufferSize, filled in at the end
    put_u32(out, 0xFFFFFFFF);  // dwQuality: the codec's default
    put_u32(out, 0);           // dwSampleSize: frames vary in size
    put_u16(out, 0);           // rcFrame: left, top, right, bottom
    put_u16(out, 0);
    put_u16(out, width);
    put_u16(out, height);
    end_chunk(out, at);
}

void put_stream_format(std::vector<uint8_t>& out, uint32_t width, uint32_t height) {
    const size_t at = begin_chunk(out, "strf");
    put_u32(out, 40);  // biSize: a BITMAPINFOHEADER
    put_u32(out, width);
    put_u32(out, height);
    put_u16(out, 1);   // biPlanes
    put_u16(out, 24);  // biBitCount
    put_fourcc(out, "MJPG");
    put_u32(out, width * height * 3);  // biSizeImage
    for (int i = 0; i < 4; ++i) put_u32(out, 0);
    end_chunk(out, at);
}

Error too_big(const std::string& label, uint64_t max_bytes) {
    return Error::invalid_request(label + ": the video would be larger than the " + human_bytes(max_bytes) +
                                  " an AVI file can hold (kiln writes AVI 1.0, without the OpenDML extension); "
                                  "write .webm or .webp, or fewer or smaller frames");
}

// Reads exactly `n` bytes at `offset`; false at the end of the file or on an
// error (errno says which: 0 for the end).
bool read_at(int fd, uint64_t offset, uint8_t* data, size_t n) {
    while (n > 0) {
        const ssize_t got = ::pread(fd, data, n, static_cast<off_t>(offset));
        if (got < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (got == 0) {
            errno = 0;
            return false;
        }
        data += got;
        offset += static_cast<uint64_t>(got);
        n -= static_cast<size_t>(got);
    }
    return true;
}

Error read_failure(const std::string& path, const std::string& what) {
    if (errno != 0) return Error{path + ": cannot read: " + std::strerror(errno)};
    return Error{path + ": truncated AVI file (it ends inside " + what + ")"};
}

// The ICMT of an INFO list's body (after the 'INFO' type).
std::string info_comment(const std::vector<uint8_t>& body) {
    size_t pos = 0;
    while (pos + 8 <= body.size()) {
        const uint32_t size = get_u32(body.data() + pos + 4);
        if (size > body.size() - pos - 8) break;
        if (std::memcmp(body.data() + pos, "ICMT", 4) == 0) {
            std::string text(reinterpret_cast<const char*>(body.data() + pos + 8), size);
            while (!text.empty() && text.back() == '\0') text.pop_back();
            return text;
        }
        pos += 8 + static_cast<size_t>(size) + (size & 1);
    }
    return "";
}

}  // namespace

Result<std::vector<uint8_t>> encode_avi_mjpeg(const std::vector<Image>& frames, int fps, const std::string& parameters,
                                              const std::string& label, uint64_t max_bytes) {
    const uint32_t width = static_cast<uint32_t>(frames.front().width);
    const uint32_t height = static_cast<uint32_t>(frames.front().height);
    const uint32_t count = static_cast<uint32_t>(frames.size());
    // idx1 comes last: 8 bytes of header and 16 a frame.
    const uint64_t index_bytes = 8 + 16 * uint64_t(count);

    std::vector<uint8_t> out;
    const size_t riff_at = begin_chunk(out, "RIFF");
    put_fourcc(out, "AVI ");
    const size_t hdrl_at = begin_list(out, "hdrl");
    const size_t avih_at = out.size();
    put_main_header(out, fps, count, width, height);
    const size_t strl_at = begin_list(out, "strl");
    const size_t strh_at = out.size();
    put_stream_header(out, fps, count, width, height);
    put_stream_format(out, width, height);
    end_chunk(out, strl_at);
    end_chunk(out, hdrl_at);
    if (!parameters.empty()) {
        const size_t info_at = begin_list(out, "INFO");
        put_info_text(out, "ISFT", std::string("kiln ") + KILN_VERSION);
        put_info_text(out, "ICMT", parameters);
        end_chunk(out, info_at);
    }

    const size_t movi_at = begin_list(out, "movi");
    const size_t movi_fourcc = movi_at + 4;  // idx1 offsets count from here
    std::vector<uint8_t> index;
    index.reserve(static_cast<size_t>(index_bytes));
    put_fourcc(index, "idx1");
    put_u32(index, 16 * count);
    uint32_t largest = 0;
    ImageWriteOptions jpeg;
    jpeg.quality = kJpegQuality;
    for (size_t i = 0; i < frames.size(); ++i) {
        Result<std::vector<uint8_t>> encoded =
            encode_image(frames[i], ImageFormat::Jpeg, jpeg, label + ": frame " + std::to_string(i));
        if (!encoded) return encoded.error();
        const uint64_t chunk_bytes = 8 + encoded->size() + (encoded->size() & 1);
        if (out.size() + chunk_bytes + index_bytes > max_bytes) return too_big(label, max_bytes);
        const size_t chunk_at = out.size();
        const size_t size_at = begin_chunk(out, "00dc");
        out.insert(out.end(), encoded->begin(), encoded->end());
        end_chunk(out, size_at);
        const uint32_t size = static_cast<uint32_t>(encoded->size());
        largest = std::max(largest, size);
        put_fourcc(index, "00dc");
        put_u32(index, kIndexKeyFrame);
        put_u32(index, static_cast<uint32_t>(chunk_at - movi_fourcc));
        put_u32(index, size);
    }
    end_chunk(out, movi_at);
    out.insert(out.end(), index.begin(), index.end());
    end_chunk(out, riff_at);

    // The header fields that depend on the frames' sizes.
    const uint32_t buffer = largest + 8;
    set_u32(out, avih_at + 8 + 4, static_cast<uint32_t>(std::min<uint64_t>(uint64_t(buffer) * fps, 0xFFFFFFFF)));
    set_u32(out, avih_at + 8 + 28, buffer);
    set_u32(out, strh_at + 8 + 36, buffer);
    return out;
}

Result<std::string> read_avi_parameters(const std::string& path) {
    Result<int> opened = open_regular_file(path);
    if (!opened) return opened.error();
    struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
    } closer{*opened};
    const int fd = closer.fd;
    struct stat st;
    if (::fstat(fd, &st) != 0) return Error{path + ": cannot stat: " + std::strerror(errno)};
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);

    uint8_t head[12];
    if (!read_at(fd, 0, head, sizeof(head))) {
        if (errno != 0) return Error{path + ": cannot read: " + std::strerror(errno)};
        return Error{path + ": not an AVI file (too short)"};
    }
    if (std::memcmp(head, "RIFF", 4) != 0 || std::memcmp(head + 8, "AVI ", 4) != 0) {
        return Error{path + ": not an AVI file (no RIFF 'AVI ' header)"};
    }
    const uint64_t end = std::min<uint64_t>(file_size, uint64_t(get_u32(head + 4)) + 8);
    uint64_t pos = 12;
    while (pos + 8 <= end) {
        uint8_t header[12];
        if (!read_at(fd, pos, header, 8)) return read_failure(path, "a chunk header");
        const uint32_t size = get_u32(header + 4);
        if (size > end - pos - 8) {
            return Error{path + ": corrupt AVI file: chunk '" + std::string(reinterpret_cast<char*>(header), 4) +
                         "' at byte " + std::to_string(pos) + " runs past the end of the file"};
        }
        if (std::memcmp(header, "LIST", 4) == 0 && size >= 4) {
            if (!read_at(fd, pos + 8, header + 8, 4)) return read_failure(path, "a list header");
            if (std::memcmp(header + 8, "INFO", 4) == 0) {
                if (size - 4 > kMaxInfoBytes) {
                    return Error{path + ": INFO list of " + std::to_string(size) + " bytes, more than the " +
                                 human_bytes(kMaxInfoBytes) + " kiln reads"};
                }
                std::vector<uint8_t> body(size - 4);
                if (!read_at(fd, pos + 12, body.data(), body.size())) return read_failure(path, "the INFO list");
                std::string comment = info_comment(body);
                if (!comment.empty()) return comment;
            }
        }
        pos += 8 + uint64_t(size) + (size & 1);
    }
    return std::string();
}

}  // namespace kiln::image
