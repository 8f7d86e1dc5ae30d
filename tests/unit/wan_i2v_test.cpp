// Wan 2.2 image-to-video on the tiny random Wan of
// training/make_wan_pipeline_fixtures.py: a DiT taking 36 planes (Wan 2.2
// I2V-A14B's input) with -i as the clip's first frame, against the reference
// job that builds the condition as Wan's WanI2V.generate does (the clip
// [image, zeros] through the VAE's encode, a mask on the first latent
// frame) and samples with it beside the noise in both CFG passes. Then the
// sd-cli line, the plan's encode, and the requests it refuses.
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

constexpr const char* kPrompt = test::kWanTinyPrompt;
constexpr int kWidth = test::kWanTinyWidth, kHeight = test::kWanTinyHeight, kFrames = test::kWanTinyFrames;

// The job's -i image: the reference's 8-bit values.
image::Image first_frame(const io::ModelFile& io) { return test::wan_tiny_frame(io, "image"); }

class WanI2v : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        load(test::wan_tiny_parts("wan_dit_i2v.safetensors"), test::golden_model_options(), "wan_tiny_i2v.safetensors");
    }
    GenerationRequest job() const {
        GenerationRequest r = test::wan_tiny_request();
        r.init_image = first_frame(*io_);
        return r;
    }
};

TEST_F(WanI2v, TheConditionIsWansMaskAndFirstFrameLatent) {
    EXPECT_TRUE(takes_first_frame(*model_));
    EXPECT_EQ(model_->diffusion().capabilities().in_channels, 36);
    auto v = validate_request(*model_, job());
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->first_frame);
    auto condition = first_frame_condition(*model_, *job().init_image, nullptr, *v);
    ASSERT_TRUE(condition.ok()) << condition.error().message;
    EXPECT_LT(relative_error(*condition, fixture_tensor(*io_, "condition").values), 1e-4);
}

TEST_F(WanI2v, ImageToVideoMatchesTheReferenceJob) {
    auto clips = generate(*model_, job());
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    const GeneratedImage& clip = clips->front();
    ASSERT_EQ(clip.frames.size(), static_cast<size_t>(kFrames));
    for (int f = 0; f < kFrames; ++f) {
        EXPECT_LE(difference_from_reference(clip.frames[f], *io_, "video", f), 1) << "frame " << f;
    }
    for (const auto& [key, value] : clip.info.extra) EXPECT_NE(key, "Denoising strength");
    // A first frame of another size is resized to the clip's, as sd-cli resizes it.
    GenerationRequest small = job();
    small.init_image = image::make_image(kWidth / 2, kHeight / 2, 3, 90);
    auto resized = generate(*model_, small);
    ASSERT_TRUE(resized.ok()) << resized.error().message;
    EXPECT_EQ(resized->front().frames.front().width, kWidth);
}

// kiln plan plans the first frame's encode before the DiT.
TEST_F(WanI2v, ThePlanEncodesTheFirstFrame) {
    const GenerationRequest r = job();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    auto passes = passes_of(r, *v);
    ASSERT_TRUE(passes.ok());
    EXPECT_TRUE(passes->first_frame);
    EXPECT_FALSE(passes->init_encode_size.has_value());
    auto f = forecast_job(*model_, kWidth, kHeight, true, false, nullptr, *passes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    const std::string text = describe_forecast(*model_, *f);
    EXPECT_NE(text.find("vae (first frame encode) on CPU"), std::string::npos) << text;
}

TEST_F(WanI2v, AnImageToVideoJobNeedsItsFirstFrame) {
    GenerationRequest r = job();
    r.init_image.reset();
    auto v = validate_request(*model_, r);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(v.error().message.find("image-to-video (its input takes a first frame's latent and mask): pass the "
                                     "first frame with -i"),
              std::string::npos)
        << v.error().message;
    r = job();
    r.mask = image::make_image(kWidth, kHeight, 1, 255);
    v = validate_request(*model_, r);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.error().message.find("--mask"), std::string::npos) << v.error().message;
}

// A DiT whose input is neither the latent nor Wan's first-frame condition
// (the Fun models' control clip: 16 + 32 channels) is refused when loaded.
TEST(WanI2vFiles, ControlDitsAreRefusedByName) {
    test::TempDir dir;
    const std::string dit =
        dir.write("wan_fun_control.safetensors",
                  test::with_tensor_shape(test::wan_tiny_part("wan_dit_i2v.safetensors"), "patch_embedding.weight",
                                          {48, 48, 1, 2, 2}, {{"kiln.wan.heads", "3"}}));
    ModelPaths paths = test::wan_tiny_parts();
    paths.diffusion_model = dit;
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.error().kind, ErrorKind::BadFile);
    EXPECT_NE(model.error().message.find("patch_embedding takes 48 channels for head.head's 16; kiln runs Wan's "
                                         "text-to-video DiTs (16) and its image-to-video and first-last-frame ones "
                                         "(36)"),
              std::string::npos)
        << model.error().message;
}

// sd-cli's Wan 2.2 I2V line: -i is the first frame.
TEST(WanI2vCli, SdCliLineWritesTheReferenceClip) {
    const test::TempDir dir;
    auto io = io::ModelFile::open({golden_path("pipeline/wan_tiny_i2v.safetensors")});
    ASSERT_TRUE(io.ok());
    const std::string image = dir.file("first.png");
    ASSERT_TRUE(image::write_image(image, first_frame(*io)).ok());
    const std::string line = test::wan_tiny_sd_cli_line("wan_dit_i2v.safetensors", "--steps 3");
    auto ok = test::run_command(line + "-i " + image + " -o " + dir.file("f_%03d.png"));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    test::expect_reference_frames(dir, "f_", *io);
    // Without -i: one line, a failure exit, no file.
    const test::TempDir empty;
    auto bad = test::run_command(line + "-o " + empty.file("x.avi"));
    EXPECT_TRUE(bad.exit_code == 1 || bad.exit_code == 2) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
    EXPECT_NE(bad.err.find("pass the first frame with -i"), std::string::npos) << bad.err;
    EXPECT_TRUE(std::filesystem::is_empty(empty.path()));
}

}  // namespace
}  // namespace kiln::pipeline
