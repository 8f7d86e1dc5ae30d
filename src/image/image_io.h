// Image files: PNG, JPEG and WebP, read by content and written by extension.
// Every failure (missing, empty, truncated or corrupt file, unsupported
// format, oversized image, unwritable path) is an Error whose message starts
// with the file's path; the codecs' own error exits are caught, so a bad file
// never aborts the process or leaks memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::image {

enum class ImageFormat { Png, Jpeg, WebP };

// "PNG", "JPEG", "WebP".
const char* image_format_name(ImageFormat format);

// The format whose signature starts `data`, or nullopt.
std::optional<ImageFormat> detect_image_format(const uint8_t* data, size_t size);

// Most pixels read_image decodes unless told otherwise (--max-image-pixels):
// 8192x8192, 256 MiB as 8-bit RGBA. Generous for an init image or mask, and
// finite, so a small compressed file cannot claim gigabytes.
constexpr uint64_t kDefaultMaxImagePixels = uint64_t(8192) * 8192;

// Largest image file read_image accepts (a 16384x16384 RGBA PNG of noise fits).
constexpr size_t kMaxImageFileBytes = size_t(1) << 30;

// RAM a decoded w x h image takes at most: 8-bit RGBA, the widest form the
// decoders return. Checked against DecodeLimits::max_bytes from the header.
constexpr uint64_t decoded_image_bytes(uint64_t width, uint64_t height) { return width * height * 4; }

// What read_image may decode, checked from the file's header before a pixel
// is decoded or allocated.
struct DecodeLimits {
    uint64_t max_pixels = kDefaultMaxImagePixels;  // more is a bad file (--max-image-pixels)
    // RAM the decoded pixels may take (decoded_image_bytes); more is an
    // out-of-memory error saying that `memory_owner` leaves only this much.
    uint64_t max_bytes = UINT64_MAX;
    std::string memory_owner = "free memory";
};

// Decodes a PNG, JPEG or WebP file, chosen by its signature, never by its
// name. The result is 8-bit RGB, or RGBA when the file has an alpha channel
// or transparency (PNG tRNS): palette, grey, grey+alpha, 1/2/4-bit and
// 16-bit PNGs are converted (16-bit rounded to 8), grey JPEGs become RGB and
// CMYK JPEGs are converted to RGB. Interlaced PNGs and progressive JPEGs are
// read. Animated WebP is rejected; EXIF orientation is not applied. Strict
// about damage: a file that ends early, fails a CRC or whose entropy-coded
// data is corrupt is an error, not a partly grey picture. Images larger than
// kMaxDimension on either side, or with more than `max_pixels` pixels, are
// rejected from their header, before a pixel is decoded or allocated (a
// 261 KB PNG can claim 16384x16384).
// A decode beyond `limits.max_bytes` is an out-of-memory error (its kind);
// every other failure is a plain error the caller gives its kind.
Result<Image> read_image(const std::string& path, uint64_t max_pixels = kDefaultMaxImagePixels);
Result<Image> read_image(const std::string& path, const DecodeLimits& limits);

// read_image on bytes already in memory (an HTTP body, a fuzzer input);
// errors start with `label`.
Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& label,
                           uint64_t max_pixels = kDefaultMaxImagePixels);
Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& label, const DecodeLimits& limits);

struct ImageWriteOptions {
    // JPEG and WebP quality, 1..100.
    int quality = 90;
    // WebP only: lossless instead of lossy (quality then sets the effort).
    bool lossless = false;
    // Text for the file. PNG: each entry a tEXt chunk (iTXt when the value is
    // not plain ASCII), before the image data. JPEG and WebP: only the
    // "parameters" entry is kept, in EXIF UserComment as A1111 writes it;
    // other keys are dropped. Keywords are 1..79 printable ASCII characters
    // without leading, trailing or doubled spaces; values hold no NUL bytes.
    std::map<std::string, std::string> text;
};

// The output format for a path's extension (case-insensitive: .png, .jpg,
// .jpeg, .webp); otherwise an error naming the extension and the valid ones.
Result<ImageFormat> format_for_path(const std::string& path);

// Encodes `image` (1, 3 or 4 channels) in `format`. JPEG drops alpha (as
// A1111 does); grey images are written as grey PNG/JPEG and as RGB WebP.
Result<std::vector<uint8_t>> encode_image(const Image& image, ImageFormat format, const ImageWriteOptions& options,
                                          const std::string& label = "image");

// Writes `image` to `path` in the format its extension names. The file
// appears only complete: the bytes go to `path + ".part"`, are flushed to
// disk and then renamed over `path`; on any failure the .part file is
// removed and `path` is left as it was.
Status write_image(const std::string& path, const Image& image, const ImageWriteOptions& options = {});

// Writes `bytes` to `path` the way write_image does: to `path + ".part"`,
// flushed, then renamed over `path`; on any failure the .part file is
// removed and `path` is left as it was. For every file kiln writes whole
// (images, videos), so none is ever seen half-written.
Status write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);

// The whole file, with read_image's checks and messages for missing, empty,
// directory, special (FIFO, device, socket: refused before any read) and
// oversized files (over `max_bytes`).
Result<std::vector<uint8_t>> read_file_bytes(const std::string& path, size_t max_bytes = kMaxImageFileBytes);

}  // namespace kiln::image
