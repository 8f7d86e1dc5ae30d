// kiln serve's memory books (GET /kiln/v1/memory) and two models from
// --model-dir taking turns on a loopback RPC device whose --max-vram budget
// holds one of them at a time: each generates what it does without a
// budget, the books never pass the budget, and the server unloads one model
// to run the other.
#include <gtest/gtest.h>

#include <chrono>

#include <thread>
#include <signal.h>

#include <algorithm>
#include <filesystem>

#include "rpc_child.h"
#include "server_test_support.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::body_json;
using test::json;
using test::ServerProcess;

constexpr const char* kSd1 = "sd1_tiny.safetensors";
constexpr const char* kSd2 = "sd2/sd2_tiny.safetensors";

// The UNet and text encoder compute on the RPC device and keep their
// weights there (so a loaded model holds device memory between jobs); the
// VAE decodes on the CPU.
std::string rpc_server_flags(const test::RpcServer& rpc, const std::string& folder, const std::string& more) {
    return "-t 1 " + test::tokenizer_flag() + "--model-dir " + folder + " --rpc-servers " + rpc.endpoint() +
           " --backend diffusion=RPC0,te=RPC0,vae=cpu " + more;
}

json request_for(const std::string& model) {
    return {{"model", model}, {"prompt", "a red circle"}, {"size", "32x32"},   {"steps", 2},
            {"seed", 4},      {"cfg_scale", 3},           {"sampler", "euler"}};
}

// The model's image from the OpenAI endpoint (it waits for the job).
image::Image generate(httplib::Client& client, const std::string& model) {
    auto r = client.Post("/v1/images/generations", request_for(model).dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return r->status == 200 ? test::decode_base64_image(body_json(r)["data"][0]["b64_json"]) : image::Image{};
}

// RPC0's line of GET /kiln/v1/memory.
struct Books {
    uint64_t managed = 0, peak = 0;
    json budget;  // bytes or null
    std::vector<std::string> loaded;
};
Books rpc_books(httplib::Client& client) {
    const json memory = body_json(client.Get("/kiln/v1/memory"));
    Books books;
    books.loaded = memory.value("loaded", std::vector<std::string>{});
    for (const json& d : memory.value("devices", json::array())) {
        if (d["device"] != "RPC0") continue;
        books.managed = d["managed_bytes"];
        books.peak = d["peak_bytes"];
        books.budget = d["budget_bytes"];
        return books;
    }
    ADD_FAILURE() << "no RPC0 in " << memory.dump();
    return books;
}

struct TwoModelFolder {
    test::TempDir dir;
    TwoModelFolder() {
        fs::create_directories(dir.file("sd2"));
        fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file(kSd1));
        fs::copy_file(test::golden_path("models/sd2_tiny.safetensors"), dir.file(kSd2));
    }
};

// What one model does alone on the device without a budget.
struct Alone {
    image::Image image;
    Books books;  // after its job
};
Alone run_alone(const test::RpcServer& rpc, const TwoModelFolder& folder, const std::string& model) {
    ServerProcess server(rpc_server_flags(rpc, folder.dir.path(), ""));
    EXPECT_TRUE(server.started()) << server.log();
    if (!server.started()) return {};
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    Alone alone;
    alone.image = generate(client, model);
    alone.books = rpc_books(client);
    EXPECT_EQ(server.stop(SIGTERM), 0);
    return alone;
}

