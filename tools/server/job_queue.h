// The server's jobs: one bounded queue, one worker thread that runs them in
// order on the model each names (a kiln_context is used by one thread at a
// time), progress per step, cancel of queued and running jobs, and finished
// jobs kept for a bounded time and count so their results can be fetched.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gallery.h"
#include "job_request.h"
#include "model_registry.h"

namespace kiln::server {

enum class JobState { Queued, Running, Done, Failed, Cancelled };
const char* job_state_name(JobState state);  // "queued", "running", "done", "failed", "cancelled"

struct JobImage {
    std::vector<uint8_t> bytes;  // the encoded file in the request's output_format
    std::string parameters;      // A1111's parameters text
    int64_t seed = 0;
    uint32_t width = 0, height = 0;
    int frames = 0;  // a clip's frame count (0: a still image)
};

// One server-sent event: its type (queued, started, phase, step, done, failed, cancelled) and data.
// A step event carries its live preview ("preview", base64 PNG) while the
// job's event history has room for it (see JobQueue::bound_previews).
struct JobEvent {
    std::string type;
    nlohmann::json data;
};

struct Job {
    std::string id;
    JobRequest request;
    double created = 0;  // Unix seconds
    // The rest is guarded by the queue's mutex.
    JobState state = JobState::Queued;
    int image = 0, images = 1, step = 0, steps = 0;
    double started = 0, finished = 0, sampling_started = 0;
    bool cancel_requested = false;
    bool interrupt_requested = false;  // A1111's interrupt: the job ends done with the image it has
    bool shutdown = false;  // cancelled because the server is stopping (503)
    kiln_status error_status = KILN_OK;
    std::string error_message;
    std::vector<JobImage> results;
    std::vector<JobEvent> events;
    // The latest live preview as base64 PNG ("" when there is none): only
    // the latest is kept, and it is dropped with the previews in the job's
    // events once the next job has ended (JobQueue::work).
    std::string preview;
    size_t preview_bytes_in_events = 0;  // of the previews its stored step events carry
};

class JobQueue {
  public:
    // A finished job's images go to `gallery` (when it keeps outputs) before
    // the job is reported done.
    JobQueue(ModelRegistry& models, const ServerOptions& options, Gallery& gallery);
    ~JobQueue();  // shuts down

    enum class Submitted { Accepted, Full, ShuttingDown };
    // Queues `request` (its model already resolved); *position is the number
    // of jobs ahead of it, the running one included.
    Submitted submit(JobRequest request, std::shared_ptr<Job>* job, int* position);
    std::shared_ptr<Job> find(const std::string& id);
    // A queued job is cancelled at once, a running one at its next step.
    // False when the job had already finished.
    bool cancel(const std::shared_ptr<Job>& job);
    // Skips the running job's current image, if any (A1111's skip): it ends
    // with what it has and the batch goes on.
    void skip_running();
    // Interrupts the running job, if any (A1111's interrupt): its sampling
    // stops at the next step and it finishes done with the image it has.
    void interrupt_running();

    // The job's state, progress and (when done) results as the native API
    // reports them; with_images false leaves the images out.
    nlohmann::json describe(const Job& job, bool with_images);
    // Events from index `seen` on, waiting up to `wait_ms` for one; *over
    // is set once the job's last event is among those returned.
    std::vector<JobEvent> events_since(const Job& job, size_t seen, int wait_ms, bool* over);
    // The job's latest live preview (base64 PNG); "" when it has none.
    std::string latest_preview(const Job& job);
    // Waits up to `wait_ms` for the job to finish, however it finishes: whether it has.
    bool wait_finished_for(const Job& job, int wait_ms);
    // A snapshot of what runs now, for A1111's /progress: null when idle.
    std::shared_ptr<Job> running();
    // Fields of a job read under the queue's lock.
    template <typename F>
    auto with_lock(F&& read) {
        std::lock_guard<std::mutex> lock(mutex_);
        return read();
    }
    int queued_count();
    // Every job the queue knows, running and queued first (in their order),
    // then the finished ones, newest first, as describe() reports them
    // without images.
    nlohmann::json list();
    // Seconds a client should wait before retrying a full queue.
    int retry_after_seconds();

    // Stops taking jobs, cancels the running one at its next step, finishes
    // every queued one as cancelled by shutdown, and joins the worker.
    void shutdown();

  private:
    void work();
    void run(const std::shared_ptr<Job>& job);
    nlohmann::json describe_locked(const Job& job, bool with_images);                     // locked
    void finish(Job& job, JobState state, kiln_status status, const std::string& message);  // locked
    void add_event(Job& job, const std::string& type, nlohmann::json data);                // locked
    void forget_old_jobs();                                                                 // locked
    // Step events and their previews (the latter made in the job's worker thread).
    void add_step_event(Job& job, nlohmann::json data, const std::string& preview);  // locked
    void bound_previews(Job& job);                                                   // locked
    void drop_previews(Job& job);                                                    // locked
    static void on_progress(int image, int step, int steps, void* user_data);
    static void on_phase(kiln_phase phase, int image, void* user_data);
    static void on_decode(int image, int done, int frames, void* user_data);
    static void on_preview(int image, int step, const kiln_image* preview, void* user_data);

    ModelRegistry& models_;
    const ServerOptions& options_;
    Gallery& gallery_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::shared_ptr<Job>> pending_;
    std::map<std::string, std::shared_ptr<Job>> jobs_;
    std::deque<std::shared_ptr<Job>> finished_;  // oldest first
    std::shared_ptr<Job> running_;
    std::weak_ptr<Job> last_run_;  // the job that ran before: its previews are kept until the next one ends
    kiln_context* running_ctx_ = nullptr;
    double recent_job_seconds_ = 1.0;
    bool stopping_ = false;
    uint64_t next_id_ = 1;
    std::thread worker_;
};

}  // namespace kiln::server
