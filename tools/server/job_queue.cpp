#include "job_queue.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <utility>

#include "request_fields.h"
#include "util/base64.h"

namespace kiln::server {
namespace {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// Ids are unguessable, so one client cannot read or cancel another's jobs by counting.
std::string new_job_id(uint64_t serial) {
    static std::mutex mutex;
    static std::mt19937_64 random{std::random_device{}()};
    std::lock_guard<std::mutex> lock(mutex);
    char id[48];
    std::snprintf(id, sizeof id, "%06llx%016llx", static_cast<unsigned long long>(serial & 0xffffff),
                  static_cast<unsigned long long>(random()));
    return id;
}

// The previews a job's stored step events may carry, in bytes of base64. A
// client that follows the stream live gets every preview; one that falls this
// far behind (or reads the history later) finds the oldest ones left out.
// Only the running job and the one before it keep any (JobQueue::work).
constexpr size_t kMaxPreviewBytesInEvents = size_t(8) << 20;

// What the progress and preview callbacks need: the job they report on, the
// context to cancel, and the step event that waits for its preview.
struct ProgressTarget {
    ProgressTarget(JobQueue* q, Job* j, kiln_context* c) : queue(q), job(j), ctx(c) {}
    JobQueue* queue;
    Job* job;
    kiln_context* ctx;
    int preview_interval = 0;  // 0: no previews
    // A step that has a preview due: its event goes out with the preview
    // (on_preview), or without it at the next step or the job's end when
    // the preview failed. Read and written under the queue's lock.
    std::optional<nlohmann::json> held_step;
    bool preview_failed = false;  // logged once per job
};

// The preview mode a job runs with: its own, else the server's --preview,
// else proj where the model can project its latent (all families kiln loads).
kiln_preview_mode preview_mode_of(const JobRequest& request, const ServerOptions& options, kiln_context* ctx) {
    const std::string& name = request.preview.empty() ? options.preview : request.preview;
    if (!name.empty()) return preview_mode_named(name).value_or(KILN_PREVIEW_NONE);
    kiln_model_info info;
    kiln_context_info(ctx, &info);
    return info.latent_preview ? KILN_PREVIEW_PROJ : KILN_PREVIEW_NONE;
}

// A clip's file format (JobRequest::output_format): webm and avi always; webp
// is a video when the job makes clips (video_frames), else a still image.
bool is_video_format_of(const JobRequest& r) {
    return r.output_format == "webm" || r.output_format == "avi" || (r.output_format == "webp" && r.video_frames > 1);
}

// A video model's frames (kiln_generate's, clip after clip) as one video
// file per clip: kiln_video_save writes files, so each goes through a
// temporary file that is read back and removed.
kiln_status encode_clips(const Job& job, const kiln_image* frames, int count, std::vector<JobImage>& results,
                         std::string& error) {
    const JobRequest& r = job.request;
    const int clips = std::max(1, r.batch), per_clip = count / clips;
    for (int c = 0; c < clips; ++c) {
        std::vector<kiln_image> clip(frames + static_cast<ptrdiff_t>(c) * per_clip,
                                     frames + static_cast<ptrdiff_t>(c + 1) * per_clip);
        if (!r.embed_metadata) {
            for (kiln_image& frame : clip) frame.parameters = nullptr;
        }
        const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                           ("kiln-clip-" + job.id + "-" + std::to_string(c) + "." + r.output_format);
        char* message = nullptr;
        const kiln_status status = kiln_video_save(clip.data(), per_clip, r.fps, 0, file.c_str(), &message);
        error = message ? message : "";
        kiln_free_string(message);
        if (status != KILN_OK) return status;
        std::ifstream in(file, std::ios::binary);
        JobImage out;
        out.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        in.close();
        std::error_code ignored;
        std::filesystem::remove(file, ignored);
        if (out.bytes.empty()) {
            error = "reading back the clip " + file.string() + " failed";
            return KILN_ERROR_INTERNAL;
        }
        out.parameters = clip[0].parameters ? clip[0].parameters : "";
        out.seed = r.seed + c;
        out.width = clip[0].width;
        out.height = clip[0].height;
        out.frames = per_clip;
        results.push_back(std::move(out));
    }
    return KILN_OK;
}

}  // namespace

const char* job_state_name(JobState state) {
    switch (state) {
        case JobState::Queued: return "queued";
        case JobState::Running: return "running";
        case JobState::Done: return "done";
        case JobState::Failed: return "failed";
        case JobState::Cancelled: return "cancelled";
    }
    return "unknown";
}

JobQueue::JobQueue(ModelRegistry& models, const ServerOptions& options, Gallery& gallery)
    : models_(models), options_(options), gallery_(gallery), worker_([this] { work(); }) {}

JobQueue::~JobQueue() { shutdown(); }

JobQueue::Submitted JobQueue::submit(JobRequest request, std::shared_ptr<Job>* job, int* position) {
    if (request.seed < 0) request.seed = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Submitted::ShuttingDown;
    forget_old_jobs();
    if (pending_.size() >= static_cast<size_t>(options_.max_queue)) return Submitted::Full;
    auto created = std::make_shared<Job>();
    created->id = new_job_id(next_id_++);
    created->request = std::move(request);
    created->created = unix_now();
    created->images = created->request.batch;
    created->steps = created->request.steps;
    *position = static_cast<int>(pending_.size()) + (running_ ? 1 : 0);
    add_event(*created, "queued", {{"position", *position}});
    pending_.push_back(created);
    jobs_[created->id] = created;
    *job = created;
    changed_.notify_all();
    return Submitted::Accepted;
}

std::shared_ptr<Job> JobQueue::find(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_old_jobs();
    auto it = jobs_.find(id);
    return it == jobs_.end() ? nullptr : it->second;
}

bool JobQueue::cancel(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job->state == JobState::Queued) {
        for (auto it = pending_.begin(); it != pending_.end(); ++it) {
            if (*it == job) {
                pending_.erase(it);
                break;
            }
        }
        finish(*job, JobState::Cancelled, KILN_ERROR_CANCELLED, "cancelled while queued");
        return true;
    }
    if (job->state != JobState::Running) return false;
    job->cancel_requested = true;
    // Also checked by the progress callback: a cancel that lands between
    // kiln_generate's start and its first step would otherwise be lost.
    if (running_ == job && running_ctx_) kiln_cancel(running_ctx_);
    return true;
}

void JobQueue::interrupt_running() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_) return;
    running_->interrupt_requested = true;
    // Also sent again by the progress callback, as a cancel is.
    if (running_ctx_) kiln_interrupt(running_ctx_);
}

void JobQueue::skip_running() {
    std::lock_guard<std::mutex> lock(mutex_);
    // Once, not again from the progress callback: a skip is the current image's alone.
    if (running_ && running_ctx_) kiln_skip(running_ctx_);
}

std::shared_ptr<Job> JobQueue::running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
}

int JobQueue::queued_count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(pending_.size());
}

int JobQueue::retry_after_seconds() {
    std::lock_guard<std::mutex> lock(mutex_);
    // The queue is full: about one job's time frees a place.
    return std::max(1, static_cast<int>(recent_job_seconds_ + 0.5));
}

nlohmann::json JobQueue::describe(const Job& job, bool with_images) {
    std::lock_guard<std::mutex> lock(mutex_);
    return describe_locked(job, with_images);
}

nlohmann::json JobQueue::list() {
    std::lock_guard<std::mutex> lock(mutex_);
    nlohmann::json jobs = nlohmann::json::array();
    // With its prompt, so a queue view can say which job is which.
    const auto add = [&](const Job& job) {
        jobs.push_back(describe_locked(job, false));
        jobs.back()["prompt"] = job.request.prompt;
    };
    if (running_) add(*running_);
    for (const auto& job : pending_) add(*job);
    for (auto it = finished_.rbegin(); it != finished_.rend(); ++it) add(**it);
    return jobs;
}

nlohmann::json JobQueue::describe_locked(const Job& job, bool with_images) {
    nlohmann::json out = {{"id", job.id},
                          {"state", job_state_name(job.state)},
                          {"model", job.request.model},
                          {"seed", job.request.seed},
                          {"image", job.image},
                          {"images", job.images},
                          {"step", job.step},
                          {"steps", job.steps},
                          {"created", job.created}};
    const double total = double(job.images) * std::max(1, job.steps);
    const double done = job.state == JobState::Done ? total : double(job.image) * job.steps + job.step;
    out["progress"] = total > 0 ? std::min(1.0, done / total) : 0.0;
    out["eta"] = nullptr;
    if (job.state == JobState::Running && done > 0 && job.sampling_started > 0) {
        out["eta"] = (unix_now() - job.sampling_started) / done * (total - done);
    }
    if (job.state == JobState::Queued) {
        int position = running_ ? 1 : 0;
        for (const auto& pending : pending_) {
            if (pending.get() == &job) break;
            ++position;
        }
        out["position"] = position;
    }
    if (job.started > 0) out["started"] = job.started;
    if (job.finished > 0) out["finished"] = job.finished;
    if (job.error_status != KILN_OK) {
        out["error"] = {{"kind", job.shutdown ? "shutdown" : kiln_status_name(job.error_status)},
                        {"message", job.error_message}};
    }
    if (job.state == JobState::Done) {
        nlohmann::json results = nlohmann::json::array();
        for (size_t i = 0; i < job.results.size(); ++i) {
            const JobImage& r = job.results[i];
            nlohmann::json item = {
                {"index", i},
                {"seed", r.seed},
                {"width", r.width},
                {"height", r.height},
                {"parameters", r.parameters},
                {"format", job.request.output_format},
                {"url", "/kiln/v1/results/" + job.id + "/" + std::to_string(i) + "." + job.request.output_format}};
            if (with_images) item["image"] = base64_encode(r.bytes);
            results.push_back(std::move(item));
        }
        out["results"] = std::move(results);
    }
    return out;
}

std::vector<JobEvent> JobQueue::events_since(const Job& job, size_t seen, int wait_ms, bool* over) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return job.events.size() > seen; });
    std::vector<JobEvent> out;
    for (size_t i = seen; i < job.events.size(); ++i) out.push_back(job.events[i]);
    *over = job.finished > 0 && seen + out.size() == job.events.size();
    return out;
}

std::string JobQueue::latest_preview(const Job& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    return job.preview;
}

bool JobQueue::wait_finished_for(const Job& job, int wait_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return job.finished > 0; });
}

void JobQueue::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        for (const auto& job : pending_) {
            job->shutdown = true;
            finish(*job, JobState::Cancelled, KILN_ERROR_CANCELLED, "the server is shutting down");
        }
        pending_.clear();
        if (running_) {
            running_->shutdown = true;
            running_->cancel_requested = true;
            if (running_ctx_) kiln_cancel(running_ctx_);
        }
        changed_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
}

void JobQueue::work() {
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            changed_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
            if (pending_.empty()) return;  // stopping
            job = pending_.front();
            pending_.pop_front();
            running_ = job;
            job->state = JobState::Running;
            job->started = unix_now();
            add_event(*job, "started", {{"model", job->request.model}});
        }
        run(job);
        std::lock_guard<std::mutex> lock(mutex_);
        // The job before this one gives up its previews: at most two jobs hold any.
        if (auto previous = last_run_.lock()) drop_previews(*previous);
        last_run_ = job;
        recent_job_seconds_ = 0.7 * recent_job_seconds_ + 0.3 * (job->finished - job->started);
        running_ = nullptr;
        changed_.notify_all();
    }
}