TEST(ServerMemory, ReportsTheDevicesBooks) {
    ServerProcess server(test::tiny_server_flags() + " --max-vram cpu=2G");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    // Nothing loaded yet: no books.
    const json before = body_json(client.Get("/kiln/v1/memory"));
    EXPECT_EQ(before["devices"], json::array()) << before;
    EXPECT_EQ(before["loaded"], json::array()) << before;
    auto r = client.Post("/sdapi/v1/txt2img", R"({"prompt": "x", "width": 32, "height": 32, "steps": 1})",
                         "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json after = body_json(client.Get("/kiln/v1/memory"));
    ASSERT_EQ(after["devices"].size(), 1u) << after;
    const json& cpu = after["devices"][0];
    EXPECT_EQ(cpu["device"], "CPU");
    EXPECT_EQ(cpu["budget_bytes"], uint64_t(2) << 30);
    // The job's compute buffers were counted: a peak above nothing, and at least what is held now.
    EXPECT_GT(cpu["peak_bytes"].get<uint64_t>(), 0u) << after;
    EXPECT_GE(cpu["peak_bytes"].get<uint64_t>(), cpu["managed_bytes"].get<uint64_t>()) << after;
    EXPECT_LE(cpu["peak_bytes"].get<uint64_t>(), uint64_t(2) << 30) << after;
    EXPECT_EQ(after["loaded"], json::array({"sd1_tiny.safetensors"})) << after;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// The books are read when asked: a running job's weights and compute
// buffers show while it runs (the model's weights load lazily, in the job).
TEST(ServerMemory, ARunningJobsBooksShowWhileItRuns) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::string id =
        test::post_job(client, {{"prompt", "a long job"}, {"width", 32}, {"height", 32}, {"steps", 3000}});
    ASSERT_FALSE(id.empty());
    json state;
    for (int i = 0; i < 600; ++i) {  // until its second step has started (at most a minute)
        state = body_json(client.Get("/kiln/v1/jobs/" + id));
        const std::string now = state.value("state", "");
        if (state.value("step", 0) >= 2 || (now != "running" && now != "queued")) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(state.value("state", ""), "running") << state;
    const json during = body_json(client.Get("/kiln/v1/memory"));
    ASSERT_EQ(during["devices"].size(), 1u) << during;
    EXPECT_GT(during["devices"][0]["managed_bytes"].get<uint64_t>(), 0u) << during;
    EXPECT_GT(during["devices"][0]["peak_bytes"].get<uint64_t>(), 0u) << during;
    EXPECT_EQ(during["loaded"], json::array({"sd1_tiny.safetensors"})) << during;
    client.Post("/kiln/v1/jobs/" + id + "/cancel", "", "application/json");
    EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// Each model alone without a budget gives its image and its peak on RPC0.
// Then one server with a budget just over the larger peak (so each fits
// alone, but not both models' weights and a job) and room for two loaded
// models by count: requested alternately, each image equals its unbudgeted
// one, RPC0's peak stays within the budget, and only the model that ran
// last is loaded: the other was unloaded to make room.
TEST(ServerMemory, TwoModelsTakeTurnsUnderABudgetForOne) {
    TwoModelFolder folder;
    test::RpcServer rpc;
    ASSERT_TRUE(rpc.ok()) << rpc.log();
    const Alone sd1 = run_alone(rpc, folder, kSd1);
    const Alone sd2 = run_alone(rpc, folder, kSd2);
    ASSERT_FALSE(sd1.image.pixels.empty());
    ASSERT_FALSE(sd2.image.pixels.empty());
    ASSERT_NE(sd1.image.pixels, sd2.image.pixels);
    // Between jobs a model keeps its weights on the device.
    ASSERT_GT(sd1.books.managed, 0u);
    ASSERT_GT(sd2.books.managed, 0u);
    const uint64_t larger_peak = std::max(sd1.books.peak, sd2.books.peak);
    // Both loaded would hold both models' weights, and a job needs its peak on top of the other's.
    const uint64_t budget_kib = larger_peak / 1024 + 64;
    const uint64_t budget = budget_kib * 1024;
    ASSERT_LT(budget, larger_peak + std::min(sd1.books.managed, sd2.books.managed))
        << "the budget must not hold both models: peaks " << sd1.books.peak << ", " << sd2.books.peak
        << "; held between jobs " << sd1.books.managed << ", " << sd2.books.managed;

    ServerProcess server(rpc_server_flags(rpc, folder.dir.path(),
                                          "--max-loaded-models 2 --max-vram RPC0=" + std::to_string(budget_kib) + "K"));
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    for (const char* model : {kSd1, kSd2, kSd1, kSd2}) {
        const image::Image got = generate(client, model);
        EXPECT_EQ(got.pixels, model == kSd1 ? sd1.image.pixels : sd2.image.pixels) << model;
        const Books books = rpc_books(client);
        EXPECT_EQ(books.budget, budget);
        EXPECT_LE(books.peak, budget) << model;
        EXPECT_GT(books.managed, 0u) << model;
        EXPECT_EQ(books.loaded, std::vector<std::string>{model}) << "the other model should have been unloaded";
    }
    // Each turn after the first unloaded the other model (a load that ran out of memory, then the retry).
    const std::string log = server.log();
    size_t unloads = 0;
    for (size_t at = 0; (at = log.find("kiln serve: unloading ", at)) != std::string::npos; ++at) ++unloads;
    EXPECT_EQ(unloads, 3u) << log;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln
