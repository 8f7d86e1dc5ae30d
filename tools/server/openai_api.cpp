// OpenAI's image API: /v1/images/generations (JSON), /v1/images/edits
// (multipart) and /v1/models, so the OpenAI SDKs and the clients built on
// them (Open WebUI, SillyTavern) work when pointed at this server.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "json_body.h"
#include "request_fields.h"
#include "server_state.h"
#include "util/base64.h"

namespace kiln::server {
namespace {

// Families whose DiT takes reference images: OpenAI's edit is theirs.
bool takes_reference_images(const std::string& family) {
    return family.find("Kontext") != std::string::npos || family.rfind("Qwen-Image", 0) == 0;
}

// OpenAI's own model names mean "whatever this server generates with": SDKs
// send them by default.
bool is_openai_model_name(const std::string& name) {
    return name == "dall-e-2" || name == "dall-e-3" || name.rfind("gpt-image-", 0) == 0;
}

// "512x768" into width and height; "auto" or absent leaves the model's.
void read_size(const json& j, JobRequest& r, const ServerLimits& limits) {
    const std::string size = read_string(j, "size", "auto");
    if (size == "auto") return;
    auto side = [](const std::string& text, int max) {
        if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
        const int v = std::stoi(text);
        return v >= 8 && v <= max ? v : -1;
    };
    const auto x = size.find('x');
    const int w = x == std::string::npos ? -1 : side(size.substr(0, x), limits.max_width);
    const int h = x == std::string::npos ? -1 : side(size.substr(x + 1), limits.max_height);
    if (w < 0 || h < 0) {
        throw RequestError{400, "size",
                           "size: expected WIDTHxHEIGHT from 8x8 to " + std::to_string(limits.max_width) + "x" +
                               std::to_string(limits.max_height) + " (or auto), got '" + size + "'"};
    }
    r.width = w;
    r.height = h;
}

// A form field's text as the JSON value the field readers expect: the
// numeric fields as numbers when their text is one (else the text, which
// the reader refuses naming the field), the others as text.
json form_value(const std::string& name, const std::string& text) {
    static const char* const kNumeric[] = {"n", "steps", "cfg_scale", "seed", "strength"};
    if (std::find(std::begin(kNumeric), std::end(kNumeric), name) == std::end(kNumeric)) return text;
    // Short texts only: a number never needs more, and a long one is not parsed at all.
    if (text.size() > 32) return text;
    json number = json::parse(text, nullptr, /*allow_exceptions=*/false);
    return number.is_number() ? number : json(text);
}

struct OpenAiRequest {
    JobRequest job;
    std::string response_format;  // b64_json or url
};

// The fields generations and edits share (edits send them as form fields).
OpenAiRequest parse_common(ServerState& state, const json& j) {
    const ServerLimits& limits = state.options.limits;
    OpenAiRequest out;
    JobRequest& r = out.job;
    const std::string model = read_string(j, "model");
    r.model = state.models.resolve(is_openai_model_name(model) ? "" : model, "model").name;
    r.prompt = read_string(j, "prompt");
    if (r.prompt.empty()) throw RequestError{400, "prompt", "prompt: required"};
    r.batch = static_cast<int>(read_integer(j, "n", 1, 1, limits.max_batch));
    read_size(j, r, limits);
    out.response_format = read_string(j, "response_format", "b64_json");
    if (out.response_format != "b64_json" && out.response_format != "url") {
        throw RequestError{400, "response_format",
                           "response_format: expected b64_json or url, got '" + out.response_format + "'"};
    }
    r.output_format = read_string(j, "output_format", "png");
    if (r.output_format == "jpg") r.output_format = "jpeg";
    if (r.output_format != "png" && r.output_format != "jpeg" && r.output_format != "webp") {
        throw RequestError{400, "output_format",
                           "output_format: expected png, jpeg or webp, got '" + r.output_format + "'"};
    }
    // kiln's own fields, for clients that can send more than OpenAI's.
    r.negative_prompt = read_string(j, "negative_prompt");
    r.steps = static_cast<int>(read_integer(j, "steps", 0, 0, limits.max_steps));
    r.cfg_scale = static_cast<float>(read_number(j, "cfg_scale", -1, -1, 1000));
    r.seed = read_integer(j, "seed", -1, -1, INT64_MAX);
    set_sampler(r, "sampler", read_string(j, "sampler"));
    set_scheduler(r, "scheduler", read_string(j, "scheduler"));
    return out;
}

void answer(ServerState& state, const httplib::Request& req, httplib::Response& res, OpenAiRequest request) {
    const std::string response_format = request.response_format;
    check_limits(request.job, state.options.limits);
    auto job = run_job_and_wait(state, std::move(request.job), req);
    json data = json::array();
    const std::string host = req.has_header("Host") ? req.get_header_value("Host") : "127.0.0.1";
    state.jobs.with_lock([&] {
        for (size_t i = 0; i < job->results.size(); ++i) {
            if (response_format == "url") {
                data.push_back({{"url", "http://" + host + "/kiln/v1/results/" + job->id + "/" + std::to_string(i) +
                                            "." + job->request.output_format}});
            } else {
                data.push_back({{"b64_json", base64_encode(job->results[i].bytes)}});
            }
        }
        return 0;
    });
    const JobImage& first = job->results.front();
    send_json(res, 200,
              {{"created", static_cast<long long>(job->created)},
               {"data", data},
               {"output_format", job->request.output_format},
               {"size", std::to_string(first.width) + "x" + std::to_string(first.height)}});
}

}  // namespace

void add_openai_routes(httplib::Server& server, ServerState& state) {
    server.Post("/v1/images/generations", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { answer(state, req, res, parse_common(state, parse_json_body(req))); });
    });
    server.Post("/v1/images/edits", [&state](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
            if (!req.is_multipart_form_data()) {
                throw RequestError{400, "body", "body: expected multipart/form-data (image, mask, prompt, ...)"};
            }
            json fields = json::object();
            std::vector<const httplib::MultipartFormData*> images;  // gpt-image-1 takes several: image[]
            const httplib::MultipartFormData* mask = nullptr;
            for (const auto& [name, part] : req.files) {
                if (name == "image" || name == "image[]") {
                    images.push_back(&part);
                } else if (name == "mask") {
                    mask = &part;
                } else {
                    fields[name] = form_value(name, part.content);
                }
            }
            if (images.empty()) throw RequestError{400, "image", "image: required (the image to edit, as a file part)"};
            const ServerLimits& limits = state.options.limits;
            OpenAiRequest request = parse_common(state, fields);
            // An edit model (Flux.1-Kontext, Qwen-Image-Edit) takes the
            // images as references and edits by the prompt; a mask, or any
            // other model, repaints the image itself.
            if (!mask && takes_reference_images(state.models.resolve(request.job.model, "model").family)) {
                if (images.size() > static_cast<size_t>(limits.max_ref_images)) {
                    throw RequestError{400, "image",
                                       "image: at most " + std::to_string(limits.max_ref_images) + " images, got " +
                                           std::to_string(images.size())};
                }
                for (const httplib::MultipartFormData* part : images) {
                    request.job.ref_images.push_back(without_alpha(decode_upload("image", part->content, limits)));
                }
                // size auto: about 1024x1024 pixels in the first image's aspect (diffusers' edit pipelines).
                if (request.job.width == 0) {
                    const kiln_image& first = *request.job.ref_images.front();
                    const double ratio = static_cast<double>(first.width) / first.height;
                    auto side = [](double x) { return std::max(16, static_cast<int>(std::lround(x / 16)) * 16); };
                    request.job.width = side(std::sqrt(1024.0 * 1024.0 * ratio));
                    request.job.height = side(std::sqrt(1024.0 * 1024.0 / ratio));
                }
                answer(state, req, res, std::move(request));
                return;
            }
            if (images.size() > 1) {
                throw RequestError{400, "image",
                                   "image: one image to repaint (" + std::to_string(images.size()) +
                                       " given); several are for edit models' references"};
            }
            SharedImage init = decode_upload("image", images.front()->content, limits);
            if (mask) {
                request.job.mask = mask_of(decode_upload("mask", mask->content, limits), true);
            } else if (init->channels == 4) {
                // No mask: the image's own transparent pixels are the ones to repaint.
                request.job.mask = mask_of(init, true);
            }
            request.job.init_image = without_alpha(init);
            request.job.strength = static_cast<float>(read_number(fields, "strength", request.job.mask ? 1.0 : 0.75, 0.0001, 1));
            // The edit is made at the image's size (kiln does not resize).
            request.job.width = 0;
            request.job.height = 0;
            answer(state, req, res, std::move(request));
        });
    });
    server.Get("/v1/models", [&state](const httplib::Request&, httplib::Response& res) {
        guarded(res, [&] {
            json data = json::array();
            for (const ModelEntry& m : state.models.list()) {
                data.push_back({{"id", m.name}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"},
                                {"family", m.family}});
            }
            send_json(res, 200, {{"object", "list"}, {"data", data}});
        });
    });
}

}  // namespace kiln::server
