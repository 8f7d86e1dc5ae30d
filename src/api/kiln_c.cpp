// The C API (include/kiln.h) over the C++ pipeline: converts parameters,
// catches every failure into an error string, owns the returned buffers.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "image/image_io.h"
#include "image/png_metadata.h"
#include "io/gguf_writer.h"
#include "io/model_report.h"
#include "io/tensor_convert.h"
#include "kiln.h"
#include "pipeline/generate.h"
#include "pipeline/job_forecast.h"
#include "runtime/device_budget.h"
#include "runtime/devices.h"
#include "util/format.h"
#include "util/log.h"

struct kiln_context {
    std::unique_ptr<kiln::pipeline::StableDiffusionModel> model;
    bool plan_only = false;
};

namespace {

char* copy_string(const std::string& s) {
    char* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out) std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
}

int fail(char** error, const std::string& message) {
    if (error) *error = copy_string(message);
    return -1;
}

std::string str(const char* s) { return s ? s : ""; }

// Fills a kiln_image from an image::Image (RGB), with optional parameters text.
bool export_image(const kiln::image::Image& img, const std::string& parameters, kiln_image* out) {
    out->width = static_cast<uint32_t>(img.width);
    out->height = static_cast<uint32_t>(img.height);
    out->channels = static_cast<uint32_t>(img.channels);
    out->data = static_cast<uint8_t*>(std::malloc(img.pixels.size()));
    out->parameters = parameters.empty() ? nullptr : copy_string(parameters);
    if (!out->data) return false;
    std::memcpy(out->data, img.pixels.data(), img.pixels.size());
    return true;
}

kiln::Result<kiln::image::Image> import_image(const kiln_image* in) {
    kiln::image::Image img;
    img.width = static_cast<int>(in->width);
    img.height = static_cast<int>(in->height);
    img.channels = static_cast<int>(in->channels);
    if (!in->data) return kiln::Error{"image has no pixel data"};
    img.pixels.assign(in->data, in->data + img.row_bytes() * static_cast<size_t>(img.height));
    KILN_TRY(kiln::image::validate_image(img));
    return img;
}

}  // namespace

extern "C" {

void kiln_set_log_level(kiln_log_level level) { kiln::log_set_level(static_cast<kiln::LogLevel>(level)); }
void kiln_set_log_color(int enabled) { kiln::log_set_color(enabled != 0); }

namespace {
kiln_log_callback g_api_log_callback = nullptr;
void forward_log(kiln::LogLevel level, const char* text, void* user_data) {
    g_api_log_callback(static_cast<kiln_log_level>(level), text, user_data);
}
}  // namespace

void kiln_set_log_callback(kiln_log_callback callback, void* user_data) {
    g_api_log_callback = callback;
    kiln::log_set_callback(callback ? forward_log : nullptr, user_data);
}

void kiln_context_params_init(kiln_context_params* params) { std::memset(params, 0, sizeof *params); }

kiln_context* kiln_context_create(const kiln_context_params* params, char** error) {
    try {
        kiln::pipeline::ModelPaths paths;
        if (params->model_path) paths.model.push_back(params->model_path);
        paths.diffusion_model = str(params->diffusion_model_path);
        paths.vae = str(params->vae_path);
        paths.clip_l = str(params->clip_l_path);
        paths.tokenizer = str(params->tokenizer_path);
        paths.embeddings = str(params->embeddings_dir);
        kiln::pipeline::ModelOptions options;
        options.threads = params->n_threads;
        if (params->weight_type) {
            auto type = kiln::io::parse_weight_type(params->weight_type);
            if (!type.ok()) {
                fail(error, type.error().message);
                return nullptr;
            }
            options.weight_type = *type;
        }
        if (params->prediction) {
            const std::string p = params->prediction;
            if (p == "eps") {
                options.prediction = kiln::pipeline::Prediction::Eps;
            } else if (p == "v") {
                options.prediction = kiln::pipeline::Prediction::V;
            } else {
                fail(error, "--prediction: unknown prediction '" + p + "' (valid: eps, v)");
                return nullptr;
            }
        }
        if (params->rpc_servers && *params->rpc_servers) {
            if (kiln::Status s = kiln::runtime::add_rpc_servers(params->rpc_servers); !s.ok()) {
                fail(error, s.error().message);
                return nullptr;
            }
        }
        if (params->backend && *params->backend) {
            auto placement = kiln::runtime::parse_backend_assignments(params->backend);
            if (!placement.ok()) {
                fail(error, placement.error().message);
                return nullptr;
            }
            // One device for everything parses as every module on it.
            options.placement.backend = std::move(placement).value();
        }
        if (params->params_backend && *params->params_backend) {
            auto where =
                kiln::pipeline::parse_params_backend(params->params_backend, kiln::runtime::registered_device_names());
            if (!where.ok()) {
                fail(error, where.error().message);
                return nullptr;
            }
            options.placement.params_backend = std::move(where).value();
        }
        if (params->max_vram && *params->max_vram) {
            auto budgets = kiln::runtime::parse_max_vram(params->max_vram);
            if (!budgets.ok()) {
                fail(error, budgets.error().message);
                return nullptr;
            }
            options.placement.budgets = std::move(budgets).value();
        }
        options.placement.offload_to_cpu = params->offload_to_cpu != 0;
        options.placement.auto_fit = params->disable_auto_fit == 0;
        options.executor.prefetch = params->disable_prefetch == 0;
        options.executor.segmented = params->disable_segmented_compute == 0;
        options.eager_load = params->eager_load != 0;
        options.plan_only = params->plan_only != 0;
        options.job_width = params->job_width;
        options.job_height = params->job_height;
        kiln::log_capture_ggml();
        auto model = kiln::pipeline::StableDiffusionModel::load(paths, options);
        if (!model.ok()) {
            fail(error, model.error().message);
            return nullptr;
        }
        auto* ctx = new kiln_context();
        ctx->model = std::move(model).value();
        ctx->plan_only = options.plan_only;
        return ctx;
    } catch (const std::bad_alloc&) {
        fail(error, "out of memory loading the model");
        return nullptr;
    }
}

void kiln_context_free(kiln_context* ctx) { delete ctx; }

void kiln_context_info(const kiln_context* ctx, kiln_model_info* info) {
    std::memset(info, 0, sizeof *info);
    const auto& d = ctx->model->defaults();
    info->width = d.width;
    info->height = d.height;
    info->steps = d.steps;
    info->cfg_scale = d.cfg_scale;
    std::strncpy(info->sampler, d.sampler.c_str(), sizeof info->sampler - 1);
    std::strncpy(info->scheduler, d.scheduler.c_str(), sizeof info->scheduler - 1);
    std::strncpy(info->family, ctx->model->family().c_str(), sizeof info->family - 1);
}

void kiln_generation_params_init(kiln_generation_params* params) {
    std::memset(params, 0, sizeof *params);
    params->cfg_scale = -1.0f;
    params->seed = 42;
    params->batch_count = 1;
    params->strength = 0.75f;
    params->vae_tile_size = 32;
    params->vae_tile_overlap = 0.5f;
}

int kiln_generate(kiln_context* ctx, const kiln_generation_params* params, kiln_image** images, int* n_images,
                  char** error) {
    *images = nullptr;
    *n_images = 0;
    try {
        kiln::pipeline::GenerationRequest r;
        r.prompt = str(params->prompt);
        r.negative_prompt = str(params->negative_prompt);
        r.width = params->width;
        r.height = params->height;
        r.steps = params->steps;
        r.cfg_scale = params->cfg_scale;
        r.seed = params->seed;
        r.batch_count = params->batch_count;
        r.sampler = str(params->sampler);
        r.scheduler = str(params->scheduler);
        r.clip_skip = params->clip_skip;
        r.flash_attention = params->flash_attention != 0;
        r.strength = params->strength;
        if (params->rng) {
            auto rng = kiln::pipeline::parse_rng_kind(params->rng);
            if (!rng.ok()) return fail(error, rng.error().message);
            r.rng = *rng;
        }
        if (params->init_image) {
            auto img = import_image(params->init_image);
            if (!img.ok()) return fail(error, "init image: " + img.error().message);
            r.init_image = std::move(img).value();
        }
        if (params->vae_tiling)
            r.vae_tiling = kiln::pipeline::VaeTiling{params->vae_tile_size, params->vae_tile_overlap};
        if (params->mask) {
            auto img = import_image(params->mask);
            if (!img.ok()) return fail(error, "mask: " + img.error().message);
            r.mask = std::move(img).value();
        }
        kiln::pipeline::StepCallback on_step;
        if (params->progress) {
            on_step = [params](int image, int step, int total) {
                params->progress(image, step, total, params->progress_user_data);
            };
        }
        if (ctx->plan_only) return fail(error, "this context was created with plan_only: it can plan, not generate");
        auto result = kiln::pipeline::generate(*ctx->model, r, on_step);
        if (!result.ok()) {
            ctx->model->release_caches();  // a failed job gives back what it took
            return fail(error, result.error().message);
        }
        auto* out = static_cast<kiln_image*>(std::calloc(result->size(), sizeof(kiln_image)));
        if (!out) return fail(error, "out of memory");
        for (size_t i = 0; i < result->size(); ++i) {
            const auto& g = (*result)[i];
            if (!export_image(g.image, kiln::image::format_a1111_parameters(g.info), &out[i])) {
                kiln_images_free(out, static_cast<int>(result->size()));
                return fail(error, "out of memory");
            }
        }
        *images = out;
        *n_images = static_cast<int>(result->size());
        return 0;
    } catch (const std::bad_alloc&) {
        return fail(error, "out of memory during generation");
    }
}

void kiln_images_free(kiln_image* images, int n_images) {
    if (!images) return;
    for (int i = 0; i < n_images; ++i) {
        std::free(images[i].data);
        std::free(images[i].parameters);
    }
    std::free(images);
}

int kiln_image_save(const kiln_image* image, const char* path, char** error) {
    auto img = import_image(image);
    if (!img.ok()) return fail(error, std::string(path) + ": " + img.error().message);
    kiln::image::ImageWriteOptions options;
    if (image->parameters) options.text[kiln::image::kParametersKeyword] = image->parameters;
    auto status = kiln::image::write_image(path, *img, options);
    if (!status.ok()) return fail(error, status.error().message);
    return 0;
}

int kiln_image_load(const char* path, kiln_image** image, char** error) {
    return kiln_image_load_limited(path, 0, image, error);
}

int kiln_image_load_limited(const char* path, uint64_t max_pixels, kiln_image** image, char** error) {
    *image = nullptr;
    auto img = kiln::image::read_image(path, max_pixels ? max_pixels : kiln::image::kDefaultMaxImagePixels);
    if (!img.ok()) return fail(error, img.error().message);
    auto rgb = kiln::image::convert_channels(*img, 3);
    if (!rgb.ok()) return fail(error, std::string(path) + ": " + rgb.error().message);
    auto* out = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
    if (!out || !export_image(*rgb, "", out)) {
        kiln_images_free(out, out ? 1 : 0);
        return fail(error, "out of memory");
    }
    *image = out;
    return 0;
}

int kiln_image_read_parameters(const char* path, char** text, char** error) {
    *text = nullptr;
    auto chunks = kiln::image::read_image_text(path);
    if (!chunks.ok()) return fail(error, chunks.error().message);
    auto it = chunks->find(kiln::image::kParametersKeyword);
    if (it == chunks->end()) return fail(error, std::string(path) + ": no generation parameters in this image");
    *text = copy_string(it->second);
    return 0;
}

int kiln_model_describe(const char* path, int list_tensors, char** text, char** error) {
    *text = nullptr;
    try {
        auto model = kiln::io::ModelFile::open({str(path)});
        if (!model.ok()) return fail(error, model.error().message);
        *text = copy_string(kiln::io::describe_model(*model, str(path), list_tensors != 0));
        return *text ? 0 : fail(error, "out of memory");
    } catch (const std::bad_alloc&) {
        return fail(error, "out of memory describing the model");
    }
}

int kiln_model_convert(const char* const* paths, int n_paths, const char* out_path, const char* weight_type,
                       kiln_convert_progress progress, void* user_data, char** error) {
    try {
        std::vector<std::string> files;
        for (int i = 0; i < n_paths; ++i) files.push_back(str(paths[i]));
        kiln::io::GgufWriteOptions options;
        if (weight_type) {
            auto type = kiln::io::parse_weight_type(weight_type);
            if (!type.ok()) return fail(error, type.error().message);
            options.type = *type;
        }
        auto model = kiln::io::ModelFile::open(files);
        if (!model.ok()) return fail(error, model.error().message);
        if (progress) {
            options.progress = [progress, user_data](size_t done, size_t total) {
                progress(static_cast<int>(done), static_cast<int>(total), user_data);
            };
        }
        auto status = kiln::io::write_gguf(*model, str(out_path), options);
        if (!status.ok()) return fail(error, status.error().message);
        return 0;
    } catch (const std::bad_alloc&) {
        return fail(error, "out of memory converting the model");
    }
}

void kiln_free_string(char* text) { std::free(text); }

int kiln_plan(kiln_context* ctx, const kiln_generation_params* params, char** text, int* fits, char** error) {
    *text = nullptr;
    try {
        const auto& d = ctx->model->defaults();
        const int width = params->width > 0 ? params->width : d.width;
        const int height = params->height > 0 ? params->height : d.height;
        const float cfg = params->cfg_scale >= 0 ? params->cfg_scale : d.cfg_scale;
        const int stride = ctx->model->vae().config().downscale();
        if (width % stride != 0 || height % stride != 0) {
            return fail(error, "width and height must be multiples of " + std::to_string(stride) + ", got " +
                                   std::to_string(width) + "x" + std::to_string(height));
        }
        auto forecast =
            kiln::pipeline::forecast_job(*ctx->model, width, height, cfg != 1.0f, params->flash_attention != 0);
        if (!forecast.ok()) return fail(error, forecast.error().message);
        *text = copy_string("job: " + std::to_string(width) + "x" + std::to_string(height) +
                            (cfg != 1.0f ? ", CFG batch of two\n" : "\n") +
                            kiln::pipeline::describe_forecast(*ctx->model, *forecast));
        if (fits) *fits = forecast->fits ? 1 : 0;
        return 0;
    } catch (const std::bad_alloc&) {
        return fail(error, "out of memory while planning");
    }
}

char* kiln_memory_report(kiln_context* ctx) {
    std::string out;
    for (const auto& [name, ledger] : ctx->model->ledgers()) {
        out += name + " peak " + kiln::human_bytes(ledger->peak()) + " now " + kiln::human_bytes(ledger->managed());
        out += ledger->budget() ? " budget " + kiln::human_bytes(*ledger->budget()) : std::string(" no budget");
        out += "\n";
    }
    auto& m = *ctx->model;
    for (kiln::runtime::Executor* e : {&m.text_encoder_compute(), &m.diffusion_compute(), &m.vae_compute()}) {
        out += e->module() + " compute buffers peak " + kiln::human_bytes(e->stats().peak_workspace) + " on " +
               e->store().ledger().device_name() + "\n";
    }
    return copy_string(out);
}

const char* kiln_version(void) { return KILN_VERSION; }

}  // extern "C"
