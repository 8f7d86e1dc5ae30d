#include "generate_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "cli.h"
#include "default_model.h"
#include "kiln.h"
#include "output_pattern.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

// Owns a C API error string.
struct ErrorText {
    char* text = nullptr;
    ~ErrorText() { kiln_free_string(text); }
    const char* c_str() const { return text ? text : "unknown error"; }
};

bool has_image_extension(const std::string& path) {
    const auto dot = path.rfind('.');
    if (dot == std::string::npos) return false;
    std::string ext = path.substr(dot);
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp";
}

// Progress on a terminal: one line per step, redrawn in place.
struct Progress {
    bool terminal = isatty(STDOUT_FILENO) != 0;
    int images = 1;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    int last_image = -1;

    static void on_step(int image, int step, int steps, void* user_data) {
        auto* self = static_cast<Progress*>(user_data);
        const auto now = std::chrono::steady_clock::now();
        if (step == 0 || image != self->last_image) {
            self->last_image = image;
            self->start = now;
            return;
        }
        const double elapsed = std::chrono::duration<double>(now - self->start).count();
        const double rate = elapsed > 0 ? step / elapsed : 0.0;
        const double eta = rate > 0 ? (steps - step) / rate : 0.0;
        if (self->terminal) {
            std::printf("\r  image %d/%d  step %d/%d  %.2f it/s  ETA %.0fs   ", image + 1, self->images, step, steps,
                        rate, eta);
            if (step == steps) std::printf("\n");
            std::fflush(stdout);
        } else if (step == steps) {
            KILN_LOG_VERBOSE("image %d/%d: %d steps, %.2f it/s", image + 1, self->images, steps, rate);
        }
    }
};

}  // namespace

int run_generate(const Options& options) {
    // Check what can be checked before the (slow) model load.
    if (!has_image_extension(options.output)) {
        KILN_LOG_ERROR("%s: unsupported image extension (valid: .png, .jpg, .jpeg, .webp)", options.output.c_str());
        return kExitUsage;
    }
    auto output = OutputPattern::parse(options.output);
    if (!output) {
        KILN_LOG_ERROR("-o: %s", output.error().message.c_str());
        return kExitUsage;
    }

    if (options.strength_given && options.init_image.empty()) {
        KILN_LOG_WARN("--strength applies to image-to-image only (-i); this text-to-image job runs every step");
    }
    std::string model = options.model;
    if (model.empty() && options.diffusion_model.empty()) {
        auto found = find_default_model();
        if (!found) {
            KILN_LOG_ERROR("no model given and the default model %s was not found; pass -m MODEL", kDefaultModelFile);
            return kExitFailure;
        }
        model = *found;
    }

    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.model_path = model.empty() ? nullptr : model.c_str();
    cp.diffusion_model_path = options.diffusion_model.empty() ? nullptr : options.diffusion_model.c_str();
    cp.vae_path = options.vae.empty() ? nullptr : options.vae.c_str();
    cp.clip_l_path = options.clip_l.empty() ? nullptr : options.clip_l.c_str();
    cp.clip_g_path = options.clip_g.empty() ? nullptr : options.clip_g.c_str();
    cp.t5xxl_path = options.t5xxl.empty() ? nullptr : options.t5xxl.c_str();
    cp.llm_path = options.llm.empty() ? nullptr : options.llm.c_str();
    cp.tokenizer_path = options.tokenizer.empty() ? nullptr : options.tokenizer.c_str();
    cp.embeddings_dir = options.embeddings_dir.empty() ? nullptr : options.embeddings_dir.c_str();
    cp.lora_model_dir = options.lora_model_dir.empty() ? nullptr : options.lora_model_dir.c_str();
    cp.lora_apply_mode = options.lora_apply_mode.empty() ? nullptr : options.lora_apply_mode.c_str();
    cp.weight_type = options.weight_type.empty() ? nullptr : options.weight_type.c_str();
    cp.prediction = options.prediction.empty() ? nullptr : options.prediction.c_str();
    cp.n_threads = options.threads;
    cp.rpc_servers = options.rpc_servers.empty() ? nullptr : options.rpc_servers.c_str();
    cp.backend = options.backend.empty() ? nullptr : options.backend.c_str();
    cp.params_backend = options.params_backend.empty() ? nullptr : options.params_backend.c_str();
    cp.offload_to_cpu = options.offload_to_cpu ? 1 : 0;
    cp.disable_auto_fit = options.auto_fit ? 0 : 1;
    cp.max_vram = options.max_vram.empty() ? nullptr : options.max_vram.c_str();
    cp.disable_prefetch = options.disable_prefetch ? 1 : 0;
    cp.disable_segmented_compute = options.disable_segmented_compute ? 1 : 0;
    cp.eager_load = options.eager_load ? 1 : 0;
    const bool plan_only = options.command == Command::Plan;
    cp.plan_only = plan_only ? 1 : 0;
    cp.job_width = options.width;
    cp.job_height = options.height;

    // Flags about devices are checked before the (slow) model load:
    // unreachable servers and unknown modules or devices fail fast.
    {
        ErrorText error;
        if (kiln_status st = kiln_context_params_check(&cp, &error.text); st != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
    }

    ErrorText load_error;
    KILN_LOG_VERBOSE("loading %s", model.empty() ? options.diffusion_model.c_str() : model.c_str());
    kiln_context* ctx = nullptr;
    if (kiln_status st = kiln_context_create(&cp, &ctx, &load_error.text); st != KILN_OK) {
        KILN_LOG_ERROR("%s", load_error.c_str());
        return exit_code_of(st);
    }
    struct FreeContext {
        kiln_context*& ctx;
        ~FreeContext() { kiln_context_free(ctx); }
    } free_context{ctx};

    // The images are read for the context, after its (lazy, fast) load: a
    // decoded size that RAM's books cannot hold is refused from the header.
    kiln_image* init = nullptr;
    if (!options.init_image.empty()) {
        ErrorText error;
        if (kiln_status st = kiln_context_image_load(
                ctx, options.init_image.c_str(), static_cast<uint64_t>(options.max_image_pixels), &init, &error.text);
            st != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
    }
    kiln_image* mask = nullptr;
    if (!options.mask.empty()) {
        ErrorText error;
        if (kiln_status st = kiln_context_image_load(
                ctx, options.mask.c_str(), static_cast<uint64_t>(options.max_image_pixels), &mask, &error.text);
            st != KILN_OK) {
            kiln_images_free(init, init ? 1 : 0);
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
    }
    std::vector<kiln_image*> refs;
    struct FreeImages {
        kiln_image*& init;
        kiln_image*& mask;
        std::vector<kiln_image*>& refs;
        ~FreeImages() {
            kiln_images_free(init, init ? 1 : 0);
            kiln_images_free(mask, mask ? 1 : 0);
            for (kiln_image* r : refs) kiln_images_free(r, 1);
        }
    } free_images{init, mask, refs};
    for (const std::string& path : options.ref_images) {
        ErrorText error;
        kiln_image* ref = nullptr;
        if (kiln_status st = kiln_context_image_load(ctx, path.c_str(), static_cast<uint64_t>(options.max_image_pixels),
                                                     &ref, &error.text);
            st != KILN_OK) {
            KILN_LOG_ERROR("-r: %s", error.c_str());
            return exit_code_of(st);
        }
        refs.push_back(ref);
    }
    // kiln_generation_params takes the images as one array.
    std::vector<kiln_image> ref_array;
    for (kiln_image* r : refs) ref_array.push_back(*r);

    int64_t seed = options.seed;
    if (seed < 0 && !plan_only) {
        seed = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
        KILN_LOG_INFO("seed: %lld", static_cast<long long>(seed));
    }
    Progress progress;
    progress.images = options.batch_count;
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = options.prompt.c_str();
    gp.negative_prompt = options.negative_prompt.c_str();
    gp.width = options.width;
    gp.height = options.height;
    gp.steps = options.steps;
    gp.cfg_scale = options.cfg_scale_given ? options.cfg_scale : -1.0f;
    gp.seed = seed;
    gp.batch_count = options.batch_count;
    gp.sampler = options.sampling_method.empty() ? nullptr : options.sampling_method.c_str();
    gp.scheduler = options.scheduler.empty() ? nullptr : options.scheduler.c_str();
    gp.rng = options.rng.c_str();
    gp.clip_skip = options.clip_skip;
    gp.flash_attention = options.diffusion_fa ? 1 : 0;
    gp.init_image = init;
    gp.strength = options.strength;
    gp.mask = mask;
    gp.vae_tiling = options.vae_tiling ? 1 : 0;
    gp.vae_tile_size = options.vae_tile_size;
    gp.vae_tile_overlap = options.vae_tile_overlap;
    gp.guidance = options.guidance_given ? options.guidance : -1.0f;
    gp.flow_shift_given = options.flow_shift_given ? 1 : 0;
    gp.flow_shift = options.flow_shift;
    gp.ref_images = ref_array.empty() ? nullptr : ref_array.data();
    gp.n_ref_images = static_cast<int>(ref_array.size());
    gp.progress = &Progress::on_step;
    gp.progress_user_data = &progress;

    if (plan_only) {
        char* text = nullptr;
        int fits = 0;
        ErrorText error;
        const kiln_status st = kiln_plan(ctx, &gp, &text, &fits, &error.text);
        if (st != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
        std::printf("%s", text);
        kiln_free_string(text);
        return fits ? kExitOk : kExitFailure;
    }

    kiln_image* images = nullptr;
    int count = 0;
    ErrorText gen_error;
    const kiln_status st = kiln_generate(ctx, &gp, &images, &count, &gen_error.text);
    if (char* report = kiln_memory_report(ctx)) {
        for (char* line = std::strtok(report, "\n"); line; line = std::strtok(nullptr, "\n")) {
            KILN_LOG_VERBOSE("memory: %s", line);
        }
        kiln_free_string(report);
    }
    if (st != KILN_OK) {
        if (progress.terminal) std::printf("\n");
        KILN_LOG_ERROR("%s", gen_error.c_str());
        return exit_code_of(st);
    }
    int exit_code = kExitOk;
    for (int i = 0; i < count; ++i) {
        const std::string path = output->path(i, count);
        ErrorText error;
        if (kiln_status save = kiln_image_save(&images[i], path.c_str(), &error.text); save != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            exit_code = exit_code_of(save);
            continue;
        }
        KILN_LOG_INFO("saved %s (%ux%u)", path.c_str(), images[i].width, images[i].height);
    }
    kiln_images_free(images, count);
    return exit_code;
}

int run_metadata(const Options& options) {
    if (options.init_image.empty()) {
        KILN_LOG_ERROR("metadata: no image given (kiln -M metadata -i IMAGE)");
        return kExitUsage;
    }
    char* text = nullptr;
    ErrorText error;
    if (kiln_image_read_parameters(options.init_image.c_str(), &text, &error.text) != 0) {
        KILN_LOG_ERROR("%s", error.c_str());
        return kExitFailure;
    }
    std::printf("%s\n", text);
    kiln_free_string(text);
    return kExitOk;
}

}  // namespace kiln::cli
