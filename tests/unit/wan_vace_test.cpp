// Wan 2.1 VACE on the tiny random Wan of training/make_wan_vace_fixtures.py:
// a DiT of 4 blocks with VACE blocks after blocks 0 and 2 (random
// before_proj and after_proj), against training/reference/wan_vace.py
// (transcribed from Wan's VaceWanModel and WanVace): the network on a given
// context at strength 0.8 (block by block, and strength 0 giving the plain
// DiT), the context built from 3 control frames and a reference image, and
// sd-cli's whole job (-i as the reference, --control-video, --vace-strength)
// through the API and the kiln binary. Then what a VACE job refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "declared_network.h"
#include "golden.h"
#include "image/image_io.h"
#include "models/nets/wan_dit.h"
#include "pipeline/generate.h"
#include "pipeline/job_forecast.h"
#include "pipeline/request.h"
#include "pipeline/vace_context.h"
#include "runtime/graph_session.h"
#include "test_files.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::relative_error;

constexpr int kWidth = test::kWanTinyWidth, kHeight = test::kWanTinyHeight, kFrames = test::kWanTinyFrames;
constexpr int kControlFrames = 3;
constexpr float kStrength = 0.8f;
constexpr const char* kDit = "wan_dit_vace.safetensors";

std::vector<image::Image> control_frames(const io::ModelFile& job) {
    std::vector<image::Image> frames;
    for (int i = 0; i < kControlFrames; ++i)
        frames.push_back(test::wan_tiny_frame(job, ("control" + std::to_string(i)).c_str()));
    return frames;
}

class WanVace : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        load(test::wan_tiny_parts(kDit), test::golden_model_options(), "wan_tiny_vace.safetensors");
    }
    GenerationRequest job() const {
        GenerationRequest r = test::wan_tiny_request();
        r.init_image = test::wan_tiny_frame(*io_, "ref_image");
        r.control_frames = control_frames(*io_);
        r.vace_strength = kStrength;
        return r;
    }
};

TEST_F(WanVace, TheDitReadsItsVaceBlocksFromTheWeights) {
    const auto* dit = dynamic_cast<const models::WanDit*>(&model_->diffusion());
    ASSERT_NE(dit, nullptr);
    EXPECT_EQ(dit->config().layers, 4);
    EXPECT_EQ(dit->config().vace_layers, 2);
    EXPECT_EQ(dit->config().vace_in_channels, 96);
    EXPECT_EQ(model_->diffusion().capabilities().vace_channels, 96);
    EXPECT_TRUE(takes_vace_context(*model_));
    // The VACE stream runs beside the blocks: no block-level step cache.
    EXPECT_EQ(model_->diffusion().capabilities().cache_blocks, 0);
}

// The network alone on the fixture's context: the output and the stream
// after each main block (its hint added), and strength 0 the plain DiT.
TEST_F(WanVace, TheNetworkMatchesTheReferenceBlockByBlock) {
    auto weights = io::ModelFile::open({test::wan_tiny_part(kDit)});
    ASSERT_TRUE(weights.ok()) << weights.error().message;
    auto dit = test::declare_network<models::WanDit>(*weights, "", GGML_TYPE_F32);
    ASSERT_TRUE(dit.ok()) << dit.error().message;
    const std::unique_ptr<runtime::Compute> compute = test::golden_cpu();
    ASSERT_TRUE(dit->weights().load(compute->weights_backend()).ok());
    const models::WanDitConfig& c = (*dit)->config();
    for (float strength : {kStrength, 0.0f}) {
        runtime::GraphSession session;
        auto input = [&](const std::string& name) {
            const auto v = fixture_tensor(*io_, name);
            return session.input(GGML_TYPE_F32, test::ggml_ne(v.shape), v.values.data());
        };
        models::WanDitInputs in;
        const auto x = fixture_tensor(*io_, "dit.x");  // [1, 16, 3, 6, 8]
        in.x = session.input(GGML_TYPE_F32, {x.shape[4], x.shape[3], x.shape[1] * x.shape[2], 1}, x.values.data());
        const auto vace = fixture_tensor(*io_, "dit.vace_context");
        in.vace_context = session.input(GGML_TYPE_F32, {vace.shape[4], vace.shape[3], vace.shape[1] * vace.shape[2], 1},
                                        vace.values.data());
        in.timesteps = input("dit.sigma");
        in.context = input("dit.context");
        const models::WanGrid grid{x.shape[2], x.shape[3] / c.patch, x.shape[4] / c.patch};
        const auto rope = models::wan_rope_table(c, grid);
        in.rope = session.input(GGML_TYPE_F32, models::wan_rope_shape(c, grid), rope.data());
        models::WanDitBuildOptions options;
        options.vace_strength = strength;
        auto out = (*dit)->build(session.ctx(), in, options);
        ASSERT_TRUE(out.ok()) << out.error().message;
        ASSERT_TRUE(session.run(*compute, *out, /*keep_cuts=*/true).ok());
        const char* want = strength == 0.0f ? "dit.out_scale0" : "dit.out";
        EXPECT_LT(relative_error(runtime::GraphSession::read(*out), fixture_tensor(*io_, want).values), 1e-4)
            << "strength " << strength;
        if (strength == 0.0f) continue;
        for (int i = 0; i < c.layers; ++i) {
            ggml_tensor* cut = session.find("cut:blocks." + std::to_string(i));
            ASSERT_NE(cut, nullptr) << i;
            EXPECT_LT(relative_error(runtime::GraphSession::read(cut),
                                     fixture_tensor(*io_, "dit.block." + std::to_string(i)).values),
                      1e-4)
                << "block " << i;
        }
    }
}

TEST_F(WanVace, TheContextIsWansFromTheControlFramesAndTheReference) {
    const GenerationRequest r = job();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->vace);
    EXPECT_TRUE(v->vace_reference);
    EXPECT_EQ(v->frames, kFrames);
    EXPECT_EQ(v->latent_frames, 3);  // the reference's frame, then the clip's two
    model_->encoded_constants().clear();
    auto context = vace_context(*model_, r.control_frames, &*r.init_image, *v);
    ASSERT_TRUE(context.ok()) << context.error().message;
    EXPECT_LT(relative_error(*context, fixture_tensor(*io_, "vace_context").values), 1e-4);
    // The grey clip's latent is the model's for the next job of this size,
    // and what it gives is what encoding it gives.
    ASSERT_EQ(model_->encoded_constants().size(), 1u);
    std::vector<float>& kept = model_->encoded_constants().begin()->second;
    auto again = vace_context(*model_, r.control_frames, &*r.init_image, *v);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(*again, *context);
    // It is read, not encoded again: a changed value shows in the context.
    kept.front() += 1.0f;
    auto changed = vace_context(*model_, r.control_frames, &*r.init_image, *v);
    ASSERT_TRUE(changed.ok());
    EXPECT_NE(*changed, *context);
    model_->encoded_constants().clear();
}

TEST_F(WanVace, TheJobMatchesTheReference) {
    auto clips = generate(*model_, job());
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    const GeneratedImage& clip = clips->front();
    ASSERT_EQ(clip.frames.size(), static_cast<size_t>(kFrames));  // the reference's frame is not decoded
    for (int f = 0; f < kFrames; ++f) {
        EXPECT_LE(difference_from_reference(clip.frames[f], *io_, "video", f), 1) << "frame " << f;
    }
    const auto strength = std::find_if(clip.info.extra.begin(), clip.info.extra.end(),
                                       [](const auto& kv) { return kv.first == "VACE strength"; });
    ASSERT_NE(strength, clip.info.extra.end());
    EXPECT_EQ(strength->second, "0.8");
    for (const auto& [key, value] : clip.info.extra) EXPECT_NE(key, "Denoising strength");
}

// Without -i there is no reference frame: the clip's own latent frames,
// and a different clip from the same seed.
TEST_F(WanVace, WithoutAReferenceTheClipHasItsOwnFramesOnly) {
    GenerationRequest r = job();
    r.init_image.reset();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_FALSE(v->vace_reference);
    EXPECT_EQ(v->latent_frames, 2);
    auto clips = generate(*model_, r);
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    ASSERT_EQ(clips->front().frames.size(), static_cast<size_t>(kFrames));
    EXPECT_GT(difference_from_reference(clips->front().frames[0], *io_, "video", 0), 1);
}

