// A whole Flux.1-dev text-to-image job on the tiny random Flux of
// training/make_flux_pipeline_fixtures.py (BFL's parts: DiT, ae, CLIP-L, T5
// with its unigram tokenizer beside it) against the PyTorch references run
// end to end: T5 and CLIP conditioning, the flow schedule with BFL's
// resolution shift, the DiT with distilled guidance, Euler, the decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "flux_tiny.h"
#include "golden.h"
#include "image/image_io.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/schedulers.h"
#include "test_files.h"
#include "text/t5_tokenizer.h"

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;
using test::relative_error;

using test::flux_tiny_part;
using test::flux_tiny_parts;

// Largest difference between two images of the same size (255 when they differ in size).
int largest_pixel_difference(const image::Image& a, const image::Image& b) {
    if (a.width != b.width || a.height != b.height || a.pixels.size() != b.pixels.size()) return 255;
    int worst = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) worst = std::max(worst, std::abs(a.pixels[i] - b.pixels[i]));
    return worst;
}

class FluxPipeline : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ModelOptions options;
        options.weight_type = GGML_TYPE_F32;  // the reference computes with the stored weights widened
        options.threads = 1;
        auto loaded = Model::load(flux_tiny_parts(), options);
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        model_ = std::move(loaded).value().release();
        auto io = io::ModelFile::open({golden_path("pipeline/flux_tiny_txt2img.safetensors")});
        ASSERT_TRUE(io.ok()) << io.error().message;
        io_ = new io::ModelFile(std::move(io).value());
    }
    static void TearDownTestSuite() {
        delete model_;
        delete io_;
    }

    static GenerationRequest job() {
        GenerationRequest r;
        r.prompt = io_->metadata_string("prompt", "");
        r.width = r.height = 32;
        r.seed = 11;
        r.steps = 4;
        return r;
    }

    static Model* model_;
    static io::ModelFile* io_;
};
Model* FluxPipeline::model_ = nullptr;
io::ModelFile* FluxPipeline::io_ = nullptr;

TEST_F(FluxPipeline, IsFluxDevWithItsDefaults) {
    ASSERT_NE(model_, nullptr);
    EXPECT_EQ(model_->family_label(), "Flux.1-dev");
    EXPECT_EQ(model_->prediction(), Prediction::Flow);
    EXPECT_EQ(model_->size_stride(), 4);  // the tiny ae's 2 times the patch 2
    EXPECT_EQ(model_->defaults().sampler, "euler");
    EXPECT_EQ(model_->defaults().cfg_scale, 1.0f);
    EXPECT_EQ(model_->defaults().steps, 20);
    EXPECT_TRUE(model_->diffusion().capabilities().guidance);
}

TEST_F(FluxPipeline, ConditioningIsT5AndThePooledClip) {
    ASSERT_NE(model_, nullptr);
    auto cond = encode_prompt(*model_, job().prompt, 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    const auto hidden = fixture_tensor(*io_, "t5.hidden");
    EXPECT_EQ(cond->tokens, 512);
    EXPECT_EQ(cond->width, 48);
    EXPECT_LT(relative_error(cond->hidden, hidden.values), 1e-4);
    EXPECT_LT(relative_error(cond->pooled, fixture_tensor(*io_, "clip.pooled").values), 1e-4);
    EXPECT_TRUE(cond->token_valid.empty());  // Flux-dev does not mask T5's padding
}

// --max-sequence-length: T5 encodes every prompt to that many tokens, at most
// the family's (BFL's 512 for dev); sd-cli always encodes 256, so 256 is the
// way to sd-cli's image (docs/sd_cli.md).
TEST_F(FluxPipeline, MaxSequenceLengthSetsT5sTokens) {
    ASSERT_NE(model_, nullptr);
    T5Options options;
    options.length = 256;
    auto shorter = encode_prompt(*model_, job().prompt, 0, options);
    ASSERT_TRUE(shorter.ok()) << shorter.error().message;
    EXPECT_EQ(shorter->tokens, 256);
    EXPECT_EQ(shorter->hidden.size(), size_t{256} * 48);
    GenerationRequest r = job();
    r.t5_options.length = 512;  // the family's own: the same image
    auto same = generate(*model_, r);
    auto reference = generate(*model_, job());
    ASSERT_TRUE(same.ok() && reference.ok());
    EXPECT_EQ(same->front().image.pixels, reference->front().image.pixels);
    r.t5_options.length = 256;
    auto sd_cli_like = generate(*model_, r);
    ASSERT_TRUE(sd_cli_like.ok()) << sd_cli_like.error().message;
    EXPECT_GT(largest_pixel_difference(sd_cli_like->front().image, reference->front().image), 0);
    r.t5_options.length = 513;
    auto longer = generate(*model_, r);
    ASSERT_FALSE(longer.ok());
    EXPECT_EQ(longer.error().message, "--max-sequence-length must be in [1, 512] for Flux.1-dev, got 513");
}

TEST_F(FluxPipeline, ScheduleIsTheShiftedFlowTable) {
    ASSERT_NE(model_, nullptr);
    const auto schedule = model_->noise_schedule(32, 32, 20, std::nullopt);
    EXPECT_TRUE(schedule->flow());
    auto sigmas = get_sigmas(SchedulerKind::Discrete, 4, *schedule);
    ASSERT_TRUE(sigmas.ok());
    const auto want = fixture_tensor(*io_, "sigmas");
    ASSERT_EQ(sigmas->size(), want.values.size());
    for (size_t i = 0; i < want.values.size(); ++i) EXPECT_NEAR((*sigmas)[i], want.values[i], 1e-6) << i;
}

TEST_F(FluxPipeline, TextToImageMatchesTheReferenceJob) {
    ASSERT_NE(model_, nullptr);
    auto images = generate(*model_, job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    ASSERT_EQ(images->size(), 1u);
    const image::Image& img = images->front().image;
    ASSERT_EQ(img.width, 32);
    EXPECT_LE(difference_from_reference(img, *io_), 1) << "largest pixel difference from the reference";
    // The image's parameters say what a Flux job used.
    const auto& extra = images->front().info.extra;
    EXPECT_NE(std::find(extra.begin(), extra.end(), std::pair<std::string, std::string>{"Guidance", "3.5"}),
              extra.end());
}

// Image-to-image on a flow model: the init latent a posterior sample at the
// seed, noise mixed in by sigma ((1 - sigma) x0 + sigma noise), the last
// int(steps * strength) + 1 steps (sd-cli's cut of the schedule).
TEST_F(FluxPipeline, ImageToImageMixesTheInitLatentBySigma) {
    ASSERT_NE(model_, nullptr);
    GenerationRequest r = job();
    r.init_image = test::fixture_image(*io_, "i2i.init_pixels");
    r.strength = 0.5f;
    auto images = generate(*model_, r);
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io_, "i2i.image"), 1);
}

TEST_F(FluxPipeline, SamplingMatchesTheReferenceStepByStep) {
    ASSERT_NE(model_, nullptr);
    Conditioning cond;
    cond.hidden = fixture_tensor(*io_, "t5.hidden").values;
    cond.tokens = 512;
    cond.width = 48;
    cond.y = fixture_tensor(*io_, "clip.pooled").values;
    const auto schedule = model_->noise_schedule(32, 32, 20, std::nullopt);
    SamplingRun run;
    run.latent_w = run.latent_h = 16;
    run.cfg_scale = 1.0f;
    run.sampler = SamplerKind::Euler;
    run.sigmas = fixture_tensor(*io_, "sigmas").values;
    run.schedule = schedule.get();
    run.guidance = 3.5f;
    std::vector<float> x = fixture_tensor(*io_, "noise").values;
    for (float& v : x) v *= run.sigmas.front();
    auto rng = make_rng(RngKind::Cuda, 11);
    // One step: the DiT's velocity at sigma 1 is (x - D) / sigma.
    SamplingRun one = run;
    one.sigmas = {run.sigmas[0], 0.0f};
    auto denoised = sample_latent(*model_, one, x, cond, nullptr, *rng);
    ASSERT_TRUE(denoised.ok()) << denoised.error().message;
    std::vector<float> velocity(x.size());
    for (size_t i = 0; i < x.size(); ++i) velocity[i] = (x[i] - (*denoised)[i]) / run.sigmas[0];
    EXPECT_LT(relative_error(velocity, fixture_tensor(*io_, "velocity0").values), 1e-4);
    auto latent = sample_latent(*model_, run, x, cond, nullptr, *rng);
    ASSERT_TRUE(latent.ok()) << latent.error().message;
    EXPECT_LT(relative_error(*latent, fixture_tensor(*io_, "latent").values), 1e-4);
}

}  // namespace
}  // namespace kiln::pipeline

namespace kiln::pipeline {
namespace {

using test::difference_from_reference;
using test::fixture_tensor;
using test::golden_path;

Result<image::Image> one_image(const ModelPaths& paths, const GenerationRequest& request) {
    ModelOptions options;
    options.threads = 1;
    auto model = Model::load(paths, options);
    if (!model.ok()) return model.error();
    auto images = generate(**model, request);
    if (!images.ok()) return images.error();
    return std::move(images->front().image);
}

GenerationRequest tiny_job() {
    GenerationRequest r;
    r.prompt = "a red cat on a blue square";
    r.width = r.height = 32;
    r.seed = 11;
    r.steps = 4;
    return r;
}

std::string clip_tokenizer() { return std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer"; }

// Chroma: T5 only, its padding masked out of the DiT but one pad token, real
// CFG 4 against the empty negative prompt, mu 1.
TEST(ChromaPipeline, TextToImageMatchesTheReferenceJob) {
    auto io = io::ModelFile::open({golden_path("pipeline/chroma_tiny_txt2img.safetensors")});
    ASSERT_TRUE(io.ok());
    ModelPaths paths;
    paths.diffusion_model = flux_tiny_part("chroma_dit.safetensors");
    paths.t5xxl = flux_tiny_part("t5xxl.safetensors");
    paths.vae = flux_tiny_part("ae.safetensors");
    ModelOptions options;
    options.weight_type = GGML_TYPE_F32;
    options.threads = 1;
    auto model = Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Chroma");
    EXPECT_EQ((*model)->defaults().cfg_scale, 4.0f);
    auto cond = encode_prompt(**model, tiny_job().prompt, 0);
    ASSERT_TRUE(cond.ok()) << cond.error().message;
    EXPECT_EQ(cond->token_valid, fixture_tensor(*io, "t5.valid").values);
    EXPECT_TRUE(cond->pooled.empty());
    auto uncond = encode_prompt(**model, "", 0);
    ASSERT_TRUE(uncond.ok());
    EXPECT_EQ(uncond->token_valid, fixture_tensor(*io, "t5.uncond_valid").values);
    EXPECT_LT(test::relative_error(uncond->hidden, fixture_tensor(*io, "t5.uncond_hidden").values), 1e-4);
    auto images = generate(**model, tiny_job());
    ASSERT_TRUE(images.ok()) << images.error().message;
    EXPECT_LE(difference_from_reference(images->front().image, *io), 1);

    // sd-cli's --chroma-* options. More pad tokens seen by the DiT ...
    const auto seen = [](const std::vector<float>& valid) { return std::count(valid.begin(), valid.end(), 1.0f); };
    T5Options masks;
    masks.pad_tokens = 3;
    auto padded = encode_prompt(**model, tiny_job().prompt, 0, masks);
    ASSERT_TRUE(padded.ok());
    EXPECT_EQ(seen(padded->token_valid), seen(cond->token_valid) + 2);
    EXPECT_EQ(padded->hidden, cond->hidden);
    // ... no DiT mask at all (T5 unchanged) ...
    masks = {};
    masks.dit_mask = false;
    auto unmasked = encode_prompt(**model, tiny_job().prompt, 0, masks);
    ASSERT_TRUE(unmasked.ok());
    EXPECT_TRUE(unmasked->token_valid.empty());
    EXPECT_EQ(unmasked->hidden, cond->hidden);
    GenerationRequest r = tiny_job();
    r.t5_options = masks;
    auto unmasked_image = generate(**model, r);
    ASSERT_TRUE(unmasked_image.ok()) << unmasked_image.error().message;
    EXPECT_GT(largest_pixel_difference(unmasked_image->front().image, images->front().image), 0);
    // ... or the padding masked inside T5 too: the text's hidden states no longer see it.
    masks = {};
    masks.t5_mask = true;
    auto t5_masked = encode_prompt(**model, tiny_job().prompt, 0, masks);
    ASSERT_TRUE(t5_masked.ok());
    EXPECT_EQ(t5_masked->token_valid, cond->token_valid);
    EXPECT_GT(test::relative_error(t5_masked->hidden, cond->hidden), 1e-4);
}

// The tensors of a file, renamed.
std::vector<test::SafetensorsEntry> entries(const std::string& path, const std::string& prefix,
                                            const std::string& skip = "") {
    auto file = io::ModelFile::open({path});
    EXPECT_TRUE(file.ok());
    std::vector<test::SafetensorsEntry> out;
    for (const io::TensorInfo& t : file->tensors()) {
        if (!skip.empty() && t.name.rfind(skip, 0) == 0) continue;
        out.push_back(test::copy_entry(*file, t, prefix + t.name));
    }
    return out;
}

// The tiny Flux in every form users have gives the same image.
class FluxInputs : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir();
        // ComfyUI's all-in-one checkpoint.
        std::vector<test::SafetensorsEntry> all;
        for (auto [file, prefix] : {std::pair{"flux_dit.safetensors", "model.diffusion_model."},
                                    std::pair{"clip_l.safetensors", "text_encoders.clip_l.transformer."},
                                    std::pair{"t5xxl.safetensors", "text_encoders.t5xxl.transformer."},
                                    std::pair{"ae.safetensors", "vae."}}) {
            for (auto& e : entries(flux_tiny_part(file), prefix)) all.push_back(std::move(e));
        }
        dir_->write("flux_aio.safetensors",
                    test::build_safetensors(all, {{"kiln.flux.axes_dim", "8,12,12"}, {"kiln.clip.heads", "2"}}));
        // Flux.1-schnell's layout: no guidance embedding.
        dir_->write("schnell.safetensors",
                    test::build_safetensors(entries(flux_tiny_part("flux_dit.safetensors"), "", "guidance_in."),
                                            {{"kiln.flux.axes_dim", "8,12,12"}}));
        // A T5 with no tokenizer anywhere near it.
        dir_->write("lonely/t5xxl.safetensors", test::read_bytes(flux_tiny_part("t5xxl.safetensors")));
        auto reference = one_image(flux_tiny_parts(), tiny_job());
        ASSERT_TRUE(reference.ok()) << reference.error().message;
        reference_ = new image::Image(std::move(reference).value());
    }
    static void TearDownTestSuite() {
        delete reference_;
        delete dir_;
    }
    // BFL's parts with the T5 that has no tokenizer near it.
    static Result<std::unique_ptr<Model>> load_lonely_t5() {
        ModelPaths lonely = flux_tiny_parts();
        lonely.t5xxl = dir_->file("lonely/t5xxl.safetensors");
        ModelOptions options;
        options.threads = 1;
        return Model::load(lonely, options);
    }
    static test::TempDir* dir_;
    static image::Image* reference_;
};
test::TempDir* FluxInputs::dir_ = nullptr;
image::Image* FluxInputs::reference_ = nullptr;

TEST_F(FluxInputs, ComfyUiAllInOneGivesTheSameImage) {
    ModelPaths paths;
    paths.model = {dir_->file("flux_aio.safetensors")};
    paths.tokenizer = "clip_l=" + clip_tokenizer() + ",t5xxl=" + flux_tiny_part("tokenizer_2");
    auto img = one_image(paths, tiny_job());
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_EQ(largest_pixel_difference(*img, *reference_), 0);
}

// -M convert writes T5's tokenizer into the GGUF it makes: the converted
// T5 then needs no --tokenizer, and a q8_0 DiT gives nearly the same image.
TEST_F(FluxInputs, GgufFilesCarryTheTokenizerAndQuantizedWeightsRun) {
    const std::string t5 = dir_->file("t5xxl.gguf");
    auto convert = test::run_command(std::string(KILN_BIN) + " -M convert -m " + flux_tiny_part("t5xxl.safetensors") +
                                     " --tokenizer t5xxl=" + flux_tiny_part("tokenizer_2") + " -o " + t5);
    ASSERT_EQ(convert.exit_code, 0) << convert.err;
    const std::string dit = dir_->file("flux_dit-Q8_0.gguf");
    convert = test::run_command(std::string(KILN_BIN) + " -M convert -m " + flux_tiny_part("flux_dit.safetensors") +
                                " --type q8_0 -o " + dit);
    ASSERT_EQ(convert.exit_code, 0) << convert.err;
    ModelPaths paths = flux_tiny_parts();
    paths.t5xxl = t5;
    auto img = one_image(paths, tiny_job());
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_EQ(largest_pixel_difference(*img, *reference_), 0);
    paths.diffusion_model = dit;
    auto quantized = one_image(paths, tiny_job());
    ASSERT_TRUE(quantized.ok()) << quantized.error().message;
    EXPECT_LE(largest_pixel_difference(*quantized, *reference_), 8);
}

// A diffusers FluxPipeline folder: transformer/ in diffusers' names
// (training/make_flux_pipeline_fixtures.py converts the DiT as diffusers'
// conversion script does), vae/ in diffusers' names, text_encoder/ (CLIP-L),
// text_encoder_2/ (T5), tokenizer/ and tokenizer_2/; and its vae/ file alone.
TEST_F(FluxInputs, DiffusersFolderGivesTheSameImage) {
    const std::string root = "FLUX.1-dev/";
    dir_->write(root + "model_index.json",
                R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
                    "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
                    "text_encoder_2": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
                    "tokenizer_2": ["transformers", "T5TokenizerFast"],
                    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]})");
    dir_->write(root + "transformer/diffusion_pytorch_model.safetensors",
                test::read_bytes(flux_tiny_part("diffusers_transformer.safetensors")));
    dir_->write(root + "text_encoder/model.safetensors", test::read_bytes(flux_tiny_part("clip_l.safetensors")));
    dir_->write(root + "text_encoder_2/model.safetensors", test::read_bytes(flux_tiny_part("t5xxl.safetensors")));
    const io::NameMap map(io::ModelFamily::SD1);
    std::vector<test::SafetensorsEntry> vae;
    for (const auto& e : entries(flux_tiny_part("ae.safetensors"), "first_stage_model.")) {
        std::string folder;
        for (auto& d : test::to_diffusers(e, map, &folder)) vae.push_back(std::move(d));
    }
    dir_->write(root + "vae/diffusion_pytorch_model.safetensors", test::build_safetensors(vae));
    for (const char* f : {"vocab.json", "merges.txt"}) {
        dir_->write(root + "tokenizer/" + f, test::read_bytes(clip_tokenizer() + "/" + f));
    }
    dir_->write(root + "tokenizer_2/tokenizer.json", test::read_bytes(flux_tiny_part("tokenizer_2/tokenizer.json")));
    ModelPaths paths;
    paths.model = {dir_->file(root)};
    auto img = one_image(paths, tiny_job());
    ASSERT_TRUE(img.ok()) << img.error().message;
    EXPECT_EQ(largest_pixel_difference(*img, *reference_), 0);

    // The folder's vae/ file alone with --vae beside BFL's other parts, as
    // sd-cli takes it: renamed the same way.
    ModelPaths vae_alone = flux_tiny_parts();
    vae_alone.vae = dir_->file(root + "vae/diffusion_pytorch_model.safetensors");
    auto with_vae = one_image(vae_alone, tiny_job());
    ASSERT_TRUE(with_vae.ok()) << with_vae.error().message;
    EXPECT_EQ(largest_pixel_difference(*with_vae, *reference_), 0);
}

TEST_F(FluxInputs, SchnellIsDetectedAndRefusesReferenceImages) {
    ModelPaths paths = flux_tiny_parts();
    paths.diffusion_model = dir_->file("schnell.safetensors");
    ModelOptions options;
    options.threads = 1;
    auto model = Model::load(paths, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->family_label(), "Flux.1-schnell");
    EXPECT_EQ((*model)->defaults().steps, 4);
    GenerationRequest r = tiny_job();
    r.ref_images.push_back(image::make_image(32, 32, 3));
    auto refused = generate(**model, r);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().kind, ErrorKind::InvalidRequest);
    EXPECT_NE(refused.error().message.find("takes no reference images"), std::string::npos) << refused.error().message;
    // --guidance does nothing on schnell: a warning, and the job runs.
    r.ref_images.clear();
    r.guidance = 5.0f;
    EXPECT_TRUE(generate(**model, r).ok());
}

TEST_F(FluxInputs, KontextReferenceImagesAreAttendedTo) {
    ModelOptions options;
    options.threads = 1;
    auto model = Model::load(flux_tiny_parts(), options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    GenerationRequest r = tiny_job();
    image::Image ref = image::make_image(24, 40, 3);
    for (size_t i = 0; i < ref.pixels.size(); ++i) ref.pixels[i] = static_cast<uint8_t>((i * 37) % 256);
    r.ref_images.push_back(ref);
    auto with_ref = generate(**model, r);
    ASSERT_TRUE(with_ref.ok()) << with_ref.error().message;
    EXPECT_GT(largest_pixel_difference(with_ref->front().image, *reference_), 0);
    // sd-cli resizes a reference to about the output's area first (a 40x72 one to 24x40 for a
    // 32x32 job and this model's stride of 8); --disable-auto-resize-ref-image encodes it as given.
    image::Image large = image::make_image(40, 72, 3);
    for (size_t i = 0; i < large.pixels.size(); ++i) large.pixels[i] = static_cast<uint8_t>((i * 37) % 256);
    GenerationRequest sized = r;
    sized.ref_images = {large};
    auto resized = generate(**model, sized);
    sized.auto_resize_ref_images = false;
    auto as_given = generate(**model, sized);
    ASSERT_TRUE(resized.ok() && as_given.ok());
    EXPECT_GT(largest_pixel_difference(as_given->front().image, resized->front().image), 0);
    // Two references side by side at index 1, or numbered 1 and 2.
    r.ref_images.push_back(ref);
    auto side_by_side = generate(**model, r);
    r.increase_ref_index = true;
    auto numbered = generate(**model, r);
    ASSERT_TRUE(side_by_side.ok() && numbered.ok());
    EXPECT_GT(largest_pixel_difference(side_by_side->front().image, numbered->front().image), 0);
    r.increase_ref_index = false;
    r.ref_images.pop_back();
    r.ref_images.push_back(image::make_image(2, 2, 3));  // smaller than the size stride
    auto bad = generate(**model, r);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().kind, ErrorKind::InvalidRequest);
}

