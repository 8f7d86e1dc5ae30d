#include "image/video_file.h"

#include <gtest/gtest.h>
#include <webp/demux.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/avi_mjpeg.h"
#include "image/image_io.h"
#include "image/png_metadata.h"
#include "pixel_difference.h"
#include "test_files.h"

// The videos are decoded by ffmpeg, an independent reader (scripts/setup.sh
// installs it); animated WebP by libwebp's own demuxer, because ffmpeg
// before version 7 decodes no animated WebP.

namespace kiln::image {
namespace {

namespace fs = std::filesystem;
using test::pixel_difference;
using test::run_command;
using test::TempDir;

const std::string kParameters =
    "a red fox in the snow, café lights\n"
    "Negative prompt: blurry\n"
    "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 64x48, Model: tiny, Version: kiln";

// Frame i of a smooth moving picture: gradients that shift with i, so
// lossy codecs keep it well and neighbouring frames still differ.
Image frame(int i, int w, int h) {
    Image im = make_image(w, h, 3);
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            uint8_t* p = im.pixel(x, y);
            p[0] = static_cast<uint8_t>(x * 180 / (w - 1) + 6 * i);
            p[1] = static_cast<uint8_t>(y * 180 / (h - 1) + 4 * i);
            p[2] = static_cast<uint8_t>(40 + 12 * i);
        }
    }
    return im;
}

std::vector<Image> frames(int count, int w, int h) {
    std::vector<Image> out;
    for (int i = 0; i < count; ++i) out.push_back(frame(i, w, h));
    return out;
}

std::vector<std::string> folder_entries(const std::string& folder) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// ffmpeg and ffprobe, or a failure saying how to get them: these tests
// never pass by skipping their checks.
void require_ffmpeg() {
    for (const char* tool : {"ffmpeg", "ffprobe"}) {
        const test::CommandResult r = run_command(std::string(tool) + " -version");
        ASSERT_EQ(r.exit_code, 0) << tool
                                  << " is not installed or does not run; the video tests decode kiln's files with "
                                     "it: run scripts/setup.sh (it installs Debian's ffmpeg package)";
    }
}

struct Probe {
    std::string codec;
    int width = 0, height = 0;
    std::string frame_rate;  // r_frame_rate, "16/1"
    int frames = 0;          // decoded (-count_frames)
    std::string comment;     // the format's comment tag, any case
};

void probe(const std::string& path, Probe* out) {
    const test::CommandResult r = run_command(
        "ffprobe -v error -count_frames -select_streams v:0 -show_entries "
        "stream=codec_name,width,height,r_frame_rate,nb_read_frames:format_tags -of json '" +
        path + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["streams"].size(), 1u) << r.out;
    const nlohmann::json& s = j["streams"][0];
    out->codec = s.value("codec_name", "");
    out->width = s.value("width", 0);
    out->height = s.value("height", 0);
    out->frame_rate = s.value("r_frame_rate", "");
    out->frames = std::stoi(s.value("nb_read_frames", "0"));
    if (j.contains("format") && j["format"].contains("tags")) {
        for (const auto& [key, value] : j["format"]["tags"].items()) {
            std::string lower = key;
            for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            if (lower == "comment") out->comment = value.get<std::string>();
        }
    }
}

// Every frame ffmpeg decodes, as RGB, in order.
void decode_with_ffmpeg(const std::string& path, int w, int h, std::vector<Image>* out) {
    TempDir dir;
    const std::string raw = dir.file("frames.rgb");
    const test::CommandResult r =
        run_command("ffmpeg -v error -i '" + path + "' -vsync passthrough -f rawvideo -pix_fmt rgb24 -y '" + raw + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<uint8_t> bytes = test::read_bytes(raw);
    const size_t frame_bytes = size_t(w) * h * 3;
    ASSERT_EQ(bytes.size() % frame_bytes, 0u);
    for (size_t at = 0; at < bytes.size(); at += frame_bytes) {
        Image im = make_image(w, h, 3);
        std::copy(bytes.begin() + at, bytes.begin() + at + frame_bytes, im.pixels.begin());
        out->push_back(std::move(im));
    }
}

// Each decoded frame is within `max_mean` levels of its original, and
// closer to it than to its neighbours (the frames come back in order).
void expect_frames_close(const std::vector<Image>& decoded, const std::vector<Image>& original, double max_mean) {
    ASSERT_EQ(decoded.size(), original.size());
    for (size_t i = 0; i < decoded.size(); ++i) {
        const double own = pixel_difference(decoded[i], original[i]).mean;
        EXPECT_LT(own, max_mean) << "frame " << i;
        if (i > 0) EXPECT_LT(own, pixel_difference(decoded[i], original[i - 1]).mean) << "frame " << i;
        if (i + 1 < decoded.size()) {
            EXPECT_LT(own, pixel_difference(decoded[i], original[i + 1]).mean) << "frame " << i;
        }
    }
}

void expect_invalid(const Status& s, const std::string& path, const std::string& fragment) {
    ASSERT_FALSE(s.ok()) << "expected an error containing: " << fragment;
    EXPECT_EQ(s.error().kind, ErrorKind::InvalidRequest) << s.error().message;
    EXPECT_EQ(s.error().message.rfind(path + ": ", 0), 0u) << s.error().message;
    EXPECT_NE(s.error().message.find(fragment), std::string::npos) << s.error().message;
}

// ---- AVI ------------------------------------------------------------------

TEST(VideoFile, AviIsMotionJpegThatFfmpegDecodes) {
    ASSERT_NO_FATAL_FAILURE(require_ffmpeg());
    TempDir dir;
    const std::string path = dir.file("clip.avi");
    const std::vector<Image> original = frames(12, 64, 48);
    ASSERT_TRUE(write_video(path, original, 16, kParameters).ok());
    EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"clip.avi"});  // no .part left

    Probe p;
    ASSERT_NO_FATAL_FAILURE(probe(path, &p));
    EXPECT_EQ(p.codec, "mjpeg");
    EXPECT_EQ(p.width, 64);
    EXPECT_EQ(p.height, 48);
    EXPECT_EQ(p.frame_rate, "16/1");
    EXPECT_EQ(p.frames, 12);
    EXPECT_EQ(p.comment, kParameters);

    std::vector<Image> decoded;
    ASSERT_NO_FATAL_FAILURE(decode_with_ffmpeg(path, 64, 48, &decoded));
    expect_frames_close(decoded, original, 6.0);

    Result<std::string> text = read_video_parameters(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, kParameters);
}

TEST(VideoFile, AviPastItsSizeLimitIsRefusedBeforeItGrowsFurther) {
    const std::vector<Image> original = frames(20, 64, 48);
    Result<std::vector<uint8_t>> small = encode_avi_mjpeg(original, 16, "", "clip.avi");
    ASSERT_TRUE(small.ok()) << small.error().message;
    // The same frames under a limit they exceed: refused, with what to do.
    Result<std::vector<uint8_t>> capped = encode_avi_mjpeg(original, 16, "", "clip.avi", small->size() - 1);
    ASSERT_FALSE(capped.ok());
    EXPECT_EQ(capped.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(capped.error().message.find("AVI"), std::string::npos) << capped.error().message;
    EXPECT_NE(capped.error().message.find(".webm"), std::string::npos) << capped.error().message;
    // Exactly at the limit is fine, and the real limit is AVI 1.0's 1 GiB.
    EXPECT_TRUE(encode_avi_mjpeg(original, 16, "", "clip.avi", small->size()).ok());
    EXPECT_EQ(kMaxAviBytes, uint64_t(1) << 30);
}

// ---- WebM -----------------------------------------------------------------

TEST(VideoFile, WebmIsVp8ThatFfmpegDecodes) {
    ASSERT_NO_FATAL_FAILURE(require_ffmpeg());
    TempDir dir;
    const std::string path = dir.file("clip.webm");
    const std::vector<Image> original = frames(12, 64, 48);
    ASSERT_TRUE(write_video(path, original, 16, kParameters).ok());
    EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"clip.webm"});

    Probe p;
    ASSERT_NO_FATAL_FAILURE(probe(path, &p));
    EXPECT_EQ(p.codec, "vp8");
    EXPECT_EQ(p.width, 64);
    EXPECT_EQ(p.height, 48);
    EXPECT_EQ(p.frame_rate, "16/1");
    EXPECT_EQ(p.frames, 12);
    EXPECT_EQ(p.comment, kParameters);

    std::vector<Image> decoded;
    ASSERT_NO_FATAL_FAILURE(decode_with_ffmpeg(path, 64, 48, &decoded));
    expect_frames_close(decoded, original, 6.0);

    Result<std::string> text = read_video_parameters(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, kParameters);
}

TEST(VideoFile, WebmTakesOddSizesAndOtherFrameRates) {
    ASSERT_NO_FATAL_FAILURE(require_ffmpeg());
    TempDir dir;
    const std::string path = dir.file("odd.webm");
    // Enough frames at 24 fps for a second keyframe (one every 4 seconds at
    // least), so the file has several clusters; frame i % 12 keeps the
    // picture's values in range.
    std::vector<Image> original;
    for (int i = 0; i < 100; ++i) original.push_back(frame(i % 12, 33, 17));
    ASSERT_TRUE(write_video(path, original, 24, "").ok());

    Probe p;
    ASSERT_NO_FATAL_FAILURE(probe(path, &p));
    EXPECT_EQ(p.width, 33);
    EXPECT_EQ(p.height, 17);
    EXPECT_EQ(p.frame_rate, "24/1");
    EXPECT_EQ(p.frames, 100);
    EXPECT_EQ(p.comment, "");
    std::vector<Image> decoded;
    ASSERT_NO_FATAL_FAILURE(decode_with_ffmpeg(path, 33, 17, &decoded));
    ASSERT_EQ(decoded.size(), 100u);
    for (size_t i = 0; i < decoded.size(); ++i) {
        EXPECT_LT(pixel_difference(decoded[i], original[i]).mean, 6.0) << "frame " << i;
    }

    Result<std::string> text = read_video_parameters(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, "");
}

// ---- animated WebP --------------------------------------------------------

struct WebPAnimation {
    int width = 0, height = 0, loop_count = -1;
    std::vector<Image> frames;
    std::vector<int> end_ms;  // when each frame ends
};

void decode_webp_animation(const std::string& path, WebPAnimation* out) {
    const std::vector<uint8_t> bytes = test::read_bytes(path);
    WebPData data{bytes.data(), bytes.size()};
    WebPAnimDecoderOptions options;
    ASSERT_TRUE(WebPAnimDecoderOptionsInit(&options));
    options.color_mode = MODE_RGBA;
    WebPAnimDecoder* decoder = WebPAnimDecoderNew(&data, &options);
    ASSERT_NE(decoder, nullptr) << path << " is not an animated WebP libwebp decodes";
    WebPAnimInfo info;
    ASSERT_TRUE(WebPAnimDecoderGetInfo(decoder, &info));
    out->width = static_cast<int>(info.canvas_width);
    out->height = static_cast<int>(info.canvas_height);
    out->loop_count = static_cast<int>(info.loop_count);
    while (WebPAnimDecoderHasMoreFrames(decoder)) {
        uint8_t* rgba = nullptr;
        int timestamp = 0;
        ASSERT_TRUE(WebPAnimDecoderGetNext(decoder, &rgba, &timestamp));
        Image im = make_image(out->width, out->height, 3);
        for (size_t k = 0; k < size_t(out->width) * out->height; ++k) {
            std::copy(rgba + 4 * k, rgba + 4 * k + 3, im.pixels.begin() + 3 * k);
        }
        out->frames.push_back(std::move(im));
        out->end_ms.push_back(timestamp);
    }
    WebPAnimDecoderDelete(decoder);
}

TEST(VideoFile, WebpIsAnAnimationLibwebpDecodes) {
    TempDir dir;
    const std::string path = dir.file("clip.webp");
    const std::vector<Image> original = frames(12, 64, 48);
    ASSERT_TRUE(write_video(path, original, 16, kParameters).ok());
    EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"clip.webp"});

    WebPAnimation anim;
    ASSERT_NO_FATAL_FAILURE(decode_webp_animation(path, &anim));
    EXPECT_EQ(anim.width, 64);
    EXPECT_EQ(anim.height, 48);
    EXPECT_EQ(anim.loop_count, 0);  // forever
    ASSERT_EQ(anim.frames.size(), 12u);
    for (size_t i = 0; i < anim.end_ms.size(); ++i) {
        // 1/16 s a frame, rounded to WebP's milliseconds without drifting.
        EXPECT_EQ(anim.end_ms[i], static_cast<int>(std::lround((i + 1) * 1000.0 / 16))) << "frame " << i;
    }
    expect_frames_close(anim.frames, original, 3.0);

    Result<std::string> text = read_video_parameters(path);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, kParameters);
    // Where a still WebP keeps them, so kiln's image reader finds them too.
    Result<std::map<std::string, std::string>> image_text = read_image_text(path);
    ASSERT_TRUE(image_text.ok()) << image_text.error().message;
    EXPECT_EQ((*image_text)[kParametersKeyword], kParameters);
}

// ---- dispatch ---------------------------------------------------------------

TEST(VideoFile, ExtensionChoosesTheFormatInAnyCase) {
    ASSERT_NO_FATAL_FAILURE(require_ffmpeg());
    TempDir dir;
    const std::vector<Image> original = frames(3, 32, 32);
    ASSERT_TRUE(write_video(dir.file("A.AVI"), original, 16, "").ok());
    ASSERT_TRUE(write_video(dir.file("b.WebM"), original, 16, "").ok());
    ASSERT_TRUE(write_video(dir.file("c.WEBP"), original, 16, "").ok());
    Probe avi, webm;
    ASSERT_NO_FATAL_FAILURE(probe(dir.file("A.AVI"), &avi));
    ASSERT_NO_FATAL_FAILURE(probe(dir.file("b.WebM"), &webm));
    EXPECT_EQ(avi.codec, "mjpeg");
    EXPECT_EQ(webm.codec, "vp8");
    WebPAnimation anim;
    ASSERT_NO_FATAL_FAILURE(decode_webp_animation(dir.file("c.WEBP"), &anim));
    EXPECT_EQ(anim.frames.size(), 3u);
    // Without parameters, each reads back as "".
    for (const char* name : {"A.AVI", "b.WebM", "c.WEBP"}) {
        Result<std::string> text = read_video_parameters(dir.file(name));
        ASSERT_TRUE(text.ok()) << text.error().message;
        EXPECT_EQ(*text, "") << name;
    }
}

TEST(VideoFile, IsVideoPathByExtensionWithoutAFrameField) {
    EXPECT_TRUE(is_video_path("out.avi"));
    EXPECT_TRUE(is_video_path("dir.v2/OUT.WEBM"));
    EXPECT_TRUE(is_video_path("a.webp"));
    EXPECT_FALSE(is_video_path("100%.avi"));  // a '%' that starts no field is refused, as -o refuses it
    EXPECT_FALSE(is_video_path("frame_%03d.png"));
    EXPECT_FALSE(is_video_path("frame_%03d.avi"));  // an image sequence, not one file
    EXPECT_FALSE(is_video_path("out.png"));
    EXPECT_FALSE(is_video_path("out.mp4"));
    EXPECT_FALSE(is_video_path("avi"));
    EXPECT_FALSE(is_video_path("clips.avi/out"));
}

// ---- image sequences --------------------------------------------------------

TEST(VideoFile, FramePatternWritesOneImageAFrameNumberedFromZero) {
    TempDir dir;
    const std::vector<Image> original = frames(5, 40, 30);
    ASSERT_TRUE(write_video(dir.file("frame_%03d.png"), original, 16, kParameters).ok());
    EXPECT_EQ(folder_entries(dir.path()), (std::vector<std::string>{"frame_000.png", "frame_001.png", "frame_002.png",
                                                                    "frame_003.png", "frame_004.png"}));
    for (int i = 0; i < 5; ++i) {
        const std::string name = dir.file("frame_00" + std::to_string(i) + ".png");
        Result<Image> back = read_image(name);
        ASSERT_TRUE(back.ok()) << back.error().message;
        EXPECT_EQ(back->pixels, original[i].pixels) << name;  // PNG: exact
        Result<std::map<std::string, std::string>> text = read_image_text(name);
        ASSERT_TRUE(text.ok()) << text.error().message;
        EXPECT_EQ((*text)[kParametersKeyword], kParameters);
    }
}

TEST(VideoFile, FramePatternTakesAFirstIndexWidthsAndImageFormats) {
    TempDir dir;
    const std::vector<Image> original = frames(3, 16, 16);
    ASSERT_TRUE(write_video(dir.file("a_%d.jpg"), original, 16, "", 9).ok());  // --output-begin-idx 9
    ASSERT_TRUE(write_video(dir.file("b%%_%2i.webp"), original, 16, "").ok());
    EXPECT_EQ(folder_entries(dir.path()),
              (std::vector<std::string>{"a_10.jpg", "a_11.jpg", "a_9.jpg", "b%_ 0.webp", "b%_ 1.webp", "b%_ 2.webp"}));
    Result<Image> jpeg = read_image(dir.file("a_9.jpg"));
    ASSERT_TRUE(jpeg.ok()) << jpeg.error().message;
    EXPECT_LT(pixel_difference(*jpeg, original[0]).mean, 6.0);
}

TEST(VideoFile, FailedFrameRemovesTheFramesWrittenBeforeIt) {
    TempDir dir;
    // Frame 2's name is taken by a folder, so its rename fails.
    fs::create_directory(dir.file("f_2.png"));
    const Status s = write_video(dir.file("f_%d.png"), frames(4, 16, 16), 16, "");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("f_2.png"), std::string::npos) << s.error().message;
    EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"f_2.png"});
}

// ---- bad input: an error naming the path, and no file -------------------------

