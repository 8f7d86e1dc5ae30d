// Wan 2.2 TI2V-5B on the tiny random Wan of
// training/make_wan_pipeline_fixtures.py: a DiT on Wan 2.2's 48-channel
// latent with Wan 2.2's VAE (training/make_wan22_vae_fixtures.py's), against
// the reference's text-to-video job and its image-to-video job as
// WanTI2V.i2v makes it (the image's latent as the first latent frame, kept
// through every step, its tokens at timestep 0). Then the sd-cli line, the
// plan and a request it refuses.
#include <gtest/gtest.h>

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

constexpr int kSize = 64;  // a 4 x 4 latent: 2 x 2 patch tokens a latent frame

std::string wan22_vae() { return golden_path("models/wan22_vae_tiny.safetensors"); }

ModelPaths ti2v_parts() {
    ModelPaths paths = test::wan_tiny_parts("wan_dit_ti2v.safetensors");
    paths.vae = wan22_vae();
    return paths;
}

class WanTi2v : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        load(ti2v_parts(), test::golden_model_options(), "wan_tiny_ti2v_i2v.safetensors");
        auto t2v = io::ModelFile::open({golden_path("pipeline/wan_tiny_ti2v_t2v.safetensors")});
        ASSERT_TRUE(t2v.ok()) << t2v.error().message;
        t2v_ = new io::ModelFile(std::move(t2v).value());
    }
    static void TearDownTestSuite() {
        delete t2v_;
        t2v_ = nullptr;
        test::WanTinySuite::TearDownTestSuite();
    }
    static GenerationRequest job() {
        GenerationRequest r;
        r.prompt = test::kWanTinyPrompt;
        r.width = r.height = kSize;
        r.video_frames = test::kWanTinyFrames;
        r.seed = 11;
        r.steps = 3;
        return r;
    }
    static GenerationRequest image_job() {
        GenerationRequest r = job();
        r.init_image = test::wan_tiny_frame(*io_, "image", kSize, kSize);
        return r;
    }
    static void expect_frames(const GenerationRequest& r, const io::ModelFile& reference) {
        auto clips = generate(*model_, r);
        ASSERT_TRUE(clips.ok()) << clips.error().message;
        const GeneratedImage& clip = clips->front();
        ASSERT_EQ(clip.frames.size(), static_cast<size_t>(test::kWanTinyFrames));
        for (int f = 0; f < test::kWanTinyFrames; ++f)
            EXPECT_LE(difference_from_reference(clip.frames[f], reference, "video", f), 1) << "frame " << f;
    }
    inline static io::ModelFile* t2v_ = nullptr;
};

TEST_F(WanTi2v, TextToVideoMatchesTheReferenceJob) {
    EXPECT_EQ(model_->latent_channels(), 48);
    EXPECT_EQ(model_->size_stride(), 32);  // the VAE's 16 times the DiT's patch of 2
    EXPECT_TRUE(model_->has_latent_projection());  // ComfyUI's Wan22 preview factors, 48 rows
    EXPECT_FALSE(takes_first_frame(*model_));
    EXPECT_TRUE(takes_first_latent(*model_));
    expect_frames(job(), *t2v_);
}

TEST_F(WanTi2v, ImageToVideoKeepsTheImagesLatentAsTheFirstFrame) {
    const GenerationRequest r = image_job();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->first_latent);
    auto latent = first_frame_latent(*model_, *r.init_image, *v);
    ASSERT_TRUE(latent.ok()) << latent.error().message;
    EXPECT_LT(test::relative_error(*latent, fixture_tensor(*io_, "first_latent").values), 1e-4);
    expect_frames(r, *io_);
}

// kiln plan encodes the image before the DiT.
TEST_F(WanTi2v, ThePlanEncodesTheImage) {
    const GenerationRequest r = image_job();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    auto passes = passes_of(r, *v);
    ASSERT_TRUE(passes.ok());
    EXPECT_TRUE(passes->first_latent);
    auto f = forecast_job(*model_, kSize, kSize, true, false, nullptr, *passes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    const std::string text = describe_forecast(*model_, *f);
    EXPECT_NE(text.find("vae (first frame encode) on CPU"), std::string::npos) << text;
}

TEST_F(WanTi2v, AnImageNeedsAClipAfterIt) {
    GenerationRequest one = image_job();
    one.video_frames = 1;
    GenerationRequest end = image_job();
    end.end_image = image::make_image(kSize, kSize, 3, 20);
    test::expect_refused(*model_, {{"-i with one frame", one, "a clip of 1 frame would be the image alone"},
                                   {"--end-img", end, "--end-img is the last frame of an image-to-video DiT's clip"}});
}

// Each DiT with the other release's VAE: one error naming both widths.
TEST(WanTi2vFiles, AVaeOfTheOtherReleaseIsRefused) {
    ModelPaths wan21_dit = test::wan_tiny_parts();
    wan21_dit.vae = wan22_vae();
    auto model = Model::load(wan21_dit, test::golden_model_options());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.error().kind, ErrorKind::BadFile);
    EXPECT_NE(model.error().message.find("the VAE gives 48-channel latents but the Wan DiT predicts 16"),
              std::string::npos)
        << model.error().message;
    ModelPaths ti2v_dit = ti2v_parts();
    ti2v_dit.vae = test::wan_tiny_vae();
    model = Model::load(ti2v_dit, test::golden_model_options());
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.error().message.find("the VAE gives 16-channel latents but the Wan DiT predicts 48"),
              std::string::npos)
        << model.error().message;
}

// sd-cli's TI2V-5B line with -i.
TEST(WanTi2vCli, SdCliLineWritesTheReferenceClip) {
    const test::TempDir dir;
    auto io = io::ModelFile::open({golden_path("pipeline/wan_tiny_ti2v_i2v.safetensors")});
    ASSERT_TRUE(io.ok());
    const std::string image = dir.file("first.png");
    ASSERT_TRUE(image::write_image(image, test::wan_tiny_frame(*io, "image", kSize, kSize)).ok());
    std::string line = test::wan_tiny_sd_cli_line("wan_dit_ti2v.safetensors", "--steps 3 -i " + image);
    // The 64x64 job, on Wan 2.2's VAE.
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{" -H 48 ", " -H 64 "}, {test::wan_tiny_vae(), wan22_vae()}}) {
        const size_t at = line.find(from);
        ASSERT_NE(at, std::string::npos) << from;
        line.replace(at, from.size(), to);
    }
    auto ok = test::run_command(line + "-o " + dir.file("f_%03d.png"));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    test::expect_reference_frames(dir, "f_", *io);
}

}  // namespace
}  // namespace kiln::pipeline
