// Wan 2.1 image-to-video and first-last-frame-to-video on the tiny random
// Wan of training/make_wan_pipeline_fixtures.py: DiTs with img_emb and the
// I2V cross-attention, a tiny CLIP vision tower in clip_vision_h's names, and
// the reference jobs that read the frames as Wan's CLIPModel.visual does
// (stretched to 224 x 224, bicubic, the penultimate layer's tokens) and
// build the condition as WanI2V / WanFLF2V.generate do. Then the sd-cli
// lines and the requests and files they refuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "golden.h"
#include "image/image_io.h"
#include "pipeline/generate.h"
#include "pipeline/image_to_video.h"
#include "pipeline/job_forecast.h"
#include "pipeline/request.h"
#include "test_files.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

constexpr int kWidth = test::kWanTinyWidth, kHeight = test::kWanTinyHeight, kFrames = test::kWanTinyFrames;

ModelPaths with_clip_vision(const std::string& dit) {
    ModelPaths paths = test::wan_tiny_parts(dit);
    paths.clip_vision = test::wan_tiny_part("clip_vision.safetensors");
    return paths;
}

class WanImageContextSuite : public test::WanTinySuite {
  protected:
    GenerationRequest job(bool last) const {
        GenerationRequest r = test::wan_tiny_request();
        r.init_image = test::wan_tiny_frame(*io_, "image");
        if (last) r.end_image = test::wan_tiny_frame(*io_, "end_image");
        return r;
    }
    // The job's CLIP rows, condition and every frame against the reference's.
    void expect_reference_job(const GenerationRequest& r) {
        const image::Image* last = r.end_image ? &*r.end_image : nullptr;
        auto rows = image_context(*model_, *r.init_image, last);
        ASSERT_TRUE(rows.ok()) << rows.error().message;
        EXPECT_LT(relative_error(*rows, fixture_tensor(*io_, "clip_features").values), 1e-4);
        auto v = validate_request(*model_, r);
        ASSERT_TRUE(v.ok()) << v.error().message;
        auto condition = first_frame_condition(*model_, *r.init_image, last, *v);
        ASSERT_TRUE(condition.ok()) << condition.error().message;
        EXPECT_LT(relative_error(*condition, fixture_tensor(*io_, "condition").values), 1e-4);
        auto clips = generate(*model_, r);
        ASSERT_TRUE(clips.ok()) << clips.error().message;
        const GeneratedImage& clip = clips->front();
        ASSERT_EQ(clip.frames.size(), static_cast<size_t>(kFrames));
        for (int f = 0; f < kFrames; ++f) {
            EXPECT_LE(difference_from_reference(clip.frames[f], *io_, "video", f), 1) << "frame " << f;
        }
    }
};

class WanI2v21 : public WanImageContextSuite {
  protected:
    static void SetUpTestSuite() {
        load(with_clip_vision("wan_dit_i2v21.safetensors"), test::golden_model_options(), "wan_tiny_i2v21.safetensors");
    }
};

TEST_F(WanI2v21, ImageToVideoMatchesTheReferenceJob) {
    const models::DiffusionCapabilities& can = model_->diffusion().capabilities();
    EXPECT_EQ(can.image_context_width, 32);
    EXPECT_EQ(can.image_context_images, 1);
    EXPECT_TRUE(takes_image_context(*model_));
    EXPECT_EQ(image_context_rows(*model_), 257);
    expect_reference_job(job(false));
}

// kiln plan reads the frame with CLIP vision before the DiT, which reads its rows.
TEST_F(WanI2v21, ThePlanReadsTheFrameWithClipVision) {
    const GenerationRequest r = job(false);
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    auto passes = passes_of(r, *v);
    ASSERT_TRUE(passes.ok());
    auto f = forecast_job(*model_, kWidth, kHeight, true, false, nullptr, *passes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    const std::string text = describe_forecast(*model_, *f);
    EXPECT_NE(text.find("te.clip_vision (first frame CLIP vision) on CPU"), std::string::npos) << text;
}

TEST_F(WanI2v21, RefusesRequestsItCannotRun) {
    GenerationRequest no_frame = job(false);
    no_frame.init_image.reset();
    GenerationRequest one_frame = job(false);
    one_frame.end_image = image::make_image(kWidth, kHeight, 3, 200);
    one_frame.video_frames = 1;
    GenerationRequest broken_end = job(false);
    broken_end.end_image = image::make_image(kWidth, kHeight, 3, 200);
    broken_end.end_image->pixels.resize(10);
    test::expect_refused(*model_,
                         {{"no -i", no_frame, "pass the first frame with -i"},
                          {"--end-img in a one-frame clip", one_frame, "has no last frame apart from its first"},
                          {"a broken --end-img", broken_end, "--end-img"}});
}

// The DiT without CLIP vision: the model loads (plans need no tower) and
// jobs ask for --clip_vision.
TEST(WanI2v21Alone, AJobAsksForClipVision) {
    auto model = Model::load(test::wan_tiny_parts("wan_dit_i2v21.safetensors"), test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ(image_context_rows(**model), 257);  // CLIP-vision-H's, for the plan
    GenerationRequest r;
    r.prompt = test::kWanTinyPrompt;
    r.width = kWidth;
    r.height = kHeight;
    r.video_frames = kFrames;
    r.init_image = image::make_image(kWidth, kHeight, 3, 128);
    test::expect_refused(**model, {{"no --clip_vision", r,
                                    "reads the first frame through CLIP vision: pass "
                                    "--clip_vision"}});
}

class WanFlf2v : public WanImageContextSuite {
  protected:
    static void SetUpTestSuite() {
        load(with_clip_vision("wan_dit_flf2v.safetensors"), test::golden_model_options(), "wan_tiny_flf2v.safetensors");
    }
};

TEST_F(WanFlf2v, FirstLastFrameMatchesTheReferenceJob) {
    EXPECT_EQ(model_->diffusion().capabilities().image_context_images, 2);
    EXPECT_EQ(image_context_rows(*model_), 514);
    expect_reference_job(job(true));
}

TEST_F(WanFlf2v, NeedsItsLastFrame) {
    test::expect_refused(*model_, {{"no --end-img", job(false),
                                    "first-last-frame-to-video (FLF2V: "
                                    "img_emb.emb_pos): pass the last frame with --end-img"}});
}

// sd-cli's Wan 2.1 FLF2V line: --clip_vision, -i and --end-img.
TEST(WanFlf2vCli, SdCliLineWritesTheReferenceClip) {
    const test::TempDir dir;
    auto io = io::ModelFile::open({golden_path("pipeline/wan_tiny_flf2v.safetensors")});
    ASSERT_TRUE(io.ok());
    const std::string first = dir.file("first.png"), last = dir.file("last.png");
    ASSERT_TRUE(image::write_image(first, test::wan_tiny_frame(*io, "image")).ok());
    ASSERT_TRUE(image::write_image(last, test::wan_tiny_frame(*io, "end_image")).ok());
    const std::string line = test::wan_tiny_sd_cli_line("wan_dit_flf2v.safetensors", "--steps 3") + "--clip_vision " +
                             test::wan_tiny_part("clip_vision.safetensors") + " -i " + first + " ";
    auto ok = test::run_command(line + "--end-img " + last + " -o " + dir.file("f_%03d.png"));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    test::expect_reference_frames(dir, "f_", *io);
    // Without --end-img, or with one that is no image: one line, a failure exit, no file.
    const test::TempDir empty;
    const std::string not_an_image = empty.file("last.png");
    {
        std::FILE* f = std::fopen(not_an_image.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        std::fputs("not a picture", f);
        std::fclose(f);
    }
    for (const auto& [flags, says] : {std::pair<std::string, std::string>{"", "pass the last frame with --end-img"},
                                      {"--end-img " + not_an_image + " ", "--end-img"}}) {
        auto bad = test::run_command(line + flags + "-o " + empty.file("x.avi"));
        EXPECT_TRUE(bad.exit_code == 1 || bad.exit_code == 2) << bad.err;
        EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
        EXPECT_NE(bad.err.find(says), std::string::npos) << bad.err;
        EXPECT_FALSE(std::filesystem::exists(empty.file("x.avi")));
    }
}

}  // namespace
}  // namespace kiln::pipeline
