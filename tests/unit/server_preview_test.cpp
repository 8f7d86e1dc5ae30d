// kiln serve's live previews over real HTTP on 127.0.0.1: in the native job's
// step events, per request and from the server's --preview flags; in A1111's
// /sdapi/v1/progress as current_image; and the 400s for bad preview fields.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "server_test_support.h"

namespace kiln {
namespace {

using test::json;

// The steps whose events carried a preview, and the previews, decoded.
struct StreamedPreviews {
    std::vector<int> step_events;  // every step event's step
    std::vector<int> steps;        // those that had a preview
    std::vector<image::Image> images;
};

StreamedPreviews previews_of(int port, const std::string& job_id) {
    StreamedPreviews out;
    for (const test::ServerEvent& e : test::read_event_stream(port, job_id)) {
        if (e.type != "step") continue;
        out.step_events.push_back(e.data["step"]);
        if (!e.data.contains("preview")) continue;
        out.steps.push_back(e.data["step"]);
        out.images.push_back(test::decode_base64_image(e.data["preview"]));
    }
    return out;
}

// Every RGB pixel equal to the one before it.
bool one_colour(const image::Image& img) {
    return img.pixels.size() < 3 || std::equal(img.pixels.begin() + 3, img.pixels.end(), img.pixels.begin());
}

const json kJob = {{"prompt", "a red circle"}, {"width", 64}, {"height", 48}, {"steps", 4}, {"seed", 3}};

TEST(ServerPreview, StepEventsCarryPngPreviewsAtTheRequestedInterval) {
    test::ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());

    json every_step = kJob;
    every_step["preview"] = "proj";
    every_step["preview_interval"] = 1;
    const std::string id = test::post_job(client, every_step);
    ASSERT_FALSE(id.empty());
    const StreamedPreviews all = previews_of(server.port(), id);
    EXPECT_EQ(all.step_events, (std::vector<int>{1, 2, 3, 4}));
    EXPECT_EQ(all.steps, (std::vector<int>{1, 2, 3, 4}));
    for (const image::Image& img : all.images) {
        // proj: one pixel per latent pixel; the tiny SD1 model's VAE downscales 2x.
        EXPECT_EQ(img.width, 32);
        EXPECT_EQ(img.height, 24);
        EXPECT_EQ(img.channels, 3);
    }
    ASSERT_EQ(all.images.size(), 4u);
    EXPECT_FALSE(one_colour(all.images.back()));

    // The latest preview is in the job's state only when asked for.
    auto plain = test::body_json(client.Get(("/kiln/v1/jobs/" + id).c_str()));
    EXPECT_FALSE(plain.contains("preview"));
    auto with_preview = test::body_json(client.Get(("/kiln/v1/jobs/" + id + "?preview=1").c_str()));
    ASSERT_TRUE(with_preview["preview"].is_string()) << with_preview.dump().substr(0, 200);
    EXPECT_EQ(test::decode_base64_image(with_preview["preview"]).pixels, all.images.back().pixels);

    json every_other = kJob;
    every_other["preview"] = "proj";
    every_other["preview_interval"] = 2;
    const StreamedPreviews some = previews_of(server.port(), test::post_job(client, every_other));
    EXPECT_EQ(some.step_events, (std::vector<int>{1, 2, 3, 4}));
    EXPECT_EQ(some.steps, (std::vector<int>{2, 4}));

    json none = kJob;
    none["preview"] = "none";
    const std::string none_id = test::post_job(client, none);
    const StreamedPreviews no_previews = previews_of(server.port(), none_id);
    EXPECT_EQ(no_previews.step_events, (std::vector<int>{1, 2, 3, 4}));
    EXPECT_TRUE(no_previews.steps.empty());
    EXPECT_TRUE(test::body_json(client.Get(("/kiln/v1/jobs/" + none_id + "?preview=1").c_str()))["preview"].is_null());

    // Without a preview field, the server's default: proj at every step.
    const StreamedPreviews by_default = previews_of(server.port(), test::post_job(client, kJob));
    EXPECT_EQ(by_default.steps, (std::vector<int>{1, 2, 3, 4}));
    // Later jobs have run: the first one's previews are gone (only the last two jobs keep any).
    EXPECT_TRUE(test::body_json(client.Get(("/kiln/v1/jobs/" + id + "?preview=1").c_str()))["preview"].is_null());
    for (const test::ServerEvent& e : test::read_event_stream(server.port(), id)) {
        EXPECT_FALSE(e.data.contains("preview")) << e.type;
    }
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerPreview, ServerFlagsSetTheDefaultAndARequestOverridesIt) {
    test::ServerProcess server(test::tiny_server_flags() + " --preview none --preview-interval 3");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    EXPECT_TRUE(previews_of(server.port(), test::post_job(client, kJob)).steps.empty());
    json asked = kJob;
    asked["preview"] = "vae";  // the image's size; the server's interval
    const StreamedPreviews vae = previews_of(server.port(), test::post_job(client, asked));
    EXPECT_EQ(vae.steps, (std::vector<int>{3}));
    ASSERT_EQ(vae.images.size(), 1u);
    EXPECT_EQ(vae.images[0].width, 64);
    EXPECT_EQ(vae.images[0].height, 48);
    // tae without --taesd decodes with the VAE, and the server's log says so.
    json tae = kJob;
    tae["preview"] = "tae";
    const StreamedPreviews from_vae = previews_of(server.port(), test::post_job(client, tae));
    ASSERT_EQ(from_vae.images.size(), 1u);
    EXPECT_EQ(from_vae.images[0].pixels, vae.images[0].pixels);
    EXPECT_EQ(server.stop(SIGTERM), 0);
    EXPECT_NE(server.log().find("preview tae without --taesd"), std::string::npos) << server.log();
}

// preview_noisy (sd-cli's --preview-noisy): previews of the noisy latent, per
// job or from the server's flag; the same job's denoised previews differ.
TEST(ServerPreview, NoisyPreviewsPerJobAndFromTheServerFlag) {
    test::ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    json denoised = kJob;
    denoised["preview"] = "proj";
    json noisy = denoised;
    noisy["preview_noisy"] = true;
    const StreamedPreviews clean = previews_of(server.port(), test::post_job(client, denoised));
    const StreamedPreviews with_noise = previews_of(server.port(), test::post_job(client, noisy));
    ASSERT_EQ(clean.images.size(), 4u);
    ASSERT_EQ(with_noise.images.size(), 4u);
    EXPECT_NE(clean.images[0].pixels, with_noise.images[0].pixels);
    json bad = kJob;
    bad["preview_noisy"] = "yes";
    int status = 0;
    EXPECT_TRUE(test::post_job(client, bad, &status).empty());
    EXPECT_EQ(status, 400);
    EXPECT_EQ(server.stop(SIGTERM), 0);

    test::ServerProcess noisy_server(test::tiny_server_flags() + " --preview-noisy --preview-path ignored.png");
    ASSERT_TRUE(noisy_server.started()) << noisy_server.log();
    EXPECT_NE(noisy_server.log().find("--preview-path is ignored"), std::string::npos) << noisy_server.log();
    httplib::Client noisy_client("127.0.0.1", noisy_server.port());
    const StreamedPreviews by_flag = previews_of(noisy_server.port(), test::post_job(noisy_client, denoised));
    ASSERT_EQ(by_flag.images.size(), 4u);
    EXPECT_EQ(by_flag.images[0].pixels, with_noise.images[0].pixels);
    json asked_clean = denoised;
    asked_clean["preview_noisy"] = false;
    const StreamedPreviews overridden = previews_of(noisy_server.port(), test::post_job(noisy_client, asked_clean));
    ASSERT_EQ(overridden.images.size(), 4u);
    EXPECT_EQ(overridden.images[0].pixels, clean.images[0].pixels);
    EXPECT_EQ(noisy_server.stop(SIGTERM), 0);
}

TEST(ServerPreview, BadA1111PreviewSettingsGet400NamingTheField) {
    test::ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    // The native job's preview fields are among ServerApi.BadRequestsGet400NamingTheField's.
    const std::vector<std::pair<std::string, json>> a1111 = {{"live_previews_enable", "yes"},
                                                             {"show_progress_every_n_steps", -2},
                                                             {"show_progress_every_n_steps", "x"}};
    for (const auto& [field, value] : a1111) {
        auto option = client.Post("/sdapi/v1/options", json{{field, value}}.dump(), "application/json");
        ASSERT_TRUE(option);
        EXPECT_EQ(option->status, 400) << field << "=" << value.dump();
        EXPECT_EQ(test::error_param(option), field) << option->body;
        json txt2img = {{"prompt", "x"}, {"steps", 1}, {"override_settings", {{field, value}}}};
        auto r = client.Post("/sdapi/v1/txt2img", txt2img.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << field << "=" << value.dump();
        EXPECT_EQ(test::error_param(r), field) << r->body;
    }
    // A refused options body changed nothing.
    const json options = test::body_json(client.Get("/sdapi/v1/options"));
    EXPECT_EQ(options["live_previews_enable"], true);
    EXPECT_EQ(options["show_progress_every_n_steps"], 1);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// Two clients setting different A1111 preview settings at once both keep
// theirs, round after round (each POST reads, merges and writes the settings).
TEST(ServerPreview, ConcurrentOptionsPostsKeepEveryField) {
    test::ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    for (int round = 0; round < 40; ++round) {
        const bool enable = round % 2 == 1;
        const int every = 2 + round % 5;
        auto post = [&](const json& body) {
            httplib::Client c("127.0.0.1", server.port());
            auto r = c.Post("/sdapi/v1/options", body.dump(), "application/json");
            return r ? r->status : 0;
        };
        auto a = std::async(std::launch::async, post, json{{"live_previews_enable", enable}});
        auto b = std::async(std::launch::async, post, json{{"show_progress_every_n_steps", every}});
        ASSERT_EQ(a.get(), 200);
        ASSERT_EQ(b.get(), 200);
        const json options = test::body_json(client.Get("/sdapi/v1/options"));
        ASSERT_EQ(options["live_previews_enable"], enable) << "round " << round;
        ASSERT_EQ(options["show_progress_every_n_steps"], every) << "round " << round;
    }
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// Polls A1111's progress until the running job's preview shows (or it ends); the last reply.
json progress_with_image(httplib::Client& client, const std::string& query = "") {
    json progress;
    for (int i = 0; i < 20000; ++i) {
        progress = test::body_json(client.Get(("/sdapi/v1/progress" + query).c_str()));
        if (!progress["current_image"].is_null() || progress["state"]["job"] == "") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return progress;
}

// A long A1111 txt2img with `overrides`, interrupted once 4 steps are done;
// returns its job id (from /progress) and the last progress seen while it
// ran. It answers 200 with the image it had, as A1111's does.
std::string interrupted_txt2img(httplib::Client& client, int port, const json& overrides, json* last_progress) {
    auto status = std::async(std::launch::async, [port, overrides] {
        httplib::Client a1111("127.0.0.1", port);
        a1111.set_read_timeout(120, 0);
        const json body = {{"prompt", "a long job"},
                           {"width", 32},
                           {"height", 32},
                           {"steps", 3000},
                           {"override_settings", overrides}};
        auto r = a1111.Post("/sdapi/v1/txt2img", body.dump(), "application/json");
        if (!r || r->status != 200) return r ? r->status : 0;
        const json reply = test::body_json(r);
        const image::Image image = test::decode_base64_image(reply["images"][0]);
        return image.width == 32 && image.height == 32 ? 200 : -1;
    });
    std::string id;
    for (int i = 0; i < 20000; ++i) {
        *last_progress = test::body_json(client.Get("/sdapi/v1/progress"));
        const json state = last_progress->value("state", json::object());
        id = state.value("job", "");
        if (!id.empty() && state.value("sampling_step", 0) >= 4) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    client.Post("/sdapi/v1/interrupt", "", "application/json");
    EXPECT_EQ(status.get(), 200);
    return id;
}

TEST(ServerPreview, A1111ProgressShowsTheRunningJobsPreview) {
    test::ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    EXPECT_TRUE(test::body_json(client.Get("/sdapi/v1/progress"))["current_image"].is_null());  // idle

    const json long_job = {{"prompt", "a long job"}, {"width", 32}, {"height", 32}, {"steps", 3000}};
    const std::string id = test::post_job(client, long_job);
    ASSERT_FALSE(id.empty());
    json progress = progress_with_image(client);
    ASSERT_EQ(progress["state"]["job"], id) << "the job ended before a preview showed";
    ASSERT_TRUE(progress["current_image"].is_string());
    const std::string current = progress["current_image"];
    EXPECT_EQ(current.rfind("data:", 0), std::string::npos);  // A1111's: no data: prefix
    const image::Image shown = test::decode_base64_image(current);
    EXPECT_EQ(shown.width, 16);
    EXPECT_EQ(shown.height, 16);
    auto skipped = test::body_json(client.Get("/sdapi/v1/progress?skip_current_image=true"));
    EXPECT_EQ(skipped["state"]["job"], id);
    EXPECT_TRUE(skipped["current_image"].is_null());
    ASSERT_TRUE(client.Post("/sdapi/v1/interrupt", "", "application/json"));
    EXPECT_EQ(test::wait_for_state(client, id, "done"), "done");
    // Once a client has seen it end, it is no longer the running job (an
    // interrupt then would cancel nothing, and the next job would run on).
    EXPECT_EQ(test::body_json(client.Get("/sdapi/v1/progress"))["state"]["job"], "");

    // A1111's settings, server-wide through /sdapi/v1/options: every 2nd step.
    auto set = client.Post("/sdapi/v1/options", R"({"show_progress_every_n_steps": 2})", "application/json");
    ASSERT_TRUE(set);
    EXPECT_EQ(set->status, 200) << set->body;
    EXPECT_EQ(test::body_json(client.Get("/sdapi/v1/options"))["show_progress_every_n_steps"], 2);
    json last_progress;
    const std::string every_other = interrupted_txt2img(client, server.port(), json::object(), &last_progress);
    ASSERT_FALSE(every_other.empty());
    const StreamedPreviews even = previews_of(server.port(), every_other);
    ASSERT_GE(even.steps.size(), 2u);
    for (int step : even.steps) EXPECT_EQ(step % 2, 0) << step;
    EXPECT_EQ(even.steps.size(), even.step_events.size() / 2);

    // And per request: live previews off makes none.
    const std::string off =
        interrupted_txt2img(client, server.port(), {{"live_previews_enable", false}}, &last_progress);
    ASSERT_FALSE(off.empty());
    EXPECT_TRUE(last_progress["current_image"].is_null());
    const StreamedPreviews none = previews_of(server.port(), off);
    EXPECT_GE(none.step_events.size(), 4u);
    EXPECT_TRUE(none.steps.empty());
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln
