// What every API's routes share: the options, the models, the job queue,
// and the replies they all send (JSON, errors naming the field).
#pragma once

#include <httplib.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "job_queue.h"
#include "long_requests.h"
#include "gallery.h"
#include "model_plans.h"
#include "model_registry.h"
#include "server_options.h"

namespace kiln::server {

// A1111's live-preview settings, server-wide as A1111 keeps them: POST
// /sdapi/v1/options sets them for later A1111 requests (a request's
// override_settings wins). Unset: the server's --preview and --preview-interval.
struct A1111PreviewSettings {
    bool live_previews_enable = true;                // false: no previews
    std::optional<int> show_progress_every_n_steps;  // -1: none, 0: every step, N: every N-th
};

struct ServerState {
    ServerState(const ServerOptions& o, ModelRegistry& m, JobQueue& j, ModelPlans& p, Gallery& g)
        : options(o), models(m), jobs(j), plans(p), gallery(g) {}
    const ServerOptions& options;
    ModelRegistry& models;
    JobQueue& jobs;
    ModelPlans& plans;
    Gallery& gallery;
    std::atomic<bool> stopping{false};
    LongRequests long_requests{kMaxLongRequests};  // event streams and synchronous waits
    std::mutex a1111_mutex;
    A1111PreviewSettings a1111_previews;  // guarded by a1111_mutex
};

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
// {"error": {"message", "type", "param", "kind"}, "detail"}: OpenAI's error
// shape, plus "detail" as A1111 clients read it.
void send_error(httplib::Response& res, const RequestError& error);

// Runs a route, turning a RequestError (or any exception) into its reply,
// so a bad request never takes the server down.
template <typename Route>
void guarded(httplib::Response& res, Route&& route) {
    try {
        route();
    } catch (const RequestError& e) {
        send_error(res, e);
    } catch (const std::exception& e) {
        send_error(res, {500, "", std::string("internal error: ") + e.what()});
    }
}

// Holds one of the long-request places (503 when none is free), queues the
// request and waits for its images, as the synchronous APIs answer; a
// client that disconnects meanwhile has its job cancelled.
std::shared_ptr<Job> run_job_and_wait(ServerState& state, JobRequest request, const httplib::Request& http);
// Queues the request: 429 with Retry-After when the queue is full, 503 while shutting down.
std::shared_ptr<Job> submit_job(ServerState& state, JobRequest request, int* position);
// The adapter files under `folder` (--lora-model-dir), sorted by name (their
// path there without the extension): A1111's /sdapi/v1/loras entries.
nlohmann::json lora_list(const char* folder);
// The job `id` names; 404 naming "id" when there is none (any more).
std::shared_ptr<Job> job_of(ServerState& state, const std::string& id);
// The job's HTTP status for its error kind.
int status_for_failure(kiln_status status, bool shutdown);

// Each API's routes.
void add_native_routes(httplib::Server& server, ServerState& state);
void add_openai_routes(httplib::Server& server, ServerState& state);
void add_a1111_routes(httplib::Server& server, ServerState& state);
void add_sdcpp_routes(httplib::Server& server, ServerState& state);
void add_web_page_route(httplib::Server& server);
void add_openapi_route(httplib::Server& server);

}  // namespace kiln::server