TEST(VideoFile, BadInputIsRefusedAndWritesNothing) {
    TempDir dir;
    const std::vector<Image> good = frames(3, 32, 24);
    for (const char* name : {"v.avi", "v.webm", "v.webp", "v_%02d.png"}) {
        SCOPED_TRACE(name);
        const std::string path = dir.file(name);
        expect_invalid(write_video(path, {}, 16, ""), path, "no frames");

        std::vector<Image> mixed = good;
        mixed[2] = frame(2, 32, 26);
        expect_invalid(write_video(path, mixed, 16, ""), path, "frame 2 is 32x26, but frame 0 is 32x24");

        for (int fps : {0, -5, 1001}) expect_invalid(write_video(path, good, fps, ""), path, "frame rate");
        EXPECT_TRUE(write_video(path, good, 1000, "").ok());  // the top of the range
        for (const auto& entry : folder_entries(dir.path())) fs::remove(dir.file(entry));

        std::vector<Image> grey = good;
        grey[1] = make_image(32, 24, 1);
        expect_invalid(write_video(path, grey, 16, ""), path, "RGB");

        std::vector<Image> broken = good;
        broken[0].pixels.pop_back();
        expect_invalid(write_video(path, broken, 16, ""), path, "frame 0");

        expect_invalid(write_video(path, good, 16, std::string("a\0b", 3)), path, "NUL");
        expect_invalid(write_video(path, good, 16, "", -1), path, "negative");

        // A folder that is not there: the write error names the path.
        const std::string missing = dir.path() + "/none/" + name;  // not dir.file(), which makes the folder
        const Status s = write_video(missing, good, 16, "");
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.error().message.rfind(dir.path() + "/none/", 0), 0u) << s.error().message;
        EXPECT_NE(s.error().message.find("No such file or directory"), std::string::npos) << s.error().message;

        EXPECT_TRUE(folder_entries(dir.path()).empty());
    }

    // Frames too wide for VP8 and WebP (16383 on a side); AVI takes them.
    const std::vector<Image> wide = {make_image(16384, 2, 3), make_image(16384, 2, 3)};
    expect_invalid(write_video(dir.file("w.webm"), wide, 16, ""), dir.file("w.webm"), "16383");
    expect_invalid(write_video(dir.file("w.webp"), wide, 16, ""), dir.file("w.webp"), "16383");

    // Names that are no video format, listing the ones that are.
    for (const char* name : {"v.mp4", "v.png", "noext", "v.gif"}) {
        expect_invalid(write_video(dir.file(name), good, 16, ""), dir.file(name), ".avi");
        expect_invalid(write_video(dir.file(name), good, 16, ""), dir.file(name), "frame_%03d.png");
    }
    expect_invalid(write_video(dir.file("s_%d.gif"), good, 16, ""), dir.file("s_%d.gif"), "image sequence");
    expect_invalid(write_video(dir.file("s_%d_%d.png"), good, 16, ""), dir.file("s_%d_%d.png"), "more than one");
    expect_invalid(write_video(dir.file("s_%12d.png"), good, 16, ""), dir.file("s_%12d.png"), "at most 9");
    EXPECT_TRUE(folder_entries(dir.path()).empty());
}

TEST(VideoFile, ReadingParametersRefusesWhatIsNoVideo) {
    TempDir dir;
    Result<std::string> missing = read_video_parameters(dir.file("none.avi"));
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().message.rfind(dir.file("none.avi") + ": ", 0), 0u);

    const std::string empty = dir.write("empty.webm", std::string_view());
    Result<std::string> r = read_video_parameters(empty);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("empty"), std::string::npos) << r.error().message;

    const std::string png = dir.file("still.png");
    ASSERT_TRUE(write_image(png, frame(0, 8, 8)).ok());
    r = read_video_parameters(png);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("not an AVI, WebM or WebP"), std::string::npos) << r.error().message;

    // An AVI cut inside its INFO list.
    const std::string avi = dir.file("cut.avi");
    ASSERT_TRUE(write_video(avi, frames(2, 8, 8), 16, kParameters).ok());
    std::vector<uint8_t> bytes = test::read_bytes(avi);
    const std::string text(bytes.begin(), bytes.end());
    const size_t icmt = text.find("ICMT");
    ASSERT_NE(icmt, std::string::npos);
    bytes.resize(icmt + 20);
    r = read_video_parameters(dir.write("cut2.avi", bytes));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("runs past the end"), std::string::npos) << r.error().message;

    // A WebM whose EBML header is cut short.
    const std::string webm = dir.file("clip.webm");
    ASSERT_TRUE(write_video(webm, frames(2, 8, 8), 16, kParameters).ok());
    std::vector<uint8_t> head = test::read_bytes(webm);
    head.resize(10);
    r = read_video_parameters(dir.write("cut.webm", head));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message.rfind(dir.file("cut.webm") + ": ", 0), 0u) << r.error().message;
}

}  // namespace
}  // namespace kiln::image
