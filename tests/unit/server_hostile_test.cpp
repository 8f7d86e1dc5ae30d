// kiln serve against hostile clients (issue 31's second round): web pages of
// other sites and DNS-rebinding names, deeply nested JSON, more event
// streams than handler threads, and values of the wrong type or out of
// range. Each against a real `kiln serve` on 127.0.0.1.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "image/image_io.h"
#include "rpc_child.h"
#include "server_test_support.h"
#include "test_files.h"
#include "util/base64.h"

namespace kiln {
namespace {

using test::body_json;
using test::error_param;
using test::json;
using test::ServerProcess;

// What a browser sends for a page's "simple" cross-origin POST: no
// preflight is asked for, so the server must refuse it itself.
httplib::Headers from_page(const std::string& origin) {
    return {{"Origin", origin}, {"Sec-Fetch-Site", "cross-site"}, {"Sec-Fetch-Mode", "no-cors"}};
}

// The status line's code of a raw HTTP exchange on an open socket, 0 for none.
int read_status(int fd) {
    std::string head;
    char c = 0;
    while (head.find("\r\n") == std::string::npos && ::recv(fd, &c, 1, 0) == 1) head += c;
    return head.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(head.c_str() + 9) : 0;
}

TEST(ServerHostile, PagesOfOtherSitesAndOtherHostNamesAreRefused) {
    ServerProcess server(test::tiny_server_flags() + "--host-name kiln.lan");
    ASSERT_TRUE(server.started()) << server.log();
    const std::string own = "127.0.0.1:" + std::to_string(server.port());
    httplib::Client client("127.0.0.1", server.port());
    const std::string job = json{{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}}.dump();

    // A page of evil.example POSTing as text/plain: refused before its body is read.
    auto queued = client.Post("/kiln/v1/jobs", from_page("http://evil.example"), job, "text/plain");
    ASSERT_TRUE(queued);
    EXPECT_EQ(queued->status, 403) << queued->body;
    EXPECT_EQ(error_param(queued), "Origin");
    EXPECT_FALSE(queued->has_header("Access-Control-Allow-Origin"));
    auto options = client.Post("/sdapi/v1/options", from_page("http://evil.example"),
                               R"({"show_progress_every_n_steps": 7})", "text/plain");
    ASSERT_TRUE(options);
    EXPECT_EQ(options->status, 403);
    EXPECT_NE(body_json(client.Get("/sdapi/v1/options"))["show_progress_every_n_steps"], 7);
    auto preflight = client.Options("/kiln/v1/jobs", from_page("http://evil.example"));
    ASSERT_TRUE(preflight);
    EXPECT_EQ(preflight->status, 403);
    auto opaque = client.Post("/kiln/v1/jobs", from_page("null"), job, "application/json");
    ASSERT_TRUE(opaque);
    EXPECT_EQ(opaque->status, 403);

    // JSON only as JSON, from anyone: a form or text body is not parsed.
    for (const char* type : {"text/plain", "application/x-www-form-urlencoded"}) {
        auto typed = client.Post("/kiln/v1/jobs", job, type);
        ASSERT_TRUE(typed);
        EXPECT_EQ(typed->status, 415) << type;
        EXPECT_EQ(error_param(typed), "body") << type;
    }
    auto form = client.Post("/kiln/v1/jobs", httplib::MultipartFormDataItems{{"prompt", "x", "", ""}});
    ASSERT_TRUE(form);
    EXPECT_EQ(form->status, 415);
    auto a1111 = client.Post("/sdapi/v1/options", R"({"show_progress_every_n_steps": 7})", "text/plain");
    ASSERT_TRUE(a1111);
    EXPECT_EQ(a1111->status, 415);
    auto openai = client.Post("/v1/images/generations", R"({"prompt": "x"})", "text/plain");
    ASSERT_TRUE(openai);
    EXPECT_EQ(openai->status, 415);

    // A DNS-rebinding page reaches 127.0.0.1 under its own name: that Host is refused.
    auto rebound = client.Get("/kiln/v1/models", {{"Host", "evil.example:" + std::to_string(server.port())}});
    ASSERT_TRUE(rebound);
    EXPECT_EQ(rebound->status, 421);
    EXPECT_EQ(error_param(rebound), "Host");
    for (const std::string host : {own, "localhost:" + std::to_string(server.port()), std::string("KILN.lan")}) {
        auto named = client.Get("/kiln/v1/models", {{"Host", host}});
        ASSERT_TRUE(named);
        EXPECT_EQ(named->status, 200) << host;
    }

    // The server's own page: its origin is the Host it was loaded from.
    auto own_page = client.Post("/sdapi/v1/options", {{"Origin", "http://" + own}},
                                R"({"show_progress_every_n_steps": 3})", "application/json; charset=utf-8");
    ASSERT_TRUE(own_page);
    EXPECT_EQ(own_page->status, 200) << own_page->body;
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/options"))["show_progress_every_n_steps"], 3);
}

// A rebound page cannot send the key: a keyed server takes any Host, as
// behind a reverse proxy that passes its own name.
TEST(ServerHostile, AKeyedServerTakesAnyHost) {
    ServerProcess server(test::tiny_server_flags() + "--api-key s3cret");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto proxied = client.Get("/kiln/v1/models", {{"Host", "kiln.example.org"}, {"X-Api-Key", "s3cret"}});
    ASSERT_TRUE(proxied);
    EXPECT_EQ(proxied->status, 200) << proxied->body;
    auto keyless = client.Get("/kiln/v1/models", {{"Host", "kiln.example.org"}});
    ASSERT_TRUE(keyless);
    EXPECT_EQ(keyless->status, 401);
    // The web page through a TLS proxy: its origin is https:// and the Host.
    auto page =
        client.Post("/sdapi/v1/options",
                    {{"Host", "kiln.example.org"}, {"Origin", "https://kiln.example.org"}, {"X-Api-Key", "s3cret"}},
                    R"({"show_progress_every_n_steps": 2})", "application/json");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200) << page->body;
}

TEST(ServerHostile, CorsOriginLetsThatSitesPagesCallWithPreflights) {
    ServerProcess server(test::tiny_server_flags() + "--cors-origin http://app.example:3000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto preflight = client.Options("/kiln/v1/jobs", {{"Origin", "http://app.example:3000"},
                                                      {"Access-Control-Request-Method", "POST"},
                                                      {"Access-Control-Request-Headers", "content-type"}});
    ASSERT_TRUE(preflight);
    EXPECT_EQ(preflight->status, 204);
    EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://app.example:3000");
    EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
    EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Content-Type"), std::string::npos);

    auto allowed = client.Post("/sdapi/v1/options", {{"Origin", "http://app.example:3000"}},
                               R"({"show_progress_every_n_steps": 2})", "application/json");
    ASSERT_TRUE(allowed);
    EXPECT_EQ(allowed->status, 200) << allowed->body;
    EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://app.example:3000");
    auto other = client.Get("/kiln/v1/models", {{"Origin", "http://app.example:3001"}});
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 403);
}

// A nesting bound refuses the body from a scan, before a parse builds a
// tree: 2 million levels took the server to hundreds of MB, kept after the reply.
TEST(ServerHostile, DeeplyNestedJsonIsRefusedWithoutGrowingTheServer) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    client.set_write_timeout(120, 0);
    ASSERT_TRUE(client.Get("/health"));
    const uint64_t before = server.resident_bytes();
    ASSERT_GT(before, 0u);

    const size_t levels = 2'000'000;
    std::string nested;
    nested.reserve(levels * 6 + 1);
    for (size_t i = 0; i < levels; ++i) nested += "{\"a\":";
    nested += "1";
    nested.append(levels, '}');
    std::vector<std::string> replies;
    for (int i = 0; i < 3; ++i) {
        auto r = client.Post("/sdapi/v1/options", nested, "application/json");
        ASSERT_TRUE(r);
        replies.push_back(std::to_string(r->status) + " " + r->body);
    }
    const uint64_t after = server.resident_bytes();
    // The bodies themselves are 12 MB each; the tree of one was over 300 MB.
    EXPECT_LT(after, before + (64ull << 20)) << "before " << before << ", after " << after;
    for (const std::string& reply : replies) {
        EXPECT_EQ(reply.rfind("400 ", 0), 0u) << reply.substr(0, 200);
        EXPECT_NE(reply.find("body: nested deeper than 32 arrays and objects"), std::string::npos)
            << reply.substr(0, 200);
    }

    // The bound leaves room for clients' extras: 32 levels pass, 33 do not.
    auto depth = [&](int n) {
        return json::parse("{\"extra\": " + std::string(n - 1, '[') + std::string(n - 1, ']') + "}").dump();
    };
    auto ok = client.Post("/sdapi/v1/options", depth(32), "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    auto deep = client.Post("/sdapi/v1/options", depth(33), "application/json");
    ASSERT_TRUE(deep);
    EXPECT_EQ(deep->status, 400);
    // Brackets inside strings are text, not nesting.
    auto text = client.Post("/sdapi/v1/options", json{{"extra", std::string(100, '[')}}.dump(), "application/json");
    ASSERT_TRUE(text);
    EXPECT_EQ(text->status, 200) << text->body;
}

