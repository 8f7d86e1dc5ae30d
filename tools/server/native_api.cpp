// kiln's own API under /kiln/v1: jobs that answer at once (202) and are
// followed by polling or server-sent events, cancelled while queued or
// running, and their images served by URL.
#include <cstdint>

#include "json_body.h"
#include "request_fields.h"
#include "server_state.h"

namespace kiln::server {
namespace {

JobRequest parse_native(ServerState& state, const httplib::Request& req) {
    const json j = parse_json_body(req);
    const ServerLimits& limits = state.options.limits;
    JobRequest r;
    r.model = state.models.resolve(read_string(j, "model"), "model").name;
    r.parts = read_model_parts(j, state.models);
    r.prompt = read_string(j, "prompt");
    r.negative_prompt = read_string(j, "negative_prompt");
    r.width = static_cast<int>(read_integer(j, "width", 0, 0, limits.max_width));
    r.height = static_cast<int>(read_integer(j, "height", 0, 0, limits.max_height));
    r.steps = static_cast<int>(read_integer(j, "steps", 0, 0, limits.max_steps));
    r.batch = static_cast<int>(read_integer(j, "batch_count", 1, 1, limits.max_batch));
    r.cfg_scale = static_cast<float>(read_number(j, "cfg_scale", -1, -1, 1000));
    r.eta = static_cast<float>(read_number(j, "eta", -1, 0, 1));
    r.seed = read_integer(j, "seed", -1, -1, INT64_MAX);
    set_sampler(r, "sampler", read_string(j, "sampler"));
    set_scheduler(r, "scheduler", read_string(j, "scheduler"));
    r.strength = static_cast<float>(read_number(j, "strength", 0.75, 0.0001, 1));
    read_hires(r, j, limits);
    if (j.contains("init_image") && !j["init_image"].is_null()) {
        r.init_image = without_alpha(read_base64_image(j["init_image"], "init_image", limits));
    }
    if (j.contains("mask") && !j["mask"].is_null())
        r.mask = mask_of(read_base64_image(j["mask"], "mask", limits), false);
    // A video model's clip (kiln -M vid_gen): its frames and the file's frame rate; a clip of more
    // than one frame is a video file (WebM by default: browsers play it).
    r.video_frames = static_cast<int>(read_integer(j, "video_frames", 0, 1, kMaxVideoFrames));
    r.fps = static_cast<int>(read_integer(j, "fps", 16, 1, 1000));
    const bool clip = r.video_frames > 1;
    r.output_format = read_string(j, "output_format", clip ? "webm" : "png");
    if (r.output_format != "png" && r.output_format != "jpeg" && r.output_format != "webp" &&
        r.output_format != "webm" && r.output_format != "avi") {
        throw RequestError{400, "output_format",
                           "output_format: unknown format '" + r.output_format +
                               "' (valid: png, jpeg, webp; for a video: webm, avi, webp)"};
    }
    if (clip && (r.output_format == "png" || r.output_format == "jpeg")) {
        throw RequestError{400, "output_format",
                           "output_format: a clip of " + std::to_string(r.video_frames) +
                               " frames is a video file: webm, avi or webp (animated), not " + r.output_format};
    }
    set_preview(r, "preview", read_string(j, "preview"));
    r.preview_interval = static_cast<int>(read_integer(j, "preview_interval", 0, 1, kMaxPreviewInterval));
    if (j.contains("preview_noisy") && !j["preview_noisy"].is_null())
        r.preview_noisy = read_bool(j, "preview_noisy", false);
    read_step_cache(r, j);
    // A seamless image or clip (the CLI's --circularx, --circulary).
    r.circular_x = read_bool(j, "circular_x", state.options.circular_x);
    r.circular_y = read_bool(j, "circular_y", state.options.circular_y);
    check_limits(r, limits);
    return r;
}

const char* content_type_of(const std::string& format) {
    return format == "jpeg"   ? "image/jpeg"
           : format == "webp" ? "image/webp"
           : format == "webm" ? "video/webm"
           : format == "avi"  ? "video/x-msvideo"
                              : "image/png";
}

// A query parameter as the body readers see a field: a number, or absent (null).
json query_field(const httplib::Request& req, const std::string& name) {
    if (!req.has_param(name)) return json{{name, nullptr}};
    const std::string text = req.get_param_value(name);
    const json value = json::parse(text, nullptr, false);
    if (!value.is_number()) throw RequestError{400, name, name + ": expected a number, got '" + text + "'"};
    return json{{name, value}};
}

long long query_integer(const httplib::Request& req, const std::string& name, long long fallback, long long min,
                        long long max) {
    return read_integer(query_field(req, name), name, fallback, min, max);
}

// GET /kiln/v1/plan: a model's defaults and whether a job of the asked
// size fits this machine, as `kiln plan` says it (the web page's "will it fit").
json plan_of(ServerState& state, const httplib::Request& req) {
    const ModelEntry model = state.models.resolve(req.get_param_value("model"), "model");
    json named = json::object();  // the parts, as a job's body names them
    for (const char* part : {"vae", "clip_l", "clip_g", "t5xxl", "llm"}) {
        if (req.has_param(part)) named[part] = req.get_param_value(part);
    }
    const ModelParts parts = read_model_parts(named, state.models);
    const ServerLimits& limits = state.options.limits;
    const kiln_model_info info = state.plans.defaults(model, parts, "model");
    const int width = static_cast<int>(query_integer(req, "width", 0, 0, limits.max_width));
    const int height = static_cast<int>(query_integer(req, "height", 0, 0, limits.max_height));
    const double hires_scale = read_number(query_field(req, "hires_scale"), "hires_scale", 0, 0, 16);
    const ModelPlan plan = state.plans.plan(model, parts, width, height, static_cast<float>(hires_scale), "model");
    return {{"model", model.name},
            {"family", info.family},
            {"defaults",
             {{"width", info.width},
              {"height", info.height},
              {"steps", info.steps},
              {"cfg_scale", info.cfg_scale},
              {"sampler", info.sampler},
              {"scheduler", info.scheduler}}},
            {"fits", plan_fit_name(plan.fit)},
            {"report", plan.report}};
}

}  // namespace

void add_native_routes(httplib::Server& server, ServerState& state) {
    server.Post("/kiln/v1/jobs", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            int position = 0;
            auto job = submit_job(state, parse_native(state, req), &position);
            send_json(res, 202,
                      {{"id", job->id},
                       {"state", "queued"},
                       {"position", position},
                       {"url", "/kiln/v1/jobs/" + job->id},
                       {"events", "/kiln/v1/jobs/" + job->id + "/events"}});
        });
    });
    server.Get(R"(/kiln/v1/jobs/([0-9a-f]+))", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            const auto job = job_of(state, req.matches[1]);
            json described = state.jobs.describe(*job, true);
            // The latest live preview only when asked: polling stays small by default.
            const std::string asked = req.get_param_value("preview");
            if (asked == "1" || asked == "true") {
                const std::string preview = state.jobs.latest_preview(*job);
                described["preview"] = preview.empty() ? json(nullptr) : json(preview);
            }
            send_json(res, 200, described);
        });
    });
    // Takes no body (a ContentReader handler: none is read, so a POST without Content-Length is answered).
    server.Post(R"(/kiln/v1/jobs/([0-9a-f]+)/cancel)",
                [&state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
                    guarded(res, [&] {
                        auto job = job_of(state, req.matches[1]);
                        if (!state.jobs.cancel(job)) {
                            throw RequestError{409, "id", "job " + job->id + " has already finished"};
                        }
                        send_json(res, 200, state.jobs.describe(*job, false));
                    });
                });
    server.Get(R"(/kiln/v1/jobs/([0-9a-f]+)/events)", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            auto job = job_of(state, req.matches[1]);
            // Held by the provider until the stream ends or its client goes.
            auto held = state.long_requests.hold();
            auto seen = std::make_shared<size_t>(0);
            res.set_header("Cache-Control", "no-cache");
            res.set_chunked_content_provider("text/event-stream",
                                             [&state, job, seen, held](size_t, httplib::DataSink& sink) {
                                                 bool over = false;
                                                 const auto events = state.jobs.events_since(*job, *seen, 1000, &over);
                                                 std::string text;
                                                 for (const JobEvent& e : events)
                                                     text += "event: " + e.type + "\ndata: " + e.data.dump() + "\n\n";
                                                 // A comment line while nothing happens, so a gone client is noticed.
                                                 if (text.empty()) text = ": waiting\n\n";
                                                 if (!sink.write(text.data(), text.size())) return false;
                                                 *seen += events.size();
                                                 if (over) sink.done();
                                                 return true;
                                             });
        });
    });
    server.Get(R"(/kiln/v1/results/([0-9a-f]+)/(\d+)\.(png|jpeg|webp|webm|avi))",
               [&state](const httplib::Request& req, httplib::Response& res) {
                   guarded(res, [&] {
                       auto job = job_of(state, req.matches[1]);
                       // Digits past any result count are simply no result (stoul would throw).
                       const std::string digits = req.matches[2];
                       const size_t index = digits.size() > 9 ? SIZE_MAX : std::stoul(digits);
                       std::string bytes;
                       const bool found = state.jobs.with_lock([&] {
                           if (job->state != JobState::Done || index >= job->results.size() ||
                               req.matches[3] != job->request.output_format) {
                               return false;
                           }
                           bytes.assign(job->results[index].bytes.begin(), job->results[index].bytes.end());
                           return true;
                       });
                       if (!found) throw RequestError{404, "", "no such result: " + req.path};
                       res.set_content(bytes, content_type_of(job->request.output_format));
                   });
               });
    server.Get("/kiln/v1/jobs", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, {{"jobs", state.jobs.list()}}); });
    });
    server.Get("/kiln/v1/plan", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, plan_of(state, req)); });
    });
    server.Get("/kiln/v1/gallery", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            const size_t offset = static_cast<size_t>(query_integer(req, "offset", 0, 0, 1ll << 40));
            const size_t limit = static_cast<size_t>(query_integer(req, "limit", 48, 1, 500));
            size_t total = 0;
            json images = json::array();
            for (const GalleryImage& image : state.gallery.list(offset, limit, &total)) {
                images.push_back({{"file", image.file},
                                  {"url", "/kiln/v1/gallery/" + image.file},
                                  {"parameters", image.parameters},
                                  {"created", image.created},
                                  {"bytes", image.bytes}});
            }
            send_json(res, 200, {{"kept", state.gallery.enabled()}, {"total", total}, {"images", images}});
        });
    });
    server.Get(R"(/kiln/v1/gallery/([^/]+))", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            auto file = state.gallery.read(req.matches[1]);
            if (!file) throw RequestError{404, "", "no such image in the gallery: " + std::string(req.matches[1])};
            res.set_header("Cache-Control", "private, max-age=86400");  // a gallery file never changes
            res.set_content(file->first, file->second);
        });
    });
    server.Get("/kiln/v1/models", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            const auto loaded = state.models.loaded();
            json models = json::array();
            for (const ModelEntry& m : state.models.list()) {
                const bool is_loaded = std::find(loaded.begin(), loaded.end(), m.name) != loaded.end();
                models.push_back({{"name", m.name}, {"family", m.family}, {"loaded", is_loaded}});
            }
            json parts = json::array();
            for (const PartEntry& p : state.models.parts()) parts.push_back({{"name", p.name}, {"kind", p.kind}});
            send_json(res, 200, {{"models", models}, {"default", state.models.default_model()}, {"parts", parts}});
        });
    });
    // The memory books of the devices the loaded models use, read now: a
    // running job's bytes show while it runs.
    server.Get("/kiln/v1/memory", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            json devices = json::array();
            for (const DeviceMemory& d : state.models.memory()) {
                devices.push_back({{"device", d.name},
                                   {"managed_bytes", d.managed},
                                   {"peak_bytes", d.peak},
                                   {"budget_bytes", d.budget ? json(d.budget) : json(nullptr)}});
            }
            send_json(res, 200, {{"devices", devices}, {"loaded", state.models.loaded()}});
        });
    });
}

}  // namespace kiln::server
