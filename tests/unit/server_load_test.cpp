// kiln serve under load: many clients at once get only "accepted" or
// "busy" and every accepted job ends, cancels land on queued and running
// jobs alike, and the server's memory stays flat over hundreds of jobs.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "server_test_support.h"

namespace kiln {
namespace {

using test::body_json;
using test::json;
using test::ServerProcess;

// What a request of the storm is.
enum class Kind {
    Native,           // a job, followed by polling at the end
    CancelledQueued,  // a job cancelled right after it was accepted (mostly while queued)
    A1111,            // synchronous txt2img: the answer waits for the images
    CancelledRunning  // a long job cancelled once its event stream shows a step
};
Kind kind_of(int client, int request) {
    switch ((client + request) % 5) {
        case 2: return Kind::CancelledQueued;
        case 3: return Kind::A1111;
        case 4: return Kind::CancelledRunning;
        default: return Kind::Native;
    }
}

// A long job's steps: far more than it gets to run before its cancel lands.
constexpr int kLongJobSteps = 40;

// Follows the job's event stream until its first step, so the job is running.
bool wait_for_first_step(int port, const std::string& id) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120, 0);
    bool stepped = false;
    std::string seen;
    client.Get(("/kiln/v1/jobs/" + id + "/events").c_str(), [&](const char* data, size_t size) {
        seen.append(data, size);
        stepped = seen.find("event: step\n") != std::string::npos;
        return !stepped && seen.find("event: cancelled\n") == std::string::npos &&
               seen.find("event: done\n") == std::string::npos && seen.find("event: failed\n") == std::string::npos;
    });
    return stepped;
}

// The id of the job the server runs now ("" for none), from A1111's progress.
std::string running_job(httplib::Client& client) {
    const json progress = body_json(client.Get("/sdapi/v1/progress?skip_current_image=true"));
    return progress.contains("state") ? progress["state"].value("job", "") : "";
}

// Waits until the server runs another job than `running` (one has ended,
// so the queue moved). No clock: on a slow machine this only takes longer.
void wait_for_the_queue_to_move(httplib::Client& client, const std::string& running) {
    while (running_job(client) == running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// What the storm saw, guarded by `mutex`.
struct Storm {
    std::mutex mutex;
    std::multiset<int> statuses;  // every job or txt2img answer
    int requests = 0;             // requests made, a retried long job counted once
    std::vector<std::string> native, cancelled_queued, cancelled_running;
    std::multiset<int> cancel_statuses;
    int long_jobs_never_accepted = 0;
    void answered(int status) {
        std::lock_guard<std::mutex> lock(mutex);
        statuses.insert(status);
    }
};

// One client's requests: mixed sizes and steps, each kind of request.
// `total_jobs`: every job of the storm, the most times the queue can move.
void run_client(int port, int c, int requests, int total_jobs, Storm& storm) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120, 0);
    for (int i = 0; i < requests; ++i) {
        const Kind kind = kind_of(c, i);
        const int side = 32 + 8 * ((c + i) % 3);
        json job = {{"prompt", "load " + std::to_string(c)},
                    {"width", side},
                    {"height", side},
                    {"steps", 1 + (c + 2 * i) % 3},
                    {"seed", c * 100 + i}};
        {
            std::lock_guard<std::mutex> lock(storm.mutex);
            ++storm.requests;
        }
        if (kind == Kind::A1111) {
            auto r = client.Post("/sdapi/v1/txt2img", job.dump(), "application/json");
            storm.answered(r ? r->status : -1);
            continue;
        }
        int status = 0;
        std::string id;
        if (kind == Kind::CancelledRunning) {
            // Retried while the queue is full: each of these jobs must get to run.
            // Each retry waits for the queue to move (a job to end), whatever
            // time that takes; other clients may take the place first, but
            // the storm has only so many jobs, so the queue moves at most
            // that often before this one is taken.
            job["steps"] = kLongJobSteps;
            job["width"] = job["height"] = 32;
            for (int moves = 0; moves <= total_jobs && id.empty(); ++moves) {
                const std::string running = running_job(client);
                id = test::post_job(client, job, &status);
                storm.answered(status);
                if (status != 429) break;
                if (id.empty()) wait_for_the_queue_to_move(client, running);
            }
        } else {
            id = test::post_job(client, job, &status);
            storm.answered(status);
        }
        if (id.empty()) {
            if (kind == Kind::CancelledRunning) {
                std::lock_guard<std::mutex> lock(storm.mutex);
                ++storm.long_jobs_never_accepted;
            }
            continue;
        }
        if (kind == Kind::CancelledRunning && !wait_for_first_step(port, id)) {
            ADD_FAILURE() << "job " << id << " ended before its first step";
            continue;
        }
        int cancel_status = 0;
        if (kind != Kind::Native) {
            auto r = client.Post(("/kiln/v1/jobs/" + id + "/cancel").c_str(), "", "application/json");
            cancel_status = r ? r->status : -1;
        }
        std::lock_guard<std::mutex> lock(storm.mutex);
        if (kind == Kind::Native) storm.native.push_back(id);
        if (kind != Kind::Native) storm.cancel_statuses.insert(cancel_status);
        if (kind == Kind::CancelledQueued) storm.cancelled_queued.push_back(id);
        // 409: it had finished (it should not have, with 40 steps): checked below.
        if (kind == Kind::CancelledRunning) storm.cancelled_running.push_back(cancel_status == 200 ? id : "");
    }
}

