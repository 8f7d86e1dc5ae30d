// `kiln serve`: the HTTP server around the job queue. Who may call (Host,
// Origin: request_origin.h), authentication and the body limit run before
// routing; each API adds its own routes.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <tuple>

#include "client_connection.h"
#include "connection_pool.h"
#include "request_origin.h"
#include "server_state.h"

namespace kiln::server {
namespace {

// Requests one connection may carry before the server closes it.
constexpr size_t kKeepAliveRequests = 100;

// Equal strings in time that depends on the length of `given` only, so a
// wrong key's timing says nothing about how much of it was right.
bool same_key(const std::string& given, const std::string& key) {
    unsigned diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < given.size(); ++i) {
        diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(key.empty() ? 0 : key[i % key.size()]);
    }
    return diff == 0;
}

bool authorized(const httplib::Request& req, const std::string& key) {
    const std::string bearer = req.get_header_value("Authorization");
    if (bearer.rfind("Bearer ", 0) == 0 && same_key(bearer.substr(7), key)) return true;
    return req.has_header("X-Api-Key") && same_key(req.get_header_value("X-Api-Key"), key);
}

}  // namespace

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
    res.status = status;
    res.set_content(body.dump(), "application/json");
}

void send_error(httplib::Response& res, const RequestError& error) {
    const char* type = error.status == 401   ? "authentication_error"
                       : error.status == 429 ? "rate_limit_error"
                       : error.status >= 500 ? "server_error"
                                             : "invalid_request_error";
    nlohmann::json body = {{"error",
                            {{"message", error.message},
                             {"type", type},
                             {"param", error.field.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.field)}}},
                           {"detail", error.message}};
    if (error.retry_after > 0) res.set_header("Retry-After", std::to_string(error.retry_after));
    send_json(res, error.status, body);
}

int status_for_failure(kiln_status status, bool shutdown) {
    if (shutdown) return 503;
    switch (status) {
        case KILN_ERROR_INVALID_REQUEST: return 400;
        case KILN_ERROR_CANCELLED: return 409;
        default: return 500;
    }
}

std::shared_ptr<Job> job_of(ServerState& state, const std::string& id) {
    auto job = state.jobs.find(id);
    if (!job) throw RequestError{404, "id", "no job " + id + " (finished jobs are kept for a while only)"};
    return job;
}

std::shared_ptr<Job> submit_job(ServerState& state, JobRequest request, int* position) {
    check_pixels(state.plans, state.models.resolve(request.model, "model"), request,
                 state.options.limits.max_pixels_factor);
    std::shared_ptr<Job> job;
    switch (state.jobs.submit(std::move(request), &job, position)) {
        case JobQueue::Submitted::Accepted: return job;
        case JobQueue::Submitted::Full:
            throw RequestError{429, "", "the queue is full (" + std::to_string(state.options.max_queue) +
                                            " jobs waiting); retry later",
                               state.jobs.retry_after_seconds()};
        case JobQueue::Submitted::ShuttingDown: break;
    }
    throw RequestError{503, "", "the server is shutting down"};
}

namespace {

// Waits for the job, cancelling it when its client goes away (polled
// every quarter second), then throws the error a failed or cancelled one
// gets (400 for a bad request, 503 on shutdown, 409 when cancelled, 500 otherwise).
void wait_for_images(ServerState& state, const std::shared_ptr<Job>& job, const httplib::Request& http) {
    const std::optional<ClientConnection> client = ClientConnection::of(http);
    bool cancelled = false;
    while (!state.jobs.wait_finished_for(*job, 250)) {
        if (!cancelled && client && client->gone()) {
            std::fprintf(stderr, "kiln serve: job %s: its client went away; cancelled\n", job->id.c_str());
            cancelled = true;
            state.jobs.cancel(job);
        }
    }
    const auto [jstate, status, shutdown, message] = state.jobs.with_lock(
        [&] { return std::make_tuple(job->state, job->error_status, job->shutdown, job->error_message); });
    if (jstate == JobState::Done) return;
    throw RequestError{status_for_failure(status, shutdown), "",
                       shutdown ? "the server is shutting down" : message};
}

}  // namespace

std::shared_ptr<Job> run_job_and_wait(ServerState& state, JobRequest request, const httplib::Request& http) {
    const auto held = state.long_requests.hold();  // before queueing: a 503 leaves no job behind
    int position = 0;
    auto job = submit_job(state, std::move(request), &position);
    wait_for_images(state, job, http);
    return job;
}

