// Animated WebP: a video that image viewers, browsers and chat clients show
// like a GIF, in full colour, for -o NAME.webp in video mode (sd-cli writes
// it with the same libwebp encoder, WebPAnimEncoder).
//
// Frames are lossy WebP at quality 90 (sd-cli's), each shown for 1/fps
// seconds rounded to WebP's millisecond durations, looping forever. The
// parameters go where kiln puts them in a still WebP: an EXIF chunk whose
// UserComment holds the text, as A1111 writes it (make_exif_user_comment),
// so exiftool shows it as "User Comment", `webpmux -info` lists the EXIF
// chunk, and read_image_text reads it as a still WebP's. (ffmpeg shows no
// WebP metadata, and before version 7 decodes no animated WebP at all.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::image {

// The animated WebP file for `frames` (RGB, all one size, as write_video
// checks them) at `fps` frames a second, with `parameters` in EXIF
// UserComment (no EXIF chunk when empty). WebPAnimEncoder merges a frame
// identical to the one before into that one's duration, so a still stretch
// is stored once and lasts as long. Errors start with `label`: a side over
// WebP's 16383, an encoder failure.
Result<std::vector<uint8_t>> encode_webp_animation(const std::vector<Image>& frames, int fps,
                                                   const std::string& parameters, const std::string& label);

// The EXIF UserComment of the WebP file (animated or still) at `path`; ""
// when it has none. Errors name the path: unreadable, not a WebP file, a
// chunk layout libwebp's demuxer refuses.
Result<std::string> read_webp_parameters(const std::string& path);

}  // namespace kiln::image