// kiln plan encodes the context's clips a chunk at a time, as the run does.
TEST_F(WanVace, ThePlanEncodesTheContext) {
    const GenerationRequest r = job();
    auto v = validate_request(*model_, r);
    ASSERT_TRUE(v.ok()) << v.error().message;
    auto passes = passes_of(r, *v);
    ASSERT_TRUE(passes.ok()) << passes.error().message;
    EXPECT_TRUE(passes->vace);
    auto f = forecast_job(*model_, kWidth, kHeight, true, false, nullptr, *passes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    bool encodes = false;
    for (const ModuleForecast& m : f->modules) encodes = encodes || m.pass == "VACE context encode";
    EXPECT_TRUE(encodes);
}

TEST_F(WanVace, BadVaceRequestsAreRefused) {
    std::vector<test::RefusedRequest> cases;
    for (float bad : {-0.5f, 11.0f, std::nanf("")}) {
        GenerationRequest r = job();
        r.vace_strength = bad;
        cases.push_back({"a strength out of range", r, "--vace-strength must be in [0, 10]"});
    }
    GenerationRequest empty = job();
    empty.control_frames[1] = image::Image{};
    cases.push_back({"an empty control frame", empty, "--control-video frame 2"});
    test::expect_refused(*model_, cases);
}

// A DiT without VACE blocks refuses control frames by name.
TEST(WanVaceAlone, ATextToVideoDitRefusesControlFrames) {
    auto model = Model::load(test::wan_tiny_parts(), test::golden_model_options());
    ASSERT_TRUE(model.ok()) << model.error().message;
    GenerationRequest r = test::wan_tiny_request();
    r.control_frames.push_back(image::make_image(kWidth, kHeight, 3));
    test::expect_refused(**model, {{"control frames", r, "--control-video is for a Wan VACE DiT"}});
}

// sd-cli's line: -i the reference, --control-video a folder of frames in
// file-name order, --vace-strength; then bad folders and strengths, each one
// clear error and no file.
TEST_F(WanVace, SdCliLineWritesTheReferenceClip) {
    const test::TempDir dir;
    std::filesystem::create_directory(dir.file("control"));
    const std::vector<image::Image> frames = control_frames(*io_);
    // Written out of order and beside a file that is not a frame: read by name.
    for (int i = kControlFrames - 1; i >= 0; --i) {
        ASSERT_TRUE(
            image::write_image(dir.file("control/frame_" + std::to_string(i) + ".png"), frames[static_cast<size_t>(i)])
                .ok());
    }
    dir.write("control/notes.txt", "not a frame");
    ASSERT_TRUE(image::write_image(dir.file("ref.png"), test::wan_tiny_frame(*io_, "ref_image")).ok());
    const std::string line = test::wan_tiny_sd_cli_line(kDit, "--steps 3 --rng cuda");
    auto ok = test::run_command(line + "-i " + dir.file("ref.png") + " --control-video " + dir.file("control") +
                                " --vace-strength 0.8 -o " + dir.file("out_%03d.png"));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    test::expect_reference_frames(dir, "out_", *io_);
    EXPECT_FALSE(std::filesystem::exists(dir.file("out_005.png")));

    struct Case {
        const char* what;
        std::string flags;
        std::string says;
    };
    std::filesystem::create_directory(dir.file("empty"));
    const std::vector<Case> cases = {
        {"no such folder", "--control-video " + dir.file("missing"), "is not a folder"},
        {"a folder without frames", "--control-video " + dir.file("empty"), "holds no .png, .jpg, .jpeg or .webp"},
        {"a file, not a folder", "--control-video " + dir.file("ref.png"), "is not a folder"},
        {"a strength above 10", "--vace-strength 11", "--vace-strength"},
        {"a strength that is not a number", "--vace-strength much", "--vace-strength"},
    };
    for (const Case& c : cases) {
        const test::TempDir out;
        auto bad = test::run_command(line + c.flags + " -o " + out.file("bad.avi"));
        EXPECT_EQ(bad.exit_code, 2) << c.what << ": " << bad.err;
        EXPECT_TRUE(std::filesystem::is_empty(out.path())) << c.what;
        EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << c.what << ": " << bad.err;
        EXPECT_NE(bad.err.find(c.says), std::string::npos) << c.what << ": " << bad.err;
    }
}

}  // namespace
}  // namespace kiln::pipeline
