// Video files, written as sd-cli writes a video job's frames, in the format
// the output name asks for:
//     NAME.avi           Motion-JPEG AVI, sd-cli's default (avi_mjpeg.h)
//     NAME.webm          VP8 in WebM (webm_vp8.h)
//     NAME.webp          animated WebP (webp_animation.h)
//     NAME_%03d.png      one image a frame (PNG, JPEG or WebP by the
//                        extension), numbered from 0 as sd-cli numbers them
// The generation parameters (the text kiln writes into a PNG's "parameters"
// chunk) go into each container's own comment field, where ffprobe,
// exiftool or kiln -M metadata find them (read_video_parameters).
#pragma once

#include <string>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::image {

// sd-cli's --fps default, and the most write_video takes (a frame a
// millisecond, the resolution WebM's and WebP's timestamps have here).
constexpr int kDefaultVideoFps = 16;
constexpr int kMaxVideoFps = 1000;

// Whether write_video writes `path` as one video file: its extension is
// .avi, .webm or .webp (any case) and it holds no frame-number field. A
// .webp name is a still image too; a caller with one frame decides.
bool is_video_path(const std::string& path);

// Writes `frames` (RGB, 3 channels, all the same size) as a video playing at
// `fps` frames a second, with `parameters` (may be empty) as its comment.
// The format comes from the extension, as above; a path holding one integer
// field (%d, %i or %u, optionally zero-padded with a width of at most 9;
// "%%" is a literal '%') writes one image per frame instead, frame i named
// with first_index + i (--output-begin-idx; sd-cli starts at 0), each with
// the parameters as an image written by write_image carries them.
// The file appears only complete (written to NAME.part, then renamed); a
// failed image sequence removes the frames it wrote. Errors name the path:
// invalid requests (no frames, frames of different sizes or not RGB, fps
// outside 1..kMaxVideoFps, parameters holding a NUL byte, a negative
// first_index, a frame too large for the codec, an AVI past 1 GiB, an
// extension that is no video format) before anything is written; write
// errors (a missing or unwritable folder) as image_io reports them.
Status write_video(const std::string& path, const std::vector<Image>& frames, int fps, const std::string& parameters,
                   int first_index = 0);

// The parameters text of an AVI (ICMT), WebM (COMMENT tag) or WebP (EXIF
// UserComment) file, chosen by its signature, not its name; "" when the
// file carries none. Errors name the path: unreadable, another format,
// a structure that does not parse.
Result<std::string> read_video_parameters(const std::string& path);

}  // namespace kiln::image
