// A whole Wan text-to-video job on the tiny random Wan of
// training/make_wan_pipeline_fixtures.py (umT5 in HF's names with a
// SentencePiece tokenizer, the DiT and Wan 2.1's VAE in the original names)
// against the PyTorch references run end to end: umT5 with the padding
// masked and its rows zero, the flow schedule with shift 3, the DiT at
// t = 1000 sigma over two latent frames, cfg 6 against the empty prompt,
// Euler, and the VAE's causal decode a latent frame at a time: five frames.
// Then sd-cli's -M vid_gen command line, the video file it writes, and the
// requests a clip cannot take, each refused with one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "golden.h"
#include "image/image_io.h"
#include "image/video_file.h"
#include "models/nets/wan_dit.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/job_forecast.h"
#include "pipeline/request.h"
#include "pipeline/schedulers.h"
#include "test_files.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

using test::wan_tiny_part;
constexpr const char* kPrompt = test::kWanTinyPrompt;
constexpr int kWidth = test::kWanTinyWidth, kHeight = test::kWanTinyHeight;
constexpr int kFrames = test::kWanTinyFrames, kLatentFrames = 2;
constexpr int64_t kTextWidth = 32;  // the tiny umT5's

io::ModelFile* open_job() {
    auto io = io::ModelFile::open({golden_path("pipeline/wan_tiny_t2v.safetensors")});
    EXPECT_TRUE(io.ok()) << io.error().message;
    return io.ok() ? new io::ModelFile(std::move(io).value()) : nullptr;
}

// The job; the negative prompt is "" and cfg the family's default, 6.
GenerationRequest tiny_job() { return test::wan_tiny_request(); }

class WanPipeline : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        load(test::wan_tiny_parts(), test::golden_model_options(), "wan_tiny_t2v.safetensors");
    }
};

TEST_F(WanPipeline, IsWanWithSdClisDefaults) {
    EXPECT_EQ(model_->family_label(), "Wan");
    EXPECT_NE(dynamic_cast<const models::WanDit*>(&model_->diffusion()), nullptr);
    EXPECT_TRUE(model_->diffusion().capabilities().video);
    EXPECT_EQ(model_->prediction(), Prediction::Flow);
    EXPECT_EQ(model_->size_stride(), 16);  // the VAE's 8 times the patch 2
    EXPECT_EQ(model_->latent_channels(), 16);
    EXPECT_EQ(model_->vae().format().temporal_downscale, 4);
    EXPECT_EQ(model_->defaults().width, 832);
    EXPECT_EQ(model_->defaults().height, 480);
    EXPECT_EQ(model_->defaults().cfg_scale, 6.0f);
    EXPECT_EQ(model_->defaults().sampler, "euler");
    ASSERT_EQ(model_->text_encoders().size(), 1u);
    EXPECT_EQ(model_->text_encoders().front().network->label(), "umT5");
}

// umT5's 512 tokens, the padding masked and its rows zero: the reference's
// context, the prompt's rows then zeros.
TEST_F(WanPipeline, ConditioningIsUmt5WithZeroPadding) {
    for (const auto& [prompt, key] :
         {std::pair{std::string(kPrompt), "t5.hidden"}, std::pair{std::string(""), "t5.uncond_hidden"}}) {
        auto c = encode_prompt(*model_, prompt, 0);
        ASSERT_TRUE(c.ok()) << c.error().message;
        const auto hidden = fixture_tensor(*io_, key);  // [1, 512, 32]
        EXPECT_EQ(c->tokens, 512) << prompt;
        EXPECT_EQ(c->width, kTextWidth);
        ASSERT_EQ(c->hidden.size(), hidden.values.size()) << prompt;
        EXPECT_LT(relative_error(c->hidden, hidden.values), 1e-4) << prompt;
        const size_t real = model_->t5_tokenizer().encode(prompt).size() + 1;  // EOS
        EXPECT_TRUE(std::all_of(c->hidden.begin() + static_cast<long>(real * kTextWidth), c->hidden.end(), [](float v) {
            return v == 0.0f;
        })) << prompt;
        EXPECT_TRUE(c->token_valid.empty());  // the DiT attends to every row, the zeros too
    }
}

// The noise in the original's [C, F, H, W] order, the guided velocity of
// the first step and the final latent.
TEST_F(WanPipeline, SamplingTheClipMatchesTheReferenceStepByStep) {
    const auto noise = fixture_tensor(*io_, "noise");
    EXPECT_EQ(make_rng(RngKind::Cuda, 11)->randn(noise.values.size()), noise.values);
    auto rng = make_rng(RngKind::Cuda, 11);
    Conditioning cond, uncond;
    for (auto [c, key] : {std::pair{&cond, "t5.hidden"}, std::pair{&uncond, "t5.uncond_hidden"}}) {
        const auto hidden = fixture_tensor(*io_, key);
        c->hidden = hidden.values;
        c->tokens = hidden.shape[1];
        c->width = kTextWidth;
    }
    const auto schedule = model_->noise_schedule(kWidth, kHeight, 3, std::nullopt);
    SamplingRun run;
    run.latent_w = kWidth / 8;
    run.latent_h = kHeight / 8;
    run.latent_frames = kLatentFrames;
    run.cfg_scale = 6.0f;
    run.sampler = SamplerKind::Euler;
    run.sigmas = fixture_tensor(*io_, "sigmas").values;
    run.schedule = schedule.get();
    std::vector<float> x = noise.values;
    for (float& v : x) v *= run.sigmas.front();
    // One step to 0: the guided velocity at sigma 1 is (x - D) / sigma.
    SamplingRun one = run;
    one.sigmas = {run.sigmas[0], 0.0f};
    auto denoised = sample_latent(*model_, one, x, cond, &uncond, *rng);
    ASSERT_TRUE(denoised.ok()) << denoised.error().message;
    std::vector<float> velocity(x.size());
    for (size_t i = 0; i < x.size(); ++i) velocity[i] = (x[i] - (*denoised)[i]) / run.sigmas[0];
    EXPECT_LT(relative_error(velocity, fixture_tensor(*io_, "velocity0").values), 1e-4);
    auto latent = sample_latent(*model_, run, x, cond, &uncond, *rng);
    ASSERT_TRUE(latent.ok()) << latent.error().message;
    EXPECT_LT(relative_error(*latent, fixture_tensor(*io_, "latent").values), 1e-4);
}

TEST_F(WanPipeline, TextToVideoMatchesTheReferenceJob) {
    auto clips = generate(*model_, tiny_job());
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    ASSERT_EQ(clips->size(), 1u);
    const GeneratedImage& clip = clips->front();
    ASSERT_EQ(clip.frames.size(), static_cast<size_t>(kFrames));
    for (int f = 0; f < kFrames; ++f) {
        ASSERT_EQ(clip.frames[f].width, kWidth);
        ASSERT_EQ(clip.frames[f].height, kHeight);
        EXPECT_LE(difference_from_reference(clip.frames[f], *io_, "video", f), 1) << "frame " << f;
    }
    EXPECT_EQ(clip.image.pixels, clip.frames.front().pixels);
    const auto frames_info = std::find_if(clip.info.extra.begin(), clip.info.extra.end(),
                                          [](const auto& kv) { return kv.first == "Frames"; });
    ASSERT_NE(frames_info, clip.info.extra.end());
    EXPECT_EQ(frames_info->second, "5");
}

// sd-cli's rule: a count that is not 4k + 1 is rounded down to one; one
// frame is an image.
TEST_F(WanPipeline, FrameCountsAreMade4kPlus1) {
    for (auto [asked, made, latent] : {std::tuple{1, 1, 1}, std::tuple{4, 1, 1}, std::tuple{6, 5, 2},
                                       std::tuple{33, 33, 9}, std::tuple{81, 81, 21}}) {
        GenerationRequest r = tiny_job();
        r.video_frames = asked;
        auto v = validate_request(*model_, r);
        ASSERT_TRUE(v.ok()) << v.error().message;
        EXPECT_TRUE(v->video);
        EXPECT_EQ(v->frames, made) << asked;
        EXPECT_EQ(v->latent_frames, latent) << asked;
    }
    GenerationRequest r = tiny_job();
    r.video_frames.reset();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->frames, 1);  // sd-cli's default
}

TEST_F(WanPipeline, RequestsAClipCannotTakeAreRefused) {
    std::vector<test::RefusedRequest> cases;
    for (int frames : {0, -3, 10000}) {
        GenerationRequest r = tiny_job();
        r.video_frames = frames;
        cases.push_back({"frame count", r, "--video-frames must be in [1, 1025]"});
    }
    GenerationRequest init = tiny_job();
    init.init_image = image::make_image(kWidth, kHeight, 3);
    cases.push_back({"an init image", init, "text-to-video"});
    GenerationRequest refs = tiny_job();
    refs.ref_images.push_back(image::make_image(kWidth, kHeight, 3));
    cases.push_back({"a reference image", refs, "text-to-video"});
    test::expect_refused(*model_, cases);
}

