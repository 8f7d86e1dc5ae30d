#include "image/video_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <optional>

#include "image/avi_mjpeg.h"
#include "image/image_io.h"
#include "image/png_metadata.h"
#include "image/webm_vp8.h"
#include "image/webp_animation.h"
#include "util/files.h"
#include "util/format.h"
#include "util/output_pattern.h"

namespace kiln::image {

namespace {

enum class Container { Avi, WebM, WebP };

constexpr const char* kAccepted =
    "use .avi (Motion-JPEG), .webm (VP8), .webp (animated WebP), or a name with a frame number field such as "
    "frame_%03d.png for one image a frame";

// The extension, lower-cased, with its dot ("" when the name has none).
std::string extension(const std::string& path) {
    const size_t dot = path.rfind('.'), slash = path.rfind('/');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
    return ascii_lower(path.substr(dot));
}

std::optional<Container> container_for(const std::string& path) {
    const std::string ext = extension(path);
    if (ext == ".avi") return Container::Avi;
    if (ext == ".webm") return Container::WebM;
    if (ext == ".webp") return Container::WebP;
    return std::nullopt;
}

// The frame pattern of a name holding an integer field, read by -o's rules
// (util/output_pattern.h); nullopt for a plain name.
Result<std::optional<OutputPattern>> frame_pattern(const std::string& path, int first_index) {
    auto pattern = OutputPattern::parse(path, first_index, /*video=*/true);
    if (!pattern) return pattern.error().as(ErrorKind::InvalidRequest);
    if (!pattern->has_field()) return std::optional<OutputPattern>();
    return std::optional<OutputPattern>(std::move(pattern).value());
}

Status check_request(const std::string& path, const std::vector<Image>& frames, int fps,
                     const std::string& parameters) {
    if (frames.empty()) return Error::invalid_request(path + ": no frames to write");
    if (fps < 1 || fps > kMaxVideoFps) {
        return Error::invalid_request(path + ": frame rate " + std::to_string(fps) + " is outside 1.." +
                                      std::to_string(kMaxVideoFps) + " frames a second");
    }
    if (parameters.find('\0') != std::string::npos) {
        return Error::invalid_request(path + ": the parameters text holds a NUL byte");
    }
    const Image& first = frames.front();
    for (size_t i = 0; i < frames.size(); ++i) {
        const std::string label = path + ": frame " + std::to_string(i);
        Status valid = validate_image(frames[i], label);
        if (!valid) return Error::invalid_request(valid.error().message);
        if (frames[i].channels != 3) {
            return Error::invalid_request(label + " has " + std::to_string(frames[i].channels) +
                                          " channels; video frames are RGB (3)");
        }
        if (frames[i].width != first.width || frames[i].height != first.height) {
            return Error::invalid_request(label + " is " + std::to_string(frames[i].width) + "x" +
                                          std::to_string(frames[i].height) + ", but frame 0 is " +
                                          std::to_string(first.width) + "x" + std::to_string(first.height) +
                                          "; a video's frames are all one size");
        }
    }
    return Status::Ok();
}

Status write_image_sequence(const std::string& path, const OutputPattern& pattern, const std::vector<Image>& frames,
                            const std::string& parameters) {
    const int count = static_cast<int>(frames.size());
    // Checked once, on the name as given (OutputPattern gives a name of no
    // image format ".png"), before any frame is written.
    if (auto format = format_for_path(path); !format) {
        return Error::invalid_request(path + ": an image sequence is written as images: " + format.error().message);
    }
    ImageWriteOptions options;
    if (!parameters.empty()) options.text[kParametersKeyword] = parameters;
    for (int i = 0; i < count; ++i) {
        Status written = write_image(pattern.path(i, count), frames[static_cast<size_t>(i)], options);
        if (!written) {
            // No partial sequence: the frames already written go too.
            for (int k = 0; k < i; ++k) ::unlink(pattern.path(k, count).c_str());
            return written;
        }
    }
    return Status::Ok();
}

}  // namespace

bool is_video_path(const std::string& path) {
    Result<std::optional<OutputPattern>> pattern = frame_pattern(path, 0);
    return pattern && !pattern->has_value() && container_for(path).has_value();
}

Status write_video(const std::string& path, const std::vector<Image>& frames, int fps, const std::string& parameters,
                   int first_index) {
    if (first_index < 0) {
        return Error::invalid_request(path + ": first frame number " + std::to_string(first_index) + " is negative");
    }
    Result<std::optional<OutputPattern>> pattern = frame_pattern(path, first_index);
    if (!pattern) return pattern.error();
    const std::optional<Container> container = container_for(path);
    if (!pattern->has_value() && !container) {
        const std::string ext = extension(path);
        return Error::invalid_request(path + ": " +
                                      (ext.empty() ? std::string("no extension to choose the video format by")
                                                   : "'" + ext + "' is not a video format kiln writes") +
                                      " (" + kAccepted + ")");
    }
    KILN_TRY(check_request(path, frames, fps, parameters));
    if (pattern->has_value()) return write_image_sequence(path, **pattern, frames, parameters);

    Result<std::vector<uint8_t>> bytes = Error{""};
    try {
        switch (*container) {
            case Container::Avi: bytes = encode_avi_mjpeg(frames, fps, parameters, path); break;
            case Container::WebM: bytes = encode_webm_vp8(frames, fps, parameters, path); break;
            case Container::WebP: bytes = encode_webp_animation(frames, fps, parameters, path); break;
        }
    } catch (const std::bad_alloc&) {
        return Error::out_of_memory(path + ": out of memory encoding the video");
    }
    if (!bytes) return bytes.error();
    return write_file_atomically(path, *bytes);
}

Result<std::string> read_video_parameters(const std::string& path) {
    Result<int> opened = open_regular_file(path);
    if (!opened) return opened.error();
    uint8_t head[12];
    size_t got = 0;
    while (got < sizeof(head)) {
        const ssize_t n = ::read(*opened, head + got, sizeof(head) - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const std::string reason = std::strerror(errno);
            ::close(*opened);
            return Error{path + ": cannot read: " + reason};
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
    }
    ::close(*opened);
    if (got == 0) return Error{path + ": file is empty"};
    if (got == sizeof(head) && std::memcmp(head, "RIFF", 4) == 0) {
        if (std::memcmp(head + 8, "AVI ", 4) == 0) return read_avi_parameters(path);
        if (std::memcmp(head + 8, "WEBP", 4) == 0) return read_webp_parameters(path);
    }
    if (got >= 4 && std::memcmp(head, "\x1A\x45\xDF\xA3", 4) == 0) return read_webm_parameters(path);
    return Error{path + ": not an AVI, WebM or WebP video (unrecognised signature)"};
}

}  // namespace kiln::image
