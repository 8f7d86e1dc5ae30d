// Generation metadata in image files, in the form AUTOMATIC1111's web UI
// writes and reads (and that sd.cpp, ComfyUI importers, Civitai and most
// image viewers understand): a text block stored under the PNG keyword
// "parameters", or in EXIF UserComment for JPEG and WebP.
//
// The text block:
//     <prompt, one or more lines>
//     Negative prompt: <negative prompt, one or more lines>      (omitted when empty)
//     Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 42, Size: 512x512, Model: name, ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/result.h"

namespace kiln::image {

// The PNG text keyword A1111 stores its parameters under.
inline constexpr const char* kParametersKeyword = "parameters";

// What produced an image. A field at its default (empty string, 0 steps,
// 0 CFG scale, negative seed, 0 width or height) is left out of the text.
struct GenerationInfo {
    std::string prompt;
    std::string negative_prompt;
    int steps = 0;
    std::string sampler;    // A1111's name, e.g. "Euler a", "DPM++ 2M"
    std::string scheduler;  // "Schedule type", e.g. "Karras", "Automatic"
    float cfg_scale = 0.0f;
    int64_t seed = -1;
    int width = 0;
    int height = 0;
    std::string model;  // "Model": the model's name, without folder or extension
    // Everything else ("Model hash", "Denoising strength", "Clip skip",
    // "Version", ...), in order; values as they should appear, unquoted.
    std::vector<std::pair<std::string, std::string>> extra;

    bool operator==(const GenerationInfo& other) const;
    bool operator!=(const GenerationInfo& other) const { return !(*this == other); }
};

// The A1111 text for `info`: exactly what A1111's create_infotext produces.
// Keys come in A1111's order: Steps, Sampler, Schedule type, CFG scale, Seed,
// Size, Model, with extra keys A1111 itself emits ("Model hash", "VAE",
// "Denoising strength", "Clip skip", ...) placed where A1111 puts them,
// other extra keys after those in the given order, then "Version" and
// "User". Values containing ',', ':' or a newline are JSON-quoted as A1111
// does; an extra whose value equals its key is written as the bare key.
// CFG scale is the shortest decimal that reads back to the same float
// ("7", "7.5").
std::string format_a1111_parameters(const GenerationInfo& info);

// Reads A1111 text back, with A1111's own rules (parse_generation_parameters):
// the last line is the key/value line when it holds at least three
// "Key: value" pairs; lines before it up to a line starting with
// "Negative prompt:" are the prompt, the rest the negative prompt (each line
// trimmed); quoted values are JSON-unquoted. Known keys fill the fields
// (a value that does not parse as the field's type stays in `extra`); all
// other keys go to `extra` in order. Never fails: text that is not A1111's
// becomes the prompt.
GenerationInfo parse_a1111_parameters(const std::string& text);

// Every tEXt, zTXt and iTXt chunk of a PNG file, keyword -> UTF-8 text
// (tEXt/zTXt are Latin-1 and converted). A later chunk with the same
// keyword replaces an earlier one, as in PIL. Errors: the file's read errors,
// not a PNG, a chunk that is cut short or fails its CRC, text that does not
// decompress or inflates past 16 MiB.
Result<std::map<std::string, std::string>> read_png_text(const std::string& path);
Result<std::map<std::string, std::string>> parse_png_text(const uint8_t* data, size_t size, const std::string& label);

// zlib-inflates a text chunk's payload, refusing to grow past 16 MiB (a few
// bytes of zTXt can claim gigabytes); errors start with `what`.
Result<std::string> inflate_text(const uint8_t* data, size_t size, const std::string& what);

// read_png_text for PNG; for JPEG and WebP the EXIF UserComment, if any, as
// {"parameters": text} (where A1111 puts it); an empty map when the file
// carries none.
Result<std::map<std::string, std::string>> read_image_text(const std::string& path);
// The same of an image file's bytes; errors start with `label`.
Result<std::map<std::string, std::string>> image_text(const uint8_t* data, size_t size, const std::string& label);

// A TIFF-structured EXIF block (big-endian, as piexif writes it) holding only
// `text` as UserComment in UTF-16 with the "UNICODE" prefix: A1111's JPEG
// and WebP metadata. Without the "Exif\0\0" header that JPEG's APP1 adds.
std::vector<uint8_t> make_exif_user_comment(const std::string& text);

// The UserComment of a TIFF-structured EXIF block (a leading "Exif\0\0" is
// skipped), decoded to UTF-8; nullopt when the block is malformed or has
// none. Understands the UNICODE (UTF-16 in the block's byte order unless a
// BOM says otherwise), ASCII and undefined (taken as UTF-8) prefixes.
std::optional<std::string> parse_exif_user_comment(const uint8_t* data, size_t size);

}  // namespace kiln::image