// Event streams share a limit below the handler threads: past it 503, and
// /health and cancel still answer with 40 streams open.
TEST(ServerHostile, FortyEventStreamsLeaveHealthAndCancelAnswering) {
    ServerProcess server(test::tiny_server_flags() + "--max-steps 10000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(60, 0);
    const std::string id =
        test::post_job(client, {{"prompt", "long"}, {"width", 32}, {"height", 32}, {"steps", 10000}});
    ASSERT_FALSE(id.empty());

    std::vector<int> streams;
    int open = 0, busy = 0;
    const std::string request = "GET /kiln/v1/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (int i = 0; i < 40; ++i) {
        const int fd = test::connect_loopback(server.port());
        ASSERT_GE(fd, 0);
        // Not a measure of speed: only so that a server that never answers fails the test.
        const timeval patience{120, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
        ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
        const int status = read_status(fd);
        if (status == 200) {
            ++open;
            streams.push_back(fd);
        } else {
            EXPECT_EQ(status, 503) << "stream " << i;
            ++busy;
            ::close(fd);
        }
    }
    EXPECT_EQ(open, 32);
    EXPECT_EQ(busy, 8);
    auto health = client.Get("/health");
    ASSERT_TRUE(health) << "no answer with " << open << " streams open";
    EXPECT_EQ(health->status, 200);
    auto extra = client.Get(("/kiln/v1/jobs/" + id + "/events").c_str());
    ASSERT_TRUE(extra);
    EXPECT_EQ(extra->status, 503);
    EXPECT_TRUE(extra->has_header("Retry-After"));
    auto cancelled = client.Post(("/kiln/v1/jobs/" + id + "/cancel").c_str());
    ASSERT_TRUE(cancelled);
    EXPECT_EQ(cancelled->status, 200);
    for (int fd : streams) ::close(fd);
    // The places come back once the streams are gone: the server notices
    // each closed one at its next write, so a new stream may get 503 (no
    // events) a few times first. No clock: a slow machine only retries more.
    EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled");
    std::vector<std::string> events;
    while ((events = test::read_events(server.port(), id)).empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(events.back(), "cancelled");
}

TEST(ServerHostile, WrongTypesAndOutOfRangeValuesAreRefused) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json good = {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}};
    const std::vector<std::pair<std::string, json>> cases = {{"steps", "12"},
                                                             {"seed", "12"},
                                                             {"cfg_scale", "12"},
                                                             {"width", "32"},
                                                             {"seed", json(18446744073709551615ull)},
                                                             {"steps", json(18446744073709551615ull)}};
    for (const char* path : {"/kiln/v1/jobs", "/sdapi/v1/txt2img", "/v1/images/generations"}) {
        for (const auto& [field, value] : cases) {
            if (std::string(path) == "/v1/images/generations" && field == "width") continue;  // OpenAI: size
            json bad = good;
            bad[field] = value;
            auto r = client.Post(path, bad.dump(), "application/json");
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 400) << path << " " << field << " = " << value.dump();
            EXPECT_EQ(error_param(r), field) << path << " " << r->body;
        }
    }
}