int run_server(const ServerOptions& options) {
    if (!options.model_dir.empty() && !std::filesystem::is_directory(options.model_dir)) {
        std::fprintf(stderr, "kiln serve: --model-dir %s: not a folder\n", options.model_dir.c_str());
        return 2;
    }
    // SIGINT and SIGTERM go to one thread that shuts down in order; every
    // thread started from here on inherits the blocked mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // glibc gives threads their own malloc arenas (up to 8 per core), and
    // each of the handler threads keeps the request and image buffers it
    // freed: resident memory would grow with how many threads have served a
    // request so far, not with what the server holds. Two arenas are plenty
    // for handlers that mostly wait.
    mallopt(M_ARENA_MAX, 2);
    httplib::Server http;
    http.new_task_queue = [] { return new ConnectionPool(kMaxConnectionThreads); };
    // httplib closes a connection after 5 requests by default, so busy
    // clients reconnect all the time; keep connections for longer.
    http.set_keep_alive_max_count(kKeepAliveRequests);
    // httplib listens with a backlog of 5. When more clients connect at once
    // than that (16 in tests/unit/server_load_test.cpp, on a loaded machine),
    // the kernel drops their handshakes and some of them see a failed read a
    // second later. The socket is remembered here, where httplib lets us set
    // its options, and listened on again with the system's backlog once bound.
    socket_t listening_socket = INVALID_SOCKET;
    http.set_socket_options([&listening_socket](socket_t sock) {
        const int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // what httplib's default option does
        listening_socket = sock;
    });
    int port = options.listen_port;
    const bool bound = (port == 0 ? (port = http.bind_to_any_port(options.listen_ip)) > 0
                                  : http.bind_to_port(options.listen_ip, port)) &&
                       ::listen(listening_socket, SOMAXCONN) == 0;
    if (!bound) {
        std::fprintf(stderr, "kiln serve: cannot listen on %s:%d (in use, or not an address of this machine)\n",
                     options.listen_ip.c_str(), options.listen_port);
        return 1;
    }
    if (options.api_key.empty() && !is_loopback_address(options.listen_ip)) {
        std::fprintf(stderr,
                     "kiln serve: WARNING: listening on %s without --api-key: anyone who can reach this address "
                     "can run jobs on this machine. Pass --api-key KEY, or listen on 127.0.0.1.\n",
                     options.listen_ip.c_str());
    }

    ModelRegistry models(options);
    ModelPlans plans(options);
    Gallery gallery(options.output_dir);
    JobQueue jobs(models, options, gallery);
    ServerState state{options, models, jobs, plans, gallery};

    http.set_payload_max_length(options.limits.max_body_bytes);
    http.set_pre_routing_handler([&state](const httplib::Request& req, httplib::Response& res) {
        if (state.stopping) {
            send_error(res, {503, "", "the server is shutting down"});
            return httplib::Server::HandlerResponse::Handled;
        }
        // Host and Origin first: a page of another site gets nothing, not even
        // a 401. A keyed server takes any Host (behind a reverse proxy it is
        // the proxy's name): a rebound page cannot send the key.
        std::optional<RequestError> refused;
        if (state.options.api_key.empty()) refused = check_host(req, state.options);
        if (!refused) refused = check_origin(req, state.options, res);
        if (refused) {
            send_error(res, *refused);
            return httplib::Server::HandlerResponse::Handled;
        }
        // Preflights carry no credentials; what they ask for is checked when it comes.
        if (req.method == "OPTIONS") {
            answer_preflight(req, res);
            return httplib::Server::HandlerResponse::Handled;
        }
        // The web page itself is public (it asks for the key), and so is the API's
        // description (documentation); everything else needs it.
        const bool is_public =
            req.method == "GET" && (req.path == "/" || req.path == "/health" || req.path == "/openapi.json");
        if (!state.options.api_key.empty() && !is_public && !authorized(req, state.options.api_key)) {
            res.set_header("WWW-Authenticate", "Bearer");
            send_error(res, {401, "", "missing or wrong API key: send 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'"});
            return httplib::Server::HandlerResponse::Handled;
        }
        // Refuse an oversized body from its Content-Length, before reading it.
        if (req.has_header("Content-Length")) {
            const unsigned long long length = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
            if (length > state.options.limits.max_body_bytes) {
                res.set_header("Connection", "close");
                send_error(res, {413, "body",
                                 "body: " + std::to_string(length) + " bytes is over this server's limit of " +
                                     std::to_string(state.options.limits.max_body_bytes) + " (--max-body-bytes)"});
                return httplib::Server::HandlerResponse::Handled;
            }
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    // Replies httplib makes itself (no route, a body over the limit) get a JSON body too.
    http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                   httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404) {
            send_error(res, {404, "", "no such endpoint: " + req.method + " " + req.path});
        } else if (res.status == 413) {
            send_error(res, {413, "body", "body: over this server's limit (--max-body-bytes)"});
        } else {
            send_error(res, {res.status, "", "request failed (HTTP " + std::to_string(res.status) + ")"});
        }
        return httplib::Server::HandlerResponse::Handled;
    }));
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
    add_native_routes(http, state);
    add_openai_routes(http, state);
    add_a1111_routes(http, state);
    add_sdcpp_routes(http, state);
    add_web_page_route(http);
    add_openapi_route(http);

    std::atomic<bool> listen_returned{false};
    std::thread stopper([&] {
        int signal_number = 0;
        sigwait(&stop_signals, &signal_number);
        std::fprintf(stderr, "kiln serve: %s: stopping (queued jobs get 503, the running one is cancelled)\n",
                     signal_number == SIGINT ? "SIGINT" : "SIGTERM");
        state.stopping = true;
        jobs.shutdown();
        // httplib's stop() does nothing before the accept loop runs: a
        // signal right after the "listening" line would be lost and the
        // server would serve on. Wait for the loop (or its failure) first.
        while (!http.is_running() && !listen_returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        http.stop();
    });
    std::printf("kiln serve: listening on http://%s:%d\n", options.listen_ip.c_str(), port);
    std::fflush(stdout);
    const bool listened = http.listen_after_bind();
    listen_returned = true;
    if (!state.stopping) pthread_kill(stopper.native_handle(), SIGTERM);  // listen failed: end the stopper
    stopper.join();
    std::fprintf(stderr, "kiln serve: stopped\n");
    return listened || state.stopping ? 0 : 1;
}

}  // namespace kiln::server