void JobQueue::run(const std::shared_ptr<Job>& job) {
    const JobRequest& r = job->request;
    kiln_context* ctx = nullptr;
    std::string load_error;
    kiln_status status = KILN_OK;
    try {
        status = models_.acquire(models_.resolve(r.model, "model"), r.parts, &ctx, &load_error);
        if (!options_.model_dir.empty()) load_error = in_request_terms(load_error);
    } catch (const RequestError& e) {  // the model left the folder since the job was queued
        status = KILN_ERROR_INVALID_REQUEST;
        load_error = e.message;
    }
    if (status != KILN_OK) {
        std::lock_guard<std::mutex> lock(mutex_);
        finish(*job, JobState::Failed, status, load_error);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (job->cancel_requested) {
            finish(*job, JobState::Cancelled, KILN_ERROR_CANCELLED, "cancelled");
            return;
        }
        running_ctx_ = ctx;
    }
    ProgressTarget target{this, job.get(), ctx};
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = r.prompt.c_str();
    gp.negative_prompt = r.negative_prompt.c_str();
    gp.width = r.width;
    gp.height = r.height;
    gp.steps = r.steps;
    gp.cfg_scale = r.cfg_scale;
    gp.eta = r.eta;
    gp.high_noise_steps = r.high_noise_steps;
    gp.high_noise_cfg_scale = r.high_noise_cfg_scale;
    gp.high_noise_sampler = r.high_noise_sampler.empty() ? nullptr : r.high_noise_sampler.c_str();
    gp.high_noise_eta = r.high_noise_eta;
    gp.moe_boundary = r.moe_boundary;
    gp.seed = r.seed;
    gp.batch_count = r.batch;
    gp.sampler = r.sampler.empty() ? nullptr : r.sampler.c_str();
    gp.scheduler = r.scheduler.empty() ? nullptr : r.scheduler.c_str();
    gp.init_image = r.init_image.get();
    gp.strength = r.strength;
    gp.init_latent_resize = r.init_latent_resize ? 1 : 0;
    gp.mask = r.mask.get();
    gp.end_image = r.end_image.get();
    std::vector<kiln_image> refs;  // the structs, over the request's pixels
    for (const SharedImage& ref : r.ref_images) refs.push_back(*ref);
    gp.ref_images = refs.empty() ? nullptr : refs.data();
    gp.n_ref_images = static_cast<int>(refs.size());
    gp.disable_auto_resize_ref_image = r.auto_resize_ref_images ? 0 : 1;
    std::vector<kiln_image> control_frames;
    for (const SharedImage& frame : r.control_frames) control_frames.push_back(*frame);
    gp.control_frames = control_frames.empty() ? nullptr : control_frames.data();
    gp.n_control_frames = static_cast<int>(control_frames.size());
    gp.vace_strength = r.vace_strength;
    gp.increase_ref_index = r.increase_ref_index ? 1 : 0;
    gp.circular_x = r.circular_x ? 1 : 0;
    gp.circular_y = r.circular_y ? 1 : 0;
    gp.progress = &JobQueue::on_progress;
    gp.progress_user_data = &target;
    gp.phase = &JobQueue::on_phase;
    gp.phase_user_data = &target;
    gp.decode = &JobQueue::on_decode;
    gp.decode_user_data = &target;
    gp.hires = r.hires ? 1 : 0;
    gp.hires_scale = r.hires_scale;
    gp.hires_width = r.hires_width;
    gp.hires_height = r.hires_height;
    gp.hires_steps = r.hires_steps;
    gp.hires_denoising_strength = r.hires_denoising_strength;
    gp.hires_upscaler = r.hires_upscaler.c_str();
    gp.clip_skip = r.clip_skip;
    gp.guidance = r.guidance;
    gp.flow_shift_given = r.flow_shift ? 1 : 0;
    gp.flow_shift = r.flow_shift.value_or(0.0f);
    gp.timestep_shift = r.timestep_shift;
    gp.sigmas = r.sigmas.empty() ? nullptr : r.sigmas.data();
    gp.n_sigmas = static_cast<int>(r.sigmas.size());
    gp.hires_sigmas = r.hires_sigmas.empty() ? nullptr : r.hires_sigmas.data();
    gp.n_hires_sigmas = static_cast<int>(r.hires_sigmas.size());
    gp.slg_scale = r.slg_scale;
    gp.skip_layers = r.skip_layers.data();
    gp.n_skip_layers = static_cast<int>(r.skip_layers.size());
    gp.skip_layer_start = r.skip_layer_start;
    gp.skip_layer_end = r.skip_layer_end;
    gp.vae_tiling = r.vae_tiling ? 1 : 0;
    gp.vae_tile_size = r.vae_tile_size;
    gp.vae_tile_overlap = r.vae_tile_overlap;
    gp.vae_relative_tile_w = r.vae_relative_tile_w;
    gp.vae_relative_tile_h = r.vae_relative_tile_h;
    gp.cache_mode = r.cache_mode.c_str();
    gp.cache_option = r.cache_option.c_str();
    gp.scm_mask = r.scm_mask.c_str();
    gp.scm_policy = r.scm_policy.c_str();
    gp.disable_file_hashes = r.embed_metadata ? 0 : 1;  // no parameters text, no file read to hash
    gp.preview_mode = preview_mode_of(r, options_, ctx);
    if (gp.preview_mode == KILN_PREVIEW_TAE) {
        kiln_model_info info;
        kiln_context_info(ctx, &info);
        if (!info.taesd) {
            std::fprintf(stderr, "kiln serve: job %s: preview tae without --taesd: the previews come from the VAE\n",
                         job->id.c_str());
        }
    }
    if (gp.preview_mode != KILN_PREVIEW_NONE) {
        gp.preview_interval = r.preview_interval > 0 ? r.preview_interval : options_.preview_interval;
        gp.preview_noisy = r.preview_noisy.value_or(options_.preview_noisy) ? 1 : 0;
        gp.preview = &JobQueue::on_preview;
        gp.preview_user_data = &target;
        target.preview_interval = std::max(1, gp.preview_interval);
    }

    gp.video_frames = r.video_frames;
    kiln_image* images = nullptr;
    int count = 0;
    char* message = nullptr;
    status = kiln_generate(ctx, &gp, &images, &count, &message);
    std::string error = message ? message : "";
    kiln_free_string(message);
    std::vector<JobImage> results;
    const bool clips = is_video_format_of(r);
    if (status == KILN_OK && clips) status = encode_clips(*job, images, count, results, error);
    for (int i = 0; status == KILN_OK && !clips && i < count; ++i) {
        JobImage out;
        uint8_t* bytes = nullptr;
        size_t size = 0;
        char* encode_error = nullptr;
        kiln_image encoded = images[i];
        if (!r.embed_metadata) encoded.parameters = nullptr;
        status = kiln_image_encode(&encoded, r.output_format.c_str(), &bytes, &size, &encode_error);
        if (status != KILN_OK) {
            error = encode_error ? encode_error : "encoding the image failed";
            kiln_free_string(encode_error);
            break;
        }
        out.bytes.assign(bytes, bytes + size);
        kiln_free_bytes(bytes);
        out.parameters = images[i].parameters ? images[i].parameters : "";
        out.seed = r.seed + i;
        out.width = images[i].width;
        out.height = images[i].height;
        results.push_back(std::move(out));
    }
    kiln_images_free(images, count);
    if (status == KILN_OK) {
        job->results = std::move(results);  // the results are read under the lock only once the job is done
        gallery_.save(*job);
    }

    std::lock_guard<std::mutex> lock(mutex_);
    running_ctx_ = nullptr;
    if (target.held_step) add_step_event(*job, *std::exchange(target.held_step, std::nullopt), "");
    if (status == KILN_OK) {
        finish(*job, JobState::Done, KILN_OK, "");
    } else if (status == KILN_ERROR_CANCELLED) {
        finish(*job, JobState::Cancelled, status, job->shutdown ? "the server is shutting down" : error);
    } else {
        std::fprintf(stderr, "kiln serve: job %s failed (%s): %s\n", job->id.c_str(), kiln_status_name(status),
                     error.c_str());
        finish(*job, JobState::Failed, status, error);
    }
}

void JobQueue::on_progress(int image, int step, int steps, void* user_data) {
    auto* target = static_cast<ProgressTarget*>(user_data);
    JobQueue& self = *target->queue;
    std::lock_guard<std::mutex> lock(self.mutex_);
    Job& job = *target->job;
    if (step == 0 && image == 0) job.sampling_started = unix_now();
    job.image = image;
    job.step = step;
    job.steps = steps;
    // An earlier step whose preview never came (it failed) goes out without it.
    if (target->held_step) self.add_step_event(job, *std::exchange(target->held_step, std::nullopt), "");
    if (step > 0) {
        const double total = double(job.images) * steps;
        const double done = double(image) * steps + step;
        const double elapsed = unix_now() - job.sampling_started;
        nlohmann::json data = {{"image", image},
                               {"step", step},
                               {"steps", steps},
                               {"progress", done / total},
                               {"eta", elapsed / done * (total - done)}};
        // kiln makes a step's preview right after reporting the step.
        if (target->preview_interval > 0 && step % target->preview_interval == 0) {
            target->held_step = std::move(data);
        } else {
            self.add_step_event(job, std::move(data), "");
        }
    }
    if (job.cancel_requested) kiln_cancel(target->ctx);
    if (job.interrupt_requested) kiln_interrupt(target->ctx);
}

void JobQueue::on_phase(kiln_phase phase, int image, void* user_data) {
    auto* target = static_cast<ProgressTarget*>(user_data);
    JobQueue& self = *target->queue;
    std::lock_guard<std::mutex> lock(self.mutex_);
    // A step whose preview is still due goes out first: events stay in order.
    if (target->held_step) self.add_step_event(*target->job, *std::exchange(target->held_step, std::nullopt), "");
    const char* name = phase == KILN_PHASE_ENCODE ? "encode" : phase == KILN_PHASE_DECODE ? "decode" : "hires";
    self.add_event(*target->job, "phase", {{"phase", name}, {"image", image}});
}

