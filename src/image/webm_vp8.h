// VP8 in WebM: a compact video that browsers play in a <video> element, for
// -o NAME.webm (sd-cli writes the same with libwebm's mkvmuxer). Frames are
// encoded by libvpx; the Matroska structure is written here, because
// Debian's libwebm-dev ships only libwebm's parser headers, not mkvmuxer's.
// The parser reads the parameters back.
//
// The file (EBML DocType "webm", version 2 for SimpleBlock):
//     Segment
//       SeekHead  where Info, Tracks, Tags and Cues are
//       Info      TimecodeScale 1 ms, Duration, MuxingApp/WritingApp "kiln"
//       Tracks    one video track: V_VP8, width x height, DefaultDuration
//                 1/fps (ffprobe's r_frame_rate comes from it)
//       Tags      one global Tag: SimpleTag COMMENT = the parameters text
//                 (ffprobe shows it as the format's "COMMENT" tag, as it
//                 shows ffmpeg's own -metadata comment=...)
//       Cluster   from each keyframe (at least every 4 seconds): SimpleBlocks
//       Cues      the time and position of each cluster, for seeking
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::image {

// VP8 codes width and height in 14 bits.
constexpr int kMaxVp8Dimension = 16383;

// The WebM file for `frames` (RGB, all one size, as write_video checks them)
// at `fps` frames a second, with `parameters` as its COMMENT tag (no Tags
// element when empty). Frames are converted to YUV 4:2:0 with BT.601
// limited-range weights (libwebp's converter: WebP lossy is VP8 too) and
// encoded at constant quality, every frame shown (no alternate reference
// frames), so the file holds exactly one block per frame. Errors start with
// `label`: a side over kMaxVp8Dimension, an encoder failure.
Result<std::vector<uint8_t>> encode_webm_vp8(const std::vector<Image>& frames, int fps, const std::string& parameters,
                                             const std::string& label);

// The COMMENT text of the WebM (or Matroska) file at `path`: its first
// global SimpleTag named COMMENT; "" when it has none. The clusters are
// skipped, not read. Errors name the path: unreadable, not a WebM file,
// an element that does not parse.
Result<std::string> read_webm_parameters(const std::string& path);

}  // namespace kiln::image