// 16 clients x 25 requests at once against a queue of 4, sizes 32 to 48,
// 1 to 3 steps: native jobs, synchronous A1111 txt2img, jobs cancelled
// while queued and jobs cancelled while running. Every answer is 200, 202
// or 429, every accepted job ends done (or cancelled, when it was), and
// the server serves an ordinary job afterwards.
TEST(ServerLoad, ConcurrentClientsGetOnlyAcceptedOrBusy) {
    constexpr int kClients = 16, kRequestsEach = 25;
    ServerProcess server(test::tiny_server_flags() +
                         " --max-queue 4 --max-results 1000");  // every job's end stays readable
    ASSERT_TRUE(server.started()) << server.log();
    Storm storm;
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c)
        clients.emplace_back(run_client, server.port(), c, kRequestsEach, kClients * kRequestsEach, std::ref(storm));
    for (std::thread& t : clients) t.join();

    EXPECT_EQ(storm.requests, kClients * kRequestsEach);
    for (int status : std::set<int>(storm.statuses.begin(), storm.statuses.end())) {
        EXPECT_TRUE(status == 200 || status == 202 || status == 429)
            << "status " << status << " answered " << storm.statuses.count(status) << " times";
    }
    EXPECT_GT(storm.statuses.count(202), 0u);
    EXPECT_GT(storm.statuses.count(429), 0u) << "the queue of 4 never filled: no load";
    for (int status : storm.cancel_statuses) EXPECT_TRUE(status == 200 || status == 409) << status;
    EXPECT_EQ(storm.long_jobs_never_accepted, 0);
    EXPECT_EQ(storm.cancelled_running.size(), size_t(kClients * kRequestsEach / 5));

    httplib::Client client("127.0.0.1", server.port());
    for (const std::string& id : storm.native) EXPECT_EQ(test::wait_for_state(client, id, "done"), "done") << id;
    for (const std::string& id : storm.cancelled_queued) {
        const std::string state = test::wait_for_state(client, id, "cancelled");
        EXPECT_TRUE(state == "cancelled" || state == "done") << id << ": " << state;
    }
    for (const std::string& id : storm.cancelled_running) {
        EXPECT_FALSE(id.empty()) << "a running job's cancel was answered 409";
        if (id.empty()) continue;
        EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled") << id;
        const json state = body_json(client.Get(("/kiln/v1/jobs/" + id).c_str()));
        EXPECT_GE(state["step"].get<int>(), 1) << state;  // it was running
        EXPECT_LT(state["step"].get<int>(), kLongJobSteps) << state;
        EXPECT_EQ(state["error"]["kind"], "cancelled") << state;
    }

    // The server still serves.
    client.set_read_timeout(120, 0);
    auto after = client.Post("/sdapi/v1/txt2img", R"({"prompt": "after", "width": 40, "height": 32, "steps": 2})",
                             "application/json");
    ASSERT_TRUE(after);
    ASSERT_EQ(after->status, 200) << after->body;
    const image::Image image = test::decode_base64_image(body_json(after)["images"][0]);
    EXPECT_EQ(image.width, 40);
    EXPECT_EQ(image.height, 32);
    EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

// 200 jobs in a row, the same size with other seeds, native and A1111 in
// turn: the server's resident memory after 200 is within 10% of its
// resident memory after 50 (a leak of a job's images, latents or graphs
// would grow it by far more). Measured from job 50, not 20: on a 2-core
// machine the resident size wanders by some MB from one job to the next
// (87 MB at job 25, 93 to 98 MB from job 50 to 200, no trend), so job 20's
// could sit 13% below job 200's with nothing leaked.
TEST(ServerLoad, ResidentMemoryStaysFlatOverTwoHundredJobs) {
    // The finished jobs kept for fetching (--max-results, 64 by default)
    // are full by job 20 here, so what grows after that is a leak. With the
    // default the server keeps 64 jobs' results and events by design, about
    // 8 MB more at job 200 than at job 20 (docs/server.md).
    ServerProcess server(test::tiny_server_flags() + " --max-results 16");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    uint64_t after_50 = 0, after_200 = 0;
    for (int i = 1; i <= 200; ++i) {
        const json job = {{"prompt", "a red circle"}, {"width", 64}, {"height", 64}, {"steps", 1}, {"seed", 1000 + i}};
        if (i % 2 == 0) {
            auto r = client.Post("/sdapi/v1/txt2img", job.dump(), "application/json");
            ASSERT_TRUE(r);
            ASSERT_EQ(r->status, 200) << r->body;
        } else {
            int status = 0;
            const std::string id = test::post_job(client, job, &status);
            ASSERT_EQ(status, 202);
            ASSERT_EQ(test::wait_for_state(client, id, "done"), "done");
        }
        if (i == 50) after_50 = server.resident_bytes();
        if (i == 200) after_200 = server.resident_bytes();
    }
    ASSERT_GT(after_50, 0u);
    EXPECT_NEAR(static_cast<double>(after_200), static_cast<double>(after_50), 0.10 * static_cast<double>(after_50))
        << "resident bytes after 50 jobs " << after_50 << ", after 200 " << after_200;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln
