#include "image/webp_animation.h"

#include <webp/demux.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <cmath>

#include "image/image_io.h"
#include "image/png_metadata.h"

namespace kiln::image {

namespace {

// sd-cli's quality and libwebp's default effort.
constexpr float kQuality = 90.0f;
constexpr int kMethod = 4;

struct AnimEncoderGuard {
    WebPAnimEncoder* encoder = nullptr;
    WebPData assembled;
    AnimEncoderGuard() { WebPDataInit(&assembled); }
    ~AnimEncoderGuard() {
        WebPDataClear(&assembled);
        if (encoder) WebPAnimEncoderDelete(encoder);
    }
};

struct PictureGuard {
    WebPPicture picture;
    bool ready = false;
    ~PictureGuard() {
        if (ready) WebPPictureFree(&picture);
    }
};

struct MuxGuard {
    WebPMux* mux = nullptr;
    WebPData assembled;
    MuxGuard() { WebPDataInit(&assembled); }
    ~MuxGuard() {
        WebPDataClear(&assembled);
        if (mux) WebPMuxDelete(mux);
    }
};

struct DemuxGuard {
    WebPDemuxer* demux = nullptr;
    WebPChunkIterator chunk{};
    bool chunk_ready = false;
    ~DemuxGuard() {
        if (chunk_ready) WebPDemuxReleaseChunkIterator(&chunk);
        if (demux) WebPDemuxDelete(demux);
    }
};

// When frame `frame` starts, in milliseconds: rounded from the exact time,
// not summed from rounded durations, so that the total does not drift.
int frame_time_ms(size_t frame, int fps) { return static_cast<int>(std::lround(double(frame) * 1000.0 / fps)); }

}  // namespace

Result<std::vector<uint8_t>> encode_webp_animation(const std::vector<Image>& frames, int fps,
                                                   const std::string& parameters, const std::string& label) {
    const int width = frames.front().width, height = frames.front().height;
    if (width > WEBP_MAX_DIMENSION || height > WEBP_MAX_DIMENSION) {
        return Error::invalid_request(label + ": frames of " + std::to_string(width) + "x" + std::to_string(height) +
                                      " are larger than WebP allows (" + std::to_string(WEBP_MAX_DIMENSION) +
                                      " on a side); write .avi instead");
    }
    WebPAnimEncoderOptions options;
    WebPConfig config;
    if (!WebPAnimEncoderOptionsInit(&options) || !WebPConfigInit(&config)) {
        return Error{label + ": libwebp version mismatch"};
    }
    options.anim_params.loop_count = 0;  // forever
    config.quality = kQuality;
    config.method = kMethod;
    if (!WebPValidateConfig(&config)) return Error{label + ": invalid WebP settings"};

    AnimEncoderGuard anim;
    anim.encoder = WebPAnimEncoderNew(width, height, &options);
    if (!anim.encoder) return Error{label + ": out of memory starting the WebP animation encoder"};
    for (size_t i = 0; i < frames.size(); ++i) {
        PictureGuard g;
        if (!WebPPictureInit(&g.picture)) return Error{label + ": libwebp version mismatch"};
        g.ready = true;
        g.picture.use_argb = 1;  // WebPAnimEncoder compares frames in ARGB
        g.picture.width = width;
        g.picture.height = height;
        if (!WebPPictureImportRGB(&g.picture, frames[i].pixels.data(), static_cast<int>(frames[i].row_bytes()))) {
            return Error{label + ": out of memory importing frame " + std::to_string(i)};
        }
        if (!WebPAnimEncoderAdd(anim.encoder, &g.picture, frame_time_ms(i, fps), &config)) {
            return Error{label + ": WebP animation encoder failed on frame " + std::to_string(i) + ": " +
                         WebPAnimEncoderGetError(anim.encoder)};
        }
    }
    // The end time gives the last frame its duration.
    if (!WebPAnimEncoderAdd(anim.encoder, nullptr, frame_time_ms(frames.size(), fps), nullptr) ||
        !WebPAnimEncoderAssemble(anim.encoder, &anim.assembled)) {
        return Error{label + ": WebP animation encoder failed: " + WebPAnimEncoderGetError(anim.encoder)};
    }
    if (parameters.empty()) {
        return std::vector<uint8_t>(anim.assembled.bytes, anim.assembled.bytes + anim.assembled.size);
    }

    const std::vector<uint8_t> exif = make_exif_user_comment(parameters);
    MuxGuard m;
    m.mux = WebPMuxCreate(&anim.assembled, 0);  // 0: refers to `anim`, which outlives it
    WebPData exif_data{exif.data(), exif.size()};
    if (!m.mux || WebPMuxSetChunk(m.mux, "EXIF", &exif_data, 1) != WEBP_MUX_OK ||
        WebPMuxAssemble(m.mux, &m.assembled) != WEBP_MUX_OK) {
        return Error{label + ": adding EXIF metadata to the WebP file failed"};
    }
    return std::vector<uint8_t>(m.assembled.bytes, m.assembled.bytes + m.assembled.size);
}

Result<std::string> read_webp_parameters(const std::string& path) {
    Result<std::vector<uint8_t>> bytes = read_file_bytes(path);
    if (!bytes) return bytes.error();
    WebPData data{bytes->data(), bytes->size()};
    DemuxGuard g;
    g.demux = WebPDemux(&data);
    if (!g.demux) return Error{path + ": not a WebP file, or one whose chunks libwebp cannot parse"};
    if (!WebPDemuxGetChunk(g.demux, "EXIF", 1, &g.chunk)) return std::string();
    g.chunk_ready = true;
    std::optional<std::string> text = parse_exif_user_comment(g.chunk.chunk.bytes, g.chunk.chunk.size);
    return text.value_or(std::string());
}

}  // namespace kiln::image
