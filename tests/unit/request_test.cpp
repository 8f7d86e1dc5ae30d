// The one request validation, error kinds and cancellation, through the C
// API (include/kiln.h) as every front-end meets them: kiln_generate and
// kiln_plan refuse the same bad requests with KILN_ERROR_INVALID_REQUEST
// before any graph is built, bad model metadata is KILN_ERROR_BAD_FILE
// naming the file and the key, and kiln_cancel stops a job that the next
// job on the same context survives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "golden.h"
#include "io/dtype.h"
#include "io/model_file.h"
#include "kiln.h"
#include "pipeline/schedulers.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::TempDir;

struct Context {
    kiln_context* ctx = nullptr;
    std::string error;
    kiln_status status = KILN_OK;
    ~Context() { kiln_context_free(ctx); }
};

// A context on `model` (the tiny SD1 golden model unless given), one thread.
std::unique_ptr<Context> open(const std::string& model = test::golden_path("models/sd1_tiny.safetensors"),
                              bool plan_only = false, const std::string& vae = "") {
    auto c = std::make_unique<Context>();
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.model_path = model.c_str();
    cp.vae_path = vae.empty() ? nullptr : vae.c_str();
    const std::string tokenizer = std::string(KILN_FIXTURES_DIR) + "/tiny_tokenizer";
    cp.tokenizer_path = tokenizer.c_str();
    cp.n_threads = 1;
    cp.plan_only = plan_only ? 1 : 0;
    char* error = nullptr;
    c->status = kiln_context_create(&cp, &c->ctx, &error);
    if (error) c->error = error;
    kiln_free_string(error);
    return c;
}

kiln_generation_params small_job() {
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle";
    gp.width = 32;
    gp.height = 32;
    gp.steps = 2;
    return gp;
}

struct Outcome {
    kiln_status status;
    std::string error;
};

Outcome generate(kiln_context* ctx, const kiln_generation_params& gp) {
    kiln_image* images = nullptr;
    int n = 0;
    char* error = nullptr;
    const kiln_status status = kiln_generate(ctx, &gp, &images, &n, &error);
    Outcome o{status, error ? error : ""};
    kiln_free_string(error);
    kiln_images_free(images, n);
    return o;
}

Outcome plan(kiln_context* ctx, const kiln_generation_params& gp) {
    char* text = nullptr;
    char* error = nullptr;
    int fits = 0;
    const kiln_status status = kiln_plan(ctx, &gp, &text, &fits, &error);
    Outcome o{status, error ? error : ""};
    kiln_free_string(error);
    kiln_free_string(text);
    return o;
}

TEST(Request, GenerateAndPlanRefuseTheSameBadRequests) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    uint8_t pixels[16 * 16 * 3] = {};
    const kiln_image small_image{16, 16, 3, pixels, nullptr};
    struct Case {
        const char* what;
        void (*apply)(kiln_generation_params&);
        const char* message;
    };
    static const kiln_image* mask = nullptr;
    mask = &small_image;
    uint8_t odd_pixels[18 * 16 * 3] = {};
    const kiln_image odd_image{18, 16, 3, odd_pixels, nullptr};
    static const kiln_image* odd = nullptr;
    odd = &odd_image;
    const Case cases[] = {
        {"width not a multiple of the stride", [](kiln_generation_params& p) { p.width = 34; },
         "width and height must be multiples of 4 for this model (SD1.x), got 34x32"},
        {"negative height", [](kiln_generation_params& p) { p.height = -32; }, "width and height must be positive"},
        {"cfg nan", [](kiln_generation_params& p) { p.cfg_scale = std::nanf(""); }, "cfg scale must be a number in"},
        {"cfg infinite", [](kiln_generation_params& p) { p.cfg_scale = INFINITY; }, "cfg scale must be a number in"},
        {"cfg too large", [](kiln_generation_params& p) { p.cfg_scale = 1e30f; }, "[0, 100], got 1e+30"},
        {"steps", [](kiln_generation_params& p) { p.steps = -3; }, "steps must be in [1, 10000], got -3"},
        {"batch count", [](kiln_generation_params& p) { p.batch_count = 0; }, "batch count must be in [1, 1000]"},
        {"sampler", [](kiln_generation_params& p) { p.sampler = "fast"; }, "fast"},
        {"scheduler", [](kiln_generation_params& p) { p.scheduler = "weird"; }, "weird"},
        {"mask without init image", [](kiln_generation_params& p) { p.mask = mask; }, "--mask needs an init image"},
        {"init image of another size", [](kiln_generation_params& p) { p.init_image = mask; },
         "init image is 16x16 but the requested size is 32x32"},
        {"init latent resize with a mask",
         [](kiln_generation_params& p) {
             p.init_image = p.mask = mask;
             p.init_latent_resize = 1;
         },
         "a mask cannot be used when the init image's latent is resized"},
        {"init latent resize off the stride",
         [](kiln_generation_params& p) {
             p.init_image = odd;
             p.init_latent_resize = 1;
         },
         "init image is 18x16: its latent is resized, so its sides must be multiples of 4"},
        {"eta above 1", [](kiln_generation_params& p) { p.eta = 1.5f; }, "--eta must be a number in [0, 1], got 1.5"},
        {"eta nan", [](kiln_generation_params& p) { p.eta = std::nanf(""); }, "--eta must be a number in [0, 1]"},
        {"sigmas not descending",
         [](kiln_generation_params& p) {
             static const float sigmas[] = {1.0f, 2.0f, 0.0f};
             p.sigmas = sigmas;
             p.n_sigmas = 3;
         },
         "--sigmas: values must descend"},
        {"sigmas without a last 0",
         [](kiln_generation_params& p) {
             static const float sigmas[] = {3.0f, 1.0f};
             p.sigmas = sigmas;
             p.n_sigmas = 2;
         },
         "--sigmas: the last value must be 0"},
        {"sampler rng", [](kiln_generation_params& p) { p.sampler_rng = "dice"; }, "--sampler-rng: unknown RNG 'dice'"},
        {"skip-layer guidance on a UNet", [](kiln_generation_params& p) { p.slg_scale = 2.5f; },
         "--slg-scale is skip-layer guidance for DiTs that take a skip list (Flux, Chroma, FLUX.2, SD3); SD1.x's UNet "
         "does not"},
        {"clip skip above the encoder's layers", [](kiln_generation_params& p) { p.clip_skip = 5; },
         "clip skip must be at most 2 for this model's clip_l text encoder, got 5"},
        {"width above the limit", [](kiln_generation_params& p) { p.width = p.height = 16384 + 4; }, "at most 16384"},
    };
    for (const Case& c : cases) {
        kiln_generation_params gp = small_job();
        c.apply(gp);
        for (const Outcome& o : {generate(model->ctx, gp), plan(model->ctx, gp)}) {
            EXPECT_EQ(o.status, KILN_ERROR_INVALID_REQUEST) << c.what << ": " << o.error;
            EXPECT_NE(o.error.find(c.message), std::string::npos) << c.what << ": " << o.error;
        }
    }
    // The context still runs a good job.
    EXPECT_EQ(generate(model->ctx, small_job()).status, KILN_OK);
}

TEST(Request, CancelStopsTheJobAndTheNextOneRuns) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    kiln_generation_params gp = small_job();
    gp.steps = 6;
    struct Seen {
        kiln_context* ctx;
        int last_step = 0;
    } seen{model->ctx};
    gp.progress = [](int, int step, int, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->last_step = step;
        if (step == 2) kiln_cancel(s->ctx);
    };
    gp.progress_user_data = &seen;
    const Outcome cancelled = generate(model->ctx, gp);
    EXPECT_EQ(cancelled.status, KILN_ERROR_CANCELLED) << cancelled.error;
    EXPECT_EQ(seen.last_step, 2);  // no step ran after the cancel
    EXPECT_STREQ(kiln_status_name(cancelled.status), "cancelled");

    // A cancel with nothing running does not touch the next job.
    kiln_cancel(model->ctx);
    seen.last_step = 0;
    gp.progress = [](int, int step, int, void* user) { static_cast<Seen*>(user)->last_step = step; };
    EXPECT_EQ(generate(model->ctx, gp).status, KILN_OK);
    EXPECT_EQ(seen.last_step, 6);
}

TEST(Request, StatusNamesAreTheErrorKinds) {
    EXPECT_STREQ(kiln_status_name(KILN_OK), "ok");
    EXPECT_STREQ(kiln_status_name(KILN_ERROR_INVALID_REQUEST), "invalid request");
    EXPECT_STREQ(kiln_status_name(KILN_ERROR_BAD_FILE), "bad file");
    EXPECT_STREQ(kiln_status_name(KILN_ERROR_OUT_OF_MEMORY), "out of memory");
    EXPECT_STREQ(kiln_status_name(KILN_ERROR_INTERNAL), "internal");
}

// The tiny SD1 model's tensors as entries for build_safetensors, and its metadata.
std::vector<test::SafetensorsEntry> tiny_entries(io::Metadata* metadata) {
    auto model = io::ModelFile::open({test::golden_path("models/sd1_tiny.safetensors")});
    EXPECT_TRUE(model.ok());
    std::vector<test::SafetensorsEntry> entries;
    if (!model.ok()) return entries;
    for (const io::TensorInfo& t : model->tensors()) {
        const uint8_t* data = model->data(t);
        entries.push_back({t.name, io::dtype_name(t.dtype), t.shape, std::vector<uint8_t>(data, data + t.nbytes)});
    }
    *metadata = model->metadata();
    return entries;
}

// The tiny SD1 model rewritten with the first tensor that `edit` changes
// (it returns true) changed; "" when it changed none.
std::string with_edited_tensor(const TempDir& dir, const std::function<bool(test::SafetensorsEntry&)>& edit) {
    io::Metadata original;
    std::vector<test::SafetensorsEntry> entries = tiny_entries(&original);
    const bool edited = std::any_of(entries.begin(), entries.end(), edit);
    if (!edited) return "";
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const auto& [k, v] : original) metadata.emplace_back(k, v.to_string());
    return dir.write("edited.safetensors", test::build_safetensors(entries, metadata));
}

// The tiny SD1 model rewritten with one more metadata key.
std::string with_metadata(const TempDir& dir, const std::string& key, const std::string& value) {
    io::Metadata original;
    std::vector<test::SafetensorsEntry> entries = tiny_entries(&original);
    std::vector<std::pair<std::string, std::string>> metadata = {{key, value}};
    for (const auto& [k, v] : original) {
        if (k != key) metadata.emplace_back(k, v.to_string());
    }
    return dir.write("bad.safetensors", test::build_safetensors(entries, metadata));
}

TEST(Request, BadModelMetadataIsABadFileNamingTheKey) {
    TempDir dir;
    const struct {
        const char* key;
        const char* value;
        const char* message;
    } cases[] = {
        {"kiln.default.width", "0", "metadata kiln.default.width is 0, expected [4, 16384]"},
        {"kiln.default.height", "4294967295", "metadata kiln.default.height is 4294967295"},
        {"kiln.default.width", "-64", "metadata kiln.default.width is -64"},
        {"kiln.default.width", "42", "not a multiple of the model's size stride 4"},
        {"kiln.default.steps", "4294967295", "metadata kiln.default.steps is 4294967295, expected [1, 10000]"},
        {"kiln.default.cfg_scale", "nan", "metadata kiln.default.cfg_scale is not a number: 'nan'"},
        {"kiln.default.sampler", "bogus", "metadata kiln.default.sampler: "},
        {"kiln.vae.scale_factor", "0", "metadata kiln.vae.scale_factor is 0"},
        {"kiln.prediction", "x", "metadata kiln.prediction is 'x', expected eps or v"},
        {"kiln.unet.heads", "3", "do not split into attention heads"},
        {"kiln.unet.heads", "0", "metadata kiln.unet.heads is 0, expected an integer in [1, 4096]"},
        {"kiln.unet.heads", "4294967295", "metadata kiln.unet.heads is 4294967295"},
        // Compared before any cast (a cast of 1e30 or NaN to an integer is
        // undefined), and never truncated (2.5 heads used to be 2).
        {"kiln.clip.heads", "1e30", "metadata kiln.clip.heads is 1e30, expected an integer in [1, 4096]"},
        {"kiln.clip.heads", "nan", "metadata kiln.clip.heads is nan, expected an integer in [1, 4096]"},
        {"kiln.clip.heads", "2.5", "metadata kiln.clip.heads is 2.5, expected an integer in [1, 4096]"},
    };
    for (const auto& c : cases) {
        const std::string path = with_metadata(dir, c.key, c.value);
        auto model = open(path);
        EXPECT_EQ(model->status, KILN_ERROR_BAD_FILE) << c.key << "=" << c.value << ": " << model->error;
        EXPECT_NE(model->error.find(c.message), std::string::npos) << c.key << "=" << c.value << ": " << model->error;
        EXPECT_NE(model->error.find(path), std::string::npos) << model->error;
    }
}

// An output block's cross-attention key with no context width (found by
// fuzz_model_config: the output blocks are read after the sizes are checked).
TEST(Request, OutputBlockWithoutAContextWidthIsABadFile) {
    TempDir dir;
    const std::string path = with_edited_tensor(dir, [](test::SafetensorsEntry& e) {
        if (e.name.find("output_blocks.") == std::string::npos || e.name.find("attn2.to_k.weight") == std::string::npos)
            return false;
        e.shape = {e.shape[0], 0};
        e.data.clear();
        return true;
    });
    ASSERT_FALSE(path.empty());
    auto model = open(path);
    EXPECT_EQ(model->status, KILN_ERROR_BAD_FILE) << model->error;
    EXPECT_NE(model->error.find("attn2.to_k.weight is not a matrix with a context width"), std::string::npos)
        << model->error;
}

TEST(Request, PlanOnlyContextCannotGenerate) {
    auto model = open(test::golden_path("models/sd1_tiny.safetensors"), /*plan_only=*/true);
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    EXPECT_EQ(plan(model->ctx, small_job()).status, KILN_OK);
    EXPECT_EQ(generate(model->ctx, small_job()).status, KILN_ERROR_INVALID_REQUEST);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A strength runs t_enc + 1 steps, t_enc = int(steps x strength) at most
// steps - 1, as sd-cli and A1111 cut the schedule.
TEST(Request, StrengthRunsSdClisShareOfTheSteps) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    std::vector<uint8_t> pixels(32 * 32 * 3, 100);
    const kiln_image init{32, 32, 3, pixels.data(), nullptr};
    for (const auto& [strength, expected] :
         {std::pair<float, int>{0.63f, 7}, {0.69f, 7}, {0.05f, 1}, {0.99f, 10}, {1.0f, 10}}) {
        kiln_generation_params gp = small_job();
        gp.steps = 10;
        gp.init_image = &init;
        gp.strength = strength;
        int total = 0;
        gp.progress = [](int, int, int steps, void* user) { *static_cast<int*>(user) = steps; };
        gp.progress_user_data = &total;
        ASSERT_EQ(generate(model->ctx, gp).status, KILN_OK);
        EXPECT_EQ(total, expected) << "strength " << strength;
    }
}

// A1111's resize_mode 3: the init image is encoded at its own size and its
// latent resized (pipeline/latent_resize.h, goldens from torch) to the
// output's. At the same size that is plain image-to-image, byte for byte.
TEST(Request, InitLatentResizeEncodesAtTheInitImagesSize) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    std::vector<uint8_t> pixels(16 * 16 * 3);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 7 % 251);
    const kiln_image small_init{16, 16, 3, pixels.data(), nullptr};
    std::vector<uint8_t> doubled(32 * 32 * 3);
    for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x)
            for (int c = 0; c < 3; ++c) doubled[(y * 32 + x) * 3 + c] = pixels[((y / 2) * 16 + x / 2) * 3 + c];
    const kiln_image init{32, 32, 3, doubled.data(), nullptr};
    auto run = [&](const kiln_image& from, bool resize, int w, int h) {
        kiln_generation_params gp = small_job();
        gp.width = w;
        gp.height = h;
        gp.init_image = &from;
        gp.strength = 0.6f;
        gp.init_latent_resize = resize ? 1 : 0;
        kiln_image* images = nullptr;
        int n = 0;
        char* error = nullptr;
        EXPECT_EQ(kiln_generate(model->ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
        kiln_free_string(error);
        std::vector<uint8_t> out;
        if (n == 1) {
            EXPECT_EQ(images[0].width, uint32_t(w));
            EXPECT_EQ(images[0].height, uint32_t(h));
            out.assign(images[0].data, images[0].data + size_t(w) * h * 3);
        }
        kiln_images_free(images, n);
        return out;
    };
    EXPECT_EQ(run(init, true, 32, 32), run(init, false, 32, 32));
    const std::vector<uint8_t> upscaled = run(small_init, true, 32, 32);
    const std::vector<uint8_t> stretched = run(init, false, 32, 32);
    ASSERT_EQ(upscaled.size(), stretched.size());
    EXPECT_NE(upscaled, stretched);  // the latent, not the image, was resized
    EXPECT_EQ(run(small_init, true, 32, 24).size(), size_t(32 * 24 * 3));
    // The plan counts the encode at the init image's size.
    kiln_generation_params gp = small_job();
    gp.width = 64;
    gp.height = 64;
    gp.init_image = &small_init;
    gp.init_latent_resize = 1;
    char* text = nullptr;
    char* error = nullptr;
    int fits = 0;
    ASSERT_EQ(kiln_plan(model->ctx, &gp, &text, &fits, &error), KILN_OK) << (error ? error : "");
    const std::string plan_text = text;
    kiln_free_string(text);
    EXPECT_NE(plan_text.find("job: 64x64"), std::string::npos) << plan_text;
    EXPECT_NE(plan_text.find("init image encode"), std::string::npos) << plan_text;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The pixels of a job on the tiny model, and how many steps it reported.
std::vector<uint8_t> pixels_of(kiln_context* ctx, kiln_generation_params gp, int* steps = nullptr) {
    gp.progress = [](int, int, int total, void* user) { *static_cast<int*>(user) = total; };
    int total = 0;
    gp.progress_user_data = &total;
    kiln_image* images = nullptr;
    int n = 0;
    char* error = nullptr;
    EXPECT_EQ(kiln_generate(ctx, &gp, &images, &n, &error), KILN_OK) << (error ? error : "");
    kiln_free_string(error);
    std::vector<uint8_t> out;
    if (n == 1) out.assign(images[0].data, images[0].data + size_t(images[0].width) * images[0].height * 3);
    kiln_images_free(images, n);
    if (steps) *steps = total;
    return out;
}

// sd-cli's --eta, --sampler-rng and --sigmas. The defaults spelled out
// give the same bits; other values change the image where they should.
TEST(Request, EtaSamplerRngAndSigmasAsSdCli) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    kiln_generation_params ddim = small_job();
    ddim.sampler = "ddim_trailing";
    const std::vector<uint8_t> ddim_default = pixels_of(model->ctx, ddim);
    ddim.eta = 0.0f;  // its default
    EXPECT_EQ(pixels_of(model->ctx, ddim), ddim_default);
    ddim.eta = 0.7f;
    EXPECT_NE(pixels_of(model->ctx, ddim), ddim_default);

    kiln_generation_params ancestral = small_job();
    ancestral.sampler = "euler_a";
    ancestral.steps = 3;
    const std::vector<uint8_t> shared = pixels_of(model->ctx, ancestral);
    ancestral.eta = 1.0f;  // its default
    EXPECT_EQ(pixels_of(model->ctx, ancestral), shared);
    ancestral.eta = -1.0f;
    ancestral.sampler_rng = "cuda";  // the same kind as --rng: the one stream, as unset
    EXPECT_EQ(pixels_of(model->ctx, ancestral), shared);
    ancestral.sampler_rng = "cpu";  // the steps' noise from a stream of its own
    const std::vector<uint8_t> own = pixels_of(model->ctx, ancestral);
    EXPECT_NE(own, shared);
    ancestral.sampler = "euler";  // draws no step noise: the sampler rng changes nothing
    const std::vector<uint8_t> euler_own = pixels_of(model->ctx, ancestral);
    ancestral.sampler_rng = nullptr;
    EXPECT_EQ(pixels_of(model->ctx, ancestral), euler_own);

    // The scheduler's own 3-step sigmas given as --sigmas run the same 3 steps, bit for bit.
    kiln_generation_params euler = small_job();
    euler.sampler = "euler";
    euler.steps = 3;
    int scheduled_steps = 0;
    const std::vector<uint8_t> scheduled = pixels_of(model->ctx, euler, &scheduled_steps);
    const std::vector<float> sigmas =
        pipeline::get_sigmas(pipeline::SchedulerKind::Discrete, 3, pipeline::DiscreteSchedule::stable_diffusion())
            .value();
    euler.steps = 0;
    euler.sigmas = sigmas.data();
    euler.n_sigmas = static_cast<int>(sigmas.size());
    int custom_steps = 0;
    EXPECT_EQ(pixels_of(model->ctx, euler, &custom_steps), scheduled);
    EXPECT_EQ(custom_steps, 3);
    EXPECT_EQ(scheduled_steps, 3);
    const std::vector<float> other = {10.0f, 1.0f, 0.0f};
    euler.sigmas = other.data();
    euler.n_sigmas = 3;
    EXPECT_NE(pixels_of(model->ctx, euler, &custom_steps), scheduled);
    EXPECT_EQ(custom_steps, 2);
}

// --rng std_default (sd-cli's STDDefaultRNG; its numbers: Rng.StdDefault*)
// is a stream of its own: another image than cuda's and cpu's, the same one
// again for the same seed, and a stream the ancestral steps can take.
TEST(Request, StdDefaultRngIsAStreamOfItsOwn) {
    auto model = open();
    ASSERT_EQ(model->status, KILN_OK) << model->error;
    kiln_generation_params job = small_job();
    job.sampler = "euler_a";
    job.steps = 3;
    const std::vector<uint8_t> cuda = pixels_of(model->ctx, job);
    job.rng = "cpu";
    const std::vector<uint8_t> cpu = pixels_of(model->ctx, job);
    job.rng = "std_default";
    const std::vector<uint8_t> std_default = pixels_of(model->ctx, job);
    EXPECT_NE(std_default, cuda);
    EXPECT_NE(std_default, cpu);
    EXPECT_EQ(pixels_of(model->ctx, job), std_default);
    job.rng = "cuda";
    job.sampler_rng = "std_default";
    const std::vector<uint8_t> mixed = pixels_of(model->ctx, job);
    EXPECT_NE(mixed, cuda);
    EXPECT_NE(mixed, std_default);
}

// --timestep-shift (NitroFusion) moves an SDXL job's steps; other families
// ignore it (a warning), as sd-cli does.
TEST(Request, TimestepShiftIsForSdxl) {
    for (const char* model_file : {"models/sdxl_tiny.safetensors", "models/sd1_tiny.safetensors"}) {
        SCOPED_TRACE(model_file);
        // The tiny SDXL UNet and encoders take the tiny SD1 model's VAE.
        auto model = open(test::golden_path(model_file), false, test::golden_path("models/sd1_tiny.safetensors"));
        ASSERT_EQ(model->status, KILN_OK) << model->error;
        kiln_generation_params gp = small_job();
        const std::vector<uint8_t> plain = pixels_of(model->ctx, gp);
        gp.timestep_shift = 500;
        const std::vector<uint8_t> shifted = pixels_of(model->ctx, gp);
        if (std::string(model_file).find("sdxl") != std::string::npos) {
            EXPECT_NE(shifted, plain);
        } else {
            EXPECT_EQ(shifted, plain);
        }
    }
    auto model = open();
    kiln_generation_params gp = small_job();
    gp.timestep_shift = 1001;
    EXPECT_EQ(generate(model->ctx, gp).status, KILN_ERROR_INVALID_REQUEST);
}

// Non-finite weights give one error naming the module, not a flat image.
TEST(Request, NonFiniteWeightsAreNamedNotAFlatImage) {
    TempDir dir;
    const std::string path = with_edited_tensor(dir, [](test::SafetensorsEntry& e) {
        if (e.name != "model.diffusion_model.out.2.bias" || e.dtype != "F16") return false;
        e.data[0] = 0x00;  // F16 0x7e00: NaN
        e.data[1] = 0x7e;
        return true;
    });
    ASSERT_FALSE(path.empty()) << "no F16 out.2.bias to poison";
    auto ctx = open(path);
    ASSERT_EQ(ctx->status, KILN_OK) << ctx->error;
    const Outcome o = generate(ctx->ctx, small_job());
    EXPECT_EQ(o.status, KILN_ERROR_INTERNAL);
    EXPECT_NE(o.error.find("the UNet produced non-finite values"), std::string::npos) << o.error;
}

}  // namespace
}  // namespace kiln