void JobQueue::on_decode(int image, int done, int frames, void* user_data) {
    auto* target = static_cast<ProgressTarget*>(user_data);
    JobQueue& self = *target->queue;
    std::lock_guard<std::mutex> lock(self.mutex_);
    self.add_event(*target->job, "decode", {{"image", image}, {"frames_done", done}, {"frames", frames}});
    if (target->job->cancel_requested) kiln_cancel(target->ctx);
}

void JobQueue::on_preview(int image, int step, const kiln_image* preview, void* user_data) {
    auto* target = static_cast<ProgressTarget*>(user_data);
    JobQueue& self = *target->queue;
    // Encoded outside the lock: a large preview must not hold up the API's readers.
    uint8_t* bytes = nullptr;
    size_t size = 0;
    char* error = nullptr;
    const kiln_status status = kiln_image_encode(preview, "png", &bytes, &size, &error);
    std::string encoded;
    if (status == KILN_OK) encoded = base64_encode(bytes, size);
    kiln_free_bytes(bytes);
    if (status != KILN_OK && !target->preview_failed) {
        std::fprintf(stderr, "kiln serve: job %s: a preview could not be encoded (%s); the job goes on without it\n",
                     target->job->id.c_str(), error ? error : kiln_status_name(status));
    }
    kiln_free_string(error);
    std::lock_guard<std::mutex> lock(self.mutex_);
    Job& job = *target->job;
    if (status != KILN_OK) {
        target->preview_failed = true;
        return;  // the held step goes out without a preview at the next step
    }
    const bool for_held_step =
        target->held_step && (*target->held_step)["image"] == image && (*target->held_step)["step"] == step;
    if (for_held_step) self.add_step_event(job, *std::exchange(target->held_step, std::nullopt), encoded);
    job.preview = std::move(encoded);
}

void JobQueue::add_step_event(Job& job, nlohmann::json data, const std::string& preview) {
    if (!preview.empty()) {
        data["preview"] = preview;
        job.preview_bytes_in_events += preview.size();
    }
    add_event(job, "step", std::move(data));
    bound_previews(job);
}

void JobQueue::bound_previews(Job& job) {
    // Oldest first; the latest event keeps its preview whatever its size.
    for (size_t i = 0; i + 1 < job.events.size() && job.preview_bytes_in_events > kMaxPreviewBytesInEvents; ++i) {
        nlohmann::json& data = job.events[i].data;
        const auto it = data.find("preview");
        if (it == data.end()) continue;
        job.preview_bytes_in_events -= it->get_ref<const std::string&>().size();
        data.erase(it);
    }
}

void JobQueue::drop_previews(Job& job) {
    for (JobEvent& event : job.events) event.data.erase("preview");
    job.preview_bytes_in_events = 0;
    job.preview.clear();
    job.preview.shrink_to_fit();
}

void JobQueue::finish(Job& job, JobState state, kiln_status status, const std::string& message) {
    // A job that has ended stops being the running one in the same critical
    // section, so that a client which saw it end never finds it "running"
    // (A1111's /progress) or cancels it in place of the next (interrupt).
    if (running_.get() == &job) running_ = nullptr;
    job.state = state;
    job.finished = unix_now();
    job.error_status = status;
    job.error_message = message;
    if (state == JobState::Done) {
        add_event(job, "done", {{"images", job.results.size()}, {"url", "/kiln/v1/jobs/" + job.id}});
    } else {
        add_event(job, job_state_name(state),
                  {{"kind", job.shutdown ? "shutdown" : kiln_status_name(status)}, {"message", message}});
    }
    for (const auto& pending : finished_) {
        if (pending.get() == &job) return;
    }
    if (auto it = jobs_.find(job.id); it != jobs_.end()) finished_.push_back(it->second);
    changed_.notify_all();
}

void JobQueue::add_event(Job& job, const std::string& type, nlohmann::json data) {
    data["id"] = job.id;
    job.events.push_back({type, std::move(data)});
    changed_.notify_all();
}

void JobQueue::forget_old_jobs() {
    const double now = unix_now();
    while (!finished_.empty() && (finished_.size() > static_cast<size_t>(options_.max_results) ||
                                  now - finished_.front()->finished > options_.result_ttl_seconds)) {
        jobs_.erase(finished_.front()->id);
        finished_.pop_front();
    }
}

}  // namespace kiln::server
