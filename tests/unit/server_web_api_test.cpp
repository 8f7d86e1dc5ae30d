// What kiln serve's web page asks of the native API, asserted on a real
// server: a model's defaults and plan (GET /kiln/v1/plan), the queue
// (GET /kiln/v1/jobs), the gallery of --output-dir, a native job's hires
// fix, and --max-pixels.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server_test_support.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::body_json;
using test::error_param;
using test::json;
using test::ServerProcess;

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ServerWebApi, PlanGivesTheModelsDefaultsAndWhetherTheJobFits) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    const json plan = body_json(client.Get("/kiln/v1/plan?model=sd1_tiny.safetensors"));
    ASSERT_TRUE(plan.contains("defaults")) << plan;
    EXPECT_EQ(plan["family"], "SD1.x");
    EXPECT_EQ(plan["defaults"]["width"], 512);
    EXPECT_EQ(plan["defaults"]["height"], 512);
    EXPECT_EQ(plan["defaults"]["steps"], 20);
    EXPECT_EQ(plan["defaults"]["cfg_scale"], 7.0);
    EXPECT_EQ(plan["defaults"]["sampler"], "euler_a");
    EXPECT_EQ(plan["fits"], "yes");
    const std::string report = plan["report"];
    EXPECT_EQ(report.rfind("job: 512x512", 0), 0u) << report;
    EXPECT_NE(report.find("fits: yes"), std::string::npos) << report;

    // The asked size is the one planned, and a smaller job needs less.
    const json small = body_json(client.Get("/kiln/v1/plan?width=64&height=64"));  // no model: the default one
    EXPECT_EQ(small["model"], "sd1_tiny.safetensors");
    EXPECT_EQ(small["report"].get<std::string>().rfind("job: 64x64", 0), 0u) << small;
    EXPECT_NE(small["report"], plan["report"]);
    const json hires = body_json(client.Get("/kiln/v1/plan?width=64&height=64&hires_scale=2"));
    EXPECT_NE(hires["report"], small["report"]);

    for (const auto& [query, field] :
         std::vector<std::pair<std::string, std::string>>{{"width=abc", "width"},
                                                          {"width=99999", "width"},
                                                          {"hires_scale=-1", "hires_scale"},
                                                          {"model=nothing.safetensors", "model"},
                                                          {"model=../etc", "model"}}) {
        SCOPED_TRACE(query);
        auto r = client.Get("/kiln/v1/plan?" + query);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << r->body;
        EXPECT_EQ(error_param(r), field) << r->body;
    }
}

TEST(ServerWebApi, NativeHiresFixMakesTheLargerImage) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json job = {{"prompt", "a red circle"},
                      {"width", 32},
                      {"height", 32},
                      {"steps", 2},
                      {"seed", 5},
                      {"hires", {{"enabled", true}, {"scale", 2}, {"steps", 1}, {"denoising_strength", 0.5}}}};
    const std::string id = test::post_job(client, job);
    ASSERT_FALSE(id.empty());
    ASSERT_EQ(test::wait_for_state(client, id, "done"), "done");
    const json done = body_json(client.Get("/kiln/v1/jobs/" + id));
    EXPECT_EQ(done["results"][0]["width"], 64);
    EXPECT_EQ(done["results"][0]["height"], 64);
    const std::string parameters = done["results"][0]["parameters"];
    EXPECT_NE(parameters.find("Hires upscale: 2"), std::string::npos) << parameters;
    EXPECT_NE(parameters.find("Denoising strength: 0.5"), std::string::npos) << parameters;

    int status = 0;
    const json bad = {{"prompt", "x"}, {"hires", {{"enabled", true}, {"scale", "two"}}}};
    EXPECT_EQ(test::post_job(client, bad, &status), "");
    EXPECT_EQ(status, 400);
}

TEST(ServerWebApi, JobsListsTheRunningTheQueuedAndTheFinished) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 10000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const std::string running =
        test::post_job(client, {{"prompt", "a long one"}, {"width", 32}, {"height", 32}, {"steps", 10000}});
    ASSERT_EQ(test::wait_for_state(client, running, "running"), "running");
    const std::string queued =
        test::post_job(client, {{"prompt", "a waiting one"}, {"width", 32}, {"height", 32}, {"steps", 2}});
    ASSERT_FALSE(queued.empty());

    json jobs = body_json(client.Get("/kiln/v1/jobs"))["jobs"];
    ASSERT_EQ(jobs.size(), 2u) << jobs;
    EXPECT_EQ(jobs[0]["id"], running);
    EXPECT_EQ(jobs[0]["state"], "running");
    EXPECT_EQ(jobs[0]["prompt"], "a long one");
    EXPECT_EQ(jobs[1]["id"], queued);
    EXPECT_EQ(jobs[1]["state"], "queued");
    EXPECT_EQ(jobs[1]["position"], 1);
    EXPECT_EQ(jobs[1]["prompt"], "a waiting one");
    EXPECT_FALSE(jobs[1].contains("results"));

    ASSERT_TRUE(client.Post("/kiln/v1/jobs/" + running + "/cancel", "", "application/json"));
    ASSERT_EQ(test::wait_for_state(client, queued, "done"), "done");
    jobs = body_json(client.Get("/kiln/v1/jobs"))["jobs"];
    ASSERT_EQ(jobs.size(), 2u) << jobs;
    EXPECT_EQ(jobs[0]["id"], queued);  // finished ones newest first
    EXPECT_EQ(jobs[0]["state"], "done");
    EXPECT_FALSE(jobs[0]["results"][0].contains("image"));  // the list carries no images
    EXPECT_EQ(jobs[1]["id"], running);
    EXPECT_EQ(jobs[1]["state"], "cancelled");
}

TEST(ServerWebApi, OutputDirKeepsEveryImageAndTheGalleryServesThem) {
    test::TempDir outputs;
    test::TempDir outside;
    const std::string folder = outputs.file("kept");  // created by the server
    ServerProcess server(test::tiny_server_flags() + " --output-dir " + folder);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const std::string id = test::post_job(
        client,
        {{"prompt", "two of them"}, {"width", 32}, {"height", 32}, {"steps", 2}, {"seed", 9}, {"batch_count", 2}});
    ASSERT_EQ(test::wait_for_state(client, id, "done"), "done");

    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(folder)) files.push_back(entry.path().filename().string());
    ASSERT_EQ(files.size(), 2u);  // no partial files left beside them

    // A file the server did not write, and ones it must not serve.
    fs::create_symlink(outside.write("secret.png", "not for the page"), fs::path(folder) / "link.png");
    std::ofstream(fs::path(folder) / ".hidden.png") << "x";
    std::ofstream(fs::path(folder) / "notes.txt") << "x";

    const json gallery = body_json(client.Get("/kiln/v1/gallery"));
    EXPECT_EQ(gallery["kept"], true);
    ASSERT_EQ(gallery["total"], 2) << gallery;
    for (size_t i = 0; i < 2; ++i) {
        const json& image = gallery["images"][i];
        const std::string file = image["file"];
        EXPECT_NE(file.find(id), std::string::npos) << file;
        const std::string parameters = image["parameters"];
        EXPECT_EQ(parameters.rfind("two of them\n", 0), 0u) << parameters;
        auto served = client.Get(image["url"].get<std::string>());
        ASSERT_TRUE(served);
        EXPECT_EQ(served->status, 200);
        EXPECT_EQ(served->get_header_value("Content-Type"), "image/png");
        EXPECT_EQ(served->body, read_bytes(folder + "/" + file));
        // The same bytes the job's own result has.
        const std::string index = file.substr(file.size() - 5, 1);
        EXPECT_EQ(served->body, client.Get("/kiln/v1/results/" + id + "/" + index + ".png")->body);
    }
    const json page = body_json(client.Get("/kiln/v1/gallery?offset=1&limit=1"));
    ASSERT_EQ(page["images"].size(), 1u);
    EXPECT_EQ(page["images"][0]["file"], gallery["images"][1]["file"]);

    for (const char* path : {"/kiln/v1/gallery/link.png", "/kiln/v1/gallery/.hidden.png", "/kiln/v1/gallery/notes.txt",
                             "/kiln/v1/gallery/..%2F..%2Fetc%2Fpasswd", "/kiln/v1/gallery/missing.png"}) {
        SCOPED_TRACE(path);
        auto r = client.Get(path);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 404) << r->body;
    }
    auto bad = client.Get("/kiln/v1/gallery?limit=zero");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_EQ(error_param(bad), "limit");

    // Without --output-dir nothing is kept, and the page is told so.
    ServerProcess plain(test::tiny_server_flags());
    ASSERT_TRUE(plain.started()) << plain.log();
    httplib::Client plain_client("127.0.0.1", plain.port());
    const json none = body_json(plain_client.Get("/kiln/v1/gallery"));
    EXPECT_EQ(none["kept"], false);
    EXPECT_EQ(none["total"], 0);
}

TEST(ServerWebApi, MaxPixelsRefusesJobsFarAboveTheFamilysTrainedSize) {
    ServerProcess server(test::tiny_server_flags() + " --max-pixels 2");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    int status = 0;
    EXPECT_EQ(test::post_job(client, {{"prompt", "x"}, {"width", 1024}, {"height", 768}, {"steps", 1}}, &status), "");
    EXPECT_EQ(status, 400);
    auto r = client.Post("/kiln/v1/jobs", json{{"prompt", "x"}, {"width", 1024}, {"height", 768}}.dump(),
                         "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(error_param(r), "width");
    EXPECT_NE(r->body.find("1024x768 is 3 times the pixels SD1.x is trained at (512x512)"), std::string::npos)
        << r->body;
    EXPECT_NE(r->body.find("--max-pixels"), std::string::npos) << r->body;

    // A1111's hires fix counts at its final size.
    const json a1111 = {{"prompt", "x"}, {"width", 512},      {"height", 512},
                        {"steps", 1},    {"enable_hr", true}, {"hr_scale", 2}};
    auto hires = client.Post("/sdapi/v1/txt2img", a1111.dump(), "application/json");
    ASSERT_TRUE(hires);
    EXPECT_EQ(hires->status, 400) << hires->body;
    EXPECT_NE(hires->body.find("the hires fix's 1024x1024 is 4 times"), std::string::npos) << hires->body;

    // Within the limit a job runs (and the server still serves).
    const std::string id = test::post_job(client, {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}});
    ASSERT_FALSE(id.empty());
    EXPECT_EQ(test::wait_for_state(client, id, "done"), "done");
}

}  // namespace
}  // namespace kiln
