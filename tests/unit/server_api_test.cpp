// kiln serve over real HTTP on 127.0.0.1: the native jobs API, OpenAI's and
// A1111's, each endpoint's success and its error statuses. The images a
// server makes must equal the CLI's for the same parameters.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "image/image_io.h"
#include "image/video_file.h"
#include "server_test_support.h"
#include "test_files.h"

namespace kiln {
namespace {

using test::body_json;
using test::error_param;
using test::json;
using test::post_job;
using test::ServerProcess;

// A job long enough to still be running when the test acts on it; it is
// always cancelled, never waited for.
const json kLongJob = {{"prompt", "a long job"}, {"width", 32}, {"height", 32}, {"steps", 3000}};

TEST(ServerApi, NativeJobRunsToDoneWithEventsAndTheCliImage) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json job = {{"prompt", "a red circle"}, {"width", 32},     {"height", 48},         {"steps", 3},
                      {"seed", 5},                {"cfg_scale", 4}, {"sampler", "euler"}, {"negative_prompt", "blurry"}};
    auto posted = client.Post("/kiln/v1/jobs", job.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const std::string id = body_json(posted)["id"];
    EXPECT_EQ(body_json(posted)["position"], 0);

    const auto events = test::read_events(server.port(), id);
    EXPECT_EQ(events, (std::vector<std::string>{"queued", "started", "phase", "step", "step", "step", "phase", "done"}));

    auto got = client.Get(("/kiln/v1/jobs/" + id).c_str());
    ASSERT_TRUE(got);
    ASSERT_EQ(got->status, 200);
    const json state = body_json(got);
    EXPECT_EQ(state["state"], "done");
    EXPECT_EQ(state["step"], 3);
    EXPECT_EQ(state["steps"], 3);
    EXPECT_EQ(state["progress"], 1.0);
    ASSERT_EQ(state["results"].size(), 1u);
    const json& result = state["results"][0];
    EXPECT_EQ(result["seed"], 5);
    EXPECT_NE(result["parameters"].get<std::string>().find("Steps: 3, Sampler: Euler, Schedule type: discrete, CFG "
                                                          "scale: 4, Seed: 5, Size: 32x48"),
              std::string::npos)
        << result["parameters"];
    const image::Image served = test::decode_base64_image(result["image"]);
    const image::Image cli = test::cli_image(
        test::tiny_server_flags(), "-p \"a red circle\" -n blurry -W 32 -H 48 --steps 3 -s 5 --cfg-scale 4 --sampling-method euler");
    ASSERT_EQ(served.width, 32);
    ASSERT_EQ(served.height, 48);
    EXPECT_EQ(served.pixels, cli.pixels);

    // The same image by URL.
    auto file = client.Get(result["url"].get<std::string>().c_str());
    ASSERT_TRUE(file);
    EXPECT_EQ(file->status, 200);
    EXPECT_EQ(file->get_header_value("Content-Type"), "image/png");
    EXPECT_EQ(file->body.substr(1, 3), "PNG");

    auto models = client.Get("/kiln/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(body_json(models)["models"][0]["name"], "sd1_tiny.safetensors");
    EXPECT_EQ(body_json(models)["models"][0]["family"], "SD1.x");
    EXPECT_EQ(body_json(models)["models"][0]["loaded"], true);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, OpenAiGenerationsEditsAndModels) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    auto models = client.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(body_json(models)["data"][0]["id"], "sd1_tiny.safetensors");

    // An SDK's default model name means the server's model.
    json request = {{"model", "dall-e-3"}, {"prompt", "a red circle"}, {"n", 2}, {"size", "32x32"}, {"seed", 3}, {"steps", 2}};
    auto generated = client.Post("/v1/images/generations", request.dump(), "application/json");
    ASSERT_TRUE(generated);
    ASSERT_EQ(generated->status, 200) << generated->body;
    const json data = body_json(generated)["data"];
    ASSERT_EQ(data.size(), 2u);
    const image::Image first = test::decode_base64_image(data[0]["b64_json"]);
    const image::Image second = test::decode_base64_image(data[1]["b64_json"]);
    EXPECT_EQ(first.width, 32);
    EXPECT_EQ(second.height, 32);
    EXPECT_NE(first.pixels, second.pixels);  // seeds 3 and 4

    request["n"] = 1;
    request["response_format"] = "url";
    request["output_format"] = "jpeg";
    auto by_url = client.Post("/v1/images/generations", request.dump(), "application/json");
    ASSERT_TRUE(by_url);
    ASSERT_EQ(by_url->status, 200) << by_url->body;
    const std::string url = body_json(by_url)["data"][0]["url"];
    const std::string prefix = "http://127.0.0.1:" + std::to_string(server.port());
    ASSERT_EQ(url.rfind(prefix, 0), 0u) << url;
    auto jpeg = client.Get(url.substr(prefix.size()).c_str());
    ASSERT_TRUE(jpeg);
    EXPECT_EQ(jpeg->get_header_value("Content-Type"), "image/jpeg");
    EXPECT_EQ(static_cast<unsigned char>(jpeg->body[0]), 0xFF);
    EXPECT_EQ(static_cast<unsigned char>(jpeg->body[1]), 0xD8);

    for (const auto& [field, value] : {std::pair<std::string, json>{"size", "32"}, {"n", 0}, {"response_format", "gif"},
                                       {"model", "no-such-model"}}) {
        json bad = request;
        bad[field] = value;
        auto r = client.Post("/v1/images/generations", bad.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << field;
        EXPECT_EQ(error_param(r), field) << r->body;
    }

    // Edits: the first image, its right half masked white (repaint); the
    // same as the CLI's inpainting with those files.
    test::TempDir dir;
    ASSERT_TRUE(image::write_image(dir.file("in.png"), first).ok());
    image::Image mask{32, 32, 3, std::vector<uint8_t>(32 * 32 * 3, 0)};
    for (int y = 0; y < 32; ++y)
        for (int x = 16; x < 32; ++x) std::fill_n(mask.pixel(x, y), 3, 255);
    ASSERT_TRUE(image::write_image(dir.file("mask.png"), mask).ok());
    const std::vector<uint8_t> png = test::read_bytes(dir.file("in.png"));
    const std::vector<uint8_t> mask_png = test::read_bytes(dir.file("mask.png"));
    httplib::MultipartFormDataItems form = {
        {"image", std::string(png.begin(), png.end()), "in.png", "image/png"},
        {"mask", std::string(mask_png.begin(), mask_png.end()), "mask.png", "image/png"},
        {"prompt", "a blue square", "", ""},
        {"steps", "2", "", ""},
        {"seed", "9", "", ""},
    };
    auto edited = client.Post("/v1/images/edits", form);
    ASSERT_TRUE(edited);
    ASSERT_EQ(edited->status, 200) << edited->body;
    const image::Image out = test::decode_base64_image(body_json(edited)["data"][0]["b64_json"]);
    ASSERT_EQ(out.width, 32);
    EXPECT_EQ(out.pixels, test::cli_image(test::tiny_server_flags(), "-p \"a blue square\" --steps 2 -s 9 -i " +
                                                                         dir.file("in.png") + " --mask " +
                                                                         dir.file("mask.png") + " --strength 1")
                              .pixels);

    form[0].content = "this is not an image";
    auto not_image = client.Post("/v1/images/edits", form);
    ASSERT_TRUE(not_image);
    EXPECT_EQ(not_image->status, 400);
    EXPECT_EQ(error_param(not_image), "image") << not_image->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// An edit model (Qwen-Image-Edit's tiny parts, tests/unit/qwen_image_edit_test.cpp):
// OpenAI's edit takes the image as a reference and makes the CLI's -r image;
// past the limit, a 400 before any decoding.
TEST(ServerApi, EditModelsTakeTheImagesAsReferences) {
    const std::string parts = test::golden_path("pipeline/qwen_image_edit_tiny/");
    const std::string flags = test::tiny_edit_model_flags();
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const std::vector<uint8_t> png = test::read_bytes(parts + "ref.png");
    const std::string ref(png.begin(), png.end());
    httplib::MultipartFormDataItems form = {
        {"image[]", ref, "ref.png", "image/png"},
        {"prompt", "make the cat blue", "", ""},
        {"size", "64x48", "", ""},
        {"steps", "2", "", ""},
        {"seed", "11", "", ""},
    };
    auto edited = client.Post("/v1/images/edits", form);
    ASSERT_TRUE(edited);
    ASSERT_EQ(edited->status, 200) << edited->body;
    const image::Image out = test::decode_base64_image(body_json(edited)["data"][0]["b64_json"]);
    const image::Image cli =
        test::cli_image(flags, "-p \"make the cat blue\" -W 64 -H 48 --steps 2 -s 11 -r " + parts + "ref.png");
    ASSERT_EQ(cli.width, 64);
    EXPECT_EQ(out.pixels, cli.pixels);

    for (int i = 0; i < 8; ++i) form.push_back({"image[]", ref, "ref.png", "image/png"});
    auto too_many = client.Post("/v1/images/edits", form);
    ASSERT_TRUE(too_many);
    EXPECT_EQ(too_many->status, 400);
    EXPECT_EQ(error_param(too_many), "image") << too_many->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A video model's job in kiln's job API: a clip of 5 frames comes back as a
// WebM file (VP8) holding the job's parameters, served by URL as video/webm
// and equal, frame for frame, to what kiln -M vid_gen makes; a clip asked as
// PNG is a 400 naming output_format.
TEST(ServerApi, VideoJobsReturnTheClipAsAVideoFile) {
    const std::string flags = test::tiny_video_model_flags();
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json job = {{"prompt", "a red cat"}, {"width", 64}, {"height", 48}, {"steps", 2}, {"seed", 11},
                      {"video_frames", 5},     {"fps", 8}};
    auto posted = client.Post("/kiln/v1/jobs", job.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const std::string id = body_json(posted)["id"];
    const auto events = test::read_events(server.port(), id);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "done");
    // 5 frames are 2 latent frames: a decode event after each.
    EXPECT_EQ(std::count(events.begin(), events.end(), "decode"), 2);
    const json state = body_json(client.Get("/kiln/v1/jobs/" + id));
    ASSERT_EQ(state["results"].size(), 1u) << state.dump();
    const json& result = state["results"][0];
    EXPECT_EQ(result["format"], "webm");
    EXPECT_NE(result["parameters"].get<std::string>().find("Frames: 5"), std::string::npos) << result["parameters"];
    auto served = client.Get(result["url"].get<std::string>());
    ASSERT_TRUE(served);
    ASSERT_EQ(served->status, 200);
    EXPECT_EQ(served->get_header_value("Content-Type"), "video/webm");
    test::TempDir dir;
    const std::string served_path = dir.write("served.webm", served->body);
    auto parameters = image::read_video_parameters(served_path);
    ASSERT_TRUE(parameters.ok()) << parameters.error().message;
    EXPECT_EQ(*parameters, result["parameters"].get<std::string>());
    // kiln -M vid_gen's file of the same job: the same clip, frame for frame.
    const std::string cli_path = dir.file("cli.webm");
    auto cli = test::run_command(
        std::string(KILN_BIN) + " " + flags +
        " -M vid_gen -p \"a red cat\" -W 64 -H 48 --steps 2 -s 11 --video-frames 5 --fps 8 -o " + cli_path);
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    for (const std::string name : {"served", "cli"})
        ASSERT_EQ(test::decode_video_frames(dir.file(name + ".webm"), dir.file(name)), "");
    for (int f = 0; f < 5; ++f) {
        auto want = image::read_image(dir.file("cli_" + std::to_string(f) + ".png"));
        auto got = image::read_image(dir.file("served_" + std::to_string(f) + ".png"));
        ASSERT_TRUE(want.ok() && got.ok()) << f;
        EXPECT_EQ(got->pixels, want->pixels) << "frame " << f;
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("served_5.png")));

    auto as_png =
        client.Post("/kiln/v1/jobs", json{{"prompt", "x"}, {"video_frames", 5}, {"output_format", "png"}}.dump(),
                    "application/json");
    ASSERT_TRUE(as_png);
    EXPECT_EQ(as_png->status, 400);
    EXPECT_EQ(error_param(as_png), "output_format") << as_png->body;
    auto too_long =
        client.Post("/kiln/v1/jobs", json{{"prompt", "x"}, {"video_frames", 10000}}.dump(), "application/json");
    ASSERT_TRUE(too_long);
    EXPECT_EQ(too_long->status, 400);
    EXPECT_EQ(error_param(too_long), "video_frames") << too_long->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, A1111Txt2ImgImg2ImgAndLists) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    const json txt2img = {{"prompt", "a red circle"}, {"negative_prompt", "blurry"}, {"seed", 7},   {"steps", 2},
                          {"cfg_scale", 5},             {"width", 32},                {"height", 32}, {"batch_size", 2},
                          {"sampler_name", "Euler a"},  {"scheduler", "karras"},
                          {"override_settings", {{"sd_model_checkpoint", "sd1_tiny"}}}};
    auto r = client.Post("/sdapi/v1/txt2img", txt2img.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json reply = body_json(r);
    ASSERT_EQ(reply["images"].size(), 2u);
    const json info = json::parse(reply["info"].get<std::string>());
    EXPECT_EQ(info["all_seeds"], json::array({7, 8}));
    EXPECT_EQ(info["sampler_name"], "Euler a");
    EXPECT_EQ(info["sd_model_name"], "sd1_tiny");
    EXPECT_NE(info["infotexts"][1].get<std::string>().find("Sampler: Euler a, Schedule type: karras, CFG scale: 5, Seed: 8"),
              std::string::npos)
        << info["infotexts"][1];
    EXPECT_EQ(reply["parameters"]["prompt"], "a red circle");
    const image::Image second = test::decode_base64_image(reply["images"][1]);
    EXPECT_EQ(second.pixels,
              test::cli_image(test::tiny_server_flags(), "-p \"a red circle\" -n blurry -W 32 -H 32 --steps 2 -s 8 "
                                                         "--cfg-scale 5 --sampling-method euler_a --scheduler karras")
                  .pixels);
    // A1111's eta, as sd-cli's --eta.
    json with_eta = txt2img;
    with_eta["eta"] = 0.25;
    with_eta["batch_size"] = 1;
    auto eta_reply = client.Post("/sdapi/v1/txt2img", with_eta.dump(), "application/json");
    ASSERT_TRUE(eta_reply && eta_reply->status == 200) << (eta_reply ? eta_reply->body : "no response");
    EXPECT_EQ(test::decode_base64_image(body_json(eta_reply)["images"][0]).pixels,
              test::cli_image(test::tiny_server_flags(), "-p \"a red circle\" -n blurry -W 32 -H 32 --steps 2 -s 7 "
                                                         "--cfg-scale 5 --sampling-method euler_a --scheduler karras "
                                                         "--eta 0.25")
                  .pixels);

    json img2img = {{"prompt", "a blue square"}, {"init_images", {reply["images"][0]}}, {"denoising_strength", 0.5},
                    {"steps", 4},                {"width", 48},                         {"height", 40}};
    // An img2img request's first image; a failed request fails the test.
    auto first_image = [&](const json& request) {
        auto r = client.Post("/sdapi/v1/img2img", request.dump(), "application/json");
        EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
        return r && r->status == 200 ? test::decode_base64_image(body_json(r)["images"][0]) : image::Image{};
    };
    // As A1111: the 32x32 init image is resized to the requested size first.
    const image::Image i2i_image = first_image(img2img);
    EXPECT_EQ(i2i_image.width, 48);
    EXPECT_EQ(i2i_image.height, 40);
    json unsized = img2img;
    unsized.erase("width");
    unsized.erase("height");
    EXPECT_EQ(first_image(unsized).width, 32);  // the init image's size
    // A1111's resize modes (tools/server/a1111_resize.h, checked against A1111's
    // code in ServerImages.A1111ResizeModesMatchA1111): crop and fill give
    // other init images, so other results, at the requested size.
    std::vector<std::vector<uint8_t>> by_mode = {i2i_image.pixels};
    for (int mode : {1, 2}) {
        json moded = img2img;
        moded["resize_mode"] = mode;
        const image::Image result = first_image(moded);
        EXPECT_EQ(result.width, 48);
        EXPECT_EQ(result.height, 40);
        for (const auto& other : by_mode) EXPECT_NE(result.pixels, other) << "resize_mode " << mode;
        by_mode.push_back(result.pixels);
    }
    // Latent upscale: the 32x32 init image's latent is resized to 48x40.
    json latent = img2img;
    latent["resize_mode"] = 3;
    const image::Image latent_result = first_image(latent);
    EXPECT_EQ(latent_result.width, 48);
    EXPECT_EQ(latent_result.height, 40);
    for (const auto& other : by_mode) EXPECT_NE(latent_result.pixels, other) << "resize_mode 3";
    latent["mask"] = reply["images"][0];  // A1111 cannot do that either
    json no_mode = img2img;
    no_mode["resize_mode"] = 4;
    for (const json& bad : {latent, no_mode}) {
        auto r = client.Post("/sdapi/v1/img2img", bad.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << r->body;
        EXPECT_EQ(error_param(r), "resize_mode");
    }

    img2img["init_images"] = json::array({"bm90IGFuIGltYWdl"});  // "not an image"
    auto bad_image = client.Post("/sdapi/v1/img2img", img2img.dump(), "application/json");
    ASSERT_TRUE(bad_image);
    EXPECT_EQ(bad_image->status, 400);
    EXPECT_EQ(error_param(bad_image), "init_images[0]") << bad_image->body;

    json bad_sampler = txt2img;
    bad_sampler["sampler_name"] = "Nope";
    auto sampler = client.Post("/sdapi/v1/txt2img", bad_sampler.dump(), "application/json");
    ASSERT_TRUE(sampler);
    EXPECT_EQ(sampler->status, 400);
    EXPECT_EQ(error_param(sampler), "sampler_name");

    auto samplers = body_json(client.Get("/sdapi/v1/samplers"));
    EXPECT_EQ(samplers[0]["name"], "Euler a");
    EXPECT_EQ(samplers.size(), 11u);
    auto schedulers = body_json(client.Get("/sdapi/v1/schedulers"));
    EXPECT_EQ(schedulers[2]["name"], "karras");
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/loras")), json::array());
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/upscalers")), json::array());
    auto models = body_json(client.Get("/sdapi/v1/sd-models"));
    EXPECT_EQ(models[0]["title"], "sd1_tiny.safetensors");
    EXPECT_EQ(models[0]["model_name"], "sd1_tiny");
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/options"))["sd_model_checkpoint"], "sd1_tiny.safetensors");
    auto bad_option = client.Post("/sdapi/v1/options", R"({"sd_model_checkpoint": "other.safetensors"})", "application/json");
    ASSERT_TRUE(bad_option);
    EXPECT_EQ(bad_option->status, 400);
    EXPECT_EQ(error_param(bad_option), "sd_model_checkpoint");
    auto good_option = client.Post("/sdapi/v1/options", R"({"sd_model_checkpoint": "sd1_tiny.safetensors"})", "application/json");
    ASSERT_TRUE(good_option);
    EXPECT_EQ(good_option->status, 200);

    // Progress while a job runs; interrupt ends it with the image it has (A1111's).
    const std::string id = post_job(client, kLongJob);
    ASSERT_FALSE(id.empty());
    ASSERT_EQ(test::wait_for_state(client, id, "running"), "running");
    json progress;
    do {
        progress = body_json(client.Get("/sdapi/v1/progress"));
    } while (progress["state"]["sampling_step"] == 0);
    EXPECT_EQ(progress["state"]["job"], id);
    EXPECT_EQ(progress["state"]["sampling_steps"], 3000);
    EXPECT_GT(progress["progress"].get<double>(), 0.0);
    auto interrupted = client.Post("/sdapi/v1/interrupt", "", "application/json");
    ASSERT_TRUE(interrupted);
    EXPECT_EQ(interrupted->status, 200);
    EXPECT_EQ(test::wait_for_state(client, id, "done"), "done");
    const json done = body_json(client.Get("/kiln/v1/jobs/" + id));
    ASSERT_EQ(done["results"].size(), 1u);
    EXPECT_NE(done["results"][0]["parameters"].get<std::string>().find("Steps: 3000"), std::string::npos);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, BadRequestsGet400NamingTheField) {
    ServerProcess server(test::tiny_server_flags() + " --max-width 256 --max-height 256 --max-steps 50 --max-batch 2 "
                                                     "--max-body-bytes 100000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json good = {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}};
    const std::vector<std::pair<std::string, json>> cases = {
        {"width", "wide"},           {"width", 512},          {"height", 36},          {"height", 1024},  {"steps", 51},
        {"steps", 2.5},              {"batch_count", 3},      {"cfg_scale", "x"}, {"seed", -2},
        {"sampler", "nope"},         {"scheduler", "nope"},   {"prompt", 42},    {"model", "../sd1_tiny.safetensors"},
        {"model", "/etc/passwd"},    {"model", "other.gguf"}, {"init_image", "!!not base64!!"},
        {"init_image", "aGVsbG8gd29ybGQ="},  // "hello world"
        {"mask", "aGVsbG8gd29ybGQ="},        {"output_format", "gif"}, {"strength", 2},
        {"preview", "fast"},         {"preview", 1},          {"preview_interval", 0}, {"preview_interval", "often"},
        {"preview_interval", 10001}, {"eta", 2},             {"eta", "x"},
        {"cache_mode", "fastcache"}, {"cache_option", "threshold=1"}, {"scm_mask", "1,0"}, {"scm_policy", "sometimes"}};
    for (const auto& [field, value] : cases) {
        json bad = good;
        bad[field] = value;
        auto r = client.Post("/kiln/v1/jobs", bad.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << field << " = " << value.dump();
        EXPECT_EQ(error_param(r), field) << r->body;
        EXPECT_EQ(body_json(r)["error"]["message"].get<std::string>().rfind(field, 0), 0u) << r->body;
    }
    auto prompt = client.Post("/kiln/v1/jobs", json{{"prompt", std::string(20000, 'a')}}.dump(), "application/json");
    ASSERT_TRUE(prompt);
    EXPECT_EQ(prompt->status, 400);
    EXPECT_EQ(error_param(prompt), "prompt");

    auto not_json = client.Post("/kiln/v1/jobs", "{\"prompt\": ", "application/json");
    ASSERT_TRUE(not_json);
    EXPECT_EQ(not_json->status, 400);
    EXPECT_EQ(error_param(not_json), "body");
    auto array = client.Post("/kiln/v1/jobs", "[1, 2]", "application/json");
    ASSERT_TRUE(array);
    EXPECT_EQ(error_param(array), "body");

    // Over --max-body-bytes: refused from Content-Length.
    auto big = client.Post("/kiln/v1/jobs", json{{"prompt", std::string(200000, 'a')}}.dump(), "application/json");
    ASSERT_TRUE(big);
    EXPECT_EQ(big->status, 413);

    auto missing = client.Get("/kiln/v1/jobs/0123abcd");
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 404);
    auto no_route = client.Get("/no/such/endpoint");
    ASSERT_TRUE(no_route);
    EXPECT_EQ(no_route->status, 404);
    EXPECT_EQ(body_json(no_route)["error"]["type"], "invalid_request_error");

    // After all that, a good job still runs.
    const std::string id = post_job(client, good);
    ASSERT_FALSE(id.empty());
    EXPECT_EQ(test::wait_for_state(client, id, "done"), "done");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// sd-server's cache fields: the job's parameters say what the cache skipped;
// a mode the model's family does not take fails the job by name, and the
// server goes on.
TEST(ServerApi, StepCacheJobsSayWhatTheySkipped) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json cached = {{"prompt", "a red circle"}, {"width", 32},         {"height", 32},
                         {"steps", 20},              {"cache_mode", "ucache"}, {"scm_policy_dynamic", true}};
    auto posted = client.Post("/kiln/v1/jobs", cached.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const std::string id = body_json(posted)["id"];
    EXPECT_EQ(test::wait_for_state(client, id, "done"), "done");
    auto got = client.Get(("/kiln/v1/jobs/" + id).c_str());
    ASSERT_TRUE(got);
    const std::string parameters = body_json(got)["results"][0]["parameters"];
    EXPECT_NE(parameters.find("Cache: \"ucache, skipped "), std::string::npos) << parameters;
    EXPECT_EQ(parameters.find("skipped 0/"), std::string::npos) << parameters;

    json misfit = cached;
    misfit["cache_mode"] = "easycache";
    auto refused = client.Post("/kiln/v1/jobs", misfit.dump(), "application/json");
    ASSERT_TRUE(refused);
    ASSERT_EQ(refused->status, 202) << refused->body;
    const std::string refused_id = body_json(refused)["id"];
    EXPECT_EQ(test::wait_for_state(client, refused_id, "failed"), "failed");
    auto failed = client.Get(("/kiln/v1/jobs/" + refused_id).c_str());
    ASSERT_TRUE(failed);
    EXPECT_NE(body_json(failed)["error"]["message"].get<std::string>().find("does not apply to SD1.x"), std::string::npos)
        << failed->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A1111's hires fix fields: the image of sd-cli's --hires with the same
// settings; an upscaler kiln serve does not have is a 400 naming the field.
TEST(ServerApi, A1111HiresFixIsTheCliHiresFix) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    json job = {{"prompt", "a red circle"}, {"seed", 3}, {"steps", 2}, {"width", 32}, {"height", 32},
                {"enable_hr", true}, {"hr_scale", 2}, {"hr_upscaler", "Latent (nearest)"}, {"hr_second_pass_steps", 3},
                {"denoising_strength", 0.5}};
    auto r = client.Post("/sdapi/v1/txt2img", job.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const image::Image served = test::decode_base64_image(body_json(r)["images"][0]);
    EXPECT_EQ(served.width, 64);
    EXPECT_EQ(served.pixels, test::cli_image(test::tiny_server_flags(),
                                             "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 3 --hires --hires-scale 2 "
                                             "--hires-upscaler latent-nearest --hires-steps 3 "
                                             "--hires-denoising-strength 0.5")
                                 .pixels);
    for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
             {"hr_upscaler", "R-ESRGAN 4x+"}, {"hr_scale", 100}, {"hr_second_pass_steps", -1}}) {
        json bad = job;
        bad[field] = value;
        auto refused = client.Post("/sdapi/v1/txt2img", bad.dump(), "application/json");
        ASSERT_TRUE(refused);
        EXPECT_EQ(refused->status, 400) << field;
        EXPECT_EQ(error_param(refused), field) << refused->body;
    }
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// kiln's job API takes circular_x and circular_y: the CLI's seams, and the
// image's parameters say so as A1111's "Tiling".
TEST(ServerApi, NativeCircularFieldsAreTheCliSeams) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json job = {{"prompt", "a red circle"}, {"width", 32},       {"height", 32}, {"steps", 2}, {"seed", 6},
                      {"circular_x", true},       {"circular_y", true}};
    auto posted = client.Post("/kiln/v1/jobs", job.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const std::string id = body_json(posted)["id"];
    test::read_events(server.port(), id);
    auto got = client.Get(("/kiln/v1/jobs/" + id).c_str());
    ASSERT_TRUE(got);
    const json state = body_json(got);
    ASSERT_EQ(state["state"], "done") << state.dump();
    const json& result = state["results"][0];
    EXPECT_NE(result["parameters"].get<std::string>().find("Tiling: True"), std::string::npos) << result["parameters"];
    EXPECT_EQ(
        test::decode_base64_image(result["image"]).pixels,
        test::cli_image(test::tiny_server_flags(), "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 6 --circular").pixels);
    json bad = job;
    bad["circular_y"] = 3;
    auto refused = client.Post("/kiln/v1/jobs", bad.dump(), "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << refused->body;
    EXPECT_EQ(error_param(refused), "circular_y") << refused->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A1111's "tiling" is the CLI's --circular.
TEST(ServerApi, A1111TilingIsTheCliCircular) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json job = {
        {"prompt", "a red circle"}, {"seed", 4}, {"steps", 2}, {"width", 32}, {"height", 32}, {"tiling", true}};
    auto r = client.Post("/sdapi/v1/txt2img", job.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const image::Image served = test::decode_base64_image(body_json(r)["images"][0]);
    const std::string cli = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 4";
    EXPECT_EQ(served.pixels, test::cli_image(test::tiny_server_flags(), cli + " --circular").pixels);
    EXPECT_NE(served.pixels, test::cli_image(test::tiny_server_flags(), cli).pixels);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// docs/server.md's commands as curl sends them: a POST with no body and no
// Content-Length is answered, not refused.
// A1111's skip ends the current image of a batch and the job goes on with the next.
TEST(ServerApi, A1111SkipMovesTheBatchToItsNextImage) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    json job = kLongJob;
    job["batch_count"] = 2;
    const std::string id = post_job(client, job);
    ASSERT_FALSE(id.empty());
    json state;
    for (int attempt = 0; attempt < 20000; ++attempt) {
        state = body_json(client.Get("/kiln/v1/jobs/" + id));
        if (state["state"] == "running" && state["step"].get<int>() > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(state["image"], 0) << state;
    auto skipped = client.Post("/sdapi/v1/skip", "", "application/json");
    ASSERT_TRUE(skipped);
    EXPECT_EQ(skipped->status, 200);
    for (int attempt = 0; attempt < 20000; ++attempt) {
        state = body_json(client.Get("/kiln/v1/jobs/" + id));
        if (state["image"] == 1 || state["state"] != "running") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(state["state"], "running") << state;
    EXPECT_EQ(state["image"], 1) << "the batch did not go on to its second image: " << state;
    ASSERT_TRUE(client.Post("/kiln/v1/jobs/" + id + "/cancel", "", "application/json"));
    EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled");
}

TEST(ServerApi, BodilessPostsAsTheDocsWriteThem) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    int status = 0;
    const std::string id = test::post_job(client, kLongJob, &status);
    ASSERT_EQ(status, 202);
    EXPECT_EQ(test::wait_for_state(client, id, "running"), "running");
    const std::string bare = " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(test::raw_status_line(server.port(), "POST /kiln/v1/jobs/" + id + "/cancel" + bare), "HTTP/1.1 200 OK");
    EXPECT_EQ(test::wait_for_state(client, id, "cancelled"), "cancelled");
    EXPECT_EQ(test::raw_status_line(server.port(), "POST /sdapi/v1/interrupt" + bare), "HTTP/1.1 200 OK");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, ApiKeyIsRequiredFromEitherHeader) {
    ServerProcess server(test::tiny_server_flags() + " --api-key s3cret");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto none = client.Get("/v1/models");
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401);
    EXPECT_EQ(body_json(none)["error"]["type"], "authentication_error");
    auto wrong = client.Get("/v1/models", {{"Authorization", "Bearer s3cre"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto wrong_long = client.Get("/v1/models", {{"X-Api-Key", "s3cret-and-more"}});
    ASSERT_TRUE(wrong_long);
    EXPECT_EQ(wrong_long->status, 401);
    auto post = client.Post("/kiln/v1/jobs", json{{"prompt", "x"}}.dump(), "application/json");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 401);
    auto bearer = client.Get("/v1/models", {{"Authorization", "Bearer s3cret"}});
    ASSERT_TRUE(bearer);
    EXPECT_EQ(bearer->status, 200);
    auto header = client.Get("/sdapi/v1/sd-models", {{"X-Api-Key", "s3cret"}});
    ASSERT_TRUE(header);
    EXPECT_EQ(header->status, 200);
    auto page = client.Get("/");  // the page asks for the key itself
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, CancelsQueuedAndRunningJobsAndAFullQueueGets429) {
    ServerProcess server(test::tiny_server_flags() + " --max-queue 1 --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::string running = post_job(client, kLongJob);
    ASSERT_FALSE(running.empty());
    ASSERT_EQ(test::wait_for_state(client, running, "running"), "running");

    auto queued_reply = client.Post("/kiln/v1/jobs", kLongJob.dump(), "application/json");
    ASSERT_TRUE(queued_reply);
    ASSERT_EQ(queued_reply->status, 202);
    EXPECT_EQ(body_json(queued_reply)["position"], 1);
    const std::string queued = body_json(queued_reply)["id"];

    auto full = client.Post("/kiln/v1/jobs", kLongJob.dump(), "application/json");
    ASSERT_TRUE(full);
    EXPECT_EQ(full->status, 429);
    ASSERT_TRUE(full->has_header("Retry-After"));
    EXPECT_GE(std::stoi(full->get_header_value("Retry-After")), 1);

    auto cancel_queued = client.Post(("/kiln/v1/jobs/" + queued + "/cancel").c_str(), "", "application/json");
    ASSERT_TRUE(cancel_queued);
    EXPECT_EQ(cancel_queued->status, 200);
    EXPECT_EQ(body_json(cancel_queued)["state"], "cancelled");
    EXPECT_EQ(test::read_events(server.port(), queued), (std::vector<std::string>{"queued", "cancelled"}));

    auto cancel_running = client.Post(("/kiln/v1/jobs/" + running + "/cancel").c_str(), "", "application/json");
    ASSERT_TRUE(cancel_running);
    EXPECT_EQ(cancel_running->status, 200);
    EXPECT_EQ(test::wait_for_state(client, running, "cancelled"), "cancelled");
    const json state = body_json(client.Get(("/kiln/v1/jobs/" + running).c_str()));
    EXPECT_EQ(state["error"]["kind"], "cancelled");
    EXPECT_LT(state["step"].get<int>(), 3000);
    auto again = client.Post(("/kiln/v1/jobs/" + running + "/cancel").c_str(), "", "application/json");
    ASSERT_TRUE(again);
    EXPECT_EQ(again->status, 409);

    // The next job starts and finishes.
    const std::string next = post_job(client, {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}});
    ASSERT_FALSE(next.empty());
    EXPECT_EQ(test::wait_for_state(client, next, "done"), "done");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerApi, ShutdownCancelsTheRunningJobAnswersQueued503AndExits0) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::string running = post_job(client, kLongJob);
    ASSERT_EQ(test::wait_for_state(client, running, "running"), "running");

    int waiting_status = 0;
    std::thread waiting([&] {
        httplib::Client sync_client("127.0.0.1", server.port());
        sync_client.set_read_timeout(120, 0);
        auto r = sync_client.Post("/sdapi/v1/txt2img", R"({"prompt": "queued", "width": 32, "height": 32})",
                                  "application/json");
        waiting_status = r ? r->status : -1;
    });
    // Stop once the synchronous request's job is queued behind the running one.
    while (body_json(client.Get("/sdapi/v1/progress"))["state"]["job_count"] != 2) std::this_thread::yield();
    EXPECT_EQ(server.stop(SIGTERM), 0);
    waiting.join();
    EXPECT_EQ(waiting_status, 503);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A prompt's <lora:NAME:W> works through the server as on the command line,
// job after job on one loaded model (other LoRAs, then none), and
// /sdapi/v1/loras lists what --lora-model-dir holds.
TEST(ServerApi, LorasFromThePromptJobAfterJob) {
    const std::string flags = test::tiny_server_flags() + " --lora-model-dir " + test::golden_path("lora");
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    auto loras = body_json(client.Get("/sdapi/v1/loras"));
    ASSERT_EQ(loras.size(), 7u) << loras;
    EXPECT_EQ(loras[0]["name"], "sd1_adapters_io");  // every safetensors file: A1111 lists them unread
    EXPECT_EQ(loras[1]["name"], "sd1_loha");
    for (const char* prompt : {"<lora:sd1_lora_kohya:0.8> a red circle", "<lora:sd1_loha:1> a red circle",
                               "a red circle"}) {
        SCOPED_TRACE(prompt);
        const json txt2img = {{"prompt", prompt}, {"seed", 3}, {"steps", 2}, {"width", 32}, {"height", 32}};
        auto r = client.Post("/sdapi/v1/txt2img", txt2img.dump(), "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const image::Image served = test::decode_base64_image(body_json(r)["images"][0]);
        EXPECT_EQ(served.pixels, test::cli_image(flags, std::string("-p \"") + prompt +
                                                            "\" -W 32 -H 32 --steps 2 -s 3 --sampling-method euler_a")
                                     .pixels);
    }
    const json missing = {{"prompt", "<lora:nothing:1> x"}, {"steps", 1}, {"width", 32}, {"height", 32}};
    auto bad = client.Post("/sdapi/v1/txt2img", missing.dump(), "application/json");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << bad->body;
    EXPECT_NE(bad->body.find("nothing"), std::string::npos) << bad->body;
}

// The lists and pings A1111 clients read at start, and png-info reading back
// the parameters of an image the server made.
TEST(ServerApi, A1111DiscoveryEndpointsAndPngInfo) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    for (const char* path : {"/sdapi/v1/sd-vae", "/sdapi/v1/latent-upscale-modes", "/sdapi/v1/embeddings",
                             "/internal/ping"}) {
        auto r = client.Get(path);
        ASSERT_TRUE(r) << path;
        EXPECT_EQ(r->status, 200) << path << " " << r->body;
    }
    EXPECT_EQ(body_json(client.Get("/sdapi/v1/latent-upscale-modes"))[0]["name"], "Latent");
    EXPECT_TRUE(body_json(client.Get("/sdapi/v1/embeddings"))["loaded"].is_object());
    auto refresh = client.Post("/sdapi/v1/refresh-checkpoints");
    ASSERT_TRUE(refresh);
    EXPECT_EQ(refresh->status, 200);

    const json txt2img = {{"prompt", "a red circle"}, {"negative_prompt", "blurry"}, {"width", 32}, {"height", 32},
                          {"steps", 2},               {"seed", 7},                   {"cfg_scale", 3}};
    auto made = client.Post("/sdapi/v1/txt2img", txt2img.dump(), "application/json");
    ASSERT_TRUE(made);
    ASSERT_EQ(made->status, 200) << made->body;
    const json info = json::parse(body_json(made)["info"].get<std::string>());
    EXPECT_EQ(info["job_timestamp"].get<std::string>().size(), 14u) << info["job_timestamp"];  // YYYYmmddHHMMSS

    const json ask = {{"image", "data:image/png;base64," + body_json(made)["images"][0].get<std::string>()}};
    auto read = client.Post("/sdapi/v1/png-info", ask.dump(), "application/json");
    ASSERT_TRUE(read);
    ASSERT_EQ(read->status, 200) << read->body;
    const json png = body_json(read);
    EXPECT_EQ(png["info"].get<std::string>().rfind("a red circle\nNegative prompt: blurry\nSteps: 2,", 0), 0u)
        << png["info"];
    EXPECT_EQ(png["parameters"]["Prompt"], "a red circle");
    EXPECT_EQ(png["parameters"]["Negative prompt"], "blurry");
    EXPECT_EQ(png["parameters"]["Seed"], "7");
    EXPECT_EQ(png["parameters"]["Size-1"], "32");

    auto bad = client.Post("/sdapi/v1/png-info", json{{"image", "bm90IGFuIGltYWdl"}}.dump(), "application/json");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_EQ(error_param(bad), "image") << bad->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln
