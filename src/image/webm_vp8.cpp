#include "image/webm_vp8.h"

#include <unistd.h>
#include <vpx/vp8cx.h>
#include <vpx/vpx_encoder.h>
#include <webm/callback.h>
#include <webm/file_reader.h>
#include <webm/status.h>
#include <webm/webm_parser.h>
#include <webp/encode.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "util/files.h"
#include "util/format.h"

namespace kiln::image {

namespace {

// ---- VP8 encoding (libvpx) -------------------------------------------------

// Constant-quality level (0 best .. 63) and the cap on the bitrate, in bits
// a pixel, that the level may use: about sd-cli's quality 90, where smooth
// content comes back within a few levels of 255.
constexpr int kCqLevel = 10;
constexpr double kMaxBitsPerPixel = 1.0;
// libvpx's speed/quality trade-off for the good-quality deadline (0 slowest).
constexpr int kCpuUsed = 4;
// A keyframe, and so a cluster and a seek point, at least this often.
constexpr int kMaxKeyframeSeconds = 4;

struct Packet {
    std::vector<uint8_t> data;
    int64_t pts = 0;  // in frames
    bool key = false;
};

struct VpxEncoder {
    vpx_codec_ctx_t codec{};
    bool ready = false;
    ~VpxEncoder() {
        if (ready) vpx_codec_destroy(&codec);
    }
};

struct VpxImage {
    vpx_image_t* image = nullptr;
    ~VpxImage() {
        if (image) vpx_img_free(image);
    }
};

struct YuvPicture {
    WebPPicture picture;
    bool ready = false;
    ~YuvPicture() {
        if (ready) WebPPictureFree(&picture);
    }
};

Error vpx_failure(const std::string& label, vpx_codec_ctx_t* codec, const char* step) {
    std::string message = label + ": VP8 encoder failed to " + step + ": " + vpx_codec_error(codec);
    if (const char* detail = vpx_codec_error_detail(codec)) message += std::string(" (") + detail + ")";
    return Error{message};
}

// `frame` into `image`'s planes, as BT.601 limited-range YUV 4:2:0.
Status to_i420(const Image& frame, vpx_image_t* image, const std::string& label) {
    YuvPicture yuv;
    if (!WebPPictureInit(&yuv.picture)) return Error{label + ": libwebp version mismatch"};
    yuv.ready = true;
    yuv.picture.use_argb = 0;  // import converts to YUV 4:2:0
    yuv.picture.width = frame.width;
    yuv.picture.height = frame.height;
    if (!WebPPictureImportRGB(&yuv.picture, frame.pixels.data(), static_cast<int>(frame.row_bytes()))) {
        return Error{label + ": out of memory converting a frame to YUV"};
    }
    const int chroma_width = (frame.width + 1) / 2, chroma_height = (frame.height + 1) / 2;
    auto copy = [](const uint8_t* src, int src_stride, uint8_t* dst, int dst_stride, int width, int height) {
        for (int y = 0; y < height; ++y) std::memcpy(dst + size_t(y) * dst_stride, src + size_t(y) * src_stride, width);
    };
    copy(yuv.picture.y, yuv.picture.y_stride, image->planes[VPX_PLANE_Y], image->stride[VPX_PLANE_Y], frame.width,
         frame.height);
    copy(yuv.picture.u, yuv.picture.uv_stride, image->planes[VPX_PLANE_U], image->stride[VPX_PLANE_U], chroma_width,
         chroma_height);
    copy(yuv.picture.v, yuv.picture.uv_stride, image->planes[VPX_PLANE_V], image->stride[VPX_PLANE_V], chroma_width,
         chroma_height);
    return Status::Ok();
}

// Collects the packets the encoder has ready.
void take_packets(vpx_codec_ctx_t* codec, std::vector<Packet>& packets, bool* got_any) {
    vpx_codec_iter_t iter = nullptr;
    while (const vpx_codec_cx_pkt_t* pkt = vpx_codec_get_cx_data(codec, &iter)) {
        if (pkt->kind != VPX_CODEC_CX_FRAME_PKT) continue;
        Packet packet;
        const auto* bytes = static_cast<const uint8_t*>(pkt->data.frame.buf);
        packet.data.assign(bytes, bytes + pkt->data.frame.sz);
        packet.pts = pkt->data.frame.pts;
        packet.key = (pkt->data.frame.flags & VPX_FRAME_IS_KEY) != 0;
        packets.push_back(std::move(packet));
        *got_any = true;
    }
}

Result<std::vector<Packet>> encode_vp8(const std::vector<Image>& frames, int fps, const std::string& label) {
    const int width = frames.front().width, height = frames.front().height;
    vpx_codec_iface_t* iface = vpx_codec_vp8_cx();
    vpx_codec_enc_cfg_t cfg;
    if (vpx_codec_enc_config_default(iface, &cfg, 0) != VPX_CODEC_OK) {
        return Error{label + ": VP8 encoder has no default configuration"};
    }
    cfg.g_w = static_cast<unsigned>(width);
    cfg.g_h = static_cast<unsigned>(height);
    cfg.g_timebase.num = 1;
    cfg.g_timebase.den = fps;
    cfg.g_pass = VPX_RC_ONE_PASS;
    // No look-ahead: alternate reference frames would add hidden packets,
    // and a block per frame is what players and the tests count.
    cfg.g_lag_in_frames = 0;
    cfg.g_threads = 2;
    cfg.rc_end_usage = VPX_CQ;
    const double bits = double(width) * height * fps * kMaxBitsPerPixel;
    cfg.rc_target_bitrate = static_cast<unsigned>(std::clamp(bits / 1000.0, 1000.0, 1e6));
    cfg.rc_min_quantizer = 0;
    cfg.rc_max_quantizer = 63;
    cfg.kf_mode = VPX_KF_AUTO;
    cfg.kf_min_dist = 0;
    cfg.kf_max_dist = static_cast<unsigned>(std::min(kMaxKeyframeSeconds * fps, 9999));

    VpxEncoder encoder;
    if (vpx_codec_enc_init(&encoder.codec, iface, &cfg, 0) != VPX_CODEC_OK) {
        return vpx_failure(label, &encoder.codec, "start");
    }
    encoder.ready = true;
    if (vpx_codec_control(&encoder.codec, VP8E_SET_CQ_LEVEL, kCqLevel) != VPX_CODEC_OK ||
        vpx_codec_control(&encoder.codec, VP8E_SET_CPUUSED, kCpuUsed) != VPX_CODEC_OK) {
        return vpx_failure(label, &encoder.codec, "take its settings");
    }
    VpxImage image;
    image.image =
        vpx_img_alloc(nullptr, VPX_IMG_FMT_I420, static_cast<unsigned>(width), static_cast<unsigned>(height), 16);
    if (!image.image) {
        return Error{label + ": out of memory for a " + std::to_string(width) + "x" + std::to_string(height) +
                     " VP8 frame"};
    }

    std::vector<Packet> packets;
    bool got_any = false;
    for (size_t i = 0; i < frames.size(); ++i) {
        KILN_TRY(to_i420(frames[i], image.image, label));
        if (vpx_codec_encode(&encoder.codec, image.image, static_cast<vpx_codec_pts_t>(i), 1, 0, VPX_DL_GOOD_QUALITY) !=
            VPX_CODEC_OK) {
            return vpx_failure(label, &encoder.codec, ("encode frame " + std::to_string(i)).c_str());
        }
        take_packets(&encoder.codec, packets, &got_any);
    }
    do {  // flush
        got_any = false;
        if (vpx_codec_encode(&encoder.codec, nullptr, -1, 1, 0, VPX_DL_GOOD_QUALITY) != VPX_CODEC_OK) {
            return vpx_failure(label, &encoder.codec, "finish");
        }
        take_packets(&encoder.codec, packets, &got_any);
    } while (got_any);
    if (packets.size() != frames.size() || packets.empty() || !packets.front().key) {
        return Error{label + ": VP8 encoder returned " + std::to_string(packets.size()) + " frames for " +
                     std::to_string(frames.size())};
    }
    return packets;
}

// ---- Matroska / WebM structure (EBML) ------------------------------------

// Element ids, as the Matroska specification numbers them.
enum : uint32_t {
    kEbml = 0x1A45DFA3,
    kEbmlVersion = 0x4286,
    kEbmlReadVersion = 0x42F7,
    kEbmlMaxIdLength = 0x42F2,
    kEbmlMaxSizeLength = 0x42F3,
    kDocType = 0x4282,
    kDocTypeVersion = 0x4287,
    kDocTypeReadVersion = 0x4285,
    kSegment = 0x18538067,
    kSeekHead = 0x114D9B74,
    kSeek = 0x4DBB,
    kSeekId = 0x53AB,
    kSeekPosition = 0x53AC,
    kInfo = 0x1549A966,
    kTimecodeScale = 0x2AD7B1,
    kDuration = 0x4489,
    kMuxingApp = 0x4D80,
    kWritingApp = 0x5741,
    kTracks = 0x1654AE6B,
    kTrackEntry = 0xAE,
    kTrackNumber = 0xD7,
    kTrackUid = 0x73C5,
    kTrackType = 0x83,
    kFlagLacing = 0x9C,
    kDefaultDuration = 0x23E383,
    kCodecId = 0x86,
    kVideo = 0xE0,
    kPixelWidth = 0xB0,
    kPixelHeight = 0xBA,
    kTags = 0x1254C367,
    kTag = 0x7373,
    kTargets = 0x63C0,
    kTargetTypeValue = 0x68CA,
    kSimpleTag = 0x67C8,
    kTagName = 0x45A3,
    kTagString = 0x4487,
    kCluster = 0x1F43B675,
    kTimecode = 0xE7,
    kSimpleBlock = 0xA3,
    kCues = 0x1C53BB6B,
    kCuePoint = 0xBB,
    kCueTime = 0xB3,
    kCueTrackPositions = 0xB7,
    kCueTrack = 0xF7,
    kCueClusterPosition = 0xF1,
};

constexpr uint64_t kTimecodeScaleNs = 1000000;  // block times in milliseconds
constexpr uint64_t kTrackNumberValue = 1;
// Fixed, so that the same frames give the same file byte for byte.
constexpr uint64_t kTrackUidValue = 1;
// A block's time is a signed 16-bit offset from its cluster's.
constexpr int64_t kMaxClusterSpanMs = 30000;

void put_id(std::vector<uint8_t>& out, uint32_t id) {
    const int bytes = id >= 0x1000000 ? 4 : id >= 0x10000 ? 3 : id >= 0x100 ? 2 : 1;
    for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<uint8_t>(id >> (8 * i)));
}

// An element size as an EBML variable-length integer of `length` bytes
// (0: the shortest that holds it; all ones is reserved for "unknown").
void put_size(std::vector<uint8_t>& out, uint64_t size, int length = 0) {
    if (length == 0) {
        length = 1;
        while (length < 8 && size >= (uint64_t(1) << (7 * length)) - 1) ++length;
    }
    const uint64_t marked = size | (uint64_t(1) << (7 * length));
    for (int i = length - 1; i >= 0; --i) out.push_back(static_cast<uint8_t>(marked >> (8 * i)));
}

void put_uint(std::vector<uint8_t>& out, uint32_t id, uint64_t value, int length = 0) {
    if (length == 0) {
        length = 1;
        while (length < 8 && (value >> (8 * length)) != 0) ++length;
    }
    put_id(out, id);
    put_size(out, static_cast<uint64_t>(length));
    for (int i = length - 1; i >= 0; --i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void put_float(std::vector<uint8_t>& out, uint32_t id, double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    put_id(out, id);
    put_size(out, 8);
    for (int i = 7; i >= 0; --i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
}

void put_bytes(std::vector<uint8_t>& out, uint32_t id, const void* data, size_t size) {
    put_id(out, id);
    put_size(out, size);
    const auto* bytes = static_cast<const uint8_t*>(data);
    out.insert(out.end(), bytes, bytes + size);
}

void put_string(std::vector<uint8_t>& out, uint32_t id, const std::string& text) {
    put_bytes(out, id, text.data(), text.size());
}

void put_master(std::vector<uint8_t>& out, uint32_t id, const std::vector<uint8_t>& body) {
    put_bytes(out, id, body.data(), body.size());
}

std::vector<uint8_t> ebml_header() {
    std::vector<uint8_t> body;
    put_uint(body, kEbmlVersion, 1);
    put_uint(body, kEbmlReadVersion, 1);
    put_uint(body, kEbmlMaxIdLength, 4);
    put_uint(body, kEbmlMaxSizeLength, 8);
    put_string(body, kDocType, "webm");
    put_uint(body, kDocTypeVersion, 2);  // SimpleBlock is a version 2 element
    put_uint(body, kDocTypeReadVersion, 2);
    std::vector<uint8_t> out;
    put_master(out, kEbml, body);
    return out;
}

// Where the top-level elements start, from the Segment's body; 8-byte
// positions so that the SeekHead's size does not depend on them.
std::vector<uint8_t> seek_head(const std::vector<std::pair<uint32_t, uint64_t>>& entries) {
    std::vector<uint8_t> body;
    for (const auto& [id, position] : entries) {
        std::vector<uint8_t> seek, id_bytes;
        put_id(id_bytes, id);
        put_bytes(seek, kSeekId, id_bytes.data(), id_bytes.size());
        put_uint(seek, kSeekPosition, position, 8);
        put_master(body, kSeek, seek);
    }
    std::vector<uint8_t> out;
    put_master(out, kSeekHead, body);
    return out;
}

std::vector<uint8_t> info(size_t frames, int fps) {
    std::vector<uint8_t> body;
    put_uint(body, kTimecodeScale, kTimecodeScaleNs);
    put_float(body, kDuration, double(frames) * 1000.0 / fps);  // in TimecodeScale units
    const std::string app = std::string("kiln ") + KILN_VERSION;
    put_string(body, kMuxingApp, app);
    put_string(body, kWritingApp, app);
    std::vector<uint8_t> out;
    put_master(out, kInfo, body);
    return out;
}

std::vector<uint8_t> tracks(int width, int height, int fps) {
    std::vector<uint8_t> video;
    put_uint(video, kPixelWidth, static_cast<uint64_t>(width));
    put_uint(video, kPixelHeight, static_cast<uint64_t>(height));
    std::vector<uint8_t> entry;
    put_uint(entry, kTrackNumber, kTrackNumberValue);
    put_uint(entry, kTrackUid, kTrackUidValue);
    put_uint(entry, kTrackType, 1);  // video
    put_uint(entry, kFlagLacing, 0);
    put_uint(entry, kDefaultDuration, static_cast<uint64_t>(std::llround(1e9 / fps)));  // nanoseconds
    put_string(entry, kCodecId, "V_VP8");
    put_master(entry, kVideo, video);
    std::vector<uint8_t> body;
    put_master(body, kTrackEntry, entry);
    std::vector<uint8_t> out;
    put_master(out, kTracks, body);
    return out;
}

std::vector<uint8_t> tags(const std::string& comment) {
    std::vector<uint8_t> targets;
    put_uint(targets, kTargetTypeValue, 50);  // the whole file ("MOVIE")
    std::vector<uint8_t> simple_tag;
    put_string(simple_tag, kTagName, "COMMENT");
    put_string(simple_tag, kTagString, comment);
    std::vector<uint8_t> tag;
    put_master(tag, kTargets, targets);
    put_master(tag, kSimpleTag, simple_tag);
    std::vector<uint8_t> body;
    put_master(body, kTag, tag);
    std::vector<uint8_t> out;
    put_master(out, kTags, body);
    return out;
}

int64_t frame_time_ms(int64_t frame, int fps) { return std::llround(static_cast<double>(frame) * 1000.0 / fps); }

struct ClusterStart {
    int64_t time_ms;
    uint64_t position;  // from the Segment's body
};

// The clusters, appended to `out`; `segment_body` is where the Segment's
// body starts in `out`.
std::vector<ClusterStart> put_clusters(std::vector<uint8_t>& out, size_t segment_body,
                                       const std::vector<Packet>& packets, int fps) {
    std::vector<ClusterStart> starts;
    std::vector<uint8_t> body;
    auto flush = [&]() {
        if (!starts.empty()) put_master(out, kCluster, body);
        body.clear();
    };
    for (const Packet& packet : packets) {
        const int64_t time = frame_time_ms(packet.pts, fps);
        if (starts.empty() || packet.key || time - starts.back().time_ms > kMaxClusterSpanMs) {
            flush();
            starts.push_back({time, out.size() - segment_body});
            put_uint(body, kTimecode, static_cast<uint64_t>(time));
        }
        const int16_t relative = static_cast<int16_t>(time - starts.back().time_ms);
        put_id(body, kSimpleBlock);
        put_size(body, 4 + packet.data.size());
        put_size(body, kTrackNumberValue);  // the track number is a vint too
        body.push_back(static_cast<uint8_t>(static_cast<uint16_t>(relative) >> 8));
        body.push_back(static_cast<uint8_t>(relative));
        body.push_back(packet.key ? 0x80 : 0x00);
        body.insert(body.end(), packet.data.begin(), packet.data.end());
    }
    flush();
    return starts;
}

std::vector<uint8_t> cues(const std::vector<ClusterStart>& clusters) {
    std::vector<uint8_t> body;
    for (const ClusterStart& cluster : clusters) {
        std::vector<uint8_t> positions;
        put_uint(positions, kCueTrack, kTrackNumberValue);
        put_uint(positions, kCueClusterPosition, cluster.position);
        std::vector<uint8_t> point;
        put_uint(point, kCueTime, static_cast<uint64_t>(cluster.time_ms));
        put_master(point, kCueTrackPositions, positions);
        put_master(body, kCuePoint, point);
    }
    std::vector<uint8_t> out;
    put_master(out, kCues, body);
    return out;
}

// ---- Reading the COMMENT tag back (libwebm's parser) ----------------------

class CommentReader : public webm::Callback {
  public:
    std::optional<std::string> doc_type;
    std::optional<std::string> comment;

    webm::Status OnEbml(const webm::ElementMetadata&, const webm::Ebml& ebml) override {
        doc_type = ebml.doc_type.value();
        return webm::Status(webm::Status::kOkCompleted);
    }
    // The frames are not needed: each cluster is skipped whole.
    webm::Status OnClusterBegin(const webm::ElementMetadata&, const webm::Cluster&, webm::Action* action) override {
        *action = webm::Action::kSkip;
        return webm::Status(webm::Status::kOkCompleted);
    }
    webm::Status OnTag(const webm::ElementMetadata&, const webm::Tag& tag) override {
        // A tag about a track, edition, chapter or attachment is not the file's.
        const webm::Targets& targets = tag.targets.value();
        if (comment || !targets.track_uids.empty() || targets.type_value.value() != 50) {
            return webm::Status(webm::Status::kOkCompleted);
        }
        for (const auto& simple : tag.tags) {
            if (ascii_lower(simple.value().name.value()) == "comment" && simple.value().string.is_present()) {
                comment = simple.value().string.value();
                break;
            }
        }
        return webm::Status(webm::Status::kOkCompleted);
    }
};

}  // namespace

Result<std::vector<uint8_t>> encode_webm_vp8(const std::vector<Image>& frames, int fps, const std::string& parameters,
                                             const std::string& label) {
    const int width = frames.front().width, height = frames.front().height;
    if (width > kMaxVp8Dimension || height > kMaxVp8Dimension) {
        return Error::invalid_request(label + ": frames of " + std::to_string(width) + "x" + std::to_string(height) +
                                      " are larger than VP8 allows (" + std::to_string(kMaxVp8Dimension) +
                                      " on a side); write .avi instead");
    }
    Result<std::vector<Packet>> packets = encode_vp8(frames, fps, label);
    if (!packets) return packets.error();

    std::vector<uint8_t> out = ebml_header();
    put_id(out, kSegment);
    const size_t segment_size_at = out.size();
    put_size(out, 0, 8);  // filled in at the end
    const size_t segment_body = out.size();
    const bool tagged = !parameters.empty();
    // A SeekHead of the same size as the final one, overwritten at the end.
    const std::vector<uint8_t> placeholder =
        seek_head(std::vector<std::pair<uint32_t, uint64_t>>(tagged ? 4 : 3, {kInfo, 0}));
    out.insert(out.end(), placeholder.begin(), placeholder.end());
    std::vector<std::pair<uint32_t, uint64_t>> positions;
    auto put_top = [&](uint32_t id, const std::vector<uint8_t>& element) {
        positions.emplace_back(id, out.size() - segment_body);
        out.insert(out.end(), element.begin(), element.end());
    };
    put_top(kInfo, info(frames.size(), fps));
    put_top(kTracks, tracks(width, height, fps));
    if (tagged) put_top(kTags, tags(parameters));
    const std::vector<ClusterStart> clusters = put_clusters(out, segment_body, *packets, fps);
    put_top(kCues, cues(clusters));

    const std::vector<uint8_t> head = seek_head(positions);
    std::copy(head.begin(), head.end(), out.begin() + static_cast<std::ptrdiff_t>(segment_body));
    std::vector<uint8_t> size;
    put_size(size, out.size() - segment_body, 8);
    std::copy(size.begin(), size.end(), out.begin() + static_cast<std::ptrdiff_t>(segment_size_at));
    return out;
}

Result<std::string> read_webm_parameters(const std::string& path) {
    Result<int> opened = open_regular_file(path);
    if (!opened) return opened.error();
    FILE* file = ::fdopen(*opened, "rb");
    if (!file) {
        const std::string reason = std::strerror(errno);
        ::close(*opened);
        return Error{path + ": cannot read: " + reason};
    }
    webm::FileReader reader(file);  // closes the file
    CommentReader callback;
    webm::WebmParser parser;
    const webm::Status status = parser.Feed(&callback, &reader);
    if (!callback.doc_type) return Error{path + ": not a WebM file (no EBML header)"};
    if (*callback.doc_type != "webm" && *callback.doc_type != "matroska") {
        return Error{path + ": not a WebM file (EBML document type '" + *callback.doc_type + "')"};
    }
    if (!status.completed_ok()) {
        return Error{path + ": corrupt WebM file (libwebm's parser stopped with status " +
                     std::to_string(static_cast<int>(status.code)) + ")"};
    }
    return callback.comment.value_or(std::string());
}

}  // namespace kiln::image
