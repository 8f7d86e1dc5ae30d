// The tiny random Wan of training/make_wan_pipeline_fixtures.py, as the Wan
// pipeline tests pass it: its parts, the job's prompt and size, sd-cli's
// command line on them, and the frames a CLI run wrote compared with a
// reference job's.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "golden.h"
#include "image/image_io.h"
#include "pipeline/model.h"
#include "pipeline/request.h"
#include "test_files.h"

namespace kiln::test {

constexpr const char* kWanTinyPrompt = "a red cat on a blue square";
constexpr int kWanTinyWidth = 64, kWanTinyHeight = 48;  // the VAE's 8x: a latent 8 wide and 6 high
constexpr int kWanTinyFrames = 5;                       // two latent frames

inline std::string wan_tiny_part(const std::string& name) { return golden_path("pipeline/wan_tiny/" + name); }
inline std::string wan_tiny_vae() { return golden_path("models/wan_vae_tiny.safetensors"); }
inline std::string wan_tiny_spiece() { return golden_path("text/umt5_like_spiece.model"); }

// The reference jobs' request: the prompt, 64x48, 5 frames, seed 11, 3 steps
// (the rest the family's defaults: cfg 6, euler, sd-cli's cuda generator).
inline pipeline::GenerationRequest wan_tiny_request() {
    pipeline::GenerationRequest r;
    r.prompt = kWanTinyPrompt;
    r.width = kWanTinyWidth;
    r.height = kWanTinyHeight;
    r.video_frames = kWanTinyFrames;
    r.seed = 11;
    r.steps = 3;
    return r;
}

// The parts as a user passes them: --diffusion-model DIT, --t5xxl, --vae and
// --tokenizer t5xxl=spiece.model.
inline pipeline::ModelPaths wan_tiny_parts(const std::string& dit = "wan_dit.safetensors") {
    pipeline::ModelPaths paths;
    paths.diffusion_model = wan_tiny_part(dit);
    paths.t5xxl = wan_tiny_part("umt5.safetensors");
    paths.vae = wan_tiny_vae();
    paths.tokenizer = "t5xxl=" + wan_tiny_spiece();
    return paths;
}

// sd-cli's docs/wan.md command line on the parts at the job's size, frames
// and seed, cfg 6, euler, shift 3, computed in F32 as the references are;
// `flags` adds the steps and the rest.
inline std::string wan_tiny_sd_cli_line(const std::string& dit, const std::string& flags) {
    return std::string(KILN_BIN) + " -M vid_gen --diffusion-model " + wan_tiny_part(dit) + " --vae " + wan_tiny_vae() +
           " --t5xxl " + wan_tiny_part("umt5.safetensors") + " --tokenizer t5xxl=" + wan_tiny_spiece() + " -p '" +
           kWanTinyPrompt + "' --cfg-scale 6.0 --sampling-method euler -W " + std::to_string(kWanTinyWidth) + " -H " +
           std::to_string(kWanTinyHeight) + " --video-frames " + std::to_string(kWanTinyFrames) +
           " --flow-shift 3.0 -s 11 -t 1 --type f32 " + flags + " ";
}

// A reference job's 8-bit picture (`key`: "image", "end_image"; [height, width, 3] as F32).
inline image::Image wan_tiny_frame(const io::ModelFile& job, const char* key, int width = kWanTinyWidth,
                                   int height = kWanTinyHeight) {
    const auto values = fixture_tensor(job, key);
    image::Image img = image::make_image(width, height, 3);
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(values.values[i]);
    return img;
}

// The frames PREFIX000.png ... a run wrote into `dir`, each within one 8-bit
// level of the reference job's "video".
inline void expect_reference_frames(const TempDir& dir, const std::string& prefix, const io::ModelFile& job) {
    for (int f = 0; f < kWanTinyFrames; ++f) {
        char name[64];
        std::snprintf(name, sizeof name, "%s%03d.png", prefix.c_str(), f);
        auto img = image::read_image(dir.file(name));
        ASSERT_TRUE(img.ok()) << img.error().message;
        EXPECT_LE(difference_from_reference(*img, job, "video", f), 1) << name;
    }
}

// A suite on one tiny Wan model and one reference job
// (tests/golden/pipeline/JOB), loaded once by the derived suite's
// SetUpTestSuite (load()); every test asserts both loaded.
class WanTinySuite : public ::testing::Test {
  protected:
    static void load(const pipeline::ModelPaths& paths, const pipeline::ModelOptions& options, const std::string& job) {
        auto loaded = pipeline::Model::load(paths, options);
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        auto io = io::ModelFile::open({golden_path("pipeline/" + job)});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
        model_ = nullptr;
        io_ = nullptr;
    }
    void SetUp() override {
        ASSERT_NE(model_, nullptr);
        ASSERT_NE(io_, nullptr);
    }

    inline static pipeline::Model* model_ = nullptr;
    inline static io::ModelFile* io_ = nullptr;
};

// Requests the model must refuse, each an invalid request whose message
// holds `says`.
struct RefusedRequest {
    const char* what;
    pipeline::GenerationRequest request;
    const char* says;
};
inline void expect_refused(const pipeline::Model& model, const std::vector<RefusedRequest>& cases) {
    for (const RefusedRequest& c : cases) {
        auto v = pipeline::validate_request(model, c.request);
        ASSERT_FALSE(v.ok()) << c.what;
        EXPECT_EQ(v.error().kind, ErrorKind::InvalidRequest) << c.what;
        EXPECT_NE(v.error().message.find(c.says), std::string::npos) << c.what << ": " << v.error().message;
    }
}

}  // namespace kiln::test
