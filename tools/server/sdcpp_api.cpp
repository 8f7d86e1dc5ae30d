// sd-server's native API under /sdcpp/v1, as stable-diffusion.cpp's server
// documents it: capabilities, img_gen and vid_gen jobs (202, then polled),
// their status and cancel. The request body is sd.cpp's own (sample_params,
// hires, vae_tiling_params, lora[], ...) and maps onto kiln's jobs; what
// kiln does not have (IP-Adapter, control images here; a clip's start and
// end images and control frames) is refused by name. kiln
// adds one field: "model", a name GET /kiln/v1/models lists (sd-server
// serves one model; without it, the default).
#include <cmath>
#include <filesystem>

#include "a1111_names.h"
#include "json_body.h"
#include "request_fields.h"
#include "server_state.h"
#include "util/base64.h"

namespace kiln::server {
namespace {

using json = nlohmann::json;

// An image field kiln's server does not take yet: refused when given.
void refuse_if_given(const json& body, const std::string& field, const std::string& why) {
    const auto it = body.find(field);
    if (it == body.end() || it->is_null() || (it->is_array() && it->empty()) ||
        (it->is_string() && it->get<std::string>().empty()))
        return;
    throw RequestError{400, field, field + ": " + why};
}

void read_sample_params(JobRequest& r, const json& body, const ServerLimits& limits) {
    const json sp = object_at(body, "sample_params");
    nested("sample_params", [&] {
        set_scheduler(r, "scheduler", read_string(sp, "scheduler"));
        set_sampler(r, "sample_method", read_string(sp, "sample_method"));
        r.steps = static_cast<int>(read_integer(sp, "sample_steps", 0, 0, limits.max_steps));
        r.eta = static_cast<float>(read_number(sp, "eta", -1, 0, 1));
        r.timestep_shift = static_cast<int>(read_integer(sp, "shifted_timestep", 0, 0, 1000));
        r.sigmas = read_floats(sp, "custom_sigmas");
        if (sp.contains("flow_shift") && !sp["flow_shift"].is_null()) {
            const double shift = read_number(sp, "flow_shift", 0, 0, 1000);
            if (shift > 0) r.flow_shift = static_cast<float>(shift);  // sd.cpp's 0: the model's
        }
        return 0;
    });
    const json guidance = nested("sample_params", [&] { return object_at(sp, "guidance"); });
    nested("sample_params.guidance", [&] {
        r.cfg_scale = static_cast<float>(read_number(guidance, "txt_cfg", -1, 0, 1000));
        r.guidance = static_cast<float>(read_number(guidance, "distilled_guidance", -1, 0, 1000));
        return 0;
    });
    const json slg = nested("sample_params.guidance", [&] { return object_at(guidance, "slg"); });
    nested("sample_params.guidance.slg", [&] {
        r.slg_scale = static_cast<float>(read_number(slg, "scale", 0, 0, 1000));
        r.skip_layer_start = static_cast<float>(read_number(slg, "layer_start", 0.01, 0, 1));
        r.skip_layer_end = static_cast<float>(read_number(slg, "layer_end", 0.2, 0, 1));
        if (slg.contains("layers") && !slg["layers"].is_null()) {
            if (!slg["layers"].is_array()) throw RequestError{400, "layers", "layers: expected an array of integers"};
            r.skip_layers.clear();
            for (const json& l : slg["layers"]) {
                if (!l.is_number_integer() || l.get<long long>() < 0 || l.get<long long>() > 1000) {
                    throw RequestError{400, "layers", "layers: expected block indices, got " + l.dump()};
                }
                r.skip_layers.push_back(l.get<int>());
            }
        }
        return 0;
    });
}

void read_vae_tiling(JobRequest& r, const json& body, bool video) {
    const json v = object_at(body, "vae_tiling_params");
    const std::string clips =
        video ? "kiln decodes a clip a latent frame at a time, tiled in space only" : "kiln makes images";
    nested("vae_tiling_params", [&] {
        r.vae_tiling = read_bool(v, "enabled", false);
        if (read_bool(v, "temporal_tiling", false)) {
            throw RequestError{400, "temporal_tiling", "temporal_tiling: is for video VAEs; " + clips};
        }
        const int x = static_cast<int>(read_integer(v, "tile_size_x", 0, 0, 4096));
        const int y = static_cast<int>(read_integer(v, "tile_size_y", 0, 0, 4096));
        if (x != y && x > 0 && y > 0) {
            throw RequestError{400, "tile_size_y", "tile_size_y: kiln's tiles are square; give tile_size_x alone"};
        }
        if (std::max(x, y) > 0) r.vae_tile_size = std::max(x, y);
        r.vae_tile_overlap = static_cast<float>(read_number(v, "target_overlap", 0.5, 0, 0.99));
        r.vae_relative_tile_w = static_cast<float>(read_number(v, "rel_size_x", 0, 0, 4096));
        r.vae_relative_tile_h = static_cast<float>(read_number(v, "rel_size_y", 0, 0, 4096));
        refuse_if_given(v, "extra_tiling_args", "is for video VAEs; " + clips);
        return 0;
    });
}

// sd-server's lora[]: {path, multiplier} entries, kiln's <lora:NAME:W> tags
// appended to the prompt (NAME: the path under --lora-model-dir without
// its extension, as GET /sdcpp/v1/capabilities lists them).
void read_loras(JobRequest& r, const json& body) {
    const auto it = body.find("lora");
    if (it == body.end() || it->is_null()) return;
    if (!it->is_array()) throw RequestError{400, "lora", "lora: expected an array of {path, multiplier}"};
    for (size_t i = 0; i < it->size(); ++i) {
        const json& entry = (*it)[i];
        const std::string prefix = "lora[" + std::to_string(i) + "]";
        if (!entry.is_object()) throw RequestError{400, prefix, prefix + ": expected an object {path, multiplier}"};
        nested(prefix, [&] {
            std::string path = read_string(entry, "path");
            if (path.empty() || path.find_first_of(":<>") != std::string::npos) {
                throw RequestError{400, "path", "path: expected a LoRA name, got '" + path + "'"};
            }
            // The high-noise expert's LoRA: sd-cli's <lora:|high_noise|NAME:W>.
            const std::string expert = read_bool(entry, "is_high_noise", false) ? "|high_noise|" : "";
            const double weight = read_number(entry, "multiplier", 1.0, -100, 100);
            const std::string ext = std::filesystem::path(path).extension().string();
            if (ext == ".safetensors" || ext == ".sft" || ext == ".ckpt" || ext == ".pt" || ext == ".gguf") {
                path = std::filesystem::path(path).replace_extension().generic_string();
            }
            char tag[64];
            std::snprintf(tag, sizeof tag, ":%g>", weight);
            r.prompt += " <lora:" + expert + path + tag;
            return 0;
        });
    }
}

// output_format, one of `valid` (the first without it; "jpg" is "jpeg"),
// and output_compression, checked (kiln's encoders take no quality).
void read_output_format(JobRequest& r, const json& j, std::initializer_list<const char*> valid) {
    r.output_format = read_string(j, "output_format", *valid.begin());
    if (r.output_format == "jpg") r.output_format = "jpeg";
    std::string names;
    for (const char* v : valid) {
        if (r.output_format == v) {
            read_integer(j, "output_compression", 100, 0, 100);
            return;
        }
        names += (names.empty() ? "" : ", ") + std::string(v);
    }
    throw RequestError{400, "output_format",
                       "output_format: unknown format '" + r.output_format + "' (valid: " + names + ")"};
}

JobRequest parse_img_gen(ServerState& state, const httplib::Request& req) {
    const json j = parse_json_body(req);
    const ServerLimits& limits = state.options.limits;
    JobRequest r;
    r.model = state.models.resolve(read_string(j, "model"), "model").name;
    r.prompt = read_string(j, "prompt");
    r.negative_prompt = read_string(j, "negative_prompt");
    r.clip_skip = static_cast<int>(read_integer(j, "clip_skip", -1, -1, 12));
    r.width = static_cast<int>(read_integer(j, "width", 0, 0, limits.max_width));
    r.height = static_cast<int>(read_integer(j, "height", 0, 0, limits.max_height));
    r.strength = static_cast<float>(read_number(j, "strength", 0.75, 0.0001, 1));
    r.seed = read_integer(j, "seed", -1, -1, INT64_MAX);
    r.batch = static_cast<int>(read_integer(j, "batch_count", 1, 1, limits.max_batch));
    r.embed_metadata = read_bool(j, "embed_image_metadata", true);
    r.auto_resize_ref_images = read_bool(j, "auto_resize_ref_image", true);
    r.increase_ref_index = read_bool(j, "increase_ref_index", false);
    // sd-server sets these for the whole server (--circular, kiln serve's
    // default here); a request may set its own, by KoboldCpp's names.
    r.circular_x = read_bool(j, "circular_x", state.options.circular_x);
    r.circular_y = read_bool(j, "circular_y", state.options.circular_y);
    read_number(j, "control_strength", 0.9, 0, 10);
    read_number(j, "ip_adapter_strength", 1.0, 0, 10);
    if (j.contains("init_image") && !j["init_image"].is_null()) {
        r.init_image = without_alpha(read_base64_image(j["init_image"], "init_image", limits));
    }
    if (j.contains("mask_image") && !j["mask_image"].is_null()) {
        r.mask = mask_of(read_base64_image(j["mask_image"], "mask_image", limits), false);
    }
    if (j.contains("ref_images") && !j["ref_images"].is_null()) {
        const json& refs = j["ref_images"];
        if (!refs.is_array()) throw RequestError{400, "ref_images", "ref_images: expected an array of images"};
        if (refs.size() > static_cast<size_t>(limits.max_ref_images)) {
            throw RequestError{400, "ref_images",
                               "ref_images: at most " + std::to_string(limits.max_ref_images) + " images, got " +
                                   std::to_string(refs.size())};
        }
        for (size_t i = 0; i < refs.size(); ++i) {
            const std::string field = "ref_images[" + std::to_string(i) + "]";
            r.ref_images.push_back(without_alpha(read_base64_image(refs[i], field, limits)));
        }
    }
    refuse_if_given(j, "control_image", "ControlNet is not taken by kiln's server yet (kiln --control-net takes it)");
    refuse_if_given(j, "ip_adapter_image", "is for IP-Adapter, which kiln does not have");
    read_sample_params(r, j, limits);
    read_loras(r, j);
    read_hires(r, j, limits);
    read_vae_tiling(r, j, false);
    read_step_cache(r, j);
    read_output_format(r, j, {"png", "jpeg", "webp"});
    check_limits(r, limits);
    return r;
}

// POST /sdcpp/v1/vid_gen's body: one clip of video_frames frames (made 4k + 1
// by the pipeline) in a video file. A model that makes images is a 400.
JobRequest parse_vid_gen(ServerState& state, const httplib::Request& req) {
    const json j = parse_json_body(req);
    const ServerLimits& limits = state.options.limits;
    JobRequest r;
    const auto model = state.models.resolve(read_string(j, "model"), "model");
    r.model = model.name;
    if (!state.plans.defaults(model, {}, "model").video) {
        throw RequestError{400, "model", "model: " + r.model + " makes images, not clips (POST /sdcpp/v1/img_gen)"};
    }
    r.prompt = read_string(j, "prompt");
    r.negative_prompt = read_string(j, "negative_prompt");
    r.clip_skip = static_cast<int>(read_integer(j, "clip_skip", -1, -1, 12));
    r.width = static_cast<int>(read_integer(j, "width", 0, 0, limits.max_width));
    r.height = static_cast<int>(read_integer(j, "height", 0, 0, limits.max_height));
    read_number(j, "strength", 0.75, 0.0001, 1);  // an init image's: refused below
    r.seed = read_integer(j, "seed", -1, -1, INT64_MAX);
    r.video_frames = static_cast<int>(read_integer(j, "video_frames", 1, 1, kMaxVideoFrames));
    r.fps = static_cast<int>(read_integer(j, "fps", 16, 1, 1000));
    r.moe_boundary = static_cast<float>(read_number(j, "moe_boundary", 0.875, 0, 1));
    r.vace_strength = static_cast<float>(read_number(j, "vace_strength", 1.0, 0, 10));
    // An image-to-video DiT's first and last frames (Wan 2.1 I2V and FLF2V,
    // Wan 2.2 I2V); a text-to-video one refuses them by name.
    for (auto [field, image] : {std::pair{"init_image", &r.init_image}, std::pair{"end_image", &r.end_image}}) {
        if (j.contains(field) && !j[field].is_null() && !(j[field].is_string() && j[field].get<std::string>().empty()))
            *image = without_alpha(read_base64_image(j[field], field, limits));
    }
    // A VACE DiT's control clip, frame after frame (sd-server's control_frames).
    if (j.contains("control_frames") && !j["control_frames"].is_null()) {
        const json& frames = j["control_frames"];
        if (!frames.is_array())
            throw RequestError{400, "control_frames", "control_frames: expected an array of images"};
        if (frames.size() > static_cast<size_t>(kMaxVideoFrames)) {
            throw RequestError{400, "control_frames",
                               "control_frames: at most " + std::to_string(kMaxVideoFrames) + " frames, got " +
                                   std::to_string(frames.size())};
        }
        for (size_t i = 0; i < frames.size(); ++i) {
            const std::string field = "control_frames[" + std::to_string(i) + "]";
            r.control_frames.push_back(without_alpha(read_base64_image(frames[i], field, limits)));
        }
    }
    // Wan 2.2 A14B's high-noise expert (kiln serve --high-noise-diffusion-model),
    // as sd-server reads them; its schedule is the job's.
    const json high = object_at(j, "high_noise_sample_params");
    nested("high_noise_sample_params", [&] {
        r.high_noise_steps = static_cast<int>(read_integer(high, "sample_steps", -1, -1, limits.max_steps));
        r.high_noise_eta = static_cast<float>(read_number(high, "eta", -1, 0, 1));
        const std::string method = read_string(high, "sample_method");
        if (!method.empty()) {
            JobRequest expert;
            set_sampler(expert, "sample_method", method);
            r.high_noise_sampler = expert.sampler;
        }
        const json guidance = nested("guidance", [&] { return object_at(high, "guidance"); });
        nested("guidance", [&] {
            r.high_noise_cfg_scale = static_cast<float>(read_number(guidance, "txt_cfg", -1, 0, 1000));
            const json slg = object_at(guidance, "slg");
            return nested("slg", [&] {
                if (read_number(slg, "scale", 0, 0, 1000) != 0)
                    throw RequestError{400, "scale", "scale: skip-layer guidance is not for Wan's DiT"};
                return 0;
            });
        });
        return 0;
    });
    read_sample_params(r, j, limits);
    read_loras(r, j);
    read_vae_tiling(r, j, true);
    read_step_cache(r, j);
    read_output_format(r, j, {"webm", "webp", "avi"});
    check_limits(r, limits);
    return r;
}

const char* mime_type_of(const std::string& format) {
    return format == "webm" ? "video/webm" : format == "avi" ? "video/x-msvideo" : "image/webp";
}

// sd-server's names for kiln's job states.
const char* status_of(JobState state) {
    switch (state) {
        case JobState::Queued: return "queued";
        case JobState::Running: return "generating";
        case JobState::Done: return "completed";
        case JobState::Failed: return "failed";
        case JobState::Cancelled: return "cancelled";
    }
    return "failed";
}

json seconds_or_null(double unix_seconds) {
    return unix_seconds > 0 ? json(static_cast<long long>(unix_seconds)) : json(nullptr);
}

// The job as sd-server's GET /sdcpp/v1/jobs/{id} describes it.
json describe(ServerState& state, const Job& job) {
    const json kiln_view = state.jobs.describe(job, false);
    return state.jobs.with_lock([&] {
        const bool clip = job.request.video_frames > 0;
        json out = {{"id", job.id},
                    {"kind", clip ? "vid_gen" : "img_gen"},
                    {"status", status_of(job.state)},
                    {"created", static_cast<long long>(job.created)},
                    {"started", seconds_or_null(job.started)},
                    {"completed", seconds_or_null(job.finished)},
                    {"queue_position", kiln_view.value("position", 0)},
                    {"result", nullptr},
                    {"error", nullptr}};
        if (job.state == JobState::Done && clip && !job.results.empty()) {
            // One container file: the clip's frames, at fps.
            const JobImage& file = job.results.front();
            out["result"] = {{"output_format", job.request.output_format},
                             {"mime_type", mime_type_of(job.request.output_format)},
                             {"fps", job.request.fps},
                             {"frame_count", file.frames},
                             {"b64_json", base64_encode(file.bytes)}};
        } else if (job.state == JobState::Done) {
            json images = json::array();
            for (size_t i = 0; i < job.results.size(); ++i) {
                images.push_back({{"index", i}, {"b64_json", base64_encode(job.results[i].bytes)}});
            }
            out["result"] = {{"output_format", job.request.output_format}, {"images", images}};
        } else if (job.state == JobState::Cancelled) {
            out["error"] = {{"code", "cancelled"},
                            {"message", job.shutdown ? "the server is shutting down" : "job cancelled by client"}};
        } else if (job.state == JobState::Failed) {
            out["error"] = {{"code", "generation_failed"}, {"message", job.error_message}};
        }
        return out;
    });
}

// GET /sdcpp/v1/capabilities: the default model's defaults, read from a
// context that only places its modules (no weight is read; ModelPlans keeps them).
json capabilities(ServerState& state) {
    const std::string name = state.models.default_model();
    json model = {{"name", name}, {"stem", std::filesystem::path(name).stem().string()}, {"path", name}};
    kiln_model_info info{};
    if (!name.empty()) {
        try {
            info = state.plans.defaults(state.models.resolve(name, "model"), {}, "model");
        } catch (const RequestError&) {  // a model that cannot be read: its jobs will say why
        }
    }
    const ServerLimits& limits = state.options.limits;
    const json defaults = {
        {"prompt", ""},
        {"negative_prompt", ""},
        {"clip_skip", -1},
        {"width", info.width},
        {"height", info.height},
        {"strength", 0.75},
        {"seed", -1},
        {"sample_params",
         {{"scheduler", info.scheduler},
          {"sample_method", info.sampler},
          {"sample_steps", info.steps},
          {"eta", nullptr},
          {"shifted_timestep", 0},
          {"flow_shift", nullptr},
          {"guidance",
           {{"txt_cfg", info.cfg_scale},
            {"img_cfg", nullptr},
            {"distilled_guidance", 3.5},
            {"slg", {{"layers", {7, 8, 9}}, {"layer_start", 0.01}, {"layer_end", 0.2}, {"scale", 0.0}}}}}}},
        {"vae_tiling_params",
         {{"enabled", false},
          {"temporal_tiling", false},
          {"tile_size_x", 32},
          {"tile_size_y", 32},
          {"target_overlap", 0.5},
          {"rel_size_x", 0.0},
          {"rel_size_y", 0.0},
          {"extra_tiling_args", ""}}},
        {"cache_mode", "disabled"},
        {"cache_option", ""},
        {"scm_mask", ""},
        {"scm_policy_dynamic", true},
        {"output_format", "png"},
        {"output_compression", 100},
        {"batch_count", 1},
        {"auto_resize_ref_image", true},
        {"increase_ref_index", false},
        {"circular_x", state.options.circular_x},
        {"circular_y", state.options.circular_y},
        {"control_strength", 0.9},
        {"ip_adapter_strength", 1.0},
        {"hires",
         {{"enabled", false},
          {"upscaler", "Latent"},
          {"scale", 2.0},
          {"target_width", 0},
          {"target_height", 0},
          {"steps", 0},
          {"denoising_strength", 0.7},
          {"custom_sigmas", json::array()},
          {"upscale_tile_size", 128}}}};
    const json features = {
        {"init_image", true}, {"mask_image", true},    {"control_image", false},   {"ip_adapter_image", false},
        {"ref_images", true}, {"lora", true},          {"vae_tiling", true},       {"hires", true},
        {"cache", true},      {"cancel_queued", true}, {"cancel_generating", true}};
    const json formats = {"png", "jpeg", "webp"};
    // A video model (Wan) also takes vid_gen: its defaults are img_gen's
    // with a clip's fields, in a video file.
    json video_defaults = defaults;
    for (const char* image_only : {"batch_count", "auto_resize_ref_image", "increase_ref_index", "control_strength",
                                   "ip_adapter_strength", "hires"})
        video_defaults.erase(image_only);
    video_defaults["video_frames"] = 33;
    video_defaults["fps"] = 16;
    video_defaults["moe_boundary"] = 0.875;
    video_defaults["vace_strength"] = 1.0;
    video_defaults["output_format"] = "webm";
    video_defaults["high_noise_sample_params"] = defaults["sample_params"];
    video_defaults["high_noise_sample_params"]["sample_steps"] = -1;
    const json video_formats = {"webm", "webp", "avi"};
    const json video_features = {{"init_image", info.first_frame != 0 || info.vace != 0},
                                 {"end_image", info.first_frame == 1},
                                 {"control_frames", info.vace != 0},
                                 {"high_noise", info.high_noise_expert != 0},
                                 {"lora", true},
                                 {"vae_tiling", true},
                                 {"cache", true},
                                 {"cancel_queued", true},
                                 {"cancel_generating", true}};
    json samplers = json::array(), schedulers = json::array();
    for (const SamplerName& s : sampler_names()) samplers.push_back(s.kiln);
    for (const SchedulerName& s : scheduler_names()) {
        if (*s.kiln) schedulers.push_back(s.kiln);  // "" is A1111's automatic: the model's own
    }
    json loras = json::array();
    for (const json& l : lora_list(state.options.context.lora_model_dir)) {
        loras.push_back({{"name", l["name"]}, {"path", l["name"]}});
    }
    json upscalers = json::array({{{"name", "None"}}});
    for (const HiresUpscalerName& builtin : kHiresUpscalers) upscalers.push_back({{"name", builtin.a1111}});
    json out = {{"model", model},
                {"current_mode", info.video ? "vid_gen" : "img_gen"},
                {"supported_modes", info.video ? json{"img_gen", "vid_gen"} : json{"img_gen"}},
                {"defaults", info.video ? video_defaults : defaults},
                {"output_formats", info.video ? video_formats : formats},
                {"features", info.video ? video_features : features},
                {"defaults_by_mode", {{"img_gen", defaults}}},
                {"output_formats_by_mode", {{"img_gen", formats}}},
                {"features_by_mode", {{"img_gen", features}}},
                {"samplers", samplers},
                {"schedulers", schedulers},
                {"loras", loras},
                {"upscalers", upscalers},
                {"limits",
                 {{"min_width", 8},
                  {"max_width", limits.max_width},
                  {"min_height", 8},
                  {"max_height", limits.max_height},
                  {"max_batch_count", limits.max_batch},
                  {"max_queue_size", state.options.max_queue}}}};
    if (info.video) {
        out["defaults_by_mode"]["vid_gen"] = video_defaults;
        out["output_formats_by_mode"]["vid_gen"] = video_formats;
        out["features_by_mode"]["vid_gen"] = video_features;
    }
    return out;
}

}  // namespace

void add_sdcpp_routes(httplib::Server& server, ServerState& state) {
    server.Get("/sdcpp/v1/capabilities", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, capabilities(state)); });
    });
    // img_gen and vid_gen: the job queued, 202 with where to poll it.
    for (const auto& [kind, parse] : {std::pair{"img_gen", &parse_img_gen}, std::pair{"vid_gen", &parse_vid_gen}}) {
        server.Post(std::string("/sdcpp/v1/") + kind,
                    [&state, kind = kind, parse = parse](const httplib::Request& req, httplib::Response& res) {
                        guarded(res, [&] {
                            int position = 0;
                            auto job = submit_job(state, parse(state, req), &position);
                            send_json(res, 202,
                                      {{"id", job->id},
                                       {"kind", kind},
                                       {"status", "queued"},
                                       {"created", static_cast<long long>(job->created)},
                                       {"poll_url", "/sdcpp/v1/jobs/" + job->id}});
                        });
                    });
    }
    server.Get(R"(/sdcpp/v1/jobs/([^/]+))", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, describe(state, *job_of(state, req.matches[1]))); });
    });
    // Takes no body (a ContentReader handler: none is read).
    server.Post(R"(/sdcpp/v1/jobs/([^/]+)/cancel)",
                [&state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
                    guarded(res, [&] {
                        auto job = job_of(state, req.matches[1]);
                        if (!state.jobs.cancel(job)) {
                            throw RequestError{409, "id", "job " + job->id + " has already finished"};
                        }
                        send_json(res, 200, describe(state, *job));
                    });
                });
}

}  // namespace kiln::server
