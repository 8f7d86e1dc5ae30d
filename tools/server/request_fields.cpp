#include "request_fields.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "a1111_names.h"
#include "pipeline/step_cache_options.h"
#include "util/base64.h"
#include "util/format.h"

namespace kiln::server {
namespace {

const json* find_field(const json& body, const std::string& field) {
    const auto it = body.find(field);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

[[noreturn]] void bad_field(const std::string& field, const std::string& problem) {
    throw RequestError{400, field, field + ": " + problem};
}

std::string type_name(const json& value) { return value.type_name(); }

SharedImage blank_like(const kiln_image& like, uint32_t channels) {
    return blank_image(like.width, like.height, channels);
}

}  // namespace

SharedImage share_image(kiln_image* image) {
    return SharedImage(image, [](kiln_image* img) { kiln_images_free(img, img ? 1 : 0); });
}

std::string read_string(const json& body, const std::string& field, const std::string& fallback) {
    const json* value = find_field(body, field);
    if (!value) return fallback;
    if (!value->is_string()) bad_field(field, "expected a string, got " + type_name(*value));
    return value->get<std::string>();
}

long long read_integer(const json& body, const std::string& field, long long fallback, long long min, long long max) {
    const json* value = find_field(body, field);
    if (!value) return fallback;
    const auto out_of_range = [&] {
        bad_field(field, "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " +
                             value->dump());
    };
    long long v = 0;
    if (value->is_number_unsigned()) {
        // Above LLONG_MAX (2^64-1 as a seed) it is out of range, not clamped.
        if (value->get<unsigned long long>() > static_cast<unsigned long long>(max)) out_of_range();
        v = static_cast<long long>(value->get<unsigned long long>());
    } else if (value->is_number_integer()) {
        v = value->get<long long>();
    } else if (value->is_number_float() && std::floor(value->get<double>()) == value->get<double>() &&
               std::fabs(value->get<double>()) < 9e18) {
        v = static_cast<long long>(value->get<double>());  // 20.0 from clients that only have doubles
    } else {
        // A string ("12") is a wrong type too, as docs/server.md promises.
        bad_field(field, "expected an integer, got " + type_name(*value) + " " + value->dump());
    }
    if (v < min || v > max) out_of_range();
    return v;
}

double read_number(const json& body, const std::string& field, double fallback, double min, double max) {
    const json* value = find_field(body, field);
    if (!value) return fallback;
    if (!value->is_number()) bad_field(field, "expected a number, got " + type_name(*value) + " " + value->dump());
    const double v = value->get<double>();
    if (!(v >= min && v <= max)) {
        char range[96];
        std::snprintf(range, sizeof range, "expected a number from %g to %g, got ", min, max);
        bad_field(field, range + value->dump());
    }
    return v;
}

bool read_bool(const json& body, const std::string& field, bool fallback) {
    const json* value = find_field(body, field);
    if (!value) return fallback;
    if (!value->is_boolean()) bad_field(field, "expected true or false, got " + value->dump());
    return value->get<bool>();
}

std::vector<float> read_floats(const json& body, const std::string& field) {
    std::vector<float> out;
    const auto it = body.find(field);
    if (it == body.end() || it->is_null()) return out;
    if (!it->is_array()) throw RequestError{400, field, field + ": expected an array of numbers"};
    for (const json& v : *it) {
        if (!v.is_number()) throw RequestError{400, field, field + ": expected numbers, got " + v.dump()};
        out.push_back(v.get<float>());
    }
    return out;
}

json object_at(const json& body, const std::string& key) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return json::object();
    if (!it->is_object()) throw RequestError{400, key, key + ": expected an object, got " + it->dump()};
    return *it;
}

ModelParts read_model_parts(const json& body, ModelRegistry& models) {
    ModelParts parts;
    for (auto [field, path] : {std::pair<const char*, std::string*>{"vae", &parts.vae}, {"clip_l", &parts.clip_l},
                               {"clip_g", &parts.clip_g}, {"t5xxl", &parts.t5xxl}, {"llm", &parts.llm}}) {
        const std::string name = read_string(body, field);
        if (!name.empty()) *path = models.resolve_part(name, field).path;
    }
    return parts;
}

std::string hires_upscaler_named(const std::string& name, const std::string& field) {
    std::string names;
    for (const HiresUpscalerName& known : kHiresUpscalers) {
        if (name == known.a1111 || name == known.kiln) return name;
        names += (names.empty() ? "" : ", ") + std::string(known.a1111);
    }
    // Not a path either: a file name would let a client probe the server's files.
    throw RequestError{400, field, field + ": '" + name + "' is not one of kiln serve's upscalers: " + names};
}

void read_hires(JobRequest& r, const json& body, const ServerLimits& limits) {
    const json h = object_at(body, "hires");
    nested("hires", [&] {
        r.hires = read_bool(h, "enabled", false);
        const std::string upscaler = read_string(h, "upscaler", "Latent");
        if (upscaler == "None") {
            r.hires = false;
        } else {
            r.hires_upscaler = hires_upscaler_named(upscaler, "upscaler");
        }
        r.hires_scale = static_cast<float>(read_number(h, "scale", 2.0, 0, 16));
        r.hires_width = static_cast<int>(read_integer(h, "target_width", 0, 0, limits.max_width));
        r.hires_height = static_cast<int>(read_integer(h, "target_height", 0, 0, limits.max_height));
        r.hires_steps = static_cast<int>(read_integer(h, "steps", 0, 0, limits.max_steps));
        r.hires_denoising_strength = static_cast<float>(read_number(h, "denoising_strength", 0.7, 0, 1));
        r.hires_sigmas = read_floats(h, "custom_sigmas");
        read_integer(h, "upscale_tile_size", 128, 0, 1 << 16);
        return 0;
    });
}

void set_sampler(JobRequest& request, const std::string& field, const std::string& name) {
    if (name.empty()) return;
    auto choice = resolve_sampler(name);
    if (!choice) {
        std::string valid;
        for (const SamplerName& s : sampler_names()) valid += std::string(valid.empty() ? "" : ", ") + s.a1111;
        bad_field(field, "unknown sampler '" + name + "' (valid: " + valid + ", or kiln's names)");
    }
    request.sampler = choice->sampler;
    if (!choice->scheduler.empty()) request.scheduler = choice->scheduler;
}

void set_scheduler(JobRequest& request, const std::string& field, const std::string& name) {
    if (name.empty()) return;
    auto kiln_name = resolve_scheduler(name);
    if (!kiln_name) {
        std::string valid;
        for (const SchedulerName& s : scheduler_names()) valid += std::string(valid.empty() ? "" : ", ") + s.a1111;
        bad_field(field, "unknown scheduler '" + name + "' (valid: " + valid + ", or kiln's names)");
    }
    request.scheduler = *kiln_name;
}

std::optional<kiln_preview_mode> preview_mode_named(const std::string& name) {
    if (name == "none") return KILN_PREVIEW_NONE;
    if (name == "proj") return KILN_PREVIEW_PROJ;
    if (name == "tae") return KILN_PREVIEW_TAE;
    if (name == "vae") return KILN_PREVIEW_VAE;
    return std::nullopt;
}

void set_preview(JobRequest& request, const std::string& field, const std::string& name) {
    if (name.empty()) return;
    if (!preview_mode_named(name)) {
        bad_field(field, "unknown preview mode '" + name + "' (valid: none, proj, tae, vae)");
    }
    request.preview = name;
}

SharedImage blank_image(uint32_t width, uint32_t height, uint32_t channels) {
    auto* out = static_cast<kiln_image*>(std::calloc(1, sizeof(kiln_image)));
    if (!out) throw RequestError{500, "", "out of memory"};
    out->width = width;
    out->height = height;
    out->channels = channels;
    out->data = static_cast<uint8_t*>(std::calloc(size_t(width) * height * channels, 1));
    if (!out->data) {
        kiln_images_free(out, 1);
        throw RequestError{500, "", "out of memory"};
    }
    return share_image(out);
}

SharedImage decode_upload(const std::string& field, const std::string& bytes, const ServerLimits& limits) {
    kiln_image* image = nullptr;
    char* error = nullptr;
    if (kiln_image_decode(bytes.data(), bytes.size(), field.c_str(), limits.max_image_pixels, &image, &error) !=
        KILN_OK) {
        std::string message = error ? error : field + ": not an image";
        kiln_free_string(error);
        throw RequestError{400, field, message};
    }
    return share_image(image);
}

SharedImage read_base64_image(const json& value, const std::string& field, const ServerLimits& limits) {
    if (!value.is_string()) bad_field(field, "expected a base64 image string, got " + type_name(value));
    auto bytes = base64_decode(value.get_ref<const std::string&>());
    if (!bytes) bad_field(field, "not valid base64");
    return decode_upload(field, std::string(bytes->begin(), bytes->end()), limits);
}

SharedImage resized(const SharedImage& image, int width, int height, const std::string& field) {
    if (!image || (int(image->width) == width && int(image->height) == height)) return image;
    kiln_image* out = nullptr;
    char* error = nullptr;
    if (kiln_image_resize(image.get(), width, height, &out, &error) != KILN_OK) {
        std::string message = error ? error : "cannot be resized";
        kiln_free_string(error);
        bad_field(field, message);
    }
    return share_image(out);
}

SharedImage without_alpha(const SharedImage& image) {
    if (!image || image->channels == 3) return image;
    SharedImage out = blank_like(*image, 3);
    const size_t pixels = size_t(image->width) * image->height;
    for (size_t i = 0; i < pixels; ++i) std::memcpy(out->data + i * 3, image->data + i * image->channels, 3);
    return out;
}

SharedImage mask_of(const SharedImage& image, bool alpha_repaints) {
    if (!image || image->channels == 3 || !alpha_repaints) return without_alpha(image);
    SharedImage out = blank_like(*image, 3);
    const size_t pixels = size_t(image->width) * image->height;
    for (size_t i = 0; i < pixels; ++i) {
        const uint8_t repaint = image->data[i * 4 + 3] < 128 ? 255 : 0;
        std::memset(out->data + i * 3, repaint, 3);
    }
    return out;
}

void check_limits(const JobRequest& request, const ServerLimits& limits) {
    auto over = [](const std::string& field, long long value, long long max) {
        if (value > max) {
            bad_field(field, std::to_string(value) + " is over this server's limit of " + std::to_string(max));
        }
    };
    over("width", request.width, limits.max_width);
    over("height", request.height, limits.max_height);
    // Every family's size stride is a multiple of 8 (kiln_generate checks the model's own).
    if (request.width % 8) bad_field("width", "expected a multiple of 8, got " + std::to_string(request.width));
    if (request.height % 8) bad_field("height", "expected a multiple of 8, got " + std::to_string(request.height));
    over("steps", request.steps, limits.max_steps);
    over("batch", request.batch, limits.max_batch);
    over("prompt", static_cast<long long>(request.prompt.size()), static_cast<long long>(limits.max_prompt_chars));
    over("negative_prompt", static_cast<long long>(request.negative_prompt.size()),
         static_cast<long long>(limits.max_prompt_chars));
    if (request.init_image && !request.init_latent_resize) {
        // An image-to-image job runs at its init image's size (kiln_generate's rule).
        const kiln_image& init = *request.init_image;
        const std::string init_size = std::to_string(init.width) + "x" + std::to_string(init.height);
        if (request.width && request.width != static_cast<int>(init.width)) {
            bad_field("width", std::to_string(request.width) + " differs from the init image's " + init_size);
        }
        if (request.height && request.height != static_cast<int>(init.height)) {
            bad_field("height", std::to_string(request.height) + " differs from the init image's " + init_size);
        }
    }
    if (request.init_image) {
        const kiln_image& init = *request.init_image;
        over("width", init.width, limits.max_width);
        over("height", init.height, limits.max_height);
        // Refused here rather than by the job, after its 202.
        if (init.width % 8 || init.height % 8) {
            bad_field(init.width % 8 ? "width" : "height", "the init image is " + std::to_string(init.width) + "x" +
                                                               std::to_string(init.height) +
                                                               "; its sides must be multiples of 8");
        }
    }
    if (request.mask && !request.init_image) bad_field("mask", "a mask needs an init image");
    if (request.mask &&
        (request.mask->width != request.init_image->width || request.mask->height != request.init_image->height)) {
        bad_field("mask", "is " + std::to_string(request.mask->width) + "x" + std::to_string(request.mask->height) +
                              ", the init image " + std::to_string(request.init_image->width) + "x" +
                              std::to_string(request.init_image->height));
    }
}

void read_step_cache(JobRequest& r, const json& j) {
    r.cache_mode = read_string(j, "cache_mode");
    if (r.cache_mode == "disabled") r.cache_mode.clear();  // sd-server's name for none
    r.cache_option = read_string(j, "cache_option");
    r.scm_mask = read_string(j, "scm_mask");
    r.scm_policy = read_string(j, "scm_policy");
    // sd-server's boolean; its clients send it (true) with every request, so without a mask it says nothing.
    if (r.scm_policy.empty() && !r.scm_mask.empty() && j.contains("scm_policy_dynamic") &&
        !j["scm_policy_dynamic"].is_null()) {
        r.scm_policy = read_bool(j, "scm_policy_dynamic", true) ? "dynamic" : "static";
    }
    auto checked = pipeline::make_step_cache_options(r.cache_mode, r.cache_option, r.scm_mask, r.scm_policy);
    if (checked.ok()) return;
    // The CLI's message, under the field's name.
    std::string message = checked.error().message, field = "cache_option";
    for (auto [flag, name] : {std::pair{"--cache-mode: ", "cache_mode"}, std::pair{"--cache-option: ", "cache_option"},
                              std::pair{"--scm-mask: ", "scm_mask"}, std::pair{"--scm-policy: ", "scm_policy"}}) {
        if (message.rfind(flag, 0) == 0) {
            field = name;
            message = message.substr(std::string(flag).size());
        }
    }
    if (message.rfind("--scm-mask and --scm-policy", 0) == 0) field = r.scm_mask.empty() ? "scm_policy" : "scm_mask";
    throw RequestError{400, field, field + ": " + message};
}

}  // namespace kiln::server
