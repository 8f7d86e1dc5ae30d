// Wan 2.2 A14B's two experts on the tiny random Wan of
// training/make_wan_pipeline_fixtures.py: a second DiT as the high-noise
// expert (--high-noise-diffusion-model), the first as the low-noise one,
// against the reference job that samples the schedule's first two steps with
// the expert at cfg 4 and the last two with the low-noise DiT at cfg 6
// (sd-cli's split of its sigmas). Then sd-cli's flags, the plan's time
// share, the high-noise LoRA tag, and the bad requests and files an A14B
// job can meet, each one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "golden.h"
#include "image/image_io.h"
#include "pipeline/experts.h"
#include "pipeline/generate.h"
#include "pipeline/job_forecast.h"
#include "pipeline/loras.h"
#include "pipeline/request.h"
#include "random_model.h"
#include "test_files.h"
#include "wan_tiny.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::golden_path;

using test::wan_tiny_part;
constexpr const char* kPrompt = test::kWanTinyPrompt;
constexpr int kWidth = test::kWanTinyWidth, kHeight = test::kWanTinyHeight, kFrames = test::kWanTinyFrames;

ModelPaths a14b_parts() {
    ModelPaths paths = test::wan_tiny_parts();
    paths.high_noise_diffusion_model = wan_tiny_part("wan_dit_high_noise.safetensors");
    return paths;
}

// The reference job: --steps 2 --high-noise-steps 2 --high-noise-cfg-scale 4, cfg 6.
GenerationRequest a14b_job() {
    GenerationRequest r = test::wan_tiny_request();
    r.steps = 2;
    r.cfg_scale = 6.0f;
    r.high_noise.steps = 2;
    r.high_noise.cfg_scale = 4.0f;
    return r;
}

std::string extra(const GeneratedImage& g, const std::string& key) {
    for (const auto& [k, v] : g.info.extra) {
        if (k == key) return v;
    }
    return "";
}

class WanA14b : public test::WanTinySuite {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        ModelOptions options = test::golden_model_options();
        options.lora_dir = dir_->path();
        load(a14b_parts(), options, "wan_tiny_a14b.safetensors");
    }
    static void TearDownTestSuite() {
        WanTinySuite::TearDownTestSuite();
        delete dir_;
        dir_ = nullptr;
    }
    void expect_reference_clip(const GeneratedImage& clip) {
        ASSERT_EQ(clip.frames.size(), static_cast<size_t>(kFrames));
        for (int f = 0; f < kFrames; ++f) {
            EXPECT_LE(difference_from_reference(clip.frames[f], *io_, "video", f), 1) << "frame " << f;
        }
    }

    static test::TempDir* dir_;
};
test::TempDir* WanA14b::dir_ = nullptr;

TEST_F(WanA14b, TheExpertIsASecondDiffusionModule) {
    ASSERT_TRUE(model_->has_high_noise_expert());
    EXPECT_EQ(model_->diffusion_compute().module(), "diffusion");
    EXPECT_EQ(model_->high_noise_compute().module(), "diffusion.high_noise");
    EXPECT_EQ(model_->high_noise_expert_name(), "wan_dit_high_noise");
    {
        HighNoiseExpertScope expert(*model_);
        EXPECT_EQ(&model_->diffusion_compute(), &model_->high_noise_compute());
    }
    EXPECT_NE(&model_->diffusion_compute(), &model_->high_noise_compute());
}

// sd-cli's rule (generate_video): N steps when asked, else those before
// the first sigma below the boundary.
TEST(WanA14bSteps, TheSwitchFollowsSdCli) {
    const std::vector<float> sigmas = {1.0f, 0.9f, 0.875f, 0.6f, 0.0f};
    EXPECT_EQ(high_noise_step_count(sigmas, -1, 0.875f), 3);  // 0.875 is not below 0.875
    EXPECT_EQ(high_noise_step_count(sigmas, -1, 0.95f), 1);
    EXPECT_EQ(high_noise_step_count(sigmas, -1, 1.5f), 0);
    EXPECT_EQ(high_noise_step_count(sigmas, -1, 0.0f), 4);
    EXPECT_EQ(high_noise_step_count(sigmas, 2, 0.875f), 2);
    EXPECT_EQ(high_noise_step_count(sigmas, 9, 0.875f), 4);
    EXPECT_EQ(high_noise_step_count(sigmas, 0, 0.875f), 0);
}

TEST_F(WanA14b, TwoExpertsMatchTheReferenceJob) {
    auto clips = generate(*model_, a14b_job());
    ASSERT_TRUE(clips.ok()) << clips.error().message;
    ASSERT_EQ(clips->size(), 1u);
    expect_reference_clip(clips->front());
    EXPECT_EQ(extra(clips->front(), "High noise steps"), "2");
    EXPECT_EQ(extra(clips->front(), "High noise CFG scale"), "4");
    EXPECT_EQ(extra(clips->front(), "High noise model"), "wan_dit_high_noise");
    EXPECT_EQ(clips->front().info.steps, 4);
    // The same schedule of 4 steps split by the boundary: sigma 0.6 (step 3)
    // is the first below 0.8.
    GenerationRequest by_boundary = a14b_job();
    by_boundary.steps = 4;
    by_boundary.high_noise.steps = -1;
    by_boundary.high_noise.moe_boundary = 0.8f;
    auto v = validate_request(*model_, by_boundary);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->high_noise_steps, 2);
    auto again = generate(*model_, by_boundary);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(again->front().frames.size(), clips->front().frames.size());
    for (size_t f = 0; f < again->front().frames.size(); ++f)
        EXPECT_EQ(again->front().frames[f].pixels, clips->front().frames[f].pixels) << "frame " << f;
}

// Which expert runs matters: the expert alone for every step, or no expert
// step at all, makes another clip.
TEST_F(WanA14b, EachExpertShapesTheClip) {
    auto both = generate(*model_, a14b_job());
    ASSERT_TRUE(both.ok()) << both.error().message;
    // --high-noise-steps 0: the low-noise DiT alone; a boundary of 0: the expert alone.
    for (float boundary : {2.0f, 0.0f}) {
        GenerationRequest r = a14b_job();
        r.steps = 4;
        r.high_noise.steps = boundary > 1.0f ? 0 : -1;
        r.high_noise.moe_boundary = std::min(boundary, 1.0f);
        auto v = validate_request(*model_, r);
        ASSERT_TRUE(v.ok()) << v.error().message;
        EXPECT_EQ(v->high_noise_steps, boundary > 1.0f ? 0 : 4);
        auto other = generate(*model_, r);
        ASSERT_TRUE(other.ok()) << other.error().message;
        EXPECT_NE(other->front().frames.back().pixels, both->front().frames.back().pixels) << boundary;
    }
}

// kiln plan plans both experts, the expert first, and says they take turns.
TEST_F(WanA14b, ThePlanShowsTheTimeShare) {
    const GenerationRequest r = a14b_job();
    auto job = validate_request(*model_, r);
    ASSERT_TRUE(job.ok()) << job.error().message;
    EXPECT_EQ(job->high_noise_steps, 2);
    EXPECT_EQ(job->steps, 4);
    auto passes = passes_of(r, *job);
    ASSERT_TRUE(passes.ok());
    auto f = forecast_job(*model_, kWidth, kHeight, true, false, nullptr, *passes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    std::vector<std::string> order;
    for (const ModuleForecast& m : f->modules) order.push_back(m.module);
    const auto expert = std::find(order.begin(), order.end(), "diffusion.high_noise");
    const auto main = std::find(order.begin(), order.end(), "diffusion");
    ASSERT_NE(expert, order.end());
    ASSERT_NE(main, order.end());
    EXPECT_LT(expert, main);
    ASSERT_TRUE(f->expert_steps.has_value());
    EXPECT_EQ(*f->expert_steps, std::make_pair(2, 4));
    const std::string text = describe_forecast(*model_, *f);
    EXPECT_NE(text.find("time share: diffusion.high_noise samples steps 1-2 of 4"), std::string::npos) << text;
}

// <lora:|high_noise|NAME:W> changes the expert alone; a plain tag never does.
TEST_F(WanA14b, HighNoiseLorasChangeTheExpertAlone) {
    auto tags = extract_lora_tags("a <lora:|high_noise|fast:0.5> b <lora:fast:1> <lora:|high_noise|fast:0.25>");
    ASSERT_TRUE(tags.ok()) << tags.error().message;
    ASSERT_EQ(tags->loras.size(), 2u);
    EXPECT_TRUE(tags->loras[0].high_noise);
    EXPECT_EQ(tags->loras[0].name, "fast");
    EXPECT_FLOAT_EQ(tags->loras[0].strength, 0.75f);
    EXPECT_FALSE(tags->loras[1].high_noise);

    // A LoRA on the first block's self-attention query, in ComfyUI's names.
    const int64_t dim = 48, rank = 2;
    std::vector<float> down(static_cast<size_t>(rank * dim)), up(static_cast<size_t>(dim * rank));
    for (size_t i = 0; i < down.size(); ++i) down[i] = 0.05f * static_cast<float>((i * 7) % 11) - 0.25f;
    for (size_t i = 0; i < up.size(); ++i) up[i] = 0.04f * static_cast<float>((i * 5) % 13) - 0.24f;
    auto bytes = [](const std::vector<float>& v) {
        std::vector<uint8_t> out(v.size() * sizeof(float));
        std::memcpy(out.data(), v.data(), out.size());
        return out;
    };
    dir_->write("fast.safetensors",
                test::build_safetensors(
                    {{"diffusion_model.blocks.0.self_attn.q.lora_down.weight", "F32", {rank, dim}, bytes(down)},
                     {"diffusion_model.blocks.0.self_attn.q.lora_up.weight", "F32", {dim, rank}, bytes(up)}}));
    auto patched_modules = [&] {
        std::vector<std::string> out;
        for (const auto& m : model_->modules()) {
            if (!m->weights().patches().empty()) out.push_back(m->executor->module());
        }
        return out;
    };
    auto base = generate(*model_, a14b_job());
    ASSERT_TRUE(base.ok()) << base.error().message;
    GenerationRequest tagged = a14b_job();
    tagged.prompt += " <lora:|high_noise|fast:1>";
    auto expert_only = generate(*model_, tagged);
    ASSERT_TRUE(expert_only.ok()) << expert_only.error().message;
    EXPECT_EQ(patched_modules(), std::vector<std::string>{"diffusion.high_noise"});
    EXPECT_NE(expert_only->front().frames.back().pixels, base->front().frames.back().pixels);
    tagged.prompt = std::string(kPrompt) + " <lora:fast:1>";
    auto main_only = generate(*model_, tagged);
    ASSERT_TRUE(main_only.ok()) << main_only.error().message;
    EXPECT_EQ(patched_modules(), std::vector<std::string>{"diffusion"});
    EXPECT_NE(main_only->front().frames.back().pixels, expert_only->front().frames.back().pixels);
    // Back to none: the reference clip again.
    auto plain = generate(*model_, a14b_job());
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    EXPECT_TRUE(patched_modules().empty());
    expect_reference_clip(plain->front());
}

TEST_F(WanA14b, BadExpertRequestsAreRefusedByName) {
    std::vector<test::RefusedRequest> cases;
    GenerationRequest r = a14b_job();
    r.high_noise.moe_boundary = 1.5f;
    cases.push_back({"a boundary above 1", r, "--moe-boundary must be a number in [0, 1]"});
    r = a14b_job();
    r.high_noise.cfg_scale = std::nanf("");
    cases.push_back({"a NaN cfg", r, "--high-noise-cfg-scale must be a number"});
    r = a14b_job();
    r.high_noise.sampler = "warp_drive";
    cases.push_back({"an unknown sampler", r, "--high-noise-sampling-method: "});
    r = a14b_job();
    r.high_noise.eta = 2.0f;
    cases.push_back({"an eta above 1", r, "--high-noise-eta must be a number in [0, 1]"});
    r = a14b_job();
    r.steps = 9000;
    r.high_noise.steps = 2000;
    cases.push_back({"too many steps in all", r, "--steps and --high-noise-steps must make at most 10000"});
    test::expect_refused(*model_, cases);
}

// A model without the expert: the high-noise LoRA is refused, the flags
// only warned about.
TEST(WanA14bWithoutExpert, AHighNoiseLoraIsRefused) {
    ModelPaths paths = a14b_parts();
    paths.high_noise_diffusion_model.clear();
    const test::TempDir dir;
    dir.write("fast.safetensors", std::string_view("not read"));
    ModelOptions options = test::golden_model_options();
    options.lora_dir = dir.path();
    auto model = Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_FALSE((*model)->has_high_noise_expert());
    GenerationRequest r = a14b_job();
    r.steps = 1;
    r.prompt += " <lora:|high_noise|fast:1>";
    auto clips = generate(**model, r);
    ASSERT_FALSE(clips.ok());
    EXPECT_EQ(clips.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(clips.error().message.find("high-noise expert, and this Wan model has none"), std::string::npos)
        << clips.error().message;
}

// An expert of another shape than the low-noise DiT: a bad file, named.
TEST(WanA14bWithoutExpert, AnExpertOfAnotherShapeIsABadFile) {
    const test::TempDir dir;
    // The tiny DiT at width 128 (one head of 128) instead of 48.
    auto tiny = io::ModelFile::open({wan_tiny_part("wan_dit.safetensors")});
    ASSERT_TRUE(tiny.ok()) << tiny.error().message;
    std::string spec;
    for (const io::TensorInfo& t : tiny->tensors()) {
        spec += t.name + " F16";
        for (int64_t d : t.shape) spec += " " + std::to_string(d == 48 ? 128 : d == 6 * 48 ? 6 * 128 : d);
        spec += "\n";
    }
    const std::string wide = dir.file("wide_expert.safetensors");
    ASSERT_TRUE(test::write_random_model(dir.write("wide.spec", spec), wide).ok());
    ModelPaths paths = a14b_parts();
    paths.high_noise_diffusion_model = wide;
    auto model = Model::load(paths, test::golden_model_options());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.error().kind, ErrorKind::BadFile);
    EXPECT_NE(model.error().message.find("(--high-noise-diffusion-model): the high-noise expert is a Wan DiT 128 wide"),
              std::string::npos)
        << model.error().message;
    EXPECT_NE(model.error().message.find("the --diffusion-model's Wan DiT is 48 wide"), std::string::npos)
        << model.error().message;
    // Another family's DiT-less file as the expert: no Wan DiT in it.
    paths.high_noise_diffusion_model = golden_path("models/wan_vae_tiny.safetensors");
    model = Model::load(paths, test::golden_model_options());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.error().kind, ErrorKind::BadFile);
    EXPECT_NE(model.error().message.find("(--high-noise-diffusion-model): no high_noise in it"), std::string::npos)
        << model.error().message;
}

// sd-cli's Wan 2.2 A14B command line, unchanged but for the tiny parts.
TEST(WanA14bCli, SdCliLineWritesTheReferenceClip) {
    const test::TempDir dir;
    const std::string line = test::wan_tiny_sd_cli_line(
        "wan_dit.safetensors", "--steps 2 --high-noise-diffusion-model " +
                                   wan_tiny_part("wan_dit_high_noise.safetensors") +
                                   " --high-noise-cfg-scale 4 --high-noise-sampling-method euler --high-noise-steps 2");
    auto io = io::ModelFile::open({golden_path("pipeline/wan_tiny_a14b.safetensors")});
    ASSERT_TRUE(io.ok());
    auto ok = test::run_command(line + "-o " + dir.file("f_%03d.png"));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    test::expect_reference_frames(dir, "f_", *io);
    // The plan of the same line shows the time share.
    auto plan = test::run_command(line + "--dry-run");
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    EXPECT_NE(plan.out.find("time share: diffusion.high_noise samples steps 1-2 of 4"), std::string::npos) << plan.out;
    // A bad value: one line, a usage exit, no file.
    const test::TempDir empty;
    auto bad = test::run_command(line + "--moe-boundary 3 -o " + empty.file("x.avi"));
    EXPECT_EQ(bad.exit_code, 2) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
    EXPECT_NE(bad.err.find("--moe-boundary"), std::string::npos) << bad.err;
    EXPECT_TRUE(std::filesystem::is_empty(empty.path()));
}

}  // namespace
}  // namespace kiln::pipeline
