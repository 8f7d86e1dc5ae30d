// The memory system end to end (docs/architecture.md, issue "run models bigger than
// device memory"): a real ggml RPC server on 127.0.0.1 is the GPU-type
// device; the default model, a larger random-weight SD1 model and a
// random-weight SDXL (real tensor names, reduced widths) run under
// --max-vram budgets from unconstrained down to the smallest that runs.
//   (a) the image is bit-identical to the unconstrained run on that device;
//   (b) the managed peak never exceeds the budget (the ledger's own books);
//   (c) the segment count grows as the budget shrinks;
//   (d) prefetch on and off give the same image;
//   (e) a budget below the largest segment is one clear error naming the
//       module, what it needs and the budget, and the next job still runs;
//   (f) a 20-step CFG run builds each module's plan once.
// kiln plan is checked against the runs it predicts.
//
// KILN_TEST_DEVICE=CUDA0 runs the same tests on a real device instead of the
// RPC server (scripts/device-check.sh).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf_writer.h"
#include "kiln.h"
#include "pipeline/auto_fit.h"
#include "pipeline/generate.h"
#include "pipeline/job_forecast.h"
#include "pipeline/loras.h"
#include "random_model.h"
#include "rpc_child.h"
#include "runtime/devices.h"
#include "test_files.h"

namespace kiln {
namespace {

using pipeline::Model;

// The prompt of every job here (kiln plan is told it: an LLM's context is as
// long as the prompt).
constexpr const char* kPrompt = "a red circle on a white background";

struct Job {
    std::string model = KILN_DEFAULT_MODEL;
    std::map<std::string, std::string> params = {{"diffusion", "CPU"}, {"te", "CPU"}};
    std::string tokenizer;
    std::string budget;  // --max-vram, "" for none
    bool prefetch = true;
    int steps = 4;
    float cfg = 2.0f;
    int size = 64;
    bool batch_cfg = true;
    std::optional<ggml_type> type;  // --type
    std::string prompt = kPrompt;
    std::string lora_dir;  // --lora-model-dir
    pipeline::LoraApplyMode lora_mode = pipeline::LoraApplyMode::Auto;
    // --control-net, computing on the device with its weights in RAM, and
    // --control-image (a disc of the output's size; empty: none).
    std::string control_net;
    bool control_image = false;
    // The hires fix at twice the size: "" for none, else the upscaler
    // ("latent", "lanczos").
    std::string hires;
    pipeline::StepCacheOptions cache;  // --cache-mode
    int video_frames = 0;              // a video model's job: --video-frames; 0: an image job
    // Wan 2.2 A14B: --high-noise-diffusion-model ("" for none) and --high-noise-steps.
    std::string high_noise_model;
    int high_noise_steps = -1;
    bool te_on_cpu = false;  // the text encoder computes on the CPU, not the device
    // Image-to-video: --clip_vision ("" for none), and a first frame (-i) when set.
    std::string clip_vision;
    bool first_frame = false;
    int control_frames = 0;  // a VACE DiT's --control-video frames (-i is then its reference image)
};

struct Outcome {
    std::vector<uint8_t> pixels;     // a clip's: every frame's, one after the other
    int frames = 1;                  // a clip's frames
    uint64_t peak = 0;               // the device's managed peak
    std::optional<uint64_t> budget;  // the device's budget
    int segments = 0;                // the UNet's groups in its last run
    int unet_builds = 0, unet_hits = 0;
    int te_builds = 0, vae_builds = 0;
    int te_segments = 0;  // the first text encoder's groups in its last run
    int unet_runs = 0;    // UNet graph runs: one per step batched, two with separate CFG passes
    int prefetches = 0;
    int control_segments = 0;  // the ControlNet's groups in its last run
    int high_noise_segments = 0;  // Wan 2.2 A14B's high-noise expert's groups in its last run
    int cache_skipped = 0;     // evaluations the step cache skipped
};

// The device under test: the RPC server's RPC0, or KILN_TEST_DEVICE.
std::string dev() {
    const char* env = std::getenv("KILN_TEST_DEVICE");
    std::string name = env && *env ? env : "RPC0";
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return name;
}
bool on_rpc() { return dev().rfind("RPC", 0) == 0; }

// The UNet and text encoder compute on the device with their weights in RAM (so a
// budget below their size streams them); the VAE decodes on the CPU, whose
// 64x64 decode needs more than the budgets that make the UNet segment.
pipeline::ModelOptions options_for(const Job& job) {
    pipeline::ModelOptions o;
    o.threads = 1;
    o.placement.backend = {{"diffusion", dev()}, {"te", job.te_on_cpu ? "CPU" : dev()}, {"vae", "CPU"}};
    o.placement.params_backend = job.params;
    if (!job.budget.empty()) o.placement.budgets = runtime::parse_max_vram(job.budget).value();
    o.executor.prefetch = job.prefetch;
    o.weight_type = job.type;
    o.lora_dir = job.lora_dir;
    o.lora_apply_mode = job.lora_mode;
    if (!job.control_net.empty()) {
        o.placement.backend["control"] = dev();
        if (!o.placement.params_backend.empty()) o.placement.params_backend["control"] = "CPU";
    }
    return o;
}

pipeline::ModelPaths paths_for(const Job& job) {
    pipeline::ModelPaths paths;
    paths.model = {job.model};
    paths.tokenizer = job.tokenizer;
    paths.control_net = job.control_net;
    paths.high_noise_diffusion_model = job.high_noise_model;
    paths.clip_vision = job.clip_vision;
    return paths;
}

Result<std::unique_ptr<Model>> load(const Job& job) { return load_model(paths_for(job), options_for(job)); }

pipeline::GenerationRequest request_for(const Job& job) {
    pipeline::GenerationRequest r;
    r.prompt = job.prompt;
    r.negative_prompt = "blurry";
    r.width = r.height = job.size;
    r.steps = job.steps;
    r.cfg_scale = job.cfg;
    r.seed = 7;
    r.batch_cfg = job.batch_cfg;
    if (job.control_image) {
        image::Image disc = image::make_image(job.size, job.size, 3, 0);
        for (int y = 0; y < job.size; ++y) {
            for (int x = 0; x < job.size; ++x) {
                const int dx = x - job.size / 2, dy = y - job.size / 2;
                if (16 * (dx * dx + dy * dy) < job.size * job.size)
                    std::fill(disc.pixel(x, y), disc.pixel(x, y) + 3, 255);
            }
        }
        r.control_image = std::move(disc);
    }
    if (!job.hires.empty()) {
        pipeline::HiresFix h;
        h.upscaler = job.hires;
        h.steps = 2;
        r.hires = h;
    }
    r.cache = job.cache;
    if (job.video_frames > 0) r.video_frames = job.video_frames;
    r.high_noise.steps = job.high_noise_steps;
    if (job.first_frame) {
        image::Image ramp = image::make_image(job.size, job.size, 3);
        for (size_t i = 0; i < ramp.pixels.size(); ++i) ramp.pixels[i] = static_cast<uint8_t>(i * 7 % 251);
        r.init_image = std::move(ramp);
    }
    for (int f = 0; f < job.control_frames; ++f) {
        image::Image frame = image::make_image(job.size, job.size, 3);
        for (size_t i = 0; i < frame.pixels.size(); ++i)
            frame.pixels[i] = static_cast<uint8_t>((i * (3 + f) + 40 * f) % 253);
        r.control_frames.push_back(std::move(frame));
    }
    r.file_hashes = false;  // the images' "Model hash" would read each GB-sized model file once
    return r;
}

Result<Outcome> run_job(const Job& job) {
    auto model = load(job);
    if (!model.ok()) return model.error();
    pipeline::GenerationTimings timings;
    auto images = pipeline::generate(**model, request_for(job), {}, &timings);
    if (!images.ok()) return images.error();
    Outcome o;
    o.cache_skipped = timings.cache.skipped;
    const pipeline::GeneratedImage& result = images->front();
    o.pixels = result.image.pixels;
    if (!result.frames.empty()) {
        o.frames = static_cast<int>(result.frames.size());
        o.pixels.clear();
        for (const image::Image& frame : result.frames)
            o.pixels.insert(o.pixels.end(), frame.pixels.begin(), frame.pixels.end());
    }
    const auto& rpc = *(*model)->ledgers().at(dev());
    o.peak = rpc.peak();
    o.budget = rpc.budget();
    auto& unet = (*model)->diffusion_compute();
    o.segments = unet.stats().last_segments;
    o.unet_builds = unet.plans().builds();
    o.unet_hits = unet.plans().hits();
    o.unet_runs = unet.stats().runs;
    o.te_builds = (*model)->text_encoders().front().executor->plans().builds();
    o.te_segments = (*model)->text_encoders().front().executor->stats().last_segments;
    o.vae_builds = (*model)->vae_compute().plans().builds();
    o.prefetches = unet.store().stats().prefetches;
    if ((*model)->has_control_net()) o.control_segments = (*model)->control_compute().stats().last_segments;
    if ((*model)->has_high_noise_expert()) o.high_noise_segments = (*model)->high_noise_compute().stats().last_segments;
    return o;
}

std::string mib(double m) { return dev() + "=" + std::to_string(m) + "M"; }

// One server for the suite: its device stays registered as RPC0 for the
// life of the process (ggml's registry), whichever tests run.
class Memory : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (on_rpc()) server_ = new test::RpcServer();
    }
    static void TearDownTestSuite() {
        delete server_;
        server_ = nullptr;
    }
    void SetUp() override {
        if (!on_rpc()) return;
        ASSERT_TRUE(server_->ok()) << server_->log();
        ASSERT_TRUE(runtime::add_rpc_servers(server_->endpoint()).ok());
    }
    // The flags that make the device exist for a kiln child process.
    static std::string device_flags() { return on_rpc() ? " --rpc-servers " + server_->endpoint() : ""; }
    static test::RpcServer* server_;
};
test::RpcServer* Memory::server_ = nullptr;

// Budgets from the unconstrained peak down until a run fails; checks
// (a), (b) and (c) on every run that succeeds. The segment count grows as the
// budget shrinks for each way of running CFG: when the batch of two stops
// fitting, the separate passes start again from fewer, smaller segments.
void sweep_budgets(const Job& base, double first_fraction, double factor, int min_segmented) {
    auto reference = run_job(base);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_EQ(reference->segments, 1);
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    std::map<int, int> last_segments;  // by UNet runs per job (batched or separate passes)
    int segmented = 0, most_segments = 1;
    double budget = peak_mib * first_fraction;
    std::string failure;
    for (; budget > 0.1; budget *= factor) {
        Job job = base;
        job.budget = mib(budget);
        auto r = run_job(job);
        if (!r.ok()) {
            failure = r.error().message;
            break;
        }
        SCOPED_TRACE("budget " + job.budget);
        EXPECT_EQ(r->pixels, reference->pixels) << "(a) the image differs from the unconstrained run";
        ASSERT_TRUE(r->budget.has_value());
        EXPECT_LE(r->peak, *r->budget) << "(b) managed peak above the budget";
        EXPECT_GE(r->segments, last_segments[r->unet_runs]) << "(c) fewer segments under a smaller budget";
        last_segments[r->unet_runs] = r->segments;
        segmented += r->segments > 1;
        most_segments = std::max(most_segments, r->segments);
    }
    EXPECT_GE(segmented, min_segmented) << "the sweep should reach budgets that segment the UNet";
    EXPECT_GT(most_segments, 2);
    // The sweep ends at a budget below the smallest that runs: one clear error.
    EXPECT_EQ(failure.rfind("out of memory: ", 0), 0u) << failure;
    EXPECT_NE(failure.find(" needs "), std::string::npos) << failure;
    EXPECT_NE(failure.find("budget"), std::string::npos) << failure;
}

// The first budget, going down from the unconstrained peak, at which the
// UNet runs its CFG batch of two in segments.
std::optional<std::string> segmenting_budget(const Job& base) {
    auto reference = run_job(base);
    if (!reference.ok()) return std::nullopt;
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    for (double fraction = 0.8; fraction > 0.2; fraction -= 0.05) {
        Job job = base;
        job.budget = mib(peak_mib * fraction);
        job.steps = 1;
        auto r = run_job(job);
        if (r.ok() && r->segments > 1 && r->unet_runs == 1) return job.budget;
    }
    return std::nullopt;
}

TEST_F(Memory, DefaultModelSameImageUnderEveryBudget) { sweep_budgets(Job{}, 0.9, 0.8, 3); }

// A LoRA of rank 8 on every attention and feed-forward matrix of the
// default model's UNet and text encoder, random but seeded, in kohya's
// ldm-path names.
std::string write_default_model_lora(const test::TempDir& dir) {
    auto file = io::ModelFile::open({KILN_DEFAULT_MODEL}).value();
    std::vector<test::SafetensorsEntry> entries;
    uint32_t state = 12345;
    auto values = [&](int64_t count) {
        std::vector<float> v(static_cast<size_t>(count));
        for (float& x : v) {
            state = state * 1664525u + 1013904223u;
            x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
        }
        const auto* p = reinterpret_cast<const uint8_t*>(v.data());
        return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
    };
    for (const io::TensorInfo& t : file.tensors()) {
        const bool unet = t.name.rfind("model.diffusion_model.", 0) == 0;
        const bool te = t.name.rfind("cond_stage_model.transformer.text_model.", 0) == 0;
        const bool target =
            t.name.find(".attn1.to_") != std::string::npos || t.name.find(".attn2.to_") != std::string::npos ||
            t.name.find(".ff.net.") != std::string::npos || t.name.find("_proj.weight") != std::string::npos;
        if (!(unet || te) || !target || t.shape.size() != 2) continue;
        std::string stem = t.name.substr(0, t.name.size() - 7);
        stem = unet ? "lora_unet_" + stem.substr(22) : "lora_te_" + stem.substr(29);
        for (char& c : stem) c = c == '.' ? '_' : c;
        entries.push_back({stem + ".lora_down.weight", "F32", {8, t.shape[1]}, values(8 * t.shape[1])});
        entries.push_back({stem + ".lora_up.weight", "F32", {t.shape[0], 8}, values(8 * t.shape[0])});
    }
    dir.write("random.safetensors", test::build_safetensors(entries));
    return dir.path();
}

// Run-time LoRA weights are the module's own weights to the memory system:
// streamed with the UNet's segments (weights in RAM) or kept on the device
// beside them, the image the same under every budget.
TEST_F(Memory, RuntimeLoraSameImageUnderEveryBudget) {
    test::TempDir dir;
    Job job;
    job.lora_dir = write_default_model_lora(dir);
    job.lora_mode = pipeline::LoraApplyMode::AtRuntime;
    job.prompt = std::string("<lora:random:1> ") + kPrompt;
    auto without = run_job(Job{});
    auto with = run_job(job);
    ASSERT_TRUE(without.ok() && with.ok());
    EXPECT_NE(with->pixels, without->pixels) << "the LoRA changed nothing";
    sweep_budgets(job, 0.9, 0.8, 3);
    // One model, other LoRAs job after job under a budget that streams the
    // weights: each job's image is the one a fresh model gives.
    {
        Job budgeted = job;
        budgeted.budget = segmenting_budget(job).value_or("");
        ASSERT_FALSE(budgeted.budget.empty());
        auto model = load(budgeted);
        ASSERT_TRUE(model.ok()) << model.error().message;
        for (const char* prompt : {"<lora:random:1> ", "", "<lora:random:-0.7> ", "<lora:random:1> "}) {
            SCOPED_TRACE(prompt);
            Job fresh = budgeted;
            fresh.prompt = std::string(prompt) + kPrompt;
            auto expected = run_job(fresh);
            auto images = pipeline::generate(**model, request_for(fresh), {});
            ASSERT_TRUE(expected.ok() && images.ok());
            EXPECT_EQ(images->front().image.pixels, expected->pixels);
        }
    }
    // Weights (and LoRA) kept on the device: the adapter bytes are on its ledger.
    Job resident = job;
    resident.params = {};
    auto r = run_job(resident);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, with->pixels);
}

// The ControlNet is a module of its own on the device, its weights in RAM
// streamed by segments under a budget like the UNet's: the image is the
// unconstrained one under every budget that runs.
TEST_F(Memory, ControlNetSameImageUnderEveryBudget) {
    Job job;
    job.model = std::string(KILN_GOLDEN_DIR) + "/models/sd1_tiny.safetensors";
    job.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    job.control_net = std::string(KILN_GOLDEN_DIR) + "/models/controlnet_sd1_tiny.safetensors";
    job.size = 16;
    job.steps = 2;
    auto without = run_job(job);
    job.control_image = true;
    auto with = run_job(job);
    ASSERT_TRUE(without.ok()) << without.error().message;
    ASSERT_TRUE(with.ok()) << with.error().message;
    EXPECT_NE(with->pixels, without->pixels) << "the ControlNet changed nothing";
    EXPECT_EQ(with->control_segments, 1);
    // Budgets from the unconstrained peak down until a run fails: (a) and
    // (b) on every run; the ControlNet's hint block at 8x the latent is most
    // of its compute, so it segments in fewer budgets than the UNet.
    const double peak_mib = static_cast<double>(with->peak) / (1024.0 * 1024.0);
    int most_control_segments = 1, runs = 0;
    std::string failure;
    for (double budget = peak_mib * 0.9; budget > 0.1; budget *= 0.85) {
        Job constrained = job;
        constrained.budget = mib(budget);
        auto r = run_job(constrained);
        if (!r.ok()) {
            failure = r.error().message;
            break;
        }
        SCOPED_TRACE("budget " + constrained.budget);
        ++runs;
        EXPECT_EQ(r->pixels, with->pixels) << "(a) the image differs from the unconstrained run";
        ASSERT_TRUE(r->budget.has_value());
        EXPECT_LE(r->peak, *r->budget) << "(b) managed peak above the budget";
        most_control_segments = std::max(most_control_segments, r->control_segments);
    }
    EXPECT_GE(runs, 3);
    EXPECT_GT(most_control_segments, 1) << "the sweep should reach budgets that segment the ControlNet";
    EXPECT_EQ(failure.rfind("out of memory: ", 0), 0u) << failure;
}

TEST_F(Memory, LargerModelSameImageUnderEveryBudget) {
    test::TempDir dir;
    const std::string path = dir.file("sd1_medium.safetensors");
    ASSERT_TRUE(test::write_random_model(std::string(KILN_FIXTURES_DIR) + "/sd1_medium.spec", path).ok());
    Job job;
    job.model = path;
    job.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    job.steps = 2;
    sweep_budgets(job, 0.9, 0.7, 3);
}

// kiln plan's forecast for `job` against the run itself: whether it fits,
// the UNet's segment count and a device peak close to the measured one
// (predicted from CPU-side measures before anything is placed; the run adds
// its small input buffers). The run's outcome, or its error.
Result<Outcome> expect_plan_matches_run(const Job& job) {
    pipeline::ModelOptions o = options_for(job);
    o.plan_only = true;
    auto planned = load_model(paths_for(job), o);
    if (!planned.ok()) return planned.error();
    const std::string prompt = kPrompt;
    const pipeline::GenerationRequest request = request_for(job);
    auto validated = pipeline::validate_request(**planned, request);
    if (!validated.ok()) return validated.error();
    auto passes = pipeline::passes_of(request, *validated);
    if (!passes.ok()) return passes.error();
    auto forecast = pipeline::forecast_job(**planned, job.size, job.size, job.cfg != 1.0f, false, &prompt, *passes);
    if (!forecast.ok()) return forecast.error();
    const std::string text = pipeline::describe_forecast(**planned, *forecast);
    const pipeline::ModuleForecast* unet = nullptr;
    const pipeline::ModuleForecast* expert = nullptr;
    for (const auto& m : forecast->modules) {
        if (m.module == "diffusion") unet = &m;
        if (m.module == "diffusion.high_noise") expert = &m;
    }
    EXPECT_NE(unet, nullptr) << text;
    EXPECT_EQ(expert != nullptr, !job.high_noise_model.empty()) << text;
    const int expert_segments = expert ? expert->run.segments : 0;
    // The planned model goes first: models of one process share the
    // device's books, so it would take room from the run.
    const bool fits = forecast->fits;
    const int segments = unet ? unet->run.segments : 0;
    const std::vector<pipeline::DeviceForecast> devices = forecast->devices;
    planned->reset();
    auto run = run_job(job);
    EXPECT_EQ(fits, run.ok()) << text << (run.ok() ? "" : run.error().message);
    if (!run.ok() || !unet) return run;
    EXPECT_EQ(segments, run->segments) << text;
    EXPECT_EQ(expert_segments, run->high_noise_segments) << text;
    uint64_t predicted = 0;
    for (const auto& d : devices) {
        if (d.device == dev()) predicted = d.peak;
    }
    EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(run->peak), 0.15 * run->peak) << text;
    return run;
}

// SDXL: two text encoders on the device, the UNet's y vector, real names at
// reduced widths (tests/fixtures/sdxl_medium.spec).
Job sdxl_job(const test::TempDir& dir) {
    Job job;
    job.model = dir.file("sdxl_medium.safetensors");
    EXPECT_TRUE(test::write_random_model(std::string(KILN_FIXTURES_DIR) + "/sdxl_medium.spec", job.model).ok());
    job.tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    job.steps = 2;
    return job;
}

TEST_F(Memory, SdxlSameImageUnderEveryBudget) {
    test::TempDir dir;
    sweep_budgets(sdxl_job(dir), 0.9, 0.7, 3);
}

// kiln plan's forecast for SDXL agrees with the runs: fits or not, the UNet's
// segments, the device peak.
TEST_F(Memory, SdxlPlanPredictsTheRun) {
    test::TempDir dir;
    const Job base = sdxl_job(dir);
    auto reference = run_job(base);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    int checked_fail = 0, checked_segmented = 0;
    for (double fraction : {0.0, 0.6, 0.35, 0.2, 0.02}) {
        Job job = base;
        if (fraction > 0) job.budget = mib(peak_mib * fraction);
        SCOPED_TRACE("budget " + job.budget);
        auto run = expect_plan_matches_run(job);
        if (!run.ok()) {
            ++checked_fail;
            EXPECT_EQ(run.error().message.rfind("out of memory: ", 0), 0u) << run.error().message;
            continue;
        }
        checked_segmented += run->segments > 1;
    }
    EXPECT_GT(checked_segmented, 0) << "no budget segmented the UNet";
    EXPECT_GT(checked_fail, 0) << "no budget was too small";
}

TEST_F(Memory, PrefetchOnAndOffGiveTheSameImage) {
    auto whole = run_job(Job{});
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    Job on;
    on.budget = segmenting_budget(Job{}).value_or("");
    Job off = on;
    off.prefetch = false;
    auto a = run_job(on);
    auto b = run_job(off);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_GT(a->segments, 1);
    EXPECT_GT(a->prefetches, 0) << "the RPC device copies asynchronously, so prefetch should run";
    EXPECT_EQ(b->prefetches, 0);
    EXPECT_EQ(a->pixels, b->pixels);
    EXPECT_EQ(a->pixels, whole->pixels);
}

// (e) through the C API, as a front-end meets it.
TEST_F(Memory, BudgetBelowTheLargestSegmentIsOneClearErrorAndTheNextJobRuns) {
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.model_path = KILN_DEFAULT_MODEL;
    const std::string backend = "diffusion=" + dev() + ",te=" + dev() + ",vae=cpu";
    cp.backend = backend.c_str();
    cp.params_backend = "diffusion=cpu,te=cpu";
    std::string budget = dev() + "=1.2M";
    cp.max_vram = budget.c_str();
    cp.n_threads = 1;
    char* error = nullptr;
    kiln_context* small = NULL;
    kiln_context_create(&cp, &small, &error);
    ASSERT_NE(small, nullptr) << error;
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle on a white background";
    gp.steps = 2;
    gp.seed = 1;
    gp.batch_count = 1;
    kiln_image* images = nullptr;
    int count = 0;
    ASSERT_EQ(kiln_generate(small, &gp, &images, &count, &error), KILN_ERROR_OUT_OF_MEMORY);
    const std::string message = error;
    kiln_free_string(error);
    EXPECT_EQ(message.rfind("out of memory: diffusion segment '", 0), 0u) << message;
    EXPECT_NE(message.find("' needs "), std::string::npos) << message;
    EXPECT_NE(message.find("on " + dev()), std::string::npos) << message;
    EXPECT_NE(message.find("of 1.20 MiB"), std::string::npos) << message;  // the budget
    EXPECT_EQ(count, 0);
    // The failed job gave back what it took.
    char* report = kiln_memory_report(small);
    EXPECT_NE(std::string(report).find(dev() + " peak"), std::string::npos) << report;
    EXPECT_NE(std::string(report).find(" now 0 B "), std::string::npos) << report;
    kiln_free_string(report);
    kiln_context_free(small);

    budget = dev() + "=64M";
    cp.max_vram = budget.c_str();
    kiln_context* big = NULL;
    kiln_context_create(&cp, &big, &error);
    ASSERT_NE(big, nullptr) << error;
    ASSERT_EQ(kiln_generate(big, &gp, &images, &count, &error), 0) << error;
    EXPECT_EQ(count, 1);
    kiln_images_free(images, count);
    kiln_context_free(big);
}

// The byte count human_bytes() printed at text[at] ("12.0 KiB", "512 B").
double parse_bytes(const std::string& text, size_t at) {
    char* end = nullptr;
    const double value = std::strtod(text.c_str() + at, &end);
    const std::string unit(end + 1, std::strchr(end + 1, ' ') ? std::strchr(end + 1, ' ') : end + 1 + 3);
    const std::map<std::string, double> scale = {{"B", 1}, {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
    EXPECT_TRUE(scale.count(unit)) << "unit '" << unit << "' in " << text;
    return scale.count(unit) ? value * scale.at(unit) : 0;
}

// What the memory report says `ctx`'s device holds now and at its peak.
struct DeviceBytes {
    double now = 0, peak = 0;
};
DeviceBytes device_bytes(kiln_context* ctx) {
    char* report = kiln_memory_report(ctx);
    const std::string text = report;
    kiln_free_string(report);
    const std::string head = dev() + " peak ";
    const size_t at = text.find(head);
    EXPECT_NE(at, std::string::npos) << text;
    if (at == std::string::npos) return {};
    return {parse_bytes(text, text.find(" now ", at) + 5), parse_bytes(text, at + head.size())};
}

// Budgets belong to the device: two models of one process on one device
// share its ledger and store, both generate under one budget, and the
// managed bytes never exceed it.
TEST_F(Memory, TwoModelsOnOneDeviceShareItsBudget) {
    const std::string budget = dev() + "=64M";
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.model_path = KILN_DEFAULT_MODEL;
    const std::string backend = "diffusion=" + dev() + ",te=" + dev() + ",vae=cpu";
    cp.backend = backend.c_str();
    cp.max_vram = budget.c_str();  // weights stay on the device (the default params location)
    cp.n_threads = 1;
    char* error = nullptr;
    kiln_context* first = nullptr;
    ASSERT_EQ(kiln_context_create(&cp, &first, &error), KILN_OK) << error;
    const double one = device_bytes(first).now;
    EXPECT_GT(one, 0);  // its UNet and text encoder weights
    kiln_context* second = nullptr;
    ASSERT_EQ(kiln_context_create(&cp, &second, &error), KILN_OK) << error;
    // The second model's books are the first's, holding both models' weights.
    EXPECT_NEAR(device_bytes(second).now, 2.0 * one, 0.02 * one);
    EXPECT_EQ(device_bytes(first).now, device_bytes(second).now);

    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle on a white background";
    gp.steps = 2;
    gp.seed = 1;
    std::vector<std::vector<uint8_t>> pixels;
    for (kiln_context* ctx : {first, second, first}) {
        kiln_image* images = nullptr;
        int count = 0;
        ASSERT_EQ(kiln_generate(ctx, &gp, &images, &count, &error), KILN_OK) << error;
        pixels.emplace_back(images[0].data, images[0].data + images[0].width * images[0].height * 3);
        kiln_images_free(images, count);
    }
    EXPECT_EQ(pixels[0], pixels[1]);
    EXPECT_EQ(pixels[0], pixels[2]);
    // The shared ledger's peak stays within the budget.
    EXPECT_LE(device_bytes(second).peak, 64.0 * (1 << 20));
    EXPECT_GT(device_bytes(second).peak, 2.0 * one);

    // A model that goes gives its bytes back to the books the other keeps:
    // at least its weights (and its idle workspaces); the other's stay.
    const double before = device_bytes(second).now;
    kiln_context_free(first);
    const double after = device_bytes(second).now;
    EXPECT_LE(after, before - 0.98 * one);
    EXPECT_GE(after, one);
    kiln_context_free(second);
}

TEST_F(Memory, TwentyStepCfgRunBuildsEachPlanOnce) {
    const std::optional<std::string> segmenting = segmenting_budget(Job{});
    ASSERT_TRUE(segmenting.has_value());
    for (const std::string& budget : {std::string(), *segmenting}) {
        Job job;
        job.budget = budget;
        job.steps = 20;
        auto r = run_job(job);
        ASSERT_TRUE(r.ok()) << r.error().message;
        SCOPED_TRACE("budget '" + budget + "'");
        EXPECT_EQ(r->unet_builds, 1);
        EXPECT_EQ(r->unet_hits, 19);  // one batch-of-two CFG graph per step
        EXPECT_EQ(r->te_builds, 1);   // the prompt and the negative prompt share one layout
        EXPECT_EQ(r->vae_builds, 1);
        if (!budget.empty()) EXPECT_GT(r->segments, 1);
    }
}

// CFG's two passes run as one batch; when the batch does not fit they run one
// after the other with one plan, and the image does not change.
TEST_F(Memory, CfgPassesRunSeparatelyWhenTheBatchDoesNotFit) {
    auto batched = run_job(Job{});
    ASSERT_TRUE(batched.ok()) << batched.error().message;
    EXPECT_EQ(batched->unet_runs, 4);
    Job unbatched;
    unbatched.batch_cfg = false;
    auto separate = run_job(unbatched);
    ASSERT_TRUE(separate.ok()) << separate.error().message;
    EXPECT_EQ(separate->unet_runs, 8);
    EXPECT_EQ(separate->unet_builds, 1);  // both passes share one plan
    EXPECT_EQ(separate->pixels, batched->pixels);
    // Down the budgets to where only separate passes fit.
    std::optional<Outcome> fallback;
    for (double budget = 2.5; budget > 0.5 && !fallback; budget *= 0.95) {
        Job job;
        job.budget = mib(budget);
        auto r = run_job(job);
        if (!r.ok()) break;
        if (r->unet_runs == 8) fallback = *r;
    }
    ASSERT_TRUE(fallback.has_value()) << "no budget made the CFG batch fall back to separate passes";
    EXPECT_EQ(fallback->pixels, batched->pixels);
    EXPECT_LE(fallback->peak, *fallback->budget);
}

// Where the weights live between uses changes nothing in the image.
TEST_F(Memory, ParamsOnDiskInRamOrOnTheDeviceGiveTheSameImage) {
    Job ram;
    ram.budget = segmenting_budget(Job{}).value_or("");
    auto a = run_job(ram);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_GT(a->segments, 1);
    Job disk = ram;
    disk.params = {{"diffusion", "disk"}, {"te", "disk"}};
    auto b = run_job(disk);
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(b->segments, a->segments);
    EXPECT_EQ(b->pixels, a->pixels);
    Job device;  // unconstrained, weights kept on the device itself
    device.params = {};
    auto c = run_job(device);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->pixels, a->pixels);
}

std::string kiln_cli(const std::string& args) { return std::string(KILN_BIN) + " " + args + " -t 1"; }

// Weights kept on another device: the CPU computes with copies read back.
TEST_F(Memory, ParamsOnAnotherDeviceGiveTheSameImage) {
    test::TempDir dir;
    auto plain = test::run_command(kiln_cli("--auto-fit off -p x -o " + dir.file("a.png")));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    auto other = test::run_command(kiln_cli(device_flags() + " -v --backend cpu --params-backend diffusion=" + dev() +
                                            " -p x -o " + dir.file("b.png")));
    ASSERT_EQ(other.exit_code, 0) << other.err;
    EXPECT_NE(other.out.find("diffusion: computes on CPU, weights on " + dev()), std::string::npos) << other.out;
    EXPECT_NE(other.out.find("diffusion: weights loaded (other device)"), std::string::npos) << other.out;
    EXPECT_EQ(test::read_bytes(dir.file("a.png")), test::read_bytes(dir.file("b.png")));
}

// sd-cli's --clip-on-cpu and --vae-on-cpu keep those modules on the CPU
// beside --backend DEVICE or auto-fit, which place the rest; same image.
TEST_F(Memory, ClipAndVaeOnCpuAsSdCli) {
    if (!on_rpc()) GTEST_SKIP() << "needs the loopback RPC device";
    test::TempDir dir;
    const std::string rpc = device_flags();
    for (const std::string& placement : {" --backend " + dev(), std::string()}) {
        SCOPED_TRACE(placement.empty() ? "auto-fit" : placement);
        auto all = test::run_command(kiln_cli(rpc + placement + " -v -p x -o " + dir.file("all.png")));
        auto split = test::run_command(
            kiln_cli(rpc + placement + " -v --clip-on-cpu --vae-on-cpu -p x -o " + dir.file("split.png")));
        ASSERT_EQ(all.exit_code, 0) << all.err;
        ASSERT_EQ(split.exit_code, 0) << split.err;
        EXPECT_NE(all.out.find("te: computes on " + dev()), std::string::npos) << all.out;
        EXPECT_NE(split.out.find("diffusion: computes on " + dev()), std::string::npos) << split.out;
        EXPECT_NE(split.out.find("te: computes on CPU"), std::string::npos) << split.out;
        EXPECT_NE(split.out.find("vae: computes on CPU"), std::string::npos) << split.out;
    }
    auto bad = test::run_command(kiln_cli("--clip-on-cpu=yes -p x -o " + dir.file("bad.png")));
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_FALSE(std::ifstream(dir.file("bad.png")).good());
}

// Auto-fit with an RPC device: it computes everything there and says so;
// under a small budget the weights move to RAM and the UNet segments.
TEST_F(Memory, AutoFitUsesTheGpuTypeDevice) {
    test::TempDir dir;
    const std::string rpc = device_flags();
    auto full = test::run_command(kiln_cli(rpc + " -p x -o " + dir.file("a.png")));
    ASSERT_EQ(full.exit_code, 0) << full.err;
    EXPECT_NE(full.out.find("auto-fit:"), std::string::npos) << full.out;
    EXPECT_NE(full.out.find("diffusion: computes on " + dev() + ", weights on " + dev()), std::string::npos)
        << full.out;
    auto small = test::run_command(kiln_cli(rpc + " -v --max-vram " + mib(16) + " -p x -o " + dir.file("b.png")));
    ASSERT_EQ(small.exit_code, 0) << small.err;
    EXPECT_NE(small.out.find("diffusion: computes on " + dev() + ", weights in RAM"), std::string::npos) << small.out;
    EXPECT_EQ(test::read_bytes(dir.file("a.png")), test::read_bytes(dir.file("b.png")));
    // --auto-fit off: the CPU, as without a GPU.
    auto off = test::run_command(kiln_cli(rpc + " -v --auto-fit off -p x -o " + dir.file("c.png")));
    ASSERT_EQ(off.exit_code, 0) << off.err;
    EXPECT_NE(off.out.find("diffusion: computes on CPU"), std::string::npos) << off.out;
}

// Auto-fit with two GPU-type devices of different budgets: the larger
// computes the UNet and keeps it; the text encoder, for which the VAE's
// compute reserve leaves no room beside it, computes on the other device
// with its weights there; the VAE computes on the first from RAM. kiln plan
// shows that placement, the job runs with it, and the image is the one a
// single device makes (both servers run ggml's CPU kernels).
TEST_F(Memory, AutoFitSpreadsModulesOverTwoDevices) {
    if (!on_rpc()) GTEST_SKIP() << "needs the loopback RPC device";
    test::RpcServer second;
    ASSERT_TRUE(second.ok()) << second.log();
    test::TempDir dir;
    auto one = test::run_command(kiln_cli(device_flags() + " -p x -o " + dir.file("one.png")));
    ASSERT_EQ(one.exit_code, 0) << one.err;
    // The default model: UNet 3.36 MiB, text encoder 0.95 MiB, VAE 1.83 MiB
    // (compute reserve 8 times that, 14.6 MiB).
    const std::string two =
        " --rpc-servers " + server_->endpoint() + "," + second.endpoint() + " --max-vram RPC0=18.5M,RPC1=16M -p x";
    auto plan = test::run_command(kiln_cli("plan" + two));
    ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    for (const char* line : {"diffusion: computes on RPC0, weights on RPC0", "te: computes on RPC1, weights on RPC1",
                             "vae: computes on RPC0, weights in RAM", "fits: yes"}) {
        EXPECT_NE(plan.out.find(line), std::string::npos) << line << "\n" << plan.out;
    }
    auto run = test::run_command(kiln_cli(two + " -v -o " + dir.file("two.png")));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(run.out.find("te: computes on RPC1, weights on RPC1"), std::string::npos) << run.out;
    EXPECT_EQ(test::read_bytes(dir.file("one.png")), test::read_bytes(dir.file("two.png")));
}

// Auto-fit checks the whole job: with --hires, the second pass at twice the
// size too. Under a budget the 64x64 job fits with every weight on the
// device, auto-fit moves them to RAM once its 128x128 hires pass is counted.
TEST_F(Memory, AutoFitCountsTheHiresPass) {
    const std::string flags = device_flags() + " -v --max-vram " + mib(30) + " -p x";
    auto plain = test::run_command(kiln_cli("plan " + flags));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(plain.out.find("diffusion: computes on " + dev() + ", weights on " + dev()), std::string::npos)
        << plain.out;
    // (Its 128x128 decode alone outgrows this budget, so the plan still says
    // it does not fit: the exit code is 1 either way.)
    auto hires = test::run_command(kiln_cli("plan " + flags + " --hires"));
    EXPECT_NE(hires.out.find("auto-fit: a 64x64 job with its hires pass does not fit"), std::string::npos) << hires.out;
    EXPECT_NE(hires.out.find("vae: computes on " + dev() + ", weights in RAM"), std::string::npos) << hires.out;
}

TEST_F(Memory, DryRunPrintsThePlanAndWritesNothing) {
    test::TempDir dir;
    const std::string rpc = device_flags() + " --backend diffusion=" + dev() + ",te=" + dev() +
                            ",vae=cpu --params-backend diffusion=cpu,te=cpu";
    const std::optional<std::string> segmenting = segmenting_budget(Job{});
    ASSERT_TRUE(segmenting.has_value());
    auto fits =
        test::run_command(kiln_cli(rpc + " --max-vram " + *segmenting + " --dry-run -p x -o " + dir.file("a.png")));
    EXPECT_EQ(fits.exit_code, 0) << fits.err;
    const size_t unet = fits.out.find("diffusion on " + dev() + ": ");
    ASSERT_NE(unet, std::string::npos) << fits.out;
    EXPECT_NE(fits.out.substr(unet, fits.out.find('\n', unet) - unet).find(" segments,"), std::string::npos)
        << fits.out;
    EXPECT_NE(fits.out.find("fits: yes"), std::string::npos) << fits.out;
    EXPECT_FALSE(std::ifstream(dir.file("a.png")).good());
    auto plan = test::run_command(kiln_cli("plan" + rpc + " --max-vram " + mib(1)));
    EXPECT_EQ(plan.exit_code, 1) << plan.err;
    EXPECT_NE(plan.out.find("DOES NOT FIT"), std::string::npos) << plan.out;
    EXPECT_NE(plan.out.find("fits: no"), std::string::npos) << plan.out;
}

TEST_F(Memory, BadMemoryFlagsAreUsageErrors) {
    struct Case {
        std::string args, message;
    } cases[] = {
        {"--max-vram lots", "--max-vram: 'lots' is not a number of GiB"},
        {"--auto-fit maybe", "--auto-fit: expected on or off, got 'maybe'"},
        {"--params-backend ram", "--params-backend: unknown device 'ram'"},
        {"--params-backend decoder=cpu", "--params-backend: unknown module 'decoder'"},
    };
    for (const Case& c : cases) {
        auto r = test::run_command(kiln_cli(c.args + " -p x -o /tmp/kiln-never-written.png"));
        EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.err;
        EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    }
}

// Lazy by default: a module's weights load when it first runs;
// --eager-load reads them all before the first graph.
TEST_F(Memory, EagerLoadReadsEveryModuleFirst) {
    test::TempDir dir;
    auto lazy = test::run_command(kiln_cli("-v --steps 1 -p x -o " + dir.file("a.png")));
    ASSERT_EQ(lazy.exit_code, 0) << lazy.err;
    auto eager = test::run_command(kiln_cli("-v --eager-load --steps 1 -p x -o " + dir.file("b.png")));
    ASSERT_EQ(eager.exit_code, 0) << eager.err;
    const auto first_plan = [](const std::string& out) { return out.find("plan built"); };
    EXPECT_GT(lazy.out.find("vae: weights loaded"), first_plan(lazy.out)) << lazy.out;
    EXPECT_LT(eager.out.find("vae: weights loaded"), first_plan(eager.out)) << eager.out;
    EXPECT_EQ(test::read_bytes(dir.file("a.png")), test::read_bytes(dir.file("b.png")));
}

// A hires job's second pass (its UNet and VAE at twice the size, and with
// a pixel upscaler the VAE's encode) is in the plan: the predicted peak is
// the run's, and above the plain job's.
TEST_F(Memory, PlanPredictsAHiresRun) {
    Job plain;
    auto base = expect_plan_matches_run(plain);
    ASSERT_TRUE(base.ok()) << base.error().message;
    for (const char* upscaler : {"latent", "lanczos"}) {
        SCOPED_TRACE(upscaler);
        Job job;
        job.hires = upscaler;
        auto run = expect_plan_matches_run(job);  // its expectations are the test
        ASSERT_TRUE(run.ok()) << run.error().message;
        EXPECT_GT(run->peak, base->peak);
    }
}

// kiln plan predicts what the run does.
TEST_F(Memory, PlanPredictsTheRun) {
    for (double budget : {0.0, 4.0, 3.0, 2.2, 1.2}) {
        Job job;
        if (budget > 0) job.budget = mib(budget);
        SCOPED_TRACE("budget " + job.budget);
        (void)expect_plan_matches_run(job);  // its expectations are the test
    }
}

// A job on the full-width random model `spec` (tests/fixtures/) describes,
// written as `file` in `dir`, one step at `cfg`.
Job spec_job(const test::TempDir& dir, const std::string& spec, const std::string& file, const std::string& tokenizer,
             float cfg) {
    Job job;
    job.model = dir.file(file);
    EXPECT_TRUE(test::write_random_model(std::string(KILN_FIXTURES_DIR) + "/" + spec, job.model).ok()) << spec;
    job.tokenizer = tokenizer;
    job.steps = 1;
    job.cfg = cfg;
    return job;
}

// The tiny CLIP tokenizer and the tiny T5 vocabulary (the Flux and SD3 jobs).
std::string clip_and_t5_tokenizers() {
    return "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer,t5xxl=" + std::string(KILN_GOLDEN_DIR) +
           "/pipeline/flux_tiny/tokenizer_2";
}

// Flux at full width (tests/fixtures/flux_medium.spec: a 3072-wide DiT with
// 2 double and 4 single blocks, a 2-layer 4096-wide T5-XXL, CLIP-L and the
// 16-channel autoencoder, 4 GB as F16, in ComfyUI's all-in-one names): the
// same invariants as the UNet families, its DiT cut at every block.
Job flux_job(const test::TempDir& dir) {
    return spec_job(dir, "flux_medium.spec", "flux_medium.safetensors", clip_and_t5_tokenizers(), 1.0f);
}

// A DiT job's invariants: the unconstrained run in one segment; budgets of
// `fractions` of its peak (a half and a third unless a DiT's blocks are too
// large a share of it) cut the DiT and give the same image, the managed peak
// within the budget and kiln plan agreeing; 0.4% of the peak is below the
// DiT's largest block and is one out-of-memory error. A video job's every
// frame is compared. `te_cut_in`: how many of those budgets must also cut
// the (first) text encoder.
void expect_same_image_under_shrinking_budgets(const Job& base, std::vector<double> fractions = {0.5, 0.3},
                                               int te_cut_in = 0) {
    auto reference = run_job(base);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_EQ(reference->segments, 1);
    EXPECT_EQ(reference->frames, std::max(1, base.video_frames));
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    int segmented = 0, most_segments = 1, failed = 0, te_segmented = 0;
    fractions.push_back(0.004);
    for (double fraction : fractions) {
        Job job = base;
        job.budget = mib(peak_mib * fraction);
        SCOPED_TRACE("budget " + job.budget);
        auto r = expect_plan_matches_run(job);
        if (!r.ok()) {
            ++failed;
            EXPECT_EQ(r.error().message.rfind("out of memory: ", 0), 0u) << r.error().message;
            if (fraction > 0.004) ADD_FAILURE() << r.error().message;
            continue;
        }
        EXPECT_EQ(r->frames, reference->frames);
        EXPECT_EQ(r->pixels, reference->pixels) << "(a) the image differs from the unconstrained run";
        ASSERT_TRUE(r->budget.has_value());
        EXPECT_LE(r->peak, *r->budget) << "(b) managed peak above the budget";
        EXPECT_GE(r->segments, most_segments) << "(c) fewer segments under a smaller budget";
        most_segments = std::max(most_segments, r->segments);
        segmented += r->segments > 1;
        te_segmented += r->te_segments > 1;
    }
    EXPECT_GE(segmented, 2) << "every budget but the smallest must cut the DiT";
    EXPECT_GE(te_segmented, te_cut_in) << "these budgets must cut the text encoder too";
    EXPECT_EQ(failed, 1) << "only the smallest budget is below the DiT's largest block";
}

TEST_F(Memory, FluxSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(flux_job(dir));
}

// Quantized weights under the memory system, converted once to GGUF as a
// user would (-M convert --type): a budget that cuts the DiT gives the image
// of the type's own unconstrained run.
void expect_quantized_run_under_budget(ggml_type type) {
    test::TempDir dir;
    Job job = flux_job(dir);
    {
        auto source = io::ModelFile::open({job.model});
        ASSERT_TRUE(source.ok()) << source.error().message;
        const std::string gguf = dir.file(std::string("flux_medium-") + ggml_type_name(type) + ".gguf");
        io::GgufWriteOptions write;
        write.type = type;
        ASSERT_TRUE(io::write_gguf(*source, gguf, write).ok());
        job.model = gguf;
    }
    auto whole = run_job(job);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    job.budget = mib(static_cast<double>(whole->peak) / (1024.0 * 1024.0) * 0.4);
    auto cut = run_job(job);
    ASSERT_TRUE(cut.ok()) << cut.error().message;
    EXPECT_EQ(cut->pixels, whole->pixels);
    EXPECT_GT(cut->segments, 1);
    EXPECT_LE(cut->peak, *cut->budget);
}

TEST_F(Memory, FluxQ8RunsUnderABudget) { expect_quantized_run_under_budget(GGML_TYPE_Q8_0); }

TEST_F(Memory, FluxQ4KRunsUnderABudget) { expect_quantized_run_under_budget(GGML_TYPE_Q4_K); }

// Z-Image-Turbo at full width (tests/fixtures/z_image_medium.spec: the
// 3840-wide DiT with its 2 + 2 refiners and 4 of its 30 layers, Qwen3-4B's
// widths with 4 layers, the 16-channel autoencoder, 3.9 GB as F16, in one
// all-in-one file): the same invariants, the DiT cut at every layer and the
// LLM at every decoder layer.
TEST_F(Memory, ZImageSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(
        spec_job(dir, "z_image_medium.spec", "z_image_turbo_medium.safetensors",
                 "llm=" + std::string(KILN_GOLDEN_DIR) + "/pipeline/z_image_tiny/tokenizer", 1.0f));
}

// FLUX.2 klein 4B at full width (tests/fixtures/flux2_klein_medium.spec:
// the 3072-wide DiT with its shared modulation and 1 double + 10 single
// blocks, a Qwen3 at Qwen3-4B's width with the 28 layers klein's
// hidden_states 27 reads, FLUX.2's autoencoder; 3.6 GB as F16, in one
// all-in-one file): the same invariants, the DiT cut at every block and the
// LLM at every layer.
TEST_F(Memory, Flux2KleinSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(
        spec_job(dir, "flux2_klein_medium.spec", "flux-2-klein-4b_medium.safetensors",
                 "llm=" + std::string(KILN_GOLDEN_DIR) + "/pipeline/z_image_tiny/tokenizer", 1.0f));
}

// FLUX.2 [dev] at full width (tests/fixtures/flux2_dev_medium.spec: the
// 6144-wide DiT with guidance_in and 1 double + 2 single blocks, a Mistral of
// Mistral Small's width with the 31 layers dev's hidden_states 30 reads,
// FLUX.2's autoencoder; 6.1 GB as F16, in one all-in-one file, the tiny
// Tekken tokenizer): the same invariants, the context zero-padded to 512.
// Its double block and the modulation computed with it are half the DiT, so
// the budgets are 75% and 60% of the peak.
TEST_F(Memory, Flux2DevSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(
        spec_job(dir, "flux2_dev_medium.spec", "flux2-dev_medium.safetensors",
                 "llm=" + std::string(KILN_GOLDEN_DIR) + "/pipeline/flux2_dev_tiny/tokenizer", 1.0f),
        {0.75, 0.6});
}

// Qwen-Image at full width (tests/fixtures/qwen_image_medium.spec: the
// 3072-wide DiT with 2 of its 60 blocks, Qwen2.5-VL-7B's text model at its
// full width, heads and FFN with 2 of its 28 layers and a 1024-token
// vocabulary instead of 152064 (the tiny fixture tokenizer's ids fit in it;
// the vocabulary only sizes the embedding, of which one row per token is
// read), and the full Wan 2.1 VAE; 2.6 GB as F16, in ComfyUI's all-in-one
// names). The same invariants: the DiT cut after each block, the LLM after
// each layer. The unconstrained peak holds both modules' weights (the LLM's
// are two thirds of the DiT's), and each DiT block with its compute is 30%
// of it, so the budgets are 42% of the peak (the LLM whole, the DiT in 2
// segments) and 35% (both in 2 segments). Not 50%: there the DiT's two
// segments do not both fit, the run keeps less of the first one's weights
// than the room left and peaks at the LLM's 0.91 GiB, where kiln plan
// forecasts the whole budget (1.13 GiB) as streamed weights kept: 24% above
// the run, past the 15% expect_plan_matches_run allows (on the safe side).
TEST_F(Memory, QwenImageSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(
        spec_job(dir, "qwen_image_medium.spec", "qwen_image_medium.safetensors",
                 "llm=" + std::string(KILN_GOLDEN_DIR) + "/pipeline/z_image_tiny/tokenizer", 1.0f),
        {0.42, 0.35});
}

// Wan 2.1 text-to-video at full width (tests/fixtures/wan_medium.spec: the
// 1.3B DiT, 1536 wide in 12 heads with an FFN of 8960, with 12 of its 30
// blocks; umT5-XXL at its full width (4096, 64 heads of 64, FFN 10240, a
// position table in every layer) with 2 of its 24 layers and a 512-token
// vocabulary (the tiny SentencePiece model's 500 pieces fit in it); the full
// Wan 2.1 VAE; 2.2 GB as F16, in ComfyUI-like all-in-one names): a clip of
// 5 frames (two latent frames of 8 x 8) at cfg 6, every frame the same under
// every budget, the DiT cut after each block and umT5 after each layer.
// Each umT5 layer is 372 MiB of weights, and its compute over 512 tokens 232
// MiB: its hungriest segment needs 620 MiB, more than a DiT of 2 blocks
// (227 MiB whole), which no budget that runs umT5 would cut; hence 12 blocks
// (1.09 GiB, 88.5 MiB each). The unconstrained peak (2127 MiB) holds both
// modules' weights (umT5's 740 MiB). Measured: at 52% and 47% of it the DiT
// runs in 2 segments and umT5 whole; at 43% (914 MiB, the run's peak 893
// MiB) and 38% (808 MiB, 804 MiB) both run in 2 segments. Not below 34%
// (725 MiB): kiln plan plans umT5's encode as a batch of the two prompts,
// whose hungriest segment needs 724 MiB, where the run encodes each prompt
// alone; at 32% (680 MiB) the plan says it does not fit and the run fits
// (peak 627 MiB); at 29% (617 MiB) the run fails too.
TEST_F(Memory, WanSameFramesUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    Job job = spec_job(dir, "wan_medium.spec", "wan_medium.safetensors",
                       "t5xxl=" + std::string(KILN_GOLDEN_DIR) + "/text/umt5_like_spiece.model", 6.0f);
    job.video_frames = 5;
    expect_same_image_under_shrinking_budgets(job, {0.43, 0.38}, 2);
}

// A small clip job on a medium Wan file: 5 frames, one step at cfg 6, umT5 on
// the CPU with the umT5-like tokenizer.
void make_small_clip(Job& job) {
    job.tokenizer = "t5xxl=" + std::string(KILN_GOLDEN_DIR) + "/text/umt5_like_spiece.model";
    job.cfg = 6.0f;
    job.steps = 1;
    job.video_frames = 5;
    job.te_on_cpu = true;
}

// Wan 2.2 A14B's two experts under one budget: tests/fixtures/wan_medium.spec
// with 4 of its DiT's blocks as the low-noise expert (with umT5 and the VAE,
// in its all-in-one file) and the same DiT in the original names as the
// high-noise one (a file of its own, so other weights), 403 MiB of weights
// each; umT5 on the CPU, so the device holds the experts alone. One step
// each (--steps 1 --high-noise-steps 1), cfg 6, a clip of 5 frames. At 70%
// of the unconstrained peak (which keeps both experts' copies) the budget
// holds one expert and its compute, not two: each still runs whole, the
// expert's copies evicted as the low-noise DiT's come in; at 30% each runs
// in segments. Every frame is the unconstrained run's, the managed peak
// within the budget and kiln plan predicting both experts' segments and the
// peak.
TEST_F(Memory, WanA14bExpertsTakeTurnsUnderOneBudget) {
    test::TempDir dir;
    std::ifstream spec(std::string(KILN_FIXTURES_DIR) + "/wan_medium.spec");
    std::string low, high, line;
    const std::string dit = "model.diffusion_model.";
    while (std::getline(spec, line)) {
        const size_t at = line.find("blocks.");
        if (line.rfind(dit, 0) == 0 && at != std::string::npos && std::stoi(line.substr(at + 7)) >= 4) continue;
        low += line + "\n";
        if (line.rfind(dit, 0) == 0) high += line.substr(dit.size()) + "\n";
    }
    Job job;
    job.model = dir.file("wan_low_noise.safetensors");
    job.high_noise_model = dir.file("wan_high_noise.safetensors");
    ASSERT_TRUE(test::write_random_model(dir.write("low.spec", low), job.model).ok());
    ASSERT_TRUE(test::write_random_model(dir.write("high.spec", high), job.high_noise_model).ok());
    make_small_clip(job);
    job.high_noise_steps = 1;
    auto reference = run_job(job);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_EQ(reference->segments, 1);
    EXPECT_EQ(reference->high_noise_segments, 1);  // it ran: an executor that never ran counts none
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    for (double fraction : {0.7, 0.3}) {
        Job cut = job;
        cut.budget = mib(peak_mib * fraction);
        SCOPED_TRACE("budget " + cut.budget);
        auto r = expect_plan_matches_run(cut);
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->pixels, reference->pixels) << "the clip differs from the unconstrained run";
        ASSERT_TRUE(r->budget.has_value());
        EXPECT_LE(r->peak, *r->budget) << "managed peak above the budget";
        if (fraction > 0.5) {
            EXPECT_EQ(r->segments, 1) << "room for one expert: each runs whole, in turn";
            EXPECT_EQ(r->high_noise_segments, 1);
        } else {
            EXPECT_GT(r->segments, 1);
            EXPECT_GT(r->high_noise_segments, 1);
        }
    }
}

// An image-to-video clip of a medium Wan file (`job.model`): 5 frames from
// a first frame (a VACE DiT's reference image), one step at cfg 6, umT5 on the CPU, unconstrained and at
// `fraction` (40%) of that run's peak, where the DiT must run in segments: the same
// frames, the managed peak within the budget, kiln plan agreeing.
void expect_image_to_video_under_a_cut(Job job, double fraction = 0.4) {
    job.first_frame = true;
    make_small_clip(job);
    auto reference = run_job(job);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_EQ(reference->segments, 1);
    Job cut = job;
    cut.budget = mib(static_cast<double>(reference->peak) / (1024.0 * 1024.0) * fraction);
    auto r = expect_plan_matches_run(cut);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->pixels, reference->pixels) << "the clip differs from the unconstrained run";
    ASSERT_TRUE(r->budget.has_value());
    EXPECT_LE(r->peak, *r->budget) << "managed peak above the budget";
    EXPECT_GT(r->segments, 1);
}

// Wan 2.1 image-to-video under one budget: tests/fixtures/wan_medium.spec's
// DiT with 4 of its blocks made an I2V DiT (36 input planes, img_emb over
// the 32-wide rows of the Wan goldens' tiny CLIP vision, k_img, v_img and
// norm_k_img in every cross-attention: 487 MiB of weights), umT5 on the
// CPU. A clip of 5 frames from a first frame at cfg 6, one step: every
// frame the unconstrained run's at 40% of its peak, where the DiT runs in
// segments that each read the image context (at 50% too), the managed peak
// within the budget and kiln plan agreeing. Not 30%: the first block's
// segment carries the embedders (147 MiB of weights), more than that
// budget, and kiln plan says so as the run does.
TEST_F(Memory, WanI2vSameFramesUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    std::ifstream spec(std::string(KILN_FIXTURES_DIR) + "/wan_medium.spec");
    std::string i2v, line;
    const std::string dit = "model.diffusion_model.";
    while (std::getline(spec, line)) {
        const size_t at = line.find("blocks.");
        if (line.rfind(dit, 0) == 0 && at != std::string::npos && std::stoi(line.substr(at + 7)) >= 4) continue;
        if (line == dit + "patch_embedding.weight F16 1536 16 1 2 2")
            line = dit + "patch_embedding.weight F16 1536 36 1 2 2";
        i2v += line + "\n";
        const size_t norm = line.find(".cross_attn.norm_k.weight");
        if (line.rfind(dit, 0) == 0 && norm != std::string::npos) {
            const std::string stem = line.substr(0, norm) + ".cross_attn.";
            for (const char* proj : {"k_img", "v_img"})
                i2v += stem + proj + ".weight F16 1536 1536\n" + stem + proj + ".bias F16 1536\n";
            i2v += stem + "norm_k_img.weight F16 1536\n";
        }
    }
    for (const char* part :
         {"proj.0.weight F16 32", "proj.0.bias F16 32", "proj.1.weight F16 32 32", "proj.1.bias F16 32",
          "proj.3.weight F16 1536 32", "proj.3.bias F16 1536", "proj.4.weight F16 1536", "proj.4.bias F16 1536"})
        i2v += dit + "img_emb." + part + "\n";
    Job job;
    job.model = dir.file("wan_i2v_medium.safetensors");
    ASSERT_TRUE(test::write_random_model(dir.write("i2v.spec", i2v), job.model).ok());
    job.clip_vision = std::string(KILN_GOLDEN_DIR) + "/pipeline/wan_tiny/clip_vision.safetensors";
    expect_image_to_video_under_a_cut(job);
}

// Wan 2.1 VACE under one budget: tests/fixtures/wan_medium.spec's DiT with
// 4 of its blocks and two VACE blocks of the same layout (vace_blocks.0 with
// before_proj, both with after_proj: after main blocks 0 and 2), and
// vace_patch_embedding over 96 planes; umT5 on the CPU. A clip of 5 frames
// from 3 control frames and a reference image (-i), one step at cfg 6: the
// context's two clips encoded, its reference frame in every evaluation and
// dropped before the decode. At 50% of the unconstrained peak the DiT runs
// in segments, each VACE block with its main block and the VACE stream
// carried across the cuts; every frame is the unconstrained run's and kiln
// plan agrees. Not 40%: the first segment holds the embedders, block 0 and
// VACE block 0 (236 MiB of weights), more than that budget leaves, and kiln
// plan says so as the run does.
TEST_F(Memory, WanVaceSameFramesUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    std::ifstream spec(std::string(KILN_FIXTURES_DIR) + "/wan_medium.spec");
    std::string vace, line;
    const std::string dit = "model.diffusion_model.", block0 = dit + "blocks.0.";
    while (std::getline(spec, line)) {
        const size_t at = line.find("blocks.");
        if (line.rfind(dit, 0) == 0 && at != std::string::npos && std::stoi(line.substr(at + 7)) >= 4) continue;
        vace += line + "\n";
        if (line.rfind(block0, 0) == 0) {
            for (const char* n : {"0.", "1."}) vace += dit + "vace_blocks." + n + line.substr(block0.size()) + "\n";
        }
    }
    for (const char* part : {"vace_blocks.0.before_proj", "vace_blocks.0.after_proj", "vace_blocks.1.after_proj"})
        vace += dit + part + ".weight F16 1536 1536\n" + dit + part + ".bias F16 1536\n";
    vace += dit + "vace_patch_embedding.weight F16 1536 96 1 2 2\n" + dit + "vace_patch_embedding.bias F16 1536\n";
    Job job;
    job.model = dir.file("wan_vace_medium.safetensors");
    ASSERT_TRUE(test::write_random_model(dir.write("vace.spec", vace), job.model).ok());
    job.control_frames = 3;
    expect_image_to_video_under_a_cut(job, 0.5);
}

// Wan 2.2 TI2V-5B's job under one budget: tests/fixtures/wan_medium.spec's
// DiT with 4 of its blocks on Wan 2.2's 48-channel latent (patch_embedding
// and head.head for 48 channels), umT5 (on the CPU) and the full-size Wan 2.2
// VAE (tests/fixtures/wan22_vae.spec, under vae.) in place of Wan 2.1's. A
// clip of 5 frames at 64x64 from a first frame, one step at cfg 6: the
// image's latent kept as the first latent frame, its tokens at timestep 0
// in every segment. At 40% of the unconstrained peak the DiT runs in
// segments; every frame is the unconstrained run's and kiln plan agrees.
TEST_F(Memory, WanTi2vSameFramesUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    std::ifstream spec(std::string(KILN_FIXTURES_DIR) + "/wan_medium.spec");
    std::ifstream vae(std::string(KILN_FIXTURES_DIR) + "/wan22_vae.spec");
    std::string ti2v, line;
    const std::string dit = "model.diffusion_model.";
    while (std::getline(spec, line)) {
        const size_t at = line.find("blocks.");
        if (line.rfind("vae.", 0) == 0) continue;
        if (line.rfind(dit, 0) == 0 && at != std::string::npos && std::stoi(line.substr(at + 7)) >= 4) continue;
        if (line == dit + "patch_embedding.weight F16 1536 16 1 2 2")
            line = dit + "patch_embedding.weight F16 1536 48 1 2 2";
        if (line == dit + "head.head.weight F16 64 1536") line = dit + "head.head.weight F16 192 1536";
        if (line == dit + "head.head.bias F16 64") line = dit + "head.head.bias F16 192";
        ti2v += line + "\n";
    }
    while (std::getline(vae, line)) {
        if (!line.empty() && line[0] != '#') ti2v += "vae." + line + "\n";
    }
    Job job;
    job.model = dir.file("wan_ti2v_medium.safetensors");
    ASSERT_TRUE(test::write_random_model(dir.write("ti2v.spec", ti2v), job.model).ok());
    expect_image_to_video_under_a_cut(job);
}

// SD3.5 Large at full width (tests/fixtures/sd35_large_medium.spec: the
// 2432-wide MMDiT with 4 of its 38 joint blocks and a 64 x 64 position
// embedding, CLIP-L, CLIP-G and T5-XXL at their widths with 2 layers each,
// SD3's VAE; 2.7 GB as F16, in Stability's all-in-one layout): the same
// invariants under CFG (the negative prompt's pass too), the MMDiT cut at
// every joint block.
TEST_F(Memory, Sd35LargeSameImageUnderEveryBudgetAndThePlanAgrees) {
    test::TempDir dir;
    expect_same_image_under_shrinking_budgets(
        spec_job(dir, "sd35_large_medium.spec", "sd3.5_large_medium.safetensors", clip_and_t5_tokenizers(), 4.5f));
}

// Step caches under the memory system: a condition-level cache (ucache on
// the default model) and a block-level one (dbcache on the full-width Flux,
// whose block stages are graphs of their own, cut like the whole one and
// planned by kiln plan) give the unconstrained run's image under every
// budget, and they do skip.
TEST_F(Memory, ConditionCacheSameImageUnderEveryBudget) {
    Job job;
    job.steps = 10;
    job.cache = pipeline::make_step_cache_options("ucache", "").value();
    auto reference = run_job(job);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_GT(reference->cache_skipped, 0);
    sweep_budgets(job, 0.9, 0.7, 2);
}

TEST_F(Memory, BlockCacheSameImageUnderEveryBudget) {
    test::TempDir dir;
    Job job = flux_job(dir);
    job.steps = 3;
    // One warmup step computes; the threshold lets the next two reuse the middle blocks.
    job.cache = pipeline::make_step_cache_options("dbcache", "Fn=1,Bn=1,warmup=1,threshold=100").value();
    auto reference = run_job(job);
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    EXPECT_EQ(reference->cache_skipped, 2);
    const double peak_mib = static_cast<double>(reference->peak) / (1024.0 * 1024.0);
    // Its largest block needs 0.36 of this peak.
    for (double fraction : {0.5, 0.4}) {
        Job cut = job;
        cut.budget = mib(peak_mib * fraction);
        SCOPED_TRACE("budget " + cut.budget);
        auto r = expect_plan_matches_run(cut);  // kiln plan plans the stages: the last, cached one's segments
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_EQ(r->pixels, reference->pixels) << "the image differs from the unconstrained run";
        EXPECT_LE(r->peak, *r->budget) << "managed peak above the budget";
        EXPECT_EQ(r->cache_skipped, 2);
    }
}

}  // namespace
}  // namespace kiln
