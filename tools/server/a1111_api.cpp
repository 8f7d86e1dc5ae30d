// A1111's web UI API under /sdapi/v1/, as its clients (KoboldCpp's mimic,
// sd.cpp-webui, bots and scripts) call it: txt2img and img2img answer with
// the images, `info` and the parameters text; progress, interrupt, options
// (sd_model_checkpoint switches the model) and the lists.
#include <algorithm>
#include <ctime>
#include <filesystem>

#include "a1111_names.h"
#include "a1111_resize.h"
#include "image/png_metadata.h"
#include "json_body.h"
#include "request_fields.h"
#include "server_state.h"
#include "util/base64.h"
#include "util/files.h"
#include "util/format.h"

namespace kiln::server {
namespace {


// A1111's live-preview settings in `settings` (an options body or a request's
// override_settings) over `base`; 400 naming the field when one is wrong.
A1111PreviewSettings read_preview_settings(const json& settings, A1111PreviewSettings base) {
    base.live_previews_enable = read_bool(settings, "live_previews_enable", base.live_previews_enable);
    if (settings.contains("show_progress_every_n_steps") && !settings["show_progress_every_n_steps"].is_null()) {
        base.show_progress_every_n_steps =
            static_cast<int>(read_integer(settings, "show_progress_every_n_steps", 0, -1, kMaxPreviewInterval));
    }
    return base;
}

A1111PreviewSettings current_preview_settings(ServerState& state) {
    std::lock_guard<std::mutex> lock(state.a1111_mutex);
    return state.a1111_previews;
}

// As A1111 reads them: previews off, or -1 steps (A1111: the final image
// only), is no preview; 0 is every step; unset leaves the server's interval.
void apply_preview_settings(const A1111PreviewSettings& settings, JobRequest& request) {
    if (!settings.live_previews_enable || settings.show_progress_every_n_steps == -1) {
        request.preview = "none";
        return;
    }
    if (settings.show_progress_every_n_steps) {
        request.preview_interval = std::max(1, *settings.show_progress_every_n_steps);
    }
}

// A1111's hires fix fields of txt2img (enable_hr and the hr_* fields, with
// denoising_strength for the second pass). kiln serve upscales with the
// latent modes or Lanczos, as A1111 names them; model upscalers are files
// the CLI takes by path.
void read_hires_fix(JobRequest& r, const json& j, const ServerLimits& limits) {
    if (!read_bool(j, "enable_hr", false)) return;
    r.hires = true;
    r.hires_scale = static_cast<float>(read_number(j, "hr_scale", 2.0, 0.01, 8.0));
    r.hires_width = static_cast<int>(read_integer(j, "hr_resize_x", 0, 0, limits.max_width));
    r.hires_height = static_cast<int>(read_integer(j, "hr_resize_y", 0, 0, limits.max_height));
    r.hires_steps = static_cast<int>(read_integer(j, "hr_second_pass_steps", 0, 0, limits.max_steps));
    r.hires_denoising_strength = static_cast<float>(read_number(j, "denoising_strength", 0.7, 0.0, 1.0));
    r.hires_upscaler = hires_upscaler_named(read_string(j, "hr_upscaler", "Latent"), "hr_upscaler");
    // The final size within the server's limits, as far as the request says it.
    const long long final_width = r.hires_width ? r.hires_width : static_cast<long long>(r.width * r.hires_scale);
    const long long final_height = r.hires_height ? r.hires_height : static_cast<long long>(r.height * r.hires_scale);
    if (final_width > limits.max_width || final_height > limits.max_height) {
        throw RequestError{400, "hr_scale",
                           "hr_scale: the hires size " + std::to_string(final_width) + "x" +
                               std::to_string(final_height) + " is over this server's limit of " +
                               std::to_string(limits.max_width) + "x" + std::to_string(limits.max_height)};
    }
}

JobRequest parse_a1111(ServerState& state, const json& j, bool img2img) {
    const ServerLimits& limits = state.options.limits;
    JobRequest r;
    std::string checkpoint;
    A1111PreviewSettings previews = current_preview_settings(state);
    if (j.contains("override_settings") && !j["override_settings"].is_null()) {
        if (!j["override_settings"].is_object()) {
            throw RequestError{400, "override_settings", "override_settings: expected an object"};
        }
        checkpoint = read_string(j["override_settings"], "sd_model_checkpoint");
        previews = read_preview_settings(j["override_settings"], previews);
    }
    apply_preview_settings(previews, r);
    r.model = state.models.resolve(checkpoint, "override_settings.sd_model_checkpoint").name;
    r.prompt = read_string(j, "prompt");
    r.negative_prompt = read_string(j, "negative_prompt");
    r.width = static_cast<int>(read_integer(j, "width", 0, 0, limits.max_width));
    r.height = static_cast<int>(read_integer(j, "height", 0, 0, limits.max_height));
    r.steps = static_cast<int>(read_integer(j, "steps", 0, 0, limits.max_steps));
    r.cfg_scale = static_cast<float>(read_number(j, "cfg_scale", -1, -1, 1000));
    r.eta = static_cast<float>(read_number(j, "eta", -1, 0, 1));
    r.seed = read_integer(j, "seed", -1, -1, INT64_MAX);
    const long long batch_size = read_integer(j, "batch_size", 1, 1, limits.max_batch);
    const long long n_iter = read_integer(j, "n_iter", 1, 1, limits.max_batch);
    if (batch_size * n_iter > limits.max_batch) {
        throw RequestError{400, "n_iter",
                           "n_iter: batch_size x n_iter is " + std::to_string(batch_size * n_iter) +
                               ", over this server's limit of " + std::to_string(limits.max_batch)};
    }
    r.batch = static_cast<int>(batch_size * n_iter);
    // sampler_index is the older name of sampler_name.
    const bool has_name = j.contains("sampler_name") && !j["sampler_name"].is_null();
    set_sampler(r, has_name ? "sampler_name" : "sampler_index",
                read_string(j, has_name ? "sampler_name" : "sampler_index"));
    set_scheduler(r, "scheduler", read_string(j, "scheduler"));
    // A1111's "Tiling": a seamless image across both pairs of edges (absent:
    // kiln serve's --circular flags).
    if (j.contains("tiling") && !j["tiling"].is_null()) {
        r.circular_x = r.circular_y = read_bool(j, "tiling", false);
    } else {
        r.circular_x = state.options.circular_x;
        r.circular_y = state.options.circular_y;
    }
    if (!img2img) {
        read_hires_fix(r, j, limits);
        return r;
    }

    const json* images = j.contains("init_images") ? &j["init_images"] : nullptr;
    if (!images || !images->is_array() || images->empty()) {
        throw RequestError{400, "init_images", "init_images: expected a list of one or more base64 images"};
    }
    r.init_image = without_alpha(read_base64_image((*images)[0], "init_images[0]", limits));
    if (j.contains("mask") && !j["mask"].is_null()) {
        SharedImage mask = mask_of(read_base64_image(j["mask"], "mask", limits), false);
        if (read_integer(j, "inpainting_mask_invert", 0, 0, 1) == 1) {
            for (size_t i = 0; i < size_t(mask->width) * mask->height * 3; ++i) mask->data[i] = 255 - mask->data[i];
        }
        r.mask = mask;
    }
    r.strength = static_cast<float>(read_number(j, "denoising_strength", 0.75, 0.0001, 1));
    // A1111 makes the init image and the mask width x height first, by
    // resize_mode (a1111_resize.h); kiln then works at that size.
    const int resize_mode = static_cast<int>(read_integer(j, "resize_mode", 0, 0, 3));
    if (resize_mode == 3) {
        // Its latent is resized to width x height (0: the image's own) by kiln.
        if (r.mask) {
            throw RequestError{400, "resize_mode",
                               "resize_mode: 3 (just resize, latent upscale) cannot be used with a mask; use 0 (just "
                               "resize), 1 (crop and resize) or 2 (resize and fill)"};
        }
        r.init_image = cut_to_multiples_of_8(r.init_image, "init_images[0]");
        r.init_latent_resize = true;
        return r;
    }
    if (r.width > 0 || r.height > 0) {
        const int width = r.width > 0 ? r.width : int(r.init_image->width);
        const int height = r.height > 0 ? r.height : int(r.init_image->height);
        r.init_image = a1111_resize(r.init_image, resize_mode, width, height, "init_images[0]");
        r.mask = a1111_resize(r.mask, resize_mode, width, height, "mask");
    }
    r.width = 0;
    r.height = 0;
    return r;
}

// A1111's job_timestamp: local time as YYYYmmddHHMMSS.
std::string a1111_timestamp(double unix_seconds) {
    const time_t t = static_cast<time_t>(unix_seconds);
    tm local{};
    localtime_r(&t, &local);
    char text[32];
    std::strftime(text, sizeof text, "%Y%m%d%H%M%S", &local);
    return text;
}

json info_of(const Job& job, const json& request) {
    const JobRequest& r = job.request;
    json seeds = json::array(), prompts = json::array(), negatives = json::array(), infotexts = json::array();
    for (const JobImage& image : job.results) {
        seeds.push_back(image.seed);
        prompts.push_back(r.prompt);
        negatives.push_back(r.negative_prompt);
        infotexts.push_back(image.parameters);
    }
    const JobImage& first = job.results.front();
    return {{"prompt", r.prompt},
            {"all_prompts", prompts},
            {"negative_prompt", r.negative_prompt},
            {"all_negative_prompts", negatives},
            {"seed", r.seed},
            {"all_seeds", seeds},
            {"subseed", -1},
            {"all_subseeds", seeds},
            {"subseed_strength", 0},
            {"width", first.width},
            {"height", first.height},
            {"sampler_name", r.sampler.empty() ? json(nullptr) : json(a1111_sampler_label(r.sampler))},
            {"scheduler", r.scheduler.empty() ? json("automatic") : json(r.scheduler)},
            {"cfg_scale", r.cfg_scale < 0 ? json(nullptr) : json(r.cfg_scale)},
            {"steps", job.steps},
            {"batch_size", request.value("batch_size", 1)},
            {"n_iter", request.value("n_iter", 1)},
            {"denoising_strength", r.init_image ? json(r.strength) : json(nullptr)},
            {"restore_faces", false},
            {"sd_model_name", std::filesystem::path(r.model).stem().string()},
            {"sd_model_hash", nullptr},
            {"index_of_first_image", 0},
            {"infotexts", infotexts},
            {"styles", json::array()},
            {"job_timestamp", a1111_timestamp(job.created)},
            {"version", std::string("kiln ") + kiln_version()}};
}

// POST /sdapi/v1/png-info: the parameters text of a base64 image, and A1111's
// parse of it (parse_generation_parameters: Prompt, Negative prompt, each
// key of the last line, Size-1 and Size-2).
json png_info(const json& body) {
    const std::string encoded = read_string(body, "image");
    if (encoded.empty()) throw RequestError{400, "image", "image: expected a base64 image"};
    const size_t comma =
        encoded.rfind("base64,", 0) == 0 || encoded.rfind("data:", 0) == 0 ? encoded.find(',') : std::string::npos;
    auto bytes = base64_decode(comma == std::string::npos ? encoded : encoded.substr(comma + 1));
    if (!bytes) throw RequestError{400, "image", "image: not valid base64"};
    auto text = image::image_text(bytes->data(), bytes->size(), "image");
    if (!text.ok()) throw RequestError{400, "image", text.error().message};
    json items = json::object();
    for (const auto& [key, value] : *text) items[key] = value;
    const auto parameters = text->find(image::kParametersKeyword);
    if (parameters == text->end()) return {{"info", ""}, {"items", items}, {"parameters", json::object()}};
    items.erase(image::kParametersKeyword);
    const image::GenerationInfo g = image::parse_a1111_parameters(parameters->second);
    json parsed = {{"Prompt", g.prompt}, {"Negative prompt", g.negative_prompt}};
    if (g.steps > 0) parsed["Steps"] = std::to_string(g.steps);
    if (!g.sampler.empty()) parsed["Sampler"] = g.sampler;
    if (!g.scheduler.empty()) parsed["Schedule type"] = g.scheduler;
    if (g.cfg_scale > 0) parsed["CFG scale"] = format_number(g.cfg_scale);
    if (g.seed >= 0) parsed["Seed"] = std::to_string(g.seed);
    if (g.width > 0) {
        parsed["Size-1"] = std::to_string(g.width);
        parsed["Size-2"] = std::to_string(g.height);
    }
    if (!g.model.empty()) parsed["Model"] = g.model;
    for (const auto& [key, value] : g.extra) parsed[key] = value;
    return {{"info", parameters->second}, {"items", items}, {"parameters", parsed}};
}

void generate(ServerState& state, const httplib::Request& req, httplib::Response& res, bool img2img) {
    const json body = parse_json_body(req);
    JobRequest request = parse_a1111(state, body, img2img);
    check_limits(request, state.options.limits);
    auto job = run_job_and_wait(state, std::move(request), req);
    json images = json::array();
    json info;
    state.jobs.with_lock([&] {
        for (const JobImage& image : job->results) images.push_back(base64_encode(image.bytes));
        info = info_of(*job, body);
        return 0;
    });
    json parameters = body;
    // The images are in the answer already; echoing them would double its size.
    if (parameters.contains("init_images")) parameters["init_images"] = json::array();
    if (parameters.contains("mask")) parameters["mask"] = nullptr;
    send_json(res, 200, {{"images", images}, {"parameters", parameters}, {"info", info.dump()}});
}

}  // namespace

// A1111's /sdapi/v1/loras entries, sorted by name. Never throws: a folder
// that cannot be read (or a symlink loop in it) lists what it could.
json lora_list(const char* folder) {
    json out = json::array();
    if (!folder || !*folder) return out;
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<std::pair<std::string, std::string>> found;  // name, path
    for (fs::recursive_directory_iterator it(folder, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end; it.increment(ec)) {
        std::error_code type_error;
        if (!it->is_regular_file(type_error)) continue;
        const fs::path& path = it->path();
        // Only files inside the folder's real path: a prompt could not use
        // one a symlink leads out to (find_lora_file refuses it).
        if (!real_path_outside(folder, path.string()).empty()) continue;
        const std::string ext = path.extension().string();
        if (ext != ".safetensors" && ext != ".sft" && ext != ".ckpt" && ext != ".pt" && ext != ".gguf") continue;
        std::string name = fs::relative(path, folder, type_error).replace_extension().generic_string();
        if (!type_error) found.emplace_back(name, path.string());
    }
    std::sort(found.begin(), found.end());
    for (const auto& [name, path] : found) {
        out.push_back({{"name", name}, {"alias", name}, {"path", path}, {"metadata", json::object()}});
    }
    return out;
}

void add_a1111_routes(httplib::Server& server, ServerState& state) {
    server.Post("/sdapi/v1/txt2img", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { generate(state, req, res, false); });
    });
    server.Post("/sdapi/v1/img2img", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { generate(state, req, res, true); });
    });
    server.Get("/sdapi/v1/progress", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            const auto job = state.jobs.running();
            const int queued = state.jobs.queued_count();
            json progress = {
                {"progress", 0.0}, {"eta_relative", 0.0}, {"current_image", nullptr}, {"textinfo", nullptr}};
            json job_state = {{"skipped", false},    {"interrupted", false}, {"job", ""},
                              {"job_count", queued}, {"job_timestamp", "0"}, {"job_no", 0},
                              {"sampling_step", 0},  {"sampling_steps", 0}};
            if (job) {
                const json d = state.jobs.describe(*job, false);
                progress["progress"] = d["progress"];
                progress["eta_relative"] = d["eta"].is_null() ? json(0.0) : d["eta"];
                job_state["job"] = job->id;
                job_state["job_count"] = queued + 1;
                job_state["job_no"] = d["image"];
                job_state["sampling_step"] = d["step"];
                job_state["sampling_steps"] = d["steps"];
                job_state["interrupted"] =
                    state.jobs.with_lock([&] { return job->cancel_requested || job->interrupt_requested; });
                job_state["job_timestamp"] = a1111_timestamp(job->created);
                // The latest preview, base64 PNG without a data: prefix, as A1111 sends it.
                const std::string skip = req.get_param_value("skip_current_image");
                if (skip != "true" && skip != "True" && skip != "1") {
                    std::string preview = state.jobs.latest_preview(*job);
                    if (!preview.empty()) progress["current_image"] = std::move(preview);
                }
            }
            progress["state"] = job_state;
            send_json(res, 200, progress);
        });
    });
    // A ContentReader handler: httplib reads no body, so curl -X POST without one (and no
    // Content-Length) is answered, not refused with a 400.
    // The interrupted job's request still answers 200, with the image it had (A1111's last_latent).
    server.Post("/sdapi/v1/interrupt",
                [&state](const httplib::Request&, httplib::Response& res, const httplib::ContentReader&) {
                    guarded(res, [&] {
                        state.jobs.interrupt_running();
                        send_json(res, 200, json::object());
                    });
                });
    // A ContentReader handler: httplib reads no body, so curl -X POST without one (and no
    // Content-Length) is answered, not refused with a 400.
    server.Post("/sdapi/v1/skip",
                [&state](const httplib::Request&, httplib::Response& res, const httplib::ContentReader&) {
                    guarded(res, [&] {
                        state.jobs.skip_running();
                        send_json(res, 200, json::object());
                    });
                });
    server.Get("/sdapi/v1/options", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            const A1111PreviewSettings previews = current_preview_settings(state);
            send_json(res, 200,
                      {{"sd_model_checkpoint", state.models.default_model()},
                       {"samples_format", "png"},
                       {"sd_checkpoints_limit", state.options.max_loaded_models},
                       {"live_previews_enable", previews.live_previews_enable},
                       {"show_progress_every_n_steps",
                        previews.show_progress_every_n_steps.value_or(state.options.preview_interval)}});
        });
    });
    server.Post("/sdapi/v1/options", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            const json body = parse_json_body(req);
            // Every field is read before any is set, so a bad one changes nothing.
            std::string model;
            if (body.contains("sd_model_checkpoint")) {
                model = state.models.resolve(read_string(body, "sd_model_checkpoint"), "sd_model_checkpoint").name;
            }
            // Read, merged and written under one lock: two clients setting
            // different fields at once both keep theirs.
            std::lock_guard<std::mutex> lock(state.a1111_mutex);
            const A1111PreviewSettings previews = read_preview_settings(body, state.a1111_previews);
            if (!model.empty()) state.models.set_default_model(model);
            state.a1111_previews = previews;
            send_json(res, 200, nullptr);
        });
    });
    server.Get("/sdapi/v1/sd-models", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            json models = json::array();
            for (const ModelEntry& m : state.models.list()) {
                models.push_back({{"title", m.name},
                                  {"model_name", std::filesystem::path(m.name).replace_extension().generic_string()},
                                  {"hash", nullptr},
                                  {"sha256", nullptr},
                                  {"filename", m.name},
                                  {"config", nullptr}});
            }
            send_json(res, 200, models);
        });
    });
    server.Get("/sdapi/v1/samplers", [](const httplib::Request&, httplib::Response& res) {
        json samplers = json::array();
        for (const SamplerName& s : sampler_names()) {
            json aliases = json::array({s.kiln});
            for (const char* alias : s.aliases) aliases.push_back(alias);
            samplers.push_back({{"name", s.a1111}, {"aliases", aliases}, {"options", json::object()}});
        }
        send_json(res, 200, samplers);
    });
    server.Get("/sdapi/v1/schedulers", [](const httplib::Request&, httplib::Response& res) {
        json schedulers = json::array();
        for (const SchedulerName& s : scheduler_names()) {
            schedulers.push_back({{"name", s.a1111},
                                  {"label", s.label},
                                  {"aliases", nullptr},
                                  {"default_rho", -1},
                                  {"need_inner_model", false}});
        }
        send_json(res, 200, schedulers);
    });
    // The LoRAs a prompt's <lora:NAME:W> can name: every adapter file under
    // --lora-model-dir, NAME being its path there without the extension.
    server.Get("/sdapi/v1/loras", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, lora_list(state.options.context.lora_model_dir)); });
    });
    // Not served yet: upscalers are a list clients read at start.
    server.Get("/sdapi/v1/upscalers",
               [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, json::array()); });
    // The lists and pings A1111 clients read at start, answered as A1111 does.
    server.Get("/sdapi/v1/sd-vae", [](const httplib::Request&, httplib::Response& res) {
        send_json(res, 200, json::array());  // kiln takes a VAE per model (--vae), not per request
    });
    server.Get("/sdapi/v1/latent-upscale-modes", [](const httplib::Request&, httplib::Response& res) {
        json modes = json::array();
        for (const HiresUpscalerName& u : kHiresUpscalers) {
            if (std::string(u.kiln).rfind("latent", 0) == 0) modes.push_back({{"name", u.a1111}});
        }
        send_json(res, 200, modes);
    });
    server.Get("/sdapi/v1/embeddings", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            json loaded = json::object();
            const char* folder = state.options.context.embeddings_dir;
            std::error_code ec;
            for (std::filesystem::directory_iterator it(folder && *folder ? folder : ".", ec), end;
                 folder && *folder && !ec && it != end; it.increment(ec)) {
                const std::string ext = it->path().extension().string();
                if (ext != ".pt" && ext != ".safetensors" && ext != ".bin") continue;
                loaded[it->path().stem().string()] = {{"step", nullptr}, {"sd_checkpoint", nullptr},
                                                      {"sd_checkpoint_name", nullptr}, {"shape", nullptr},
                                                      {"vectors", nullptr}};
            }
            send_json(res, 200, {{"loaded", loaded}, {"skipped", json::object()}});
        });
    });
    server.Post("/sdapi/v1/png-info", [](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, png_info(parse_json_body(req))); });
    });
    // kiln reads the model folder again at each listing: nothing to refresh.
    for (const char* refresh : {"/sdapi/v1/refresh-checkpoints", "/sdapi/v1/refresh-loras", "/sdapi/v1/refresh-vae"}) {
        server.Post(refresh, [](const httplib::Request&, httplib::Response& res, const httplib::ContentReader&) {
            send_json(res, 200, nullptr);
        });
    }
    server.Get("/internal/ping", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, json::object()); });
}

}  // namespace kiln::server