TEST(ServerHostile, AnInitImageNotAMultipleOfEightIsRefusedBeforeQueueing) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    test::TempDir dir;
    image::Image odd;
    odd.width = 63;
    odd.height = 65;
    odd.channels = 3;
    odd.pixels.assign(size_t(63) * 65 * 3, 128);
    ASSERT_TRUE(image::write_image(dir.file("odd.png"), odd).ok());
    const std::string png = base64_encode(test::read_bytes(dir.file("odd.png")));
    auto native = client.Post("/kiln/v1/jobs", json{{"prompt", "x"}, {"init_image", png}, {"steps", 1}}.dump(),
                              "application/json");
    ASSERT_TRUE(native);
    EXPECT_EQ(native->status, 400) << native->body;
    EXPECT_NE(native->body.find("63x65"), std::string::npos) << native->body;
    auto a1111 = client.Post("/sdapi/v1/img2img", json{{"prompt", "x"}, {"init_images", {png}}, {"steps", 1}}.dump(),
                             "application/json");
    ASSERT_TRUE(a1111);
    EXPECT_EQ(a1111->status, 400) << a1111->body;
}

TEST(ServerHostile, AHugeResultIndexIsNotFound) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::string id = test::post_job(client, {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}});
    ASSERT_FALSE(id.empty());
    ASSERT_EQ(test::wait_for_state(client, id, "done"), "done");
    for (const std::string index : {"99999999999999999999", "18446744073709551616", "4294967296", "1"}) {
        auto r = client.Get(("/kiln/v1/results/" + id + "/" + index + ".png").c_str());
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 404) << index << ": " << r->body;
    }
    auto first = client.Get(("/kiln/v1/results/" + id + "/0.png").c_str());
    ASSERT_TRUE(first);
    EXPECT_EQ(first->status, 200);
}

// The default model of a folder is one kiln can run: not a LoRA (family
// "unknown") nor a diffusers folder whose model_index.json is broken, even
// when they sort first.
TEST(ServerHostile, TheDefaultModelIsARunnableOne) {
    test::TempDir dir;
    dir.write("a_broken/model_index.json", "{ not json");
    dir.write("b_lora.safetensors",
              test::build_safetensors({{"lora_unet_down.lora_up.weight", "F32", {2, 2}, test::f32_bytes(4)}}));
    std::filesystem::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file("c_sd1.safetensors"));
    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + dir.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json models = body_json(client.Get("/kiln/v1/models"));
    EXPECT_EQ(models["default"], "c_sd1.safetensors") << models.dump();
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/options"))["sd_model_checkpoint"], "c_sd1.safetensors");
}

// A safetensors header of a million tensors (60 MB) in the model folder is
// not parsed by the listing: the server stays small, the file is listed
// without a family and is not the default.
TEST(ServerHostile, AHugeSafetensorsHeaderIsNotParsedByTheListing) {
    test::TempDir dir;
    std::string header = "{";
    for (int i = 0; i < 1'000'000; ++i) {
        header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
    }
    header += "}";
    dir.write("a_huge.safetensors", test::raw_safetensors(header, test::f32_bytes(1)));
    std::filesystem::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file("b_sd1.safetensors"));
    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + dir.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    ASSERT_TRUE(client.Get("/health"));
    const uint64_t before = server.resident_bytes();
    const json models = body_json(client.Get("/kiln/v1/models"));
    const uint64_t after = server.resident_bytes();
    ASSERT_EQ(models["models"].size(), 2u) << models.dump();
    EXPECT_EQ(models["models"][0]["name"], "a_huge.safetensors");
    EXPECT_EQ(models["models"][0]["family"], "");
    EXPECT_EQ(models["default"], "b_sd1.safetensors");
    // The header's tree was most of a GB, kept after the reply.
    EXPECT_LT(after, before + (64ull << 20)) << "before " << before << ", after " << after;
    EXPECT_NE(server.log().find("a_huge.safetensors: a "), std::string::npos) << server.log();
}

// A hundred clients sending their request a byte at a time (each byte
// within httplib's read timeout, so none is dropped) hold a hundred
// connections: /health must still answer while they are open.
TEST(ServerHostile, SlowSendersLeaveHealthAnswering) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    std::vector<int> slow;
    for (int i = 0; i < 100; ++i) {
        const int fd = test::connect_loopback(server.port());
        ASSERT_GE(fd, 0);
        const std::string start = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
        ASSERT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
        slow.push_back(fd);
    }
    std::atomic<bool> done{false};
    std::thread trickle([&] {
        while (!done) {
            for (int fd : slow) ::send(fd, "a", 1, MSG_NOSIGNAL);
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
    });
    httplib::Client client("127.0.0.1", server.port());
    // Not a measure of speed: only so that a server that never answers fails the test.
    client.set_read_timeout(60, 0);
    auto health = client.Get("/health");
    done = true;
    trickle.join();
    for (int fd : slow) ::close(fd);
    ASSERT_TRUE(health) << "no answer with 100 slow senders connected";
    EXPECT_EQ(health->status, 200);
}

// A hires upscaler is named, never a path: a file name in a request would
// let a client learn which files the server has from its job's error.
TEST(ServerHostile, AHiresUpscalerIsNoPathToProbe) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json hires = {{"enabled", true}, {"upscaler", "/etc/passwd"}};
    for (const auto& [path, body] : std::vector<std::pair<std::string, json>>{
             {"/kiln/v1/jobs", {{"prompt", "x"}, {"hires", hires}}},
             {"/sdcpp/v1/img_gen", {{"prompt", "x"}, {"hires", hires}}},
             {"/sdapi/v1/txt2img", {{"prompt", "x"}, {"enable_hr", true}, {"hr_upscaler", "/etc/passwd"}}}}) {
        SCOPED_TRACE(path);
        auto r = client.Post(path, body.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << r->body;
        EXPECT_EQ(error_param(r), path == "/sdapi/v1/txt2img" ? "hr_upscaler" : "hires.upscaler") << r->body;
    }
    EXPECT_TRUE(body_json(client.Get("/kiln/v1/jobs"))["jobs"].empty()) << "a job was queued";
}

// A client that asks for an image synchronously and leaves before it is
// made (a closed browser tab, a killed script) has its job cancelled,
// A1111's and OpenAI's alike, and the server goes on serving.
TEST(ServerHostile, AClientThatLeavesCancelsItsSynchronousJob) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 10000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const std::vector<std::pair<std::string, json>> requests = {
        {"/sdapi/v1/txt2img", {{"prompt", "left behind"}, {"width", 32}, {"height", 32}, {"steps", 10000}}},
        {"/v1/images/generations", {{"prompt", "left behind"}, {"size", "32x32"}, {"steps", 10000}}}};
    for (const auto& [path, body] : requests) {
        SCOPED_TRACE(path);
        const int fd = test::connect_loopback(server.port());
        ASSERT_GE(fd, 0);
        const std::string text = body.dump();
        const std::string request = "POST " + path +
                                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                    "Content-Length: " +
                                    std::to_string(text.size()) + "\r\n\r\n" + text;
        ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
        // Its job runs (seen through A1111's progress) ...
        std::string id;
        for (int attempt = 0; attempt < 20000 && id.empty(); ++attempt) {
            const json state = body_json(client.Get("/sdapi/v1/progress"))["state"];
            if (state.value("sampling_step", 0) > 0) id = state.value("job", "");
            if (id.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        ASSERT_FALSE(id.empty()) << server.log();
        // ... until its client goes.
        ::close(fd);
        EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled");
    }
    EXPECT_NE(server.log().find("its client went away; cancelled"), std::string::npos) << server.log();
    auto after =
        client.Post("/sdapi/v1/txt2img", json{{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}}.dump(),
                    "application/json");
    ASSERT_TRUE(after);
    EXPECT_EQ(after->status, 200);
}

// /sdapi/v1/loras lists the adapters a prompt can use: not a file a
// symlink leads out of --lora-model-dir to.
TEST(ServerHostile, LorasOutsideTheLoraFolderAreNotListed) {
    test::TempDir outside, loras;
    const std::string secret = outside.write("secret.safetensors", std::string("x"));
    loras.write("inside.safetensors", std::string("x"));
    std::filesystem::create_symlink(secret, loras.file("escape.safetensors"));
    ServerProcess server(test::tiny_server_flags() + "--lora-model-dir " + loras.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json listed = body_json(client.Get("/sdapi/v1/loras"));
    ASSERT_EQ(listed.size(), 1u) << listed.dump();
    EXPECT_EQ(listed[0]["name"], "inside");
}

}  // namespace
}  // namespace kiln
