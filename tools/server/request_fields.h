// Reading request fields with their types and ranges checked: every reader
// throws a RequestError that names the field, so each API's parser is a
// list of fields and no bad value reaches kiln_generate unexplained.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "job_request.h"
#include "model_registry.h"
#include "pipeline/request_limits.h"
#include "server_options.h"

namespace kiln::server {

using nlohmann::json;

// Each reader returns `fallback` when the field is absent or null.
std::string read_string(const json& body, const std::string& field, const std::string& fallback = "");
long long read_integer(const json& body, const std::string& field, long long fallback, long long min, long long max);
double read_number(const json& body, const std::string& field, double fallback, double min, double max);
bool read_bool(const json& body, const std::string& field, bool fallback);
std::vector<float> read_floats(const json& body, const std::string& field);
// The object `body[key]` (an empty one when absent or null); a field of
// another type is a 400 naming it.
json object_at(const json& body, const std::string& key);

// Reads a nested field with the readers above, naming it by its full path
// ("sample_params.sample_steps") when it is wrong.
template <typename Read>
auto nested(const std::string& prefix, Read&& read) {
    try {
        return read();
    } catch (RequestError& e) {
        e.message = prefix + "." + e.message;
        e.field = prefix + "." + e.field;
        throw;
    }
}

// The parts a request names for its model, each a file GET /kiln/v1/models
// lists among the folder's parts: "vae", "clip_l", "clip_g", "t5xxl", "llm".
// 400 naming the field for one that is not listed.
ModelParts read_model_parts(const json& body, ModelRegistry& models);

// The hires upscalers kiln serve offers, by A1111's name and kiln's (model
// upscalers are files the CLI takes by path, not a client).
struct HiresUpscalerName {
    const char* a1111;
    const char* kiln;
};
inline constexpr HiresUpscalerName kHiresUpscalers[] = {{"Latent", "latent"},
                                                        {"Latent (nearest)", "latent-nearest"},
                                                        {"Latent (nearest-exact)", "latent-nearest-exact"},
                                                        {"Lanczos", "lanczos"}};

// A hires upscaler a request may name: one of kHiresUpscalers, by either
// name; 400 naming `field` for anything else.
std::string hires_upscaler_named(const std::string& name, const std::string& field);

// The hires fix as sd-server's API writes it (kiln's native API takes the
// same object): "hires": {enabled, upscaler, scale, target_width,
// target_height, steps, denoising_strength, custom_sigmas,
// upscale_tile_size}. An upscaler kiln lacks is named by its validation.
void read_hires(JobRequest& request, const json& body, const ServerLimits& limits);

// "euler_a" or "Euler a" into request.sampler (and, for "DPM++ 2M Karras",
// request.scheduler); 400 naming `field` when unknown.
void set_sampler(JobRequest& request, const std::string& field, const std::string& name);
void set_scheduler(JobRequest& request, const std::string& field, const std::string& name);

// kiln.h's range of kiln_generation_params.preview_interval is [1, 10000].
constexpr int kMaxPreviewInterval = 10000;
// video_frames: kiln's --video-frames range.
using pipeline::kMaxVideoFrames;

// kiln's live preview modes by the names --preview takes ("none", "proj",
// "tae", "vae"); nullopt for any other.
std::optional<kiln_preview_mode> preview_mode_named(const std::string& name);
// A preview mode's name into request.preview ("" leaves the server's); 400 naming `field` when unknown.
void set_preview(JobRequest& request, const std::string& field, const std::string& name);

// The step cache fields (sd-server's names): cache_mode ("disabled" or
// absent: none), cache_option,
// scm_mask and scm_policy ("dynamic" or "static"; or sd-server's boolean
// scm_policy_dynamic), checked as the CLI checks them; 400 naming the field.
void read_step_cache(JobRequest& request, const json& body);

// A black image of that size (500 when memory runs out).
SharedImage blank_image(uint32_t width, uint32_t height, uint32_t channels);

// An uploaded image file's bytes, decoded (PNG, JPEG, WebP) within the
// pixel limit; 400 naming `field` when they are not an image.
SharedImage decode_upload(const std::string& field, const std::string& bytes, const ServerLimits& limits);
// A base64 string field (with or without a data: prefix), decoded as above.
SharedImage read_base64_image(const json& value, const std::string& field, const ServerLimits& limits);

// The image without its alpha (init images), and a mask as kiln takes it:
// RGB, white repaints. With `alpha_repaints` (OpenAI's edits) an RGBA mask's
// transparent pixels are the ones to repaint, else the alpha is dropped.
SharedImage without_alpha(const SharedImage& image);
// `image` at width x height (Lanczos, stretched as A1111's "Just resize");
// 400 naming `field` when it cannot be.
SharedImage resized(const SharedImage& image, int width, int height, const std::string& field);
SharedImage mask_of(const SharedImage& image, bool alpha_repaints);

// The server's limits on a parsed request: width, height, steps, batch,
// prompt length, and a mask only with an init image of its size.
void check_limits(const JobRequest& request, const ServerLimits& limits);

}  // namespace kiln::server
