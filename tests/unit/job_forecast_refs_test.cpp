// kiln plan's forecast (pipeline/job_forecast.h) for what a job with
// reference images runs, and for CFG's passes run one after the other, on
// the tiny golden models: Kontext's -r references VAE-encoded and attended
// to by the DiT; Qwen-Image-Edit's references also through the vision tower
// into a longer LLM prompt; and Qwen-Image's empty negative prompt, whose
// context is shorter than the prompt's, so that the DiT runs two passes of
// one a step and streams its weights for each.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "golden.h"
#include "image/image.h"
#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"
#include "pipeline/job_forecast.h"
#include "pipeline/prompt_images.h"
#include "pipeline/request.h"
#include "util/format.h"

namespace kiln::pipeline {
namespace {

using test::golden_path;

std::unique_ptr<Model> load(const ModelPaths& paths, ModelOptions options = test::golden_model_options()) {
    options.plan_only = true;
    auto model = Model::load(paths, options);
    if (!model.ok()) throw std::runtime_error(model.error().message);
    return std::move(model).value();
}

// The job's forecast as kiln plan makes it (kiln_c.cpp's kiln_plan).
JobForecast forecast(Model& model, const GenerationRequest& r, bool cfg) {
    auto job = validate_request(model, r);
    if (!job.ok()) throw std::runtime_error(job.error().message);
    auto passes = passes_of(r, *job);
    if (!passes.ok()) throw std::runtime_error(passes.error().message);
    auto f = forecast_job(model, job->width, job->height, cfg, false, &r.prompt, *passes, r.negative_prompt);
    if (!f.ok()) throw std::runtime_error(f.error().message);
    return std::move(f).value();
}

const ModuleForecast* find(const JobForecast& f, const std::string& module, const std::string& pass = "") {
    auto m = std::find_if(f.modules.begin(), f.modules.end(),
                          [&](const ModuleForecast& x) { return x.module == module && x.pass == pass; });
    return m == f.modules.end() ? nullptr : &*m;
}

size_t count(const JobForecast& f, const std::string& module, const std::string& pass) {
    return static_cast<size_t>(std::count_if(f.modules.begin(), f.modules.end(), [&](const ModuleForecast& x) {
        return x.module == module && x.pass == pass;
    }));
}

// ---- Kontext ----------------------------------------------------------------

ModelPaths flux_parts() {
    const std::string part = golden_path("pipeline/flux_tiny/");
    ModelPaths paths;
    paths.diffusion_model = part + "flux_dit.safetensors";
    paths.vae = part + "ae.safetensors";
    paths.clip_l = part + "clip_l.safetensors";
    paths.t5xxl = part + "t5xxl.safetensors";
    paths.tokenizer = "clip_l=" + std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    return paths;
}

GenerationRequest flux_job() {
    GenerationRequest r;
    r.prompt = "a red cat on a blue square";
    r.width = r.height = 32;
    r.steps = 4;
    return r;
}

// Each reference is VAE-encoded at its size (sd-cli's auto-resize to about
// the output's area in multiples of the model's stride, 4 here: 40x72 to
// 24x44 and 24x40 kept for a 32x32 job; without it, as given), and the DiT
// attends to its latent's tokens beside the image's.
TEST(JobForecastReferences, KontextPlansEachReferenceEncodeAndTheDitWithItsTokens) {
    auto model = load(flux_parts());
    ASSERT_EQ(model->size_stride(), 4);
    GenerationRequest r = flux_job();
    const JobForecast plain = forecast(*model, r, false);
    EXPECT_EQ(count(plain, "vae", "reference image encode"), 0u);

    // The VAE encoder's compute at w x h pixels, as the plan measures it.
    auto encode_at = [&](int w, int h) -> uint64_t {
        VaeGraph g = build_vae_encode_graph(*model, w, h, nullptr);
        auto f = model->vae_compute().forecast(*g.session, g.out);
        return f.ok() ? f->whole_workspace : 0;
    };
    r.ref_images = {image::make_image(40, 72, 3), image::make_image(24, 40, 3)};
    const JobForecast with_refs = forecast(*model, r, false);
    ASSERT_EQ(count(with_refs, "vae", "reference image encode"), 2u) << describe_forecast(*model, with_refs);
    std::vector<uint64_t> encodes;
    for (const ModuleForecast& m : with_refs.modules) {
        if (m.pass == "reference image encode") encodes.push_back(m.run.whole_workspace);
    }
    EXPECT_EQ(encodes, (std::vector<uint64_t>{encode_at(24, 44), encode_at(24, 40)}));
    const ModuleForecast* dit = find(with_refs, "diffusion");
    const ModuleForecast* plain_dit = find(plain, "diffusion");
    ASSERT_TRUE(dit && plain_dit);
    // The references' latent tokens join the image's in every block's attention.
    EXPECT_GT(dit->run.whole_workspace, plain_dit->run.whole_workspace);
    const std::string text = describe_forecast(*model, with_refs);
    EXPECT_NE(text.find("  vae (reference image encode) on CPU: "), std::string::npos) << text;

    r.auto_resize_ref_images = false;  // --disable-auto-resize-ref-image: encoded as given
    r.ref_images = {image::make_image(40, 72, 3)};
    const JobForecast as_given = forecast(*model, r, false);
    const ModuleForecast* encode = find(as_given, "vae", "reference image encode");
    ASSERT_NE(encode, nullptr);
    EXPECT_EQ(encode->run.whole_workspace, encode_at(40, 72));
    EXPECT_GT(encode_at(40, 72), encode_at(24, 40));
    const ModuleForecast* larger_dit = find(as_given, "diffusion");
    ASSERT_NE(larger_dit, nullptr);
    EXPECT_GT(larger_dit->run.whole_workspace, plain_dit->run.whole_workspace);
}

// ---- Qwen-Image-Edit ----------------------------------------------------------

constexpr const char* kEditPrompt = "make the cat blue";

std::string edit_part(const std::string& name) { return golden_path("pipeline/qwen_image_edit_tiny/" + name); }
std::string image_part(const std::string& name) { return golden_path("pipeline/qwen_image_tiny/" + name); }

ModelPaths edit_parts() {
    ModelPaths paths;
    paths.diffusion_model = image_part("qwen_image_dit.safetensors");
    paths.vae = image_part("qwen_image_vae.safetensors");
    paths.llm = edit_part("qwen_2.5_vl.safetensors");
    paths.llm_vision = edit_part("qwen_2.5_vl_vision.safetensors");
    paths.tokenizer = "llm=" + edit_part("tokenizer");
    return paths;
}

GenerationRequest edit_job() {
    GenerationRequest r;
    r.prompt = kEditPrompt;
    r.width = 64;
    r.height = 48;
    r.steps = 3;
    // The fixture job's 64x48 reference: 448x308 in the vision tower, a
    // merged grid of 11 x 16 rows (QwenImageEdit.VisionRowsAreTheReferences).
    r.ref_images = {image::make_image(64, 48, 3)};
    return r;
}

// The vision tower runs once per reference, the LLM reads its rows in the
// prompt (and the negative's), and the DiT's contexts are that much longer.
TEST(JobForecastReferences, QwenImageEditPlansTheVisionTowerAndTheLongerPrompts) {
    auto model = load(edit_parts());
    ASSERT_TRUE(model->has_vision());
    const std::string vision = model->vision_compute().module();
    EXPECT_EQ(vision, "te.llm_vision");
    GenerationRequest r = edit_job();
    const JobForecast f = forecast(*model, r, true);
    const std::string text = describe_forecast(*model, f);
    ASSERT_EQ(count(f, vision, "reference image encode"), 1u) << text;
    ASSERT_EQ(count(f, "vae", "reference image encode"), 1u) << text;
    EXPECT_NE(text.find("  te.llm_vision (reference image encode) on CPU: "), std::string::npos) << text;

    // The prompts' contexts: each with "Picture 1: " and the image's 176
    // pad tokens, less the edit system turn.
    const TextEncoder& llm = model->text_encoders().front();
    PromptImage grid;
    grid.grid_rows = 11;
    grid.grid_cols = 16;
    const LlmImagePrompt prompt = llm_image_prompt(model->llm_tokenizer(), *llm.use, kEditPrompt, {grid});
    const LlmImagePrompt negative = llm_image_prompt(model->llm_tokenizer(), *llm.use, "", {grid});
    const auto context_of = [](const LlmImagePrompt& p) { return static_cast<int64_t>(p.ids.size()) - p.dropped; };
    ASSERT_TRUE(f.cfg_contexts.has_value()) << text;
    EXPECT_EQ(f.cfg_contexts->first, context_of(prompt));
    EXPECT_EQ(f.cfg_contexts->second, context_of(negative));
    const std::string edit_prompt = kEditPrompt;
    EXPECT_GE(f.cfg_contexts->first, context_length(*model, &edit_prompt) + 11 * 16);

    // Against the same job without its reference: no tower, a shorter LLM
    // and a DiT with fewer tokens.
    GenerationRequest no_refs = r;
    no_refs.ref_images.clear();
    const JobForecast plain = forecast(*model, no_refs, true);
    EXPECT_EQ(count(plain, vision, "reference image encode"), 0u);
    const ModuleForecast *te = find(f, "te"), *plain_te = find(plain, "te");
    const ModuleForecast *dit = find(f, "diffusion"), *plain_dit = find(plain, "diffusion");
    ASSERT_TRUE(te && plain_te && dit && plain_dit);
    EXPECT_GT(te->run.whole_workspace, plain_te->run.whole_workspace);
    EXPECT_GT(dit->run.whole_workspace, plain_dit->run.whole_workspace);
}

// ---- Qwen-Image's CFG -----------------------------------------------------------

ModelPaths qwen_image_parts() {
    ModelPaths paths;
    paths.diffusion_model = image_part("qwen_image_dit.safetensors");
    paths.llm = image_part("qwen_2.5_vl.safetensors");
    paths.vae = image_part("qwen_image_vae.safetensors");
    paths.tokenizer = "llm=" + image_part("tokenizer");
    return paths;
}

GenerationRequest qwen_image_job() {
    GenerationRequest r;
    r.prompt = "a photo of a cat sitting on a red sofa";
    r.width = 64;
    r.height = 48;
    r.steps = 3;
    return r;
}

// The default empty negative prompt is shorter under the chat template than
// the prompt: the joint-attention DiT cannot batch the two, so a step runs
// two passes of one, each planned at the longer context's figures (the same
// graph as a job without CFG).
TEST(JobForecastCfg, QwenImageEmptyNegativePlansTwoPassesOfOne) {
    auto model = load(qwen_image_parts());
    GenerationRequest r = qwen_image_job();
    const JobForecast f = forecast(*model, r, true);
    const std::string text = describe_forecast(*model, f);
    const std::string empty;
    ASSERT_TRUE(f.cfg_contexts.has_value()) << text;
    EXPECT_EQ(f.cfg_contexts->first, context_length(*model, &r.prompt));
    EXPECT_EQ(f.cfg_contexts->second, context_length(*model, &empty));
    EXPECT_GT(f.cfg_contexts->first, f.cfg_contexts->second);
    const ModuleForecast* dit = find(f, "diffusion");
    ASSERT_NE(dit, nullptr);
    EXPECT_TRUE(dit->separate_cfg);
    EXPECT_EQ(dit->runs_per_step, 2);
    const ModuleForecast* single = find(forecast(*model, r, false), "diffusion");
    ASSERT_NE(single, nullptr);
    EXPECT_EQ(dit->run.whole_workspace, single->run.whole_workspace);
    EXPECT_NE(text.find("diffusion on CPU: whole graph, CFG passes one at a time (the prompt's " +
                        std::to_string(f.cfg_contexts->first) + " context tokens and the negative prompt's " +
                        std::to_string(f.cfg_contexts->second) + "), compute "),
              std::string::npos)
        << text;

    // A negative prompt as long as the prompt batches with it.
    r.negative_prompt = r.prompt;
    const JobForecast batched = forecast(*model, r, true);
    EXPECT_FALSE(batched.cfg_contexts.has_value());
    const ModuleForecast* batch = find(batched, "diffusion");
    ASSERT_NE(batch, nullptr);
    EXPECT_FALSE(batch->separate_cfg);
    EXPECT_EQ(batch->runs_per_step, 1);
    EXPECT_GT(batch->run.whole_workspace, dit->run.whole_workspace);
}

// `r`'s forecast with the DiT's params on disk and RAM's budget just above
// the job's peak there: room for the job's compute, none for the page cache
// to keep the DiT's file (job_forecast.cpp's kPageCacheShare). `text`: its
// description.
JobForecast forecast_streaming_from_disk(const GenerationRequest& r, std::string& text) {
    // The file's own weight types: weights converted for the job would be RAM
    // of their own, which past that room does not fit at all.
    ModelOptions options;
    options.threads = 1;
    options.placement.params_backend = {{"diffusion", "disk"}};
    uint64_t cpu_peak = 0;
    {
        auto model = load(qwen_image_parts(), options);
        for (const DeviceForecast& d : forecast(*model, r, true).devices) {
            if (d.device == model->host_ledger().device_name()) cpu_peak = d.peak;
        }
    }
    EXPECT_GT(cpu_peak, 0u);
    options.placement.budgets.per_device_gib["CPU"] = 1.05 * static_cast<double>(cpu_peak) / (1024.0 * 1024 * 1024);
    auto model = load(qwen_image_parts(), options);
    EXPECT_TRUE(model->host_ledger().budget().has_value()) << "another model holds the CPU's books";
    JobForecast f = forecast(*model, r, true);
    text = describe_forecast(*model, f);
    return f;
}

// Every run reads the DiT's weights from disk: twice a step with the passes
// apart, once with the batch of two.
TEST(JobForecastCfg, QwenImageTwoPassesReadTheWeightsFromDiskTwiceAStep) {
    GenerationRequest r = qwen_image_job();
    std::string text;
    const JobForecast apart = forecast_streaming_from_disk(r, text);
    const ModuleForecast* dit = find(apart, "diffusion");
    ASSERT_NE(dit, nullptr);
    ASSERT_TRUE(apart.fits) << text;
    ASSERT_TRUE(apart.streams_from_disk) << text;
    EXPECT_TRUE(dit->separate_cfg);
    EXPECT_EQ(dit->streamed_from_disk, dit->run.weight_bytes);
    EXPECT_EQ(apart.streamed_per_step, 2 * dit->run.weight_bytes);
    EXPECT_NE(text.find("reads its " + human_bytes(dit->run.weight_bytes) + " of weights from disk twice a step"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("fits: only by streaming: every step reads " + human_bytes(dit->run.weight_bytes) +
                        " of the diffusion model's weights from disk again, once for each of CFG's two passes (" +
                        human_bytes(2 * dit->run.weight_bytes) + ")"),
              std::string::npos)
        << text;

    r.negative_prompt = r.prompt;
    const JobForecast batched = forecast_streaming_from_disk(r, text);
    const ModuleForecast* batch = find(batched, "diffusion");
    ASSERT_NE(batch, nullptr);
    ASSERT_TRUE(batched.fits && batched.streams_from_disk) << text;
    EXPECT_FALSE(batch->separate_cfg);
    EXPECT_EQ(batch->run.weight_bytes, dit->run.weight_bytes);
    EXPECT_EQ(batched.streamed_per_step, batch->run.weight_bytes);
    EXPECT_EQ(text.find("twice a step"), std::string::npos) << text;
}

}  // namespace
}  // namespace kiln::pipeline
