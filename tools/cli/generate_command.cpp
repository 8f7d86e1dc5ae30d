#include "generate_command.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <regex>
#include <string>

#include "cli.h"
#include "context_params.h"
#include "default_model.h"
#include "image/metadata_report.h"
#include "image/video_file.h"
#include "kiln.h"
#include "output_target.h"
#include "plan_suggestions.h"
#include "runtime/device_budget.h"
#include "runtime/host_memory.h"
#include "upscale_command.h"
#include "util/format.h"
#include "util/log.h"
#include "util/output_pattern.h"

namespace kiln::cli {
namespace {

// Progress: on a terminal one line per image's steps, redrawn in place;
// off one (a log, a service) a line every few seconds of steps.
struct Progress {
    bool terminal = isatty(STDOUT_FILENO) != 0;
    int images = 1;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_line = start;  // off a terminal: the last progress line
    int last_image = -1;
    // Off a terminal (a log, a service), a progress line at most this often.
    static constexpr double kLineSeconds = 5.0;

    static void on_step(int image, int step, int steps, void* user_data) {
        auto* self = static_cast<Progress*>(user_data);
        const auto now = std::chrono::steady_clock::now();
        if (step == 0 || image != self->last_image) {
            self->last_image = image;
            self->start = self->last_line = now;
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
            KILN_LOG_VERBOSE("image %d/%d: %d steps in %.3f s, %.2f it/s", image + 1, self->images, steps, elapsed,
                             rate);
        } else if (std::chrono::duration<double>(now - self->last_line).count() >= kLineSeconds) {
            self->last_line = now;
            KILN_LOG_INFO("image %d/%d: step %d/%d, %.2f it/s, ETA %.0fs", image + 1, self->images, step, steps, rate,
                          eta);
        }
    }

    // The phases besides sampling, a line each, on a terminal or off one:
    // a log shows where the time went between the step lines.
    static void on_phase(kiln_phase phase, int image, void* user_data) {
        auto* self = static_cast<Progress*>(user_data);
        const char* what = phase == KILN_PHASE_ENCODE   ? "encoding the prompt"
                           : phase == KILN_PHASE_DECODE ? "decoding"
                                                        : "hires fix";
        if (phase == KILN_PHASE_ENCODE) {
            KILN_LOG_INFO("%s", what);
        } else {
            KILN_LOG_INFO("image %d/%d: %s", image + 1, self->images, what);
        }
        self->last_line = std::chrono::steady_clock::now();
    }

    // A clip's decode, a latent frame at a time: redrawn on a terminal, a
    // line every few seconds off one, and the last always.
    static void on_decode(int image, int done, int frames, void* user_data) {
        auto* self = static_cast<Progress*>(user_data);
        const auto now = std::chrono::steady_clock::now();
        if (self->terminal) {
            std::printf("\r  image %d/%d  decoded %d/%d frames   ", image + 1, self->images, done, frames);
            if (done == frames) std::printf("\n");
            std::fflush(stdout);
        } else if (done == frames || std::chrono::duration<double>(now - self->last_line).count() >= kLineSeconds) {
            self->last_line = now;
            KILN_LOG_INFO("image %d/%d: decoded %d/%d frames", image + 1, self->images, done, frames);
        }
    }
};

// --preview: each preview replaces the file at --preview-path
// (kiln_image_save writes a temporary file beside it and renames it over, so
// a viewer never reads half an image). A failed write is reported once and
// the job goes on.
struct PreviewWriter {
    std::string path;
    bool failed = false;

    static void on_preview(int image, int step, const kiln_image* preview, void* user_data) {
        auto* self = static_cast<PreviewWriter*>(user_data);
        ErrorText error;
        if (kiln_image_save(preview, self->path.c_str(), &error.text) != KILN_OK) {
            if (!self->failed) KILN_LOG_ERROR("preview: %s", error.c_str());
            self->failed = true;
            return;
        }
        KILN_LOG_DEBUG("preview of image %d at step %d: %s", image + 1, step, self->path.c_str());
    }
};

// --control-video's frames: the folder's PNG, JPEG and WebP files in
// file-name order (byte order, so frame_010 follows frame_009), as a folder
// of numbered frames is meant. An error names the folder and the problem.
std::optional<std::vector<std::string>> control_frame_paths(const std::string& dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
        KILN_LOG_ERROR("--control-video: '%s' is not a folder (it takes a folder of the control clip's frames)",
                       dir.c_str());
        return std::nullopt;
    }
    std::vector<std::string> paths;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        std::string ext = entry.path().extension().string();
        for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (entry.is_regular_file(ec) && (ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp"))
            paths.push_back(entry.path().string());
    }
    if (ec) {
        KILN_LOG_ERROR("--control-video: cannot list '%s': %s", dir.c_str(), ec.message().c_str());
        return std::nullopt;
    }
    if (paths.empty()) {
        KILN_LOG_ERROR("--control-video: '%s' holds no .png, .jpg, .jpeg or .webp frames", dir.c_str());
        return std::nullopt;
    }
    std::sort(paths.begin(), paths.end());
    return paths;
}

kiln_preview_mode preview_mode(const std::string& name) {
    if (name == "proj") return KILN_PREVIEW_PROJ;
    if (name == "tae") return KILN_PREVIEW_TAE;
    if (name == "vae") return KILN_PREVIEW_VAE;
    return KILN_PREVIEW_NONE;  // "none"; the parser refused anything else
}

// The context for `options`' job with `model` (the -m given or found).
kiln_context_params job_context_params(const Options& options, const std::string& model) {
    kiln_context_params cp = context_params_of(options);
    cp.model_path = model.empty() ? nullptr : model.c_str();
    cp.plan_only = options.command == Command::Plan ? 1 : 0;
    cp.job_width = options.width;
    cp.job_height = options.height;
    cp.job_hires = options.hires ? 1 : 0;
    cp.job_hires_scale = options.hires_scale;
    cp.job_hires_width = options.hires_width;
    cp.job_hires_height = options.hires_height;
    return cp;
}

// kiln_plan's verdict for `gp` under `options` (plan_suggestions.h), with
// the context's own log lines held back: they would repeat the first plan's.
int plan_verdict(const Options& options, const std::string& model, const kiln_generation_params& gp) {
    const LogLevel level = log_level();
    log_set_level(LogLevel::Error);
    const kiln_context_params cp = job_context_params(options, model);
    kiln_context* ctx = nullptr;
    int fits = -1;
    char* error = nullptr;
    char* text = nullptr;
    if (kiln_context_create(&cp, &ctx, &error) == KILN_OK && kiln_plan(ctx, &gp, &text, &fits, &error) != KILN_OK) {
        fits = -1;
    }
    kiln_free_string(text);
    kiln_free_string(error);
    kiln_context_free(ctx);
    log_set_level(level);
    return fits;
}

// --hires-upscaler NAME under --hires-upscalers-dir, as sd-cli looks it up:
// the file of that name, or of that name with a model file's extension. A
// built-in name, a path, or a name the folder lacks go on as given (the
// request says what is wrong with them).
std::string hires_upscaler_path(const Options& options) {
    const std::string& name = options.hires_upscaler;
    if (options.hires_upscalers_dir.empty() || name.find('/') != std::string::npos) return name;
    for (const char* extension : {"", ".safetensors", ".pth", ".pt", ".gguf", ".bin", ".ckpt"}) {
        const std::string candidate = options.hires_upscalers_dir + "/" + name + extension;
        if (access(candidate.c_str(), R_OK) == 0) return candidate;
    }
    return name;
}

// A video model's clips (kiln_generate's frames, clip after clip): each a
// video file or, with a field in -o, one image per frame.
int save_clips(const Options& options, const std::string& output_name, const OutputPattern& output,
               const kiln_image* frames, int count) {
    const int clips = options.batch_count, per_clip = count / clips;
    int exit_code = kExitOk;
    for (int c = 0; c < clips; ++c) {
        std::vector<kiln_image> clip(frames + static_cast<ptrdiff_t>(c) * per_clip,
                                     frames + static_cast<ptrdiff_t>(c + 1) * per_clip);
        if (!options.embed_metadata) {
            for (kiln_image& frame : clip) frame.parameters = nullptr;
        }
        // A frame pattern names one clip's frames (-b 1: checked before the job).
        const std::string path = output.has_field() ? output_name : output.path(c, clips);
        ErrorText error;
        if (kiln_status save = kiln_video_save(clip.data(), per_clip, options.fps, options.output_begin_idx,
                                               path.c_str(), &error.text);
            save != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            exit_code = exit_code_of(save);
            continue;
        }
        KILN_LOG_INFO("saved %s (%d frames, %ux%u, %d fps)", path.c_str(), per_clip, clip[0].width, clip[0].height,
                      options.fps);
    }
    return exit_code;
}

}  // namespace

int run_generate(const Options& options) {
    for (const std::string& ignored : options.ignored_sd_cli_options) {
        KILN_LOG_VERBOSE("%s: accepted for sd-cli command lines; it has no effect in kiln (kiln --help says why)",
                         ignored.c_str());
    }
    // Check what can be checked before the (slow) model load.
    if (options.preview != "none" && !has_image_extension(options.preview_path)) {
        KILN_LOG_ERROR("--preview-path %s: unsupported image extension (valid: .png, .jpg, .jpeg, .webp)",
                       options.preview_path.c_str());
        return kExitUsage;
    }
    if (options.preview == "tae" && options.taesd.empty()) {
        KILN_LOG_WARN("--preview tae without --taesd: the previews come from the VAE (as sd-cli's do)");
    }
    if (options.taesd_preview_only && options.taesd.empty()) {
        KILN_LOG_WARN("--taesd-preview-only does nothing without --taesd");
    }
    // -M vid_gen writes a video (sd-cli's default output.avi) or, with a
    // field in the name, one image per frame.
    const std::string output_name = options.video_mode && !options.output_given ? "output.avi" : options.output;
    auto output = OutputPattern::parse(output_name, options.output_begin_idx, options.video_mode);
    if (!output) {
        KILN_LOG_ERROR("-o: %s", output.error().message.c_str());
        return kExitUsage;
    }
    const bool clip = options.video_mode || options.video_frames > 1;
    if (clip && output->has_field() && options.batch_count > 1) {
        KILN_LOG_ERROR(
            "-o %s: a frame pattern names one clip's frames; -b %d clips need a video name (.avi, .webm, "
            ".webp)",
            output_name.c_str(), options.batch_count);
        return kExitUsage;
    }
    if (clip && !output->has_field() && options.video_frames > 1 && !image::is_video_path(output->path(0, 1))) {
        KILN_LOG_ERROR(
            "-o %s: a clip of %d frames needs a video name (.avi, .webm, .webp) or a frame pattern "
            "(frame_%%03d.png)",
            output_name.c_str(), options.video_frames);
        return kExitUsage;
    }
    // Where the images go, before minutes of loading and sampling.
    if (auto problem = output_path_problem(output->path(0, 1))) {
        KILN_LOG_ERROR("-o %s: %s", options.output.c_str(), problem->c_str());
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
        KILN_LOG_INFO("model: %s (the default; -m chooses another)", model.c_str());
    }

    const bool plan_only = options.command == Command::Plan;
    kiln_context_params cp = job_context_params(options, model);
    if (!options.plan_ram.empty()) {
        // Before any model is placed: every plan of this process (the
        // suggestions' too) sees that machine's RAM.
        auto bytes = runtime::parse_size_bytes("--ram", options.plan_ram);
        if (!bytes.ok()) {
            KILN_LOG_ERROR("%s", bytes.error().message.c_str());
            return kExitUsage;
        }
        runtime::assume_host_available_bytes(*bytes);
        KILN_LOG_INFO("planning for a machine with %s of RAM available (--ram), not this one",
                      human_bytes(*bytes).c_str());
    }

    // Flags about devices are checked before the (slow) model load:
    // unreachable servers and unknown modules or devices fail fast.
    {
        ErrorText error;
        if (kiln_status st = kiln_context_params_check(&cp, &error.text); st != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
    }

    // The upscaler before the model: a bad --upscale-model fails before any
    // generation. kiln plan loads it too, to measure it.
    UpscalerPtr upscaler;
    if (!options.upscale_model.empty()) {
        int exit_code = kExitOk;
        upscaler = load_upscaler(options, &exit_code);
        if (!upscaler) return exit_code;
    }

    // The images are read for the context, after its (lazy, fast) load: a
    // decoded size that RAM's books cannot hold is refused from the header.
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
    kiln_model_info model_info;
    kiln_context_info(ctx, &model_info);
    if (options.video_mode && !model_info.video) {
        KILN_LOG_ERROR("-M vid_gen: %s makes images, not video (Wan models make video); use -M img_gen",
                       model_info.family);
        return kExitUsage;
    }

    kiln_image* init = nullptr;
    kiln_image* mask = nullptr;
    kiln_image* control = nullptr;
    kiln_image* end = nullptr;
    std::vector<kiln_image*> refs, control_frames;
    struct FreeImages {
        kiln_image*& init;
        kiln_image*& mask;
        kiln_image*& control;
        kiln_image*& end;
        std::vector<kiln_image*>& refs;
        std::vector<kiln_image*>& control_frames;
        ~FreeImages() {
            for (kiln_image* image : {init, mask, control, end}) kiln_images_free(image, image ? 1 : 0);
            for (kiln_image* r : refs) kiln_images_free(r, 1);
            for (kiln_image* f : control_frames) kiln_images_free(f, 1);
        }
    } free_images{init, mask, control, end, refs, control_frames};
    // Reads an image flag's file; on failure logs the error after `label`.
    auto load_image = [&](const std::string& path, const char* label, kiln_image** image) -> kiln_status {
        ErrorText error;
        const kiln_status st = kiln_context_image_load(
            ctx, path.c_str(), static_cast<uint64_t>(options.max_image_pixels), image, &error.text);
        if (st != KILN_OK) KILN_LOG_ERROR("%s%s", label, error.c_str());
        return st;
    };
    if (!options.init_image.empty()) {
        if (kiln_status st = load_image(options.init_image, "", &init); st != KILN_OK) return exit_code_of(st);
    }
    if (!options.mask.empty()) {
        if (kiln_status st = load_image(options.mask, "", &mask); st != KILN_OK) return exit_code_of(st);
    }
    if (!options.end_image.empty()) {
        if (kiln_status st = load_image(options.end_image, "--end-img: ", &end); st != KILN_OK) return exit_code_of(st);
    }
    if (!options.control_image.empty()) {
        if (kiln_status st = load_image(options.control_image, "--control-image: ", &control); st != KILN_OK)
            return exit_code_of(st);
    }
    for (const std::string& path : options.ref_images) {
        kiln_image* ref = nullptr;
        if (kiln_status st = load_image(path, "-r: ", &ref); st != KILN_OK) return exit_code_of(st);
        refs.push_back(ref);
    }
    if (!options.control_video.empty()) {
        auto paths = control_frame_paths(options.control_video);
        if (!paths) return kExitUsage;
        for (const std::string& path : *paths) {
            kiln_image* frame = nullptr;
            if (kiln_status st = load_image(path, "--control-video: ", &frame); st != KILN_OK) return exit_code_of(st);
            control_frames.push_back(frame);
        }
    }
    // kiln_generation_params takes the images as one array.
    std::vector<kiln_image> ref_array, control_array;
    for (kiln_image* r : refs) ref_array.push_back(*r);
    for (kiln_image* f : control_frames) control_array.push_back(*f);

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
    gp.video_frames = options.video_frames;
    gp.sampler = options.sampling_method.empty() ? nullptr : options.sampling_method.c_str();
    gp.scheduler = options.scheduler.empty() ? nullptr : options.scheduler.c_str();
    gp.rng = options.rng.c_str();
    gp.sampler_rng = options.sampler_rng.empty() ? nullptr : options.sampler_rng.c_str();
    gp.eta = options.eta.value_or(-1.0f);
    gp.high_noise_steps = options.high_noise_steps;
    gp.high_noise_cfg_scale = options.high_noise_cfg_scale.value_or(-1.0f);
    gp.high_noise_sampler =
        options.high_noise_sampling_method.empty() ? nullptr : options.high_noise_sampling_method.c_str();
    gp.high_noise_eta = options.high_noise_eta.value_or(-1.0f);
    gp.moe_boundary = options.moe_boundary;
    gp.timestep_shift = options.timestep_shift;
    gp.slg_scale = options.slg_scale;
    gp.skip_layers = options.skip_layers.data();
    gp.n_skip_layers = static_cast<int>(options.skip_layers.size());
    gp.skip_layer_start = options.skip_layer_start;
    gp.skip_layer_end = options.skip_layer_end;
    gp.sigmas = options.sigmas.empty() ? nullptr : options.sigmas.data();
    gp.n_sigmas = static_cast<int>(options.sigmas.size());
    gp.clip_skip = options.clip_skip;
    gp.flash_attention = options.diffusion_fa ? 1 : 0;
    gp.init_image = init;
    gp.strength = options.strength;
    gp.mask = mask;
    gp.end_image = end;
    gp.vae_tiling = options.vae_tiling ? 1 : 0;
    gp.vae_tile_size = options.vae_tile_size;
    gp.vae_tile_overlap = options.vae_tile_overlap;
    gp.vae_relative_tile_w = options.vae_relative_tile_w;
    gp.vae_relative_tile_h = options.vae_relative_tile_h;
    gp.guidance = options.guidance_given ? options.guidance : -1.0f;
    gp.flow_shift_given = options.flow_shift_given ? 1 : 0;
    gp.flow_shift = options.flow_shift;
    gp.ref_images = ref_array.empty() ? nullptr : ref_array.data();
    gp.n_ref_images = static_cast<int>(ref_array.size());
    gp.disable_auto_resize_ref_image = options.disable_auto_resize_ref_image ? 1 : 0;
    gp.increase_ref_index = options.increase_ref_index ? 1 : 0;
    gp.circular_x = options.circular_x ? 1 : 0;
    gp.circular_y = options.circular_y ? 1 : 0;
    gp.chroma_disable_dit_mask = options.chroma_disable_dit_mask ? 1 : 0;
    gp.chroma_enable_t5_mask = options.chroma_enable_t5_mask ? 1 : 0;
    gp.chroma_t5_mask_pad = options.chroma_t5_mask_pad;
    gp.max_sequence_length = options.max_sequence_length;
    gp.control_image = control;
    gp.control_strength = options.control_strength;
    gp.control_frames = control_array.empty() ? nullptr : control_array.data();
    gp.n_control_frames = static_cast<int>(control_array.size());
    gp.vace_strength = options.vace_strength;
    gp.control_canny = options.canny ? 1 : 0;
    gp.disable_file_hashes = options.embed_metadata ? 0 : 1;  // no metadata written: no file read to hash
    if (!options.quiet) {
        gp.progress = &Progress::on_step;
        gp.progress_user_data = &progress;
        gp.phase = &Progress::on_phase;
        gp.phase_user_data = &progress;
        gp.decode = &Progress::on_decode;
        gp.decode_user_data = &progress;
    }
    gp.hires = options.hires ? 1 : 0;
    gp.hires_scale = options.hires_scale;
    gp.hires_width = options.hires_width;
    gp.hires_height = options.hires_height;
    gp.hires_steps = options.hires_steps;
    gp.hires_denoising_strength = options.hires_denoising_strength;
    const std::string hires_upscaler = hires_upscaler_path(options);
    gp.hires_upscaler = hires_upscaler.c_str();
    gp.hires_sigmas = options.hires_sigmas.empty() ? nullptr : options.hires_sigmas.data();
    gp.n_hires_sigmas = static_cast<int>(options.hires_sigmas.size());
    gp.hires_upscale_tile_size = options.hires_upscale_tile_size;
    PreviewWriter preview{options.preview_path};
    gp.preview_mode = preview_mode(options.preview);
    gp.preview_interval = options.preview_interval;
    gp.preview_noisy = options.preview_noisy ? 1 : 0;
    gp.cache_mode = options.cache_mode.c_str();
    gp.cache_option = options.cache_option.c_str();
    gp.scm_mask = options.scm_mask.c_str();
    gp.scm_policy = options.scm_policy.c_str();
    if (gp.preview_mode != KILN_PREVIEW_NONE) {
        gp.preview = &PreviewWriter::on_preview;
        gp.preview_user_data = &preview;
    }

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
        const bool uses_gpu = std::regex_search(std::string(text), std::regex("computes on (?!CPU)"));
        kiln_free_string(text);
        std::printf("%s", plan_suggestions(options, fits, uses_gpu, [&](const Options& changed) {
                              return plan_verdict(changed, model, gp);
                          }).c_str());
        if (upscaler) {
            // It runs after the job, on the CPU, outside the model's books.
            kiln_model_info info;
            kiln_context_info(ctx, &info);
            uint64_t weights = 0, compute = 0;
            if (kiln_upscaler_memory(upscaler.get(), gp.width > 0 ? gp.width : info.width,
                                     gp.height > 0 ? gp.height : info.height, options.upscale_repeats, &weights,
                                     &compute, &error.text) != KILN_OK) {
                KILN_LOG_ERROR("%s", error.c_str());
                return kExitUsage;
            }
            std::printf("then --upscale-model on CPU (outside the model's books): weights %s, compute %s per tile\n",
                        human_bytes(weights).c_str(), human_bytes(compute).c_str());
        }
        return fits != 0 ? kExitOk : kExitFailure;
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
    for (int i = 0; upscaler && i < count; ++i) {
        if (int code = upscale_in_place(upscaler.get(), options, images[i]); code != kExitOk) {
            kiln_images_free(images, count);  // no image is written half-done
            return code;
        }
    }
    // A video model's clips go to a video file or a frame pattern; a clip of one frame to an image name is an image.
    if (model_info.video && (count > options.batch_count || output->has_field() || image::is_video_path(output_name))) {
        exit_code = save_clips(options, output_name, *output, images, count);
        kiln_images_free(images, count);
        return exit_code;
    }
    for (int i = 0; i < count; ++i) {
        const std::string path = output->path(i, count);
        ErrorText error;
        kiln_image written = images[i];
        if (!options.embed_metadata) written.parameters = nullptr;
        if (kiln_status save = kiln_image_save(&written, path.c_str(), &error.text); save != KILN_OK) {
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
    if (options.metadata_format != "parameters") {
        image::MetadataReportOptions report_options;
        report_options.format =
            options.metadata_format == "json" ? image::MetadataFormat::Json : image::MetadataFormat::Text;
        report_options.raw = options.metadata_raw;
        report_options.brief = options.metadata_brief;
        report_options.all = options.metadata_all;
        auto report = image::metadata_report(options.init_image, report_options);
        if (!report.ok()) {
            KILN_LOG_ERROR("%s", report.error().message.c_str());
            return kExitFailure;
        }
        std::fputs(report->c_str(), stdout);
        return kExitOk;
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
