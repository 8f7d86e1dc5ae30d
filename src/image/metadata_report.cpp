#include "image/metadata_report.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "image/image_io.h"
#include "image/png_metadata.h"
#include "image/video_file.h"

namespace kiln::image {
namespace {

using json = nlohmann::json;

// Text values past this are cut in a brief report (sd-cli's limit).
constexpr size_t kBriefChars = 240;
// Bytes shown of an entry kiln does not parse, with --metadata-raw.
constexpr size_t kRawPreviewBytes = 64;

uint32_t be32(const uint8_t* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }

std::string text_of(const uint8_t* begin, const uint8_t* end) {
    return std::string(reinterpret_cast<const char*>(begin), reinterpret_cast<const char*>(end));
}

std::string hex_preview(const uint8_t* data, size_t size) {
    std::ostringstream out;
    for (size_t i = 0; i < std::min(size, kRawPreviewBytes); ++i) {
        if (i) out << ' ';
        out << std::hex << std::setw(2) << std::setfill('0') << int(data[i]);
    }
    if (size > kRawPreviewBytes) out << " ...";
    return out.str();
}

// The end of the NUL-terminated field starting at `p`, or `end`.
const uint8_t* field_end(const uint8_t* p, const uint8_t* end) {
    const void* nul = std::memchr(p, 0, static_cast<size_t>(end - p));
    return nul ? static_cast<const uint8_t*>(nul) : end;
}

// A text chunk's fields, as sd-cli names them; a zTXt or compressed iTXt
// whose text does not inflate says so instead of failing the report.
json text_chunk(const std::string& type, const uint8_t* p, const uint8_t* end) {
    const uint8_t* keyword_end = field_end(p, end);
    if (keyword_end == end) return nullptr;
    json data;
    data["keyword"] = text_of(p, keyword_end);
    const uint8_t* cursor = keyword_end + 1;
    auto inflated = [&](const uint8_t* from) {
        auto text = inflate_text(from, static_cast<size_t>(end - from), type);
        if (text.ok()) {
            data["text"] = *text;
        } else {
            data["decompression_error"] = text.error().message;
        }
    };
    if (type == "tEXt") {
        data["text"] = text_of(cursor, end);
    } else if (type == "zTXt") {
        if (cursor >= end) return nullptr;
        data["compression_method"] = cursor[0];
        inflated(cursor + 1);
    } else {  // iTXt
        if (end - cursor < 2) return nullptr;
        const uint8_t flag = cursor[0], method = cursor[1];
        cursor += 2;
        const uint8_t* language_end = field_end(cursor, end);
        data["language_tag"] = text_of(cursor, language_end);
        cursor = std::min(language_end + 1, end);
        const uint8_t* translated_end = field_end(cursor, end);
        data["translated_keyword"] = text_of(cursor, translated_end);
        cursor = std::min(translated_end + 1, end);
        data["compression_flag"] = flag;
        data["compression_method"] = method;
        if (flag == 1) {
            inflated(cursor);
        } else {
            data["text"] = text_of(cursor, end);
        }
    }
    return data;
}

Result<json> png_entries(const std::vector<uint8_t>& bytes, bool raw) {
    static const uint8_t kSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    json entries = json::array();
    size_t offset = sizeof(kSignature);
    while (offset + 12 <= bytes.size()) {
        const uint32_t length = be32(&bytes[offset]);
        const std::string type = text_of(&bytes[offset + 4], &bytes[offset + 8]);
        offset += 8;
        if (length > bytes.size() - offset || bytes.size() - offset - length < 4) {
            return Error::bad_file("PNG chunk " + type + " runs past the end of the file");
        }
        const uint8_t* p = &bytes[offset];
        const uint8_t* end = p + length;
        json entry;
        entry["entry_type"] = "chunk";
        entry["name"] = type;
        entry["length"] = length;
        entry["crc"] = be32(end);
        entry["critical"] = !type.empty() && std::isupper(static_cast<unsigned char>(type[0]));
        entry["metadata_like"] = !(type == "IHDR" || type == "PLTE" || type == "IDAT" || type == "IEND");
        if (type == "IHDR" && length == 13) {
            entry["data"] = {{"width", be32(p)},         {"height", be32(p + 4)},       {"bit_depth", p[8]},
                             {"color_type", p[9]},       {"compression_method", p[10]}, {"filter_method", p[11]},
                             {"interlace_method", p[12]}};
        } else if (type == "tEXt" || type == "zTXt" || type == "iTXt") {
            json data = text_chunk(type, p, end);
            if (!data.is_null()) entry["data"] = std::move(data);
        } else if (type == "gAMA" && length == 4) {
            entry["data"] = {{"gamma_times_100000", be32(p)}};
        } else if (type == "sRGB" && length == 1) {
            entry["data"] = {{"rendering_intent", p[0]}};
        } else if (type == "pHYs" && length == 9) {
            entry["data"] = {
                {"pixels_per_unit_x", be32(p)}, {"pixels_per_unit_y", be32(p + 4)}, {"unit_specifier", p[8]}};
        } else if (type == "tIME" && length == 7) {
            entry["data"] = {{"year", be16(p)}, {"month", p[2]},  {"day", p[3]},
                             {"hour", p[4]},    {"minute", p[5]}, {"second", p[6]}};
        } else if (type == "eXIf") {
            if (auto comment = parse_exif_user_comment(p, length)) entry["data"] = {{"UserComment", *comment}};
            if (raw) entry["raw_hex_preview"] = hex_preview(p, length);
        } else if (raw) {
            entry["raw_hex_preview"] = hex_preview(p, length);
        }
        entries.push_back(std::move(entry));
        offset += length + 4;
        if (type == "IEND") return entries;
    }
    return Error::bad_file("PNG has no IEND chunk");
}

std::string jpeg_marker_name(uint8_t marker) {
    if (marker >= 0xE0 && marker <= 0xEF) return "APP" + std::to_string(marker - 0xE0);
    if (marker == 0xFE) return "COM";
    std::ostringstream out;
    out << "0x" << std::hex << std::uppercase << int(marker);
    return out.str();
}

Result<json> jpeg_entries(const std::vector<uint8_t>& bytes, bool raw) {
    json entries = json::array();
    size_t offset = 2;
    while (offset + 1 < bytes.size()) {
        if (bytes[offset] != 0xFF) return Error::bad_file("JPEG marker expected at byte " + std::to_string(offset));
        while (offset < bytes.size() && bytes[offset] == 0xFF) ++offset;
        if (offset >= bytes.size()) break;
        const uint8_t marker = bytes[offset++];
        if (marker == 0xD9 || marker == 0xDA) break;  // the image data follows: no more segments
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
        if (offset + 2 > bytes.size()) return Error::bad_file("JPEG segment without a length");
        const uint16_t length = be16(&bytes[offset]);
        if (length < 2 || offset + length > bytes.size()) {
            return Error::bad_file("JPEG segment " + jpeg_marker_name(marker) + " runs past the end of the file");
        }
        const uint8_t* p = &bytes[offset + 2];
        const size_t size = length - 2u;
        json entry;
        entry["entry_type"] = "segment";
        entry["marker"] = jpeg_marker_name(marker);
        entry["length"] = size;
        entry["metadata_like"] = marker == 0xFE || (marker >= 0xE0 && marker <= 0xEF);
        if (marker == 0xFE) {
            std::string comment = text_of(p, p + size);
            if (comment.rfind(std::string("parameters\0", 11), 0) == 0) {
                entry["data"] = {{"label", "parameters"}, {"text", comment.substr(11)}};
            } else {
                while (!comment.empty() && comment.back() == '\0') comment.pop_back();
                entry["data"] = {{"text", comment}};
            }
        } else if (marker == 0xE0 && size >= 5 && std::memcmp(p, "JFIF\0", 5) == 0) {
            entry["data"] = {{"identifier", "JFIF"},
                             {"version_major", size >= 7 ? p[5] : 0},
                             {"version_minor", size >= 7 ? p[6] : 0},
                             {"density_units", size >= 8 ? p[7] : 0},
                             {"x_density", size >= 10 ? be16(p + 8) : 0},
                             {"y_density", size >= 12 ? be16(p + 10) : 0}};
        } else if (marker == 0xE1 && size >= 6 && std::memcmp(p, "Exif\0\0", 6) == 0) {
            json data = {{"type", "Exif"}};
            if (auto comment = parse_exif_user_comment(p, size)) data["UserComment"] = *comment;
            entry["data"] = std::move(data);
            if (raw) entry["raw_hex_preview"] = hex_preview(p + 6, size - 6);
        } else if (marker == 0xE1 && size >= 29 && std::memcmp(p, "http://ns.adobe.com/xap/1.0/\0", 29) == 0) {
            entry["data"] = {{"type", "XMP"}, {"xml", text_of(p + 29, p + size)}};
        } else if (raw) {
            entry["raw_hex_preview"] = hex_preview(p, size);
        }
        entries.push_back(std::move(entry));
        offset += length;
    }
    return entries;
}

std::string abbreviated(const std::string& value, bool brief) {
    return brief && value.size() > kBriefChars ? value.substr(0, kBriefChars) + "..." : value;
}

void print_value(std::ostream& out, const std::string& key, const json& value, int indent, bool brief) {
    const std::string prefix(static_cast<size_t>(indent), ' ');
    if (value.is_string()) {
        out << prefix << key << ": " << abbreviated(value.get<std::string>(), brief) << "\n";
    } else if (value.is_primitive()) {
        out << prefix << key << ": " << value.dump() << "\n";
    } else if (value.is_array()) {
        out << prefix << key << ":\n";
        for (const json& item : value) {
            if (item.is_string()) {
                out << prefix << "  - " << abbreviated(item.get<std::string>(), brief) << "\n";
            } else if (item.is_primitive()) {
                out << prefix << "  - " << item.dump() << "\n";
            } else {
                out << prefix << "  -\n";
                for (auto it = item.begin(); it != item.end(); ++it) print_value(out, it.key(), *it, indent + 4, brief);
            }
        }
    } else {
        out << prefix << key << ":\n";
        for (auto it = value.begin(); it != value.end(); ++it) print_value(out, it.key(), *it, indent + 2, brief);
    }
}

std::string text_report(const std::string& path, const json& report, bool brief) {
    std::ostringstream out;
    out << "File: " << path << "\n";
    out << "Format: " << report.value("format", "unknown") << "\n\n";
    const json& entries = report["entries"];
    if (entries.empty()) {
        out << "No metadata entries found.\n";
        return out.str();
    }
    for (const json& entry : entries) {
        const bool chunk = entry.value("entry_type", "") == "chunk";
        out << (chunk ? "Chunk: " : "Segment: ") << entry.value(chunk ? "name" : "marker", "unknown") << "\n";
        for (auto it = entry.begin(); it != entry.end(); ++it) {
            if (it.key() == "entry_type" || it.key() == "name" || it.key() == "marker") continue;
            print_value(out, it.key(), *it, 2, brief);
        }
        out << "\n";
    }
    return out.str();
}

}  // namespace

Result<std::string> metadata_report(const std::string& path, const MetadataReportOptions& options) {
    auto bytes = read_file_bytes(path);
    if (!bytes.ok()) return bytes.error();
    json report;
    Result<json> entries =
        Error::bad_file(path + ": not a PNG, JPEG or video file (-M metadata reads PNG, JPEG, AVI, WebM and WebP)");
    const auto riff = [&](const char* form) {
        return bytes->size() >= 12 && std::memcmp(bytes->data(), "RIFF", 4) == 0 &&
               std::memcmp(bytes->data() + 8, form, 4) == 0;
    };
    const bool webm = bytes->size() >= 4 && std::memcmp(bytes->data(), "\x1a\x45\xdf\xa3", 4) == 0;
    if (riff("AVI ") || riff("WEBP") || webm) {
        // A video's one metadata entry: the parameters in its container's comment (video_file.h).
        report["format"] = riff("AVI ") ? "AVI" : webm ? "WebM" : "WebP";
        auto parameters = read_video_parameters(path);
        if (parameters.ok()) {
            entries = json::array();
            if (!parameters->empty()) {
                entries->push_back({{"entry_type", "chunk"},
                                    {"name", "comment"},
                                    {"parameters", *parameters},
                                    {"metadata_like", true}});
            }
        } else {
            entries = parameters.error();
        }
    } else if (bytes->size() >= 8 && std::memcmp(bytes->data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
        report["format"] = "PNG";
        entries = png_entries(*bytes, options.raw);
    } else if (bytes->size() >= 2 && (*bytes)[0] == 0xFF && (*bytes)[1] == 0xD8) {
        report["format"] = "JPEG";
        entries = jpeg_entries(*bytes, options.raw);
    }
    if (!entries.ok()) return entries.error().in_context(path + ": ");
    report["entries"] = json::array();
    for (json& entry : *entries) {
        const bool shown = options.all || entry.value("metadata_like", false);
        entry.erase("metadata_like");
        if (shown) report["entries"].push_back(std::move(entry));
    }
    if (options.format == MetadataFormat::Json) {
        report["file"] = path;
        return report.dump(2) + "\n";
    }
    return text_report(path, report, options.brief);
}

}  // namespace kiln::image
