// What an image file carries besides its pixels, listed as sd-cli's
// `-M metadata` lists it: one entry per PNG chunk or JPEG segment, with the
// parsed fields of those it knows (text chunks, IHDR, pHYs, JFIF, EXIF's
// UserComment, ...). By default only the metadata-like entries are shown;
// `all` adds the structural ones (IHDR, IDAT, ...).
#pragma once

#include <string>

#include "util/result.h"

namespace kiln::image {

enum class MetadataFormat {
    Text,  // sd-cli's text report: "File: ...", "Format: ...", then "Chunk: tEXt" blocks
    Json,  // the same report as JSON, with "file", "format" and "entries"
};

struct MetadataReportOptions {
    MetadataFormat format = MetadataFormat::Text;
    bool raw = false;    // --metadata-raw: a hex preview of the first 64 bytes of entries kiln does not parse
    bool brief = false;  // --metadata-brief: text values past 240 characters cut, in the text report
    bool all = false;    // --metadata-all: the structural entries too
};

// The report of the PNG or JPEG file at `path`. Errors: the file's read
// errors, another format, a chunk or segment that runs past the file.
Result<std::string> metadata_report(const std::string& path, const MetadataReportOptions& options);

}  // namespace kiln::image