// kiln plan's forecast runs the clip's graphs: the DiT over every latent
// frame, and the decode a latent frame at a time, whose memory stays flat as
// the clip grows.
TEST_F(WanPipeline, PlanGrowsWithTheDitNotTheDecode) {
    auto forecast_for = [&](int frames) {
        GenerationRequest r = tiny_job();
        r.video_frames = frames;
        auto job = validate_request(*model_, r);
        EXPECT_TRUE(job.ok());
        auto passes = passes_of(r, *job);
        EXPECT_TRUE(passes.ok());
        auto f = forecast_job(*model_, kWidth, kHeight, true, false, nullptr, *passes);
        EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
        return std::move(f).value();
    };
    auto compute_of = [](const JobForecast& f, const std::string& module) {
        for (const ModuleForecast& m : f.modules) {
            if (m.module == module) return m.run.whole_workspace;
        }
        return uint64_t{0};
    };
    const JobForecast short_clip = forecast_for(5), long_clip = forecast_for(33);
    EXPECT_GT(compute_of(long_clip, "diffusion"), compute_of(short_clip, "diffusion"));
    EXPECT_GT(compute_of(short_clip, "vae"), 0u);
    EXPECT_EQ(compute_of(long_clip, "vae"), compute_of(short_clip, "vae"));
}

// The kiln binary with sd-cli's flags.
class WanPipelineCli : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        io_ = open_job();
    }
    static void TearDownTestSuite() {
        delete dir_;
        delete io_;
        dir_ = nullptr;
        io_ = nullptr;
    }

    static std::string sd_cli_line() { return test::wan_tiny_sd_cli_line("wan_dit.safetensors", "--steps 3"); }

    static test::TempDir* dir_;
    static io::ModelFile* io_;
};
test::TempDir* WanPipelineCli::dir_ = nullptr;
io::ModelFile* WanPipelineCli::io_ = nullptr;

TEST_F(WanPipelineCli, VidGenWritesTheReferenceClip) {
    // A frame pattern: the frames themselves, losslessly.
    const std::string pattern = dir_->file("frame_%03d.png");
    auto ok = test::run_command(sd_cli_line() + "-o " + pattern);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    // The decode's progress: its last line, whatever the pace.
    EXPECT_NE((ok.out + ok.err).find("image 1/1: decoded 5/5 frames"), std::string::npos) << ok.out << ok.err;
    test::expect_reference_frames(*dir_, "frame_", *io_);
    EXPECT_FALSE(std::filesystem::exists(dir_->file("frame_005.png")));
    // sd-cli's default container, with the job's parameters in it.
    const std::string avi = dir_->file("clip.avi");
    ok = test::run_command(sd_cli_line() + "--fps 8 -o " + avi);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto parameters = image::read_video_parameters(avi);
    ASSERT_TRUE(parameters.ok()) << parameters.error().message;
    EXPECT_NE(parameters->find(kPrompt), std::string::npos) << *parameters;
    EXPECT_NE(parameters->find("Frames: 5"), std::string::npos) << *parameters;
    auto metadata = test::run_command(std::string(KILN_BIN) + " -M metadata -i " + avi);
    ASSERT_EQ(metadata.exit_code, 0) << metadata.err;
    EXPECT_NE(metadata.out.find(kPrompt), std::string::npos) << metadata.out;
}

// Bad requests: one clear error line, a usage or failure exit, no file.
TEST_F(WanPipelineCli, BadVideoRequestsAreOneClearError) {
    struct Case {
        const char* what;
        std::string command;
        std::string output;
        std::vector<std::string> says;
    };
    const std::string base = sd_cli_line();
    const std::vector<Case> cases = {
        {"zero frames", base + "--video-frames 0", "bad.avi", {"--video-frames"}},
        {"ten thousand frames", base + "--video-frames 10000", "bad.avi", {"--video-frames must be in [1, 1025]"}},
        {"a clip to a PNG name", base, "bad.png", {"needs a video name"}},
        {"an unknown container", base, "bad.mkv", {"needs a video name"}},
        {"a frame pattern for two clips", base + "-b 2", "bad_%03d.png", {"one clip"}},
        {"vid_gen with an image model",
         std::string(KILN_BIN) + " -M vid_gen -m " + KILN_DEFAULT_MODEL + " -p x --steps 1 -t 1 ",
         "bad.avi",
         {"makes images, not video"}},
    };
    for (const Case& c : cases) {
        const test::TempDir folder;
        auto bad = test::run_command(c.command + " -o " + folder.file(c.output));
        EXPECT_TRUE(bad.exit_code == 1 || bad.exit_code == 2) << c.what << ": exit " << bad.exit_code;
        EXPECT_TRUE(std::filesystem::is_empty(folder.path())) << c.what;
        EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << c.what << ": " << bad.err;
        for (const std::string& s : c.says) EXPECT_NE(bad.err.find(s), std::string::npos) << c.what << ": " << bad.err;
    }
}

}  // namespace
}  // namespace kiln::pipeline