// sd-cli's skip-layer guidance: a third pass without the listed blocks on
// the steps of its window. The default window (0.01 to 0.2 of the 5 sigmas)
// holds none of these 4 steps; 0 to 1 holds them all.
TEST_F(FluxInputs, SkipLayerGuidanceRunsOnItsWindowsSteps) {
    ModelOptions options;
    options.threads = 1;
    auto model = Model::load(flux_tiny_parts(), options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    GenerationRequest r = tiny_job();
    r.slg.scale = 2.5f;
    r.slg.blocks = {1};
    auto outside = generate(**model, r);
    ASSERT_TRUE(outside.ok()) << outside.error().message;
    EXPECT_EQ(largest_pixel_difference(outside->front().image, *reference_), 0);
    r.slg.start = 0.0f;
    r.slg.end = 1.0f;
    auto inside = generate(**model, r);
    ASSERT_TRUE(inside.ok()) << inside.error().message;
    EXPECT_GT(largest_pixel_difference(inside->front().image, *reference_), 0);
    r.slg.scale = 0.0f;  // off
    auto off = generate(**model, r);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(largest_pixel_difference(off->front().image, *reference_), 0);
    for (auto bad : {std::pair<float, float>{-0.5f, 0.2f}, {0.0f, 1.5f}}) {
        r.slg.scale = 1.0f;
        r.slg.start = bad.first;
        r.slg.end = bad.second;
        auto refused = generate(**model, r);
        ASSERT_FALSE(refused.ok());
        EXPECT_EQ(refused.error().kind, ErrorKind::InvalidRequest);
        EXPECT_NE(refused.error().message.find("--skip-layer-start and --skip-layer-end"), std::string::npos);
    }
}

TEST_F(FluxInputs, MissingOrMismatchedPartsAreOneClearError) {
    ModelOptions options;
    options.threads = 1;
    ModelPaths no_t5 = flux_tiny_parts();
    no_t5.t5xxl.clear();
    auto missing = Model::load(no_t5, options);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find("no t5xxl found"), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find("--t5xxl"), std::string::npos) << missing.error().message;

    auto no_tokenizer = load_lonely_t5();
    ASSERT_FALSE(no_tokenizer.ok());
    EXPECT_EQ(no_tokenizer.error().kind, ErrorKind::BadFile);
    EXPECT_NE(no_tokenizer.error().message.find("tokenizer t5xxl=PATH"), std::string::npos)
        << no_tokenizer.error().message;
    EXPECT_NE(no_tokenizer.error().message.find("looked in"), std::string::npos);
    EXPECT_NE(no_tokenizer.error().message.find("tokenizers/t5xxl); "), std::string::npos)
        << no_tokenizer.error().message;
    EXPECT_NE(no_tokenizer.error().message.find("kiln pull --tokenizer t5xxl"), std::string::npos)
        << no_tokenizer.error().message;

    ModelPaths sd_vae = flux_tiny_parts();
    sd_vae.vae = golden_path("models/sd1_tiny.safetensors");
    auto mismatched = Model::load(sd_vae, options);
    ASSERT_FALSE(mismatched.ok());
    EXPECT_NE(mismatched.error().message.find("4 latent channels but the Flux.1-dev DiT takes 16"), std::string::npos)
        << mismatched.error().message;
}

