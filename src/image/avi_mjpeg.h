// Motion-JPEG in AVI: sd-cli's default video file (-M vid_gen writes one
// unless -o names another container). Every player and ffmpeg read it and
// it needs no codec beyond libjpeg, at the price of size (each frame is a
// whole JPEG).
//
// The file is AVI 1.0 written directly, as sd-cli writes it:
//     RIFF 'AVI '
//       LIST 'hdrl'  avih (main header), LIST 'strl' (strh: 'vids'/'MJPG',
//                    rate = fps, scale = 1; strf: BITMAPINFOHEADER 'MJPG')
//       LIST 'INFO'  ISFT (kiln's version), ICMT (the parameters text)
//       LIST 'movi'  one '00dc' chunk per frame, a JPEG (quality 90)
//       idx1         one keyframe entry per frame, offsets from 'movi'
// ffprobe shows ICMT as the "comment" tag and ISFT as "software".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::image {

// AVI 1.0 holds every size and offset in 32 bits, and readers without
// OpenDML (the AVI 2.0 extension kiln does not write) stop at the first
// RIFF, which the format caps at 1 GiB.
constexpr uint64_t kMaxAviBytes = uint64_t(1) << 30;

// The AVI file for `frames` (RGB, all one size, as write_video checks them)
// at `fps` frames a second, with `parameters` in ICMT (no INFO list when it
// is empty). Errors start with `label`: a JPEG encoder failure, or a file
// that would exceed `max_bytes` (kMaxAviBytes; smaller only in tests),
// found before more than that is held in memory.
Result<std::vector<uint8_t>> encode_avi_mjpeg(const std::vector<Image>& frames, int fps, const std::string& parameters,
                                              const std::string& label, uint64_t max_bytes = kMaxAviBytes);

// The ICMT text of the AVI file at `path` (trailing NULs dropped); "" when
// the file has no INFO list or no ICMT in it. Reads the top-level chunk
// headers only, skipping the frames. Errors name the path: unreadable, not
// an AVI file, a chunk that runs past the file.
Result<std::string> read_avi_parameters(const std::string& path);

}  // namespace kiln::image
