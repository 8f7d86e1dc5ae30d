// The C API (include/kiln.h) over the C++ pipeline: converts parameters,
// catches every failure into an error string, owns the returned buffers.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "image/image_io.h"
#include "image/png_metadata.h"
#include "image/video_file.h"
#include "io/gguf_writer.h"
#include "io/model_report.h"
#include "io/tensor_convert.h"
#include "kiln.h"
#include "models/registry.h"
#include "pipeline/auto_fit.h"
#include "pipeline/generate.h"
#include "pipeline/image_to_video.h"
#include "pipeline/job_forecast.h"
#include "pipeline/loras.h"
#include "pipeline/module_roles.h"
#include "pipeline/request.h"
#include "pipeline/upscaler.h"
#include "pipeline/vace_context.h"
#include "runtime/blas_core.h"
#include "runtime/device_budget.h"
#include "runtime/devices.h"
#include "runtime/rpc_server.h"
#include "util/format.h"
#include "util/log.h"

struct kiln_upscaler {
    std::unique_ptr<kiln::pipeline::Upscaler> upscaler;
    int tile_size = kiln::pipeline::kDefaultUpscaleTile;
};

struct kiln_context {
    std::unique_ptr<kiln::pipeline::Model> model;
    bool plan_only = false;
};

namespace {

char* copy_string(const std::string& s) {
    char* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out) std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
}

kiln_status status_of(kiln::ErrorKind kind) {
    switch (kind) {
        case kiln::ErrorKind::Internal: return KILN_ERROR_INTERNAL;
        case kiln::ErrorKind::InvalidRequest: return KILN_ERROR_INVALID_REQUEST;
        case kiln::ErrorKind::BadFile: return KILN_ERROR_BAD_FILE;
        case kiln::ErrorKind::OutOfMemory: return KILN_ERROR_OUT_OF_MEMORY;
        case kiln::ErrorKind::Cancelled: return KILN_ERROR_CANCELLED;
    }
    return KILN_ERROR_INTERNAL;
}

kiln_status fail(char** error, const kiln::Error& e) {
    if (error) *error = copy_string(e.message);
    return status_of(e.kind);
}

kiln_status out_of_memory(char** error, const std::string& doing) {
    return fail(error, kiln::Error::out_of_memory("out of memory " + doing));
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
    if (!in->data) return kiln::Error::invalid_request("image has no pixel data");
    img.pixels.assign(in->data, in->data + img.row_bytes() * static_cast<size_t>(img.height));
    if (kiln::Status s = kiln::image::validate_image(img); !s.ok())
        return s.error().as(kiln::ErrorKind::InvalidRequest);
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

const char* kiln_status_name(kiln_status status) {
    switch (status) {
        case KILN_OK: return "ok";
        case KILN_ERROR_INTERNAL: return kiln::error_kind_name(kiln::ErrorKind::Internal);
        case KILN_ERROR_INVALID_REQUEST: return kiln::error_kind_name(kiln::ErrorKind::InvalidRequest);
        case KILN_ERROR_BAD_FILE: return kiln::error_kind_name(kiln::ErrorKind::BadFile);
        case KILN_ERROR_OUT_OF_MEMORY: return kiln::error_kind_name(kiln::ErrorKind::OutOfMemory);
        case KILN_ERROR_CANCELLED: return kiln::error_kind_name(kiln::ErrorKind::Cancelled);
    }
    return "unknown";
}

namespace {

// The C parameters as the pipeline's options; errors are invalid requests.
kiln::Result<kiln::pipeline::ModelOptions> model_options(const kiln_context_params* params) {
    using kiln::Error;
    using kiln::ErrorKind;
    kiln::pipeline::ModelOptions options;
    options.threads = params->n_threads;
    if (params->weight_type) {
        auto type = kiln::io::parse_weight_type(params->weight_type);
        if (!type.ok()) return type.error().as(ErrorKind::InvalidRequest);
        options.weight_type = *type;
    }
    if (params->tensor_type_rules) {
        auto rules = kiln::io::TensorTypeRules::parse(params->tensor_type_rules);
        if (!rules.ok()) return rules.error();
        options.tensor_type_rules = std::move(rules).value();
    }
    if (params->prediction) {
        const std::string p = params->prediction;
        if (p == "eps") {
            options.prediction = kiln::pipeline::Prediction::Eps;
        } else if (p == "v") {
            options.prediction = kiln::pipeline::Prediction::V;
        } else {
            return Error::invalid_request("--prediction: unknown prediction '" + p + "' (valid: eps, v)");
        }
    }
    options.lora_dir = str(params->lora_model_dir);
    options.taesd_preview_only = params->taesd_preview_only != 0;
    options.zero_cond_t = params->qwen_image_zero_cond_t != 0;
    if (params->lora_apply_mode) {
        auto mode = kiln::pipeline::parse_lora_apply_mode(params->lora_apply_mode);
        if (!mode.ok()) return Error::invalid_request("--lora-apply-mode: " + mode.error().message);
        options.lora_apply_mode = *mode;
    }
    if (params->rpc_servers && *params->rpc_servers) {
        // A malformed endpoint is an invalid request; an unreachable server is not.
        if (kiln::Status s = kiln::runtime::add_rpc_servers(params->rpc_servers); !s.ok()) return s.error();
    }
    if (params->backend && *params->backend) {
        auto placement = kiln::pipeline::parse_backend_assignments(params->backend);
        if (!placement.ok()) return placement.error().as(ErrorKind::InvalidRequest);
        // One device for everything parses as every module on it.
        options.placement.backend = std::move(placement).value();
    }
    if (params->split_mode && *params->split_mode) {
        auto modes = kiln::pipeline::parse_split_mode(params->split_mode);
        if (!modes.ok()) return modes.error().as(ErrorKind::InvalidRequest);
        options.placement.split_mode = std::move(modes).value();
    }
    if (params->params_backend && *params->params_backend) {
        auto where =
            kiln::pipeline::parse_params_backend(params->params_backend, kiln::runtime::registered_device_names());
        if (!where.ok()) return where.error().as(ErrorKind::InvalidRequest);
        options.placement.params_backend = std::move(where).value();
    }
    if (params->max_vram && *params->max_vram) {
        auto budgets = kiln::runtime::parse_max_vram(params->max_vram);
        if (!budgets.ok()) return budgets.error().as(ErrorKind::InvalidRequest);
        KILN_TRY(budgets->check_devices(kiln::runtime::registered_device_names()));
        options.placement.budgets = std::move(budgets).value();
    }
    options.placement.offload_to_cpu = params->offload_to_cpu != 0;
    if (params->modules_on_cpu && *params->modules_on_cpu) {
        std::string list = params->modules_on_cpu;
        for (size_t start = 0; start <= list.size();) {
            const size_t comma = std::min(list.find(',', start), list.size());
            const std::string module = list.substr(start, comma - start);
            if (module != "te" && module != "vae" && module != "control") {
                return Error::invalid_request("modules on the CPU: unknown module '" + module +
                                              "' (valid: te, vae, control)");
            }
            options.placement.on_cpu.insert(module);
            start = comma + 1;
        }
    }
    options.placement.auto_fit = params->disable_auto_fit == 0;
    options.executor.prefetch = params->disable_prefetch == 0;
    options.executor.segmented = params->disable_segmented_compute == 0;
    options.eager_load = params->eager_load != 0;
    options.plan_only = params->plan_only != 0;
    options.job_width = params->job_width;
    options.job_height = params->job_height;
    if (params->job_hires) {
        kiln::pipeline::HiresFix h;
        h.scale = params->job_hires_scale;
        h.width = params->job_hires_width;
        h.height = params->job_hires_height;
        options.job_hires = h;
    }
    return options;
}

// The C generation parameters as a request (validated later, by
// pipeline::validate_request, for kiln_generate and kiln_plan alike).
kiln::Result<kiln::pipeline::GenerationRequest> generation_request(const kiln_generation_params* params) {
    kiln::pipeline::GenerationRequest r;
    r.prompt = str(params->prompt);
    r.negative_prompt = str(params->negative_prompt);
    r.width = params->width;
    r.height = params->height;
    r.steps = params->steps;
    r.cfg_scale = params->cfg_scale;
    r.seed = params->seed;
    r.batch_count = params->batch_count;
    if (params->video_frames != 0) r.video_frames = params->video_frames;
    r.high_noise.steps = params->high_noise_steps < 0 ? -1 : params->high_noise_steps;
    // NaN: refused by validation, by name.
    if (params->high_noise_cfg_scale >= 0 || std::isnan(params->high_noise_cfg_scale))
        r.high_noise.cfg_scale = params->high_noise_cfg_scale;
    r.high_noise.sampler = str(params->high_noise_sampler);
    if (params->high_noise_eta >= 0 || std::isnan(params->high_noise_eta)) r.high_noise.eta = params->high_noise_eta;
    r.high_noise.moe_boundary = params->moe_boundary;
    r.sampler = str(params->sampler);
    r.scheduler = str(params->scheduler);
    r.clip_skip = params->clip_skip;
    r.flash_attention = params->flash_attention != 0;
    r.strength = params->strength;
    r.init_latent_resize = params->init_latent_resize != 0;
    if (params->rng) {
        auto rng = kiln::pipeline::parse_rng_kind(params->rng);
        if (!rng.ok()) return rng.error().as(kiln::ErrorKind::InvalidRequest);
        r.rng = *rng;
    }
    if (params->init_image) {
        auto img = import_image(params->init_image);
        if (!img.ok()) return img.error().in_context("init image: ");
        r.init_image = std::move(img).value();
    }
    if (params->end_image) {
        auto img = import_image(params->end_image);
        if (!img.ok()) return img.error().in_context("--end-img: ");
        r.end_image = std::move(img).value();
    }
    if (params->vae_tiling) {
        r.vae_tiling = kiln::pipeline::VaeTiling{params->vae_tile_size, params->vae_tile_overlap,
                                                 params->vae_relative_tile_w, params->vae_relative_tile_h};
    }
    if (params->sampler_rng) {
        auto rng = kiln::pipeline::parse_rng_kind(params->sampler_rng, "--sampler-rng");
        if (!rng.ok()) return rng.error().as(kiln::ErrorKind::InvalidRequest);
        r.sampler_rng = *rng;
    }
    if (params->eta >= 0 || std::isnan(params->eta)) r.eta = params->eta;  // NaN: refused by validation, by name
    if (params->n_sigmas < 0 || (params->n_sigmas > 0 && !params->sigmas)) {
        return kiln::Error::invalid_request("sigmas: " + std::to_string(params->n_sigmas) + " values but no array");
    }
    if (params->n_sigmas > 0) r.sigmas.assign(params->sigmas, params->sigmas + params->n_sigmas);
    if (params->mask) {
        auto img = import_image(params->mask);
        if (!img.ok()) return img.error().in_context("mask: ");
        r.mask = std::move(img).value();
    }
    if (params->guidance >= 0) r.guidance = params->guidance;
    if (std::isnan(params->guidance)) r.guidance = params->guidance;  // refused by validation, by name
    if (params->flow_shift_given) r.flow_shift = params->flow_shift;
    if (params->n_ref_images < 0 || (params->n_ref_images > 0 && !params->ref_images)) {
        return kiln::Error::invalid_request("ref_images: " + std::to_string(params->n_ref_images) +
                                            " reference images but no array");
    }
    for (int i = 0; i < params->n_ref_images; ++i) {
        auto img = import_image(&params->ref_images[i]);
        if (!img.ok()) return img.error().in_context("reference image " + std::to_string(i + 1) + ": ");
        r.ref_images.push_back(std::move(img).value());
    }
    if (params->n_control_frames < 0 || (params->n_control_frames > 0 && !params->control_frames)) {
        return kiln::Error::invalid_request("control_frames: " + std::to_string(params->n_control_frames) +
                                            " control frames but no array");
    }
    for (int i = 0; i < params->n_control_frames; ++i) {
        auto img = import_image(&params->control_frames[i]);
        if (!img.ok()) return img.error().in_context("control frame " + std::to_string(i + 1) + ": ");
        r.control_frames.push_back(std::move(img).value());
    }
    r.vace_strength = params->vace_strength;
    r.auto_resize_ref_images = params->disable_auto_resize_ref_image == 0;
    r.increase_ref_index = params->increase_ref_index != 0;
    r.seams = kiln::nn::Seams{params->circular_x != 0, params->circular_y != 0};
    r.timestep_shift = params->timestep_shift;
    r.slg.scale = params->slg_scale;
    r.slg.start = params->skip_layer_start;
    r.slg.end = params->skip_layer_end;
    if (params->n_skip_layers < 0 || (params->n_skip_layers > 0 && !params->skip_layers)) {
        return kiln::Error::invalid_request("skip_layers: " + std::to_string(params->n_skip_layers) +
                                            " layers but no array");
    }
    if (params->skip_layers) r.slg.blocks.assign(params->skip_layers, params->skip_layers + params->n_skip_layers);
    {
        auto cache = kiln::pipeline::make_step_cache_options(
            params->cache_mode ? params->cache_mode : "", params->cache_option ? params->cache_option : "",
            params->scm_mask ? params->scm_mask : "", params->scm_policy ? params->scm_policy : "");
        if (!cache.ok()) return cache.error();
        r.cache = std::move(cache).value();
    }
    r.t5_options.dit_mask = params->chroma_disable_dit_mask == 0;
    r.t5_options.t5_mask = params->chroma_enable_t5_mask != 0;
    r.t5_options.pad_tokens = params->chroma_t5_mask_pad;
    r.t5_options.length = params->max_sequence_length;
    if (params->hires) {
        kiln::pipeline::HiresFix h;
        h.scale = params->hires_scale;
        h.width = params->hires_width;
        h.height = params->hires_height;
        h.steps = params->hires_steps;
        h.denoising_strength = params->hires_denoising_strength;
        if (params->hires_upscaler) h.upscaler = params->hires_upscaler;
        h.upscale_tile = params->hires_upscale_tile_size;
        if (params->n_hires_sigmas < 0 || (params->n_hires_sigmas > 0 && !params->hires_sigmas)) {
            return kiln::Error::invalid_request("hires sigmas: " + std::to_string(params->n_hires_sigmas) +
                                                " values but no array");
        }
        if (params->n_hires_sigmas > 0) {
            h.sigmas.assign(params->hires_sigmas, params->hires_sigmas + params->n_hires_sigmas);
        }
        r.hires = h;
    }
    if (params->control_image) {
        auto img = import_image(params->control_image);
        if (!img.ok()) return img.error().in_context("control image: ");
        r.control_image = std::move(img).value();
    }
    r.control_strength = params->control_strength;
    r.control_canny = params->control_canny != 0;
    switch (params->preview_mode) {
        case KILN_PREVIEW_NONE: r.preview.mode = kiln::pipeline::PreviewMode::None; break;
        case KILN_PREVIEW_PROJ: r.preview.mode = kiln::pipeline::PreviewMode::Proj; break;
        case KILN_PREVIEW_TAE: r.preview.mode = kiln::pipeline::PreviewMode::Tae; break;
        case KILN_PREVIEW_VAE: r.preview.mode = kiln::pipeline::PreviewMode::Vae; break;
        default:
            return kiln::Error::invalid_request("preview_mode: " + std::to_string(params->preview_mode) +
                                                " is not a kiln_preview_mode");
    }
    r.preview.interval = params->preview_interval <= 0 ? 1 : params->preview_interval;
    r.preview.noisy = params->preview_noisy != 0;
    r.file_hashes = params->disable_file_hashes == 0;
    return r;
}

}  // namespace

kiln_status kiln_check_value(kiln_value_kind kind, const char* value, char** error) {
    const std::string v = str(value);
    kiln::Status status;
    switch (kind) {
        case KILN_VALUE_SAMPLER:
            if (auto r = kiln::pipeline::parse_sampler(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_SCHEDULER:
            if (auto r = kiln::pipeline::parse_scheduler(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_RNG:
            if (auto r = kiln::pipeline::parse_rng_kind(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_RPC_SERVERS:
            if (auto r = kiln::runtime::parse_rpc_endpoints(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_MAX_VRAM:
            if (auto r = kiln::runtime::parse_max_vram(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_LORA_APPLY_MODE:
            if (auto r = kiln::pipeline::parse_lora_apply_mode(v); !r.ok()) status = r.error();
            break;
        case KILN_VALUE_PREVIEW:
            if (auto r = kiln::pipeline::parse_preview_mode(v); !r.ok()) status = r.error();
            break;
    }
    if (status.ok()) return KILN_OK;
    // The parsers name their flag ("--rng: ..."); the caller names it itself.
    std::string message = status.error().message;
    const auto colon = message.find(": ");
    if (message.rfind("--", 0) == 0 && colon != std::string::npos) message = message.substr(colon + 2);
    return fail(error, kiln::Error::invalid_request(message));
}

kiln_status kiln_context_params_check(const kiln_context_params* params, char** error) {
    try {
        auto options = model_options(params);
        return options.ok() ? KILN_OK : fail(error, options.error());
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "checking the parameters");
    }
}

kiln_status kiln_context_create(const kiln_context_params* params, kiln_context** ctx, char** error) {
    *ctx = nullptr;
    try {
        kiln::pipeline::ModelPaths paths;
        if (params->model_path) paths.model.push_back(params->model_path);
        paths.diffusion_model = str(params->diffusion_model_path);
        paths.vae = str(params->vae_path);
        paths.clip_l = str(params->clip_l_path);
        paths.clip_g = str(params->clip_g_path);
        paths.t5xxl = str(params->t5xxl_path);
        paths.high_noise_diffusion_model = str(params->high_noise_diffusion_model_path);
        paths.llm = str(params->llm_path);
        paths.llm_vision = str(params->llm_vision_path);
        paths.clip_vision = str(params->clip_vision_path);
        paths.tokenizer = str(params->tokenizer_path);
        paths.embeddings = str(params->embeddings_dir);
        paths.control_net = str(params->control_net_path);
        paths.taesd = str(params->taesd_path);
        auto options = model_options(params);
        if (!options.ok()) return fail(error, options.error());
        kiln::log_capture_ggml();
        auto model = kiln::pipeline::load_model(paths, *options);
        if (!model.ok()) return fail(error, model.error());
        auto* created = new kiln_context();
        created->model = std::move(model).value();
        created->plan_only = options->plan_only;
        *ctx = created;
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "loading the model");
    }
}

void kiln_context_free(kiln_context* ctx) { delete ctx; }

void kiln_cancel(kiln_context* ctx) {
    if (ctx && ctx->model) ctx->model->request_cancel();
}

void kiln_interrupt(kiln_context* ctx) {
    if (ctx && ctx->model) ctx->model->request_interrupt();
}

void kiln_skip(kiln_context* ctx) {
    if (ctx && ctx->model) ctx->model->request_skip();
}

void kiln_context_info(const kiln_context* ctx, kiln_model_info* info) {
    std::memset(info, 0, sizeof *info);
    const auto& d = ctx->model->defaults();
    info->width = d.width;
    info->height = d.height;
    info->steps = d.steps;
    info->cfg_scale = d.cfg_scale;
    std::strncpy(info->sampler, d.sampler.c_str(), sizeof info->sampler - 1);
    std::strncpy(info->scheduler, d.scheduler.c_str(), sizeof info->scheduler - 1);
    std::strncpy(info->family, ctx->model->family_label().c_str(), sizeof info->family - 1);
    info->latent_preview = ctx->model->has_latent_projection() ? 1 : 0;
    info->taesd = ctx->model->has_taesd() ? 1 : 0;
    info->trained_width = ctx->model->family().defaults.width;
    info->trained_height = ctx->model->family().defaults.height;
    info->video = ctx->model->diffusion().capabilities().video ? 1 : 0;
    info->first_frame = kiln::pipeline::takes_first_frame(*ctx->model)    ? 1
                        : kiln::pipeline::takes_first_latent(*ctx->model) ? 2
                                                                          : 0;
    info->high_noise_expert = ctx->model->has_high_noise_expert() ? 1 : 0;
    info->vace = kiln::pipeline::takes_vace_context(*ctx->model) ? 1 : 0;
}

void kiln_generation_params_init(kiln_generation_params* params) {
    std::memset(params, 0, sizeof *params);
    params->cfg_scale = -1.0f;
    params->seed = 42;
    params->batch_count = 1;
    params->strength = 0.75f;
    params->control_strength = 0.9f;
    params->guidance = -1.0f;
    params->eta = -1.0f;
    params->chroma_t5_mask_pad = -1;
    const kiln::pipeline::SkipLayerGuidance slg;
    params->skip_layer_start = slg.start;
    params->skip_layer_end = slg.end;
    params->vae_tile_size = 32;
    params->vae_tile_overlap = 0.5f;
    const kiln::pipeline::HiresFix hires;
    params->hires_scale = hires.scale;
    params->hires_denoising_strength = hires.denoising_strength;
    params->hires_upscale_tile_size = hires.upscale_tile;
    const kiln::pipeline::HighNoiseSampling high_noise;
    params->high_noise_steps = high_noise.steps;
    params->high_noise_cfg_scale = -1.0f;
    params->high_noise_eta = -1.0f;
    params->moe_boundary = high_noise.moe_boundary;
    params->vace_strength = 1.0f;
}

void kiln_upscaler_params_init(kiln_upscaler_params* params) {
    std::memset(params, 0, sizeof *params);
    params->tile_size = kiln::pipeline::kDefaultUpscaleTile;
}

kiln_status kiln_upscaler_create(const kiln_upscaler_params* params, kiln_upscaler** upscaler, char** error) {
    *upscaler = nullptr;
    try {
        if (kiln::Status s = kiln::pipeline::validate_upscale_tile(params->tile_size); !s.ok())
            return fail(error, s.error());
        if (!params->model_path || !*params->model_path)
            return fail(error, kiln::Error::invalid_request("no upscale model given (--upscale-model)"));
        kiln::log_capture_ggml();
        auto loaded = kiln::pipeline::Upscaler::load(params->model_path, params->n_threads);
        if (!loaded.ok()) return fail(error, loaded.error());
        auto* created = new kiln_upscaler();
        created->upscaler = std::move(loaded).value();
        created->tile_size = params->tile_size;
        *upscaler = created;
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "loading the upscaler");
    }
}

void kiln_upscaler_free(kiln_upscaler* upscaler) { delete upscaler; }

int kiln_upscaler_scale(const kiln_upscaler* upscaler) { return upscaler->upscaler->scale(); }

kiln_status kiln_upscale(kiln_upscaler* upscaler, const kiln_image* image, int repeats, kiln_image** result,
                         char** error) {
    *result = nullptr;
    try {
        auto img = import_image(image);
        if (!img.ok()) return fail(error, img.error().in_context("image to upscale: "));
        auto out = upscaler->upscaler->upscale(*img, upscaler->tile_size, repeats);
        if (!out.ok()) return fail(error, out.error());
        const int factor = out->width / img->width;
        const std::string parameters = kiln::pipeline::add_postprocess_upscale(
            image->parameters ? image->parameters : "", upscaler->upscaler->name(), factor);
        auto* exported = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
        if (!exported || !export_image(*out, parameters, exported)) {
            kiln_images_free(exported, exported ? 1 : 0);
            return out_of_memory(error, "returning the upscaled image");
        }
        *result = exported;
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "upscaling");
    }
}

kiln_status kiln_upscaler_memory(kiln_upscaler* upscaler, int width, int height, int repeats, uint64_t* weights,
                                 uint64_t* compute, char** error) {
    if (width < 1 || height < 1 || width > kiln::image::kMaxDimension || height > kiln::image::kMaxDimension ||
        repeats < 1 || repeats > kiln::pipeline::kMaxUpscaleRepeats) {
        return fail(error, kiln::Error::invalid_request("upscaler memory: a " + std::to_string(width) + "x" +
                                                        std::to_string(height) + " image, " + std::to_string(repeats) +
                                                        " repeats"));
    }
    try {
        auto m = upscaler->upscaler->memory(width, height, upscaler->tile_size, repeats);
        if (!m.ok()) return fail(error, m.error());
        *weights = m->weights;
        *compute = m->tile_compute;
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "measuring the upscaler");
    }
}

kiln_status kiln_generate(kiln_context* ctx, const kiln_generation_params* params, kiln_image** images, int* n_images,
                          char** error) {
    *images = nullptr;
    *n_images = 0;
    try {
        auto r = generation_request(params);
        if (!r.ok()) return fail(error, r.error());
        kiln::pipeline::StepCallback on_step;
        if (params->progress) {
            on_step = [params](int image, int step, int total) {
                params->progress(image, step, total, params->progress_user_data);
            };
        }
        if (ctx->plan_only) {
            return fail(error, kiln::Error::invalid_request(
                                   "this context was created with plan_only: it can plan, not generate"));
        }
        kiln::pipeline::PreviewCallback on_preview;
        if (params->preview) {
            on_preview = [params](int image, int step, const kiln::image::Image& rgb) {
                kiln_image view{static_cast<uint32_t>(rgb.width), static_cast<uint32_t>(rgb.height), 3,
                                const_cast<uint8_t*>(rgb.pixels.data()), nullptr};
                params->preview(image, step, &view, params->preview_user_data);
            };
        }
        kiln::pipeline::PhaseCallback on_phase;
        if (params->phase) {
            on_phase = [params](kiln::pipeline::JobPhase phase, int image) {
                params->phase(static_cast<kiln_phase>(phase), image, params->phase_user_data);
            };
        }
        kiln::pipeline::DecodeCallback on_decode;
        if (params->decode) {
            on_decode = [params](int image, int done, int frames) {
                params->decode(image, done, frames, params->decode_user_data);
            };
        }
        auto result = kiln::pipeline::generate(*ctx->model, *r, on_step, nullptr, on_preview, on_phase, on_decode);
        if (!result.ok()) {
            ctx->model->release_caches();  // a failed job gives back what it took
            return fail(error, result.error());
        }
        // An image per result, or a clip's frames.
        std::vector<std::pair<const kiln::image::Image*, const kiln::image::GenerationInfo*>> frames;
        for (const auto& g : *result) {
            if (g.frames.empty()) frames.emplace_back(&g.image, &g.info);
            for (const auto& frame : g.frames) frames.emplace_back(&frame, &g.info);
        }
        auto* out = static_cast<kiln_image*>(std::calloc(frames.size(), sizeof(kiln_image)));
        if (!out) return out_of_memory(error, "returning the images");
        for (size_t i = 0; i < frames.size(); ++i) {
            if (!export_image(*frames[i].first, kiln::image::format_a1111_parameters(*frames[i].second), &out[i])) {
                kiln_images_free(out, static_cast<int>(frames.size()));
                return out_of_memory(error, "returning the images");
            }
        }
        *images = out;
        *n_images = static_cast<int>(frames.size());
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        ctx->model->release_caches();
        return out_of_memory(error, "during generation");
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

kiln_status kiln_image_save(const kiln_image* image, const char* path, char** error) {
    auto img = import_image(image);
    if (!img.ok()) return fail(error, img.error().in_context(std::string(path) + ": "));
    kiln::image::ImageWriteOptions options;
    if (image->parameters) options.text[kiln::image::kParametersKeyword] = image->parameters;
    auto status = kiln::image::write_image(path, *img, options);
    if (!status.ok()) return fail(error, status.error());
    return KILN_OK;
}

kiln_status kiln_video_save(const kiln_image* frames, int n_frames, int fps, int first_index, const char* path,
                            char** error) {
    if (!frames || n_frames < 1) return fail(error, kiln::Error::invalid_request(std::string(path) + ": no frames"));
    std::vector<kiln::image::Image> clip;
    for (int i = 0; i < n_frames; ++i) {
        auto img = import_image(&frames[i]);
        if (!img.ok()) {
            return fail(error, img.error().in_context(std::string(path) + ": frame " + std::to_string(i) + ": "));
        }
        clip.push_back(std::move(img).value());
    }
    auto status =
        kiln::image::write_video(path, clip, fps, frames[0].parameters ? frames[0].parameters : "", first_index);
    if (!status.ok()) return fail(error, status.error());
    return KILN_OK;
}

kiln_status kiln_image_load(const char* path, kiln_image** image, char** error) {
    return kiln_image_load_limited(path, 0, image, error);
}

namespace {

// kiln_image_load_limited and kiln_context_image_load: `limits.max_pixels` 0 is the default.
kiln_status load_image(const char* path, kiln::image::DecodeLimits limits, kiln_image** image, char** error) {
    *image = nullptr;
    if (limits.max_pixels == 0) limits.max_pixels = kiln::image::kDefaultMaxImagePixels;
    auto img = kiln::image::read_image(path, limits);
    if (!img.ok()) return fail(error, img.error().as(kiln::ErrorKind::BadFile));
    auto rgb = kiln::image::convert_channels(*img, 3);
    if (!rgb.ok()) return fail(error, rgb.error().as(kiln::ErrorKind::BadFile).in_context(std::string(path) + ": "));
    auto* out = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
    if (!out || !export_image(*rgb, "", out)) {
        kiln_images_free(out, out ? 1 : 0);
        return out_of_memory(error, "loading " + std::string(path));
    }
    *image = out;
    return KILN_OK;
}

}  // namespace

kiln_status kiln_image_load_limited(const char* path, uint64_t max_pixels, kiln_image** image, char** error) {
    return load_image(path, kiln::image::DecodeLimits{max_pixels}, image, error);
}

kiln_status kiln_context_image_load(kiln_context* ctx, const char* path, uint64_t max_pixels, kiln_image** image,
                                    char** error) {
    const kiln::runtime::DeviceLedger& ram = ctx->model->host_ledger();
    const uint64_t limit = ram.limit();
    kiln::image::DecodeLimits limits{max_pixels};
    limits.max_bytes = limit > ram.managed() ? limit - ram.managed() : 0;
    limits.memory_owner = "the budget on " + ram.device_name();
    return load_image(path, limits, image, error);
}

kiln_status kiln_image_encode(const kiln_image* image, const char* format, uint8_t** bytes, size_t* size,
                              char** error) {
    *bytes = nullptr;
    *size = 0;
    const std::string name = str(format);
    kiln::image::ImageFormat fmt;
    if (name == "png") {
        fmt = kiln::image::ImageFormat::Png;
    } else if (name == "jpeg" || name == "jpg") {
        fmt = kiln::image::ImageFormat::Jpeg;
    } else if (name == "webp") {
        fmt = kiln::image::ImageFormat::WebP;
    } else {
        return fail(error,
                    kiln::Error::invalid_request("unknown image format '" + name + "' (valid: png, jpeg, webp)"));
    }
    auto img = import_image(image);
    if (!img.ok()) return fail(error, img.error());
    kiln::image::ImageWriteOptions options;
    if (image->parameters) options.text[kiln::image::kParametersKeyword] = image->parameters;
    auto encoded = kiln::image::encode_image(*img, fmt, options);
    if (!encoded.ok()) return fail(error, encoded.error());
    auto* out = static_cast<uint8_t*>(std::malloc(encoded->empty() ? 1 : encoded->size()));
    if (!out) return out_of_memory(error, "encoding an image");
    std::memcpy(out, encoded->data(), encoded->size());
    *bytes = out;
    *size = encoded->size();
    return KILN_OK;
}

kiln_status kiln_image_decode(const void* bytes, size_t size, const char* label, uint64_t max_pixels,
                              kiln_image** image, char** error) {
    *image = nullptr;
    const std::string what = label ? label : "image";
    if (!bytes || size == 0) return fail(error, kiln::Error::bad_file(what + ": empty image"));
    auto img = kiln::image::decode_image(static_cast<const uint8_t*>(bytes), size, what,
                                         max_pixels ? max_pixels : kiln::image::kDefaultMaxImagePixels);
    if (!img.ok()) return fail(error, img.error().as(kiln::ErrorKind::BadFile));
    // An uploaded mask may say what to repaint by its alpha (OpenAI's edits), so alpha stays.
    auto rgb = kiln::image::convert_channels(*img, img->channels == 4 ? 4 : 3);
    if (!rgb.ok()) return fail(error, rgb.error().as(kiln::ErrorKind::BadFile).in_context(what + ": "));
    auto* out = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
    if (!out || !export_image(*rgb, "", out)) {
        kiln_images_free(out, out ? 1 : 0);
        return out_of_memory(error, "decoding " + what);
    }
    *image = out;
    return KILN_OK;
}

void kiln_free_bytes(void* bytes) { std::free(bytes); }

kiln_status kiln_image_resize(const kiln_image* image, int width, int height, kiln_image** result, char** error) {
    *result = nullptr;
    if (!image) return fail(error, kiln::Error::invalid_request("resize: no image"));
    auto in = import_image(image);
    if (!in.ok()) return fail(error, in.error());
    auto resized = kiln::image::resize_image(*in, width, height);
    if (!resized.ok()) return fail(error, resized.error().as(kiln::ErrorKind::InvalidRequest));
    auto* out = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
    if (!out || !export_image(*resized, "", out)) {
        kiln_images_free(out, out ? 1 : 0);
        return out_of_memory(error, "resizing an image");
    }
    *result = out;
    return KILN_OK;
}

kiln_status kiln_image_read_parameters(const char* path, char** text, char** error) {
    *text = nullptr;
    // A video's container comment; a .webp that is a still image has its parameters as an image's.
    if (kiln::image::is_video_path(path)) {
        auto parameters = kiln::image::read_video_parameters(path);
        if (parameters.ok() && !parameters->empty()) {
            *text = copy_string(*parameters);
            return KILN_OK;
        }
        const std::string lower = kiln::ascii_lower(path);
        const bool webp = lower.size() >= 5 && lower.compare(lower.size() - 5, 5, ".webp") == 0;
        if (!parameters.ok() && !webp) {
            return fail(error, parameters.error().as(kiln::ErrorKind::BadFile));
        }
    }
    auto chunks = kiln::image::read_image_text(path);
    if (!chunks.ok()) return fail(error, chunks.error().as(kiln::ErrorKind::BadFile));
    auto it = chunks->find(kiln::image::kParametersKeyword);
    if (it == chunks->end()) {
        return fail(error, kiln::Error::bad_file(std::string(path) + ": no generation parameters in this image"));
    }
    *text = copy_string(it->second);
    return KILN_OK;
}

kiln_status kiln_model_describe(const char* path, int list_tensors, char** text, char** error) {
    *text = nullptr;
    try {
        auto model = kiln::io::ModelFile::open({str(path)});
        if (!model.ok()) return fail(error, model.error().as(kiln::ErrorKind::BadFile));
        kiln::models::FileSet files;
        files.files.push_back(&*model);
        const std::string family = kiln::models::detect_family(files).label;
        *text = copy_string(kiln::io::describe_model(*model, str(path), family, list_tensors != 0));
        return *text ? KILN_OK : out_of_memory(error, "describing the model");
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "describing the model");
    }
}

kiln_status kiln_model_convert(const char* const* paths, int n_paths, const char* out_path, const char* weight_type,
                               const char* tensor_type_rules, const char* tokenizer, kiln_convert_progress progress,
                               void* user_data, char** error) {
    try {
        std::vector<std::string> files;
        for (int i = 0; i < n_paths; ++i) files.push_back(str(paths[i]));
        kiln::io::GgufWriteOptions options;
        if (weight_type) {
            auto type = kiln::io::parse_weight_type(weight_type);
            if (!type.ok()) return fail(error, type.error().as(kiln::ErrorKind::InvalidRequest));
            options.type = *type;
        }
        if (tensor_type_rules) {
            auto rules = kiln::io::TensorTypeRules::parse(tensor_type_rules);
            if (!rules.ok()) return fail(error, rules.error());
            options.rules = std::move(rules).value();
        }
        if (tokenizer) {
            auto paths = kiln::pipeline::parse_tokenizer_flag(tokenizer);
            if (!paths.ok()) return fail(error, paths.error());
            // A GGUF carries one tokenizer: the one of the text encoder it holds.
            if (!paths->t5.empty() && !paths->llm.empty()) {
                return fail(error, kiln::Error::invalid_request(
                                       "convert: --tokenizer names both t5xxl and llm; a GGUF carries one tokenizer"));
            }
            if (!paths->t5.empty()) {
                auto t5 = kiln::text::T5Tokenizer::load(paths->t5);
                if (!t5.ok()) return fail(error, t5.error().as(kiln::ErrorKind::BadFile));
                options.extra_metadata = t5->gguf_metadata();
            } else if (!paths->llm.empty()) {
                auto llm = kiln::text::LlmTokenizer::load(paths->llm);
                if (!llm.ok()) return fail(error, llm.error().as(kiln::ErrorKind::BadFile));
                options.extra_metadata = llm->gguf_metadata();
            } else {
                KILN_LOG_WARN(
                    "convert: --tokenizer is written into the GGUF only as t5xxl=PATH or llm=PATH; '%s' is not used",
                    tokenizer);
            }
        }
        auto model = kiln::io::ModelFile::open(files);
        if (!model.ok()) return fail(error, model.error().as(kiln::ErrorKind::BadFile));
        if (progress) {
            options.progress = [progress, user_data](size_t done, size_t total) {
                progress(static_cast<int>(done), static_cast<int>(total), user_data);
            };
        }
        auto status = kiln::io::write_gguf(*model, str(out_path), options);
        if (!status.ok()) return fail(error, status.error());
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "converting the model");
    }
}

void kiln_free_string(char* text) { std::free(text); }

kiln_status kiln_plan(kiln_context* ctx, const kiln_generation_params* params, char** text, int* fits, char** error) {
    *text = nullptr;
    try {
        auto r = generation_request(params);
        if (!r.ok()) return fail(error, r.error());
        auto job = kiln::pipeline::validate_request(*ctx->model, *r);
        if (!job.ok()) return fail(error, job.error());
        // The prompt's LoRAs are weights of the modules they change: the plan counts them.
        auto tagged = kiln::pipeline::extract_lora_tags(r->prompt);
        if (!tagged.ok()) return fail(error, tagged.error());
        if (kiln::Status s = kiln::pipeline::apply_loras(*ctx->model, tagged->loras); !s.ok())
            return fail(error, s.error());
        // The images are in RAM's books while the job runs, so the plan counts them too.
        auto images_held = kiln::pipeline::reserve_request_images(*ctx->model, *r);
        if (!images_held.ok()) return fail(error, images_held.error());
        const bool cfg = job->cfg != 1.0f;
        // No prompt (kiln plan without -p): the family's typical length.
        auto passes = kiln::pipeline::passes_of(*r, *job);
        if (!passes.ok()) return fail(error, passes.error());
        auto forecast =
            kiln::pipeline::forecast_job(*ctx->model, job->width, job->height, cfg, params->flash_attention != 0,
                                         r->prompt.empty() ? nullptr : &r->prompt, *passes, r->negative_prompt);
        if (!forecast.ok()) return fail(error, forecast.error());
        const std::string images = images_held->bytes()
                                       ? "images: " + kiln::human_bytes(images_held->bytes()) + " in RAM (" +
                                             ctx->model->host_ledger().device_name() + "'s books)\n"
                                       : std::string();
        const std::string cfg_text = !cfg ? ""
                                     : forecast->cfg_contexts
                                         ? ", CFG passes one after the other (contexts of " +
                                               std::to_string(forecast->cfg_contexts->first) + " and " +
                                               std::to_string(forecast->cfg_contexts->second) + " tokens)"
                                         : ", CFG batch of two";
        const std::string frames = job->video ? ", " + std::to_string(job->frames) + " frames" : "";
        *text = copy_string("job: " + std::to_string(job->width) + "x" + std::to_string(job->height) + frames +
                            cfg_text + "\n" + images + kiln::pipeline::describe_forecast(*ctx->model, *forecast));
        if (fits) *fits = !forecast->fits ? 0 : forecast->streams_from_disk ? 2 : 1;
        return KILN_OK;
    } catch (const std::bad_alloc&) {
        return out_of_memory(error, "while planning");
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
    std::vector<const kiln::runtime::WeightStore*> stores;  // each device's, shared by its modules
    for (const auto& module : m.modules()) {
        // A module split across devices computes on each: a line per device.
        for (const kiln::runtime::Executor* e : module->executor->split_devices()) {
            out += module->executor->module() + " compute buffers peak " +
                   kiln::human_bytes(e->stats().peak_workspace) + " on " + e->store().ledger().device_name() + "\n";
            if (std::find(stores.begin(), stores.end(), &e->store()) == stores.end()) stores.push_back(&e->store());
        }
    }
    // The weight traffic: what streaming under a budget costs.
    for (const kiln::runtime::WeightStore* store : stores) {
        const kiln::runtime::StoreStats& s = store->stats();
        if (s.bytes_uploaded == 0) continue;
        out += "weights uploaded to " + store->ledger().device_name() + " " + kiln::human_bytes(s.bytes_uploaded) +
               " in " + std::to_string(s.loads) + " loads and " + std::to_string(s.prefetches) + " prefetches, " +
               std::to_string(s.evictions) + " evictions\n";
    }
    return copy_string(out);
}

int kiln_memory_devices(kiln_context* ctx, kiln_device_memory* out, int max) {
    int count = 0;
    for (const auto& [name, ledger] : ctx->model->ledgers()) {
        if (count < max) {
            kiln_device_memory& d = out[count];
            std::snprintf(d.name, sizeof d.name, "%s", name.c_str());
            d.managed = ledger->managed();
            d.peak = ledger->peak();
            d.budget = ledger->budget().value_or(0);
        }
        ++count;
    }
    return count;
}

kiln_status kiln_list_devices(const char* rpc_servers, char** text, char** error) {
    *text = nullptr;
    if (rpc_servers && *rpc_servers) {
        if (kiln::Status s = kiln::runtime::add_rpc_servers(rpc_servers); !s.ok()) return fail(error, s.error());
    }
    *text = copy_string(kiln::runtime::device_table());
    return *text ? KILN_OK : out_of_memory(error, "listing devices");
}

kiln_status kiln_rpc_server_run(const char* host, int port, const char* device, int n_threads, const char* max_alloc,
                                const char* reported_memory, const char* cache_dir, char** error) {
    kiln::runtime::RpcServeOptions options;
    options.host = str(host);
    options.port = port;
    if (device) options.device = device;
    options.threads = n_threads;
    options.max_alloc = str(max_alloc);
    options.reported_memory = str(reported_memory);
    options.cache_dir = str(cache_dir);
    kiln::log_capture_ggml();
    const kiln::Status served = kiln::runtime::serve_rpc(options);
    return served.ok() ? KILN_OK : fail(error, served.error());
}

const char* kiln_version(void) { return KILN_VERSION; }

const char* kiln_blas_core(void) {
    static const std::string core = kiln::runtime::openblas_core();
    return core.c_str();
}

const char* kiln_blas_core_to_request(void) {
    static const std::string better =
        kiln::runtime::better_openblas_core(kiln::runtime::openblas_core(), kiln::runtime::cpu_vector_level());
    return better.empty() ? nullptr : better.c_str();
}

}  // extern "C"