// The CLI with sd-cli's flags: an image, no partial file on a bad request.
// A T5 without a tokenizer near it finds the one `kiln pull --tokenizer
// t5xxl` puts in kiln's cache, the last place searched.
TEST_F(FluxInputs, LonelyT5FindsItsTokenizerInKilnsCache) {
    test::TempDir cache;
    cache.write("tokenizers/t5xxl/tokenizer.json", test::read_bytes(flux_tiny_part("tokenizer_2/tokenizer.json")));
    test::ScopedEnv env("KILN_CACHE", cache.path());
    auto model = load_lonely_t5();
    ASSERT_TRUE(model.ok()) << model.error().message;
    auto reference = text::T5Tokenizer::load(flux_tiny_part("tokenizer_2"));
    ASSERT_TRUE(reference.ok()) << reference.error().message;
    const std::string prompt = "a red circle on a white background";
    EXPECT_EQ((*model)->t5_tokenizer().encode(prompt), reference->encode(prompt));
}

TEST_F(FluxInputs, SdCliCommandLineWorks) {
    const std::string out = dir_->file("flux.png");
    const std::string base = std::string(KILN_BIN) + " --diffusion-model " + flux_tiny_part("flux_dit.safetensors") +
                             " --vae " + flux_tiny_part("ae.safetensors") + " --clip_l " +
                             flux_tiny_part("clip_l.safetensors") + " --t5xxl " + flux_tiny_part("t5xxl.safetensors") +
                             " --tokenizer clip_l=" + clip_tokenizer() +
                             " -p 'a red cat on a blue square' -W 32 -H 32 --steps 4 -s 11 --cfg-scale 1.0"
                             " --sampling-method euler -t 1 ";
    auto ok = test::run_command(base + "--guidance 3.5 -o " + out);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    auto img = image::read_image(out);
    ASSERT_TRUE(img.ok());
    EXPECT_EQ(largest_pixel_difference(*img, *reference_), 0);
    const std::string bad_out = dir_->file("bad.png");
    for (const char* flags :
         {"--sampling-method tcd", "--scheduler ays", "--guidance -1", "--flow-shift nan", "-r /nonexistent.png"}) {
        auto bad = test::run_command(base + flags + " -o " + bad_out);
        EXPECT_NE(bad.exit_code, 0) << flags;
        EXPECT_FALSE(std::filesystem::exists(bad_out)) << flags;
        EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << flags << ": " << bad.err;
    }
}

}  // namespace
}  // namespace kiln::pipeline
