// sd-server's native API (/sdcpp/v1) on kiln serve over real HTTP: the
// capabilities a front-end reads, an img_gen job with sd.cpp's own body
// polled to completion with the CLI's image, cancel, and the statuses and
// field names of bad requests, as sd-server's API document specifies.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "image/image_io.h"
#include "server_test_support.h"
#include "test_files.h"
#include "util/base64.h"
#include "wan_tiny.h"

namespace kiln {
namespace {

using test::body_json;
using test::error_param;
using test::json;
using test::ServerProcess;

// The served clip (a completed vid_gen job's webm) and the one `kiln FLAGS
// CLI_FLAGS` writes, decoded by ffmpeg: the same five frames, byte for byte.
void expect_cli_frames(const json& done, const std::string& flags, const std::string& cli_flags) {
    test::TempDir dir;
    const std::vector<uint8_t> file =
        base64_decode(done["result"]["b64_json"].get<std::string>()).value_or(std::vector<uint8_t>{});
    dir.write("served.webm", std::string_view(reinterpret_cast<const char*>(file.data()), file.size()));
    auto cli = test::run_command(std::string(KILN_BIN) + " " + flags + " " + cli_flags + " -o " + dir.file("cli.webm"));
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    for (const std::string name : {"served", "cli"})
        ASSERT_EQ(test::decode_video_frames(dir.file(name + ".webm"), dir.file(name)), "");
    for (int f = 0; f < 5; ++f) {
        const std::vector<uint8_t> want = test::read_bytes(dir.file("cli_" + std::to_string(f) + ".png"));
        EXPECT_FALSE(want.empty()) << f;
        EXPECT_EQ(test::read_bytes(dir.file("served_" + std::to_string(f) + ".png")), want) << "frame " << f;
    }
}

// Polls GET /sdcpp/v1/jobs/{id} until its status is `status` or a final one;
// counts attempts, not time, so a busy machine only makes it slower.
json poll_until(httplib::Client& client, const std::string& id, const std::string& status) {
    json last;
    for (int attempt = 0; attempt < 6000; ++attempt) {
        auto r = client.Get(("/sdcpp/v1/jobs/" + id).c_str());
        if (!r || r->status != 200) return json{{"http", r ? r->status : 0}};
        last = body_json(r);
        const std::string now = last["status"];
        if (now == status || now == "completed" || now == "failed" || now == "cancelled") return last;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return last;
}

// ref_images (base64, as sd-server takes them) reach an edit model: the CLI's -r image.
TEST(ServerSdcppApi, RefImagesReachAnEditModel) {
    ServerProcess server(test::tiny_edit_model_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::string ref = test::golden_path("pipeline/qwen_image_edit_tiny/ref.png");
    const json body = {{"prompt", "make the cat blue"},
                       {"width", 64},
                       {"height", 48},
                       {"seed", 11},
                       {"ref_images", json::array({base64_encode(test::read_bytes(ref))})},
                       {"sample_params", {{"sample_steps", 2}}}};
    auto posted = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json done = poll_until(client, body_json(posted)["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    const image::Image served = test::decode_base64_image(done["result"]["images"][0]["b64_json"]);
    const image::Image cli = test::cli_image(test::tiny_edit_model_flags(),
                                             "-p \"make the cat blue\" -W 64 -H 48 --steps 2 -s 11 -r " + ref);
    ASSERT_EQ(cli.width, 64);
    EXPECT_EQ(served.pixels, cli.pixels);

    json too_many = body;
    too_many["ref_images"] = json::array();
    for (int i = 0; i < 9; ++i) too_many["ref_images"].push_back("not even base64");
    auto refused = client.Post("/sdcpp/v1/img_gen", too_many.dump(), "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << refused->body;
    EXPECT_NE(refused->body.find("at most 8"), std::string::npos) << refused->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// circular_x and circular_y (KoboldCpp's names; sd-server takes --circular
// for the whole server) make the CLI's --circularx image, per request.
TEST(ServerSdcppApi, CircularFieldsAreTheCliSeams) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json body = {{"prompt", "a red circle"},
                       {"width", 32},
                       {"height", 32},
                       {"seed", 5},
                       {"circular_x", true},
                       {"circular_y", false},
                       {"sample_params", {{"sample_steps", 2}}}};
    auto posted = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json done = poll_until(client, body_json(posted)["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    const image::Image served = test::decode_base64_image(done["result"]["images"][0]["b64_json"]);
    const std::string cli = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 5";
    EXPECT_EQ(served.pixels, test::cli_image(test::tiny_server_flags(), cli + " --circularx").pixels);
    EXPECT_NE(served.pixels, test::cli_image(test::tiny_server_flags(), cli).pixels);
    json bad = body;
    bad["circular_x"] = "yes";
    auto refused = client.Post("/sdcpp/v1/img_gen", bad.dump(), "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << refused->body;
    EXPECT_EQ(error_param(refused), "circular_x") << refused->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// kiln serve --circularx, as sd-server's flag: every job's seams unless the
// request sets its own, on sd-server's API and A1111's alike.
TEST(ServerSdcppApi, ServeCircularFlagIsEveryJobsDefault) {
    ServerProcess server(test::tiny_server_flags() + " --circularx");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    auto caps = client.Get("/sdcpp/v1/capabilities");
    ASSERT_TRUE(caps);
    EXPECT_EQ(body_json(caps)["defaults_by_mode"]["img_gen"]["circular_x"], true);
    EXPECT_EQ(body_json(caps)["defaults_by_mode"]["img_gen"]["circular_y"], false);
    const std::string cli = "-p \"a red circle\" -W 32 -H 32 --steps 2 -s 5";
    auto served = [&](json body) {
        body.update({{"prompt", "a red circle"},
                     {"width", 32},
                     {"height", 32},
                     {"seed", 5},
                     {"sample_params", {{"sample_steps", 2}}}});
        auto posted = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
        EXPECT_TRUE(posted && posted->status == 202) << (posted ? posted->body : "no response");
        if (!posted || posted->status != 202) return image::Image{};
        const json done = poll_until(client, body_json(posted)["id"], "completed");
        EXPECT_EQ(done["status"], "completed") << done.dump();
        return test::decode_base64_image(done["result"]["images"][0]["b64_json"]);
    };
    const image::Image seamless_x = test::cli_image(test::tiny_server_flags(), cli + " --circularx");
    EXPECT_EQ(served(json::object()).pixels, seamless_x.pixels);
    EXPECT_EQ(served({{"circular_x", false}}).pixels, test::cli_image(test::tiny_server_flags(), cli).pixels);
    // A1111's API: no "tiling" takes the server's; "tiling" true both seams.
    const json a1111 = {{"prompt", "a red circle"}, {"seed", 5}, {"steps", 2}, {"width", 32}, {"height", 32}};
    auto r = client.Post("/sdapi/v1/txt2img", a1111.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    EXPECT_EQ(test::decode_base64_image(body_json(r)["images"][0]).pixels, seamless_x.pixels);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerSdcppApi, CapabilitiesDescribeTheDefaultModel) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    auto r = client.Get("/sdcpp/v1/capabilities");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json caps = body_json(r);
    EXPECT_EQ(caps["model"]["name"], "sd1_tiny.safetensors");
    EXPECT_EQ(caps["model"]["stem"], "sd1_tiny");
    EXPECT_EQ(caps["current_mode"], "img_gen");
    EXPECT_EQ(caps["supported_modes"], json::array({"img_gen"}));
    const json& defaults = caps["defaults_by_mode"]["img_gen"];
    EXPECT_EQ(caps["defaults"], defaults);
    EXPECT_GT(defaults["width"].get<int>(), 0);
    EXPECT_GT(defaults["sample_params"]["sample_steps"].get<int>(), 0);
    EXPECT_FALSE(defaults["sample_params"]["sample_method"].get<std::string>().empty());
    EXPECT_EQ(caps["features_by_mode"]["img_gen"]["cancel_generating"], true);
    EXPECT_EQ(caps["features_by_mode"]["img_gen"]["ip_adapter_image"], false);
    EXPECT_NE(std::find(caps["samplers"].begin(), caps["samplers"].end(), "euler_a"), caps["samplers"].end());
    EXPECT_NE(std::find(caps["schedulers"].begin(), caps["schedulers"].end(), "karras"), caps["schedulers"].end());
    EXPECT_EQ(caps["limits"]["max_queue_size"], 16);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerSdcppApi, ImgGenJobCompletesWithTheCliImage) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json body = {
        {"prompt", "a red circle"},
        {"negative_prompt", "blurry"},
        {"width", 32},
        {"height", 48},
        {"seed", 5},
        {"batch_count", 1},
        {"embed_image_metadata", true},
        {"init_image", nullptr},
        {"ref_images", json::array()},
        {"lora", json::array()},
        {"sample_params",
         {{"scheduler", "karras"},
          {"sample_method", "euler"},
          {"sample_steps", 3},
          {"eta", nullptr},
          {"shifted_timestep", 0},
          {"custom_sigmas", json::array()},
          {"flow_shift", 0.0},
          {"guidance",
           {{"txt_cfg", 4.0},
            {"img_cfg", 4.0},
            {"distilled_guidance", 3.5},
            {"slg", {{"layers", {7, 8, 9}}, {"layer_start", 0.01}, {"layer_end", 0.2}, {"scale", 0.0}}}}}}},
        {"hires", {{"enabled", false}, {"upscaler", "Latent"}}},
        {"vae_tiling_params", {{"enabled", false}, {"tile_size_x", 0}, {"tile_size_y", 0}, {"target_overlap", 0.5}}},
        {"cache_mode", "disabled"},
        {"scm_policy_dynamic", true},
        {"output_format", "png"},
        {"output_compression", 100}};
    auto posted = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json accepted = body_json(posted);
    const std::string id = accepted["id"];
    EXPECT_EQ(accepted["kind"], "img_gen");
    EXPECT_EQ(accepted["status"], "queued");
    EXPECT_EQ(accepted["poll_url"], "/sdcpp/v1/jobs/" + id);
    EXPECT_TRUE(accepted["created"].is_number_integer());

    const json done = poll_until(client, id, "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    EXPECT_TRUE(done["started"].is_number_integer());
    EXPECT_TRUE(done["completed"].is_number_integer());
    EXPECT_TRUE(done["error"].is_null());
    EXPECT_EQ(done["result"]["output_format"], "png");
    ASSERT_EQ(done["result"]["images"].size(), 1u);
    EXPECT_EQ(done["result"]["images"][0]["index"], 0);
    const image::Image served = test::decode_base64_image(done["result"]["images"][0]["b64_json"]);
    const image::Image cli = test::cli_image(test::tiny_server_flags(),
                                             "-p \"a red circle\" -n blurry -W 32 -H 48 --steps 3 -s 5 "
                                             "--cfg-scale 4 --sampling-method euler --scheduler karras");
    ASSERT_EQ(served.width, 32);
    EXPECT_EQ(served.pixels, cli.pixels);

    auto unknown = client.Get("/sdcpp/v1/jobs/job_nonesuch");
    ASSERT_TRUE(unknown);
    EXPECT_EQ(unknown->status, 404);
    auto finished = client.Post(("/sdcpp/v1/jobs/" + id + "/cancel").c_str(), "", "application/json");
    ASSERT_TRUE(finished);
    EXPECT_EQ(finished->status, 409);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerSdcppApi, CancelAGeneratingJob) {
    ServerProcess server(test::tiny_server_flags() + " --max-steps 5000");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const json body = {
        {"prompt", "a long job"}, {"width", 32}, {"height", 32}, {"sample_params", {{"sample_steps", 3000}}}};
    auto posted = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const std::string id = body_json(posted)["id"];
    ASSERT_EQ(poll_until(client, id, "generating")["status"], "generating");
    auto cancelled = client.Post(("/sdcpp/v1/jobs/" + id + "/cancel").c_str());  // no body, as clients send it
    ASSERT_TRUE(cancelled);
    EXPECT_EQ(cancelled->status, 200) << cancelled->body;
    const json final_state = poll_until(client, id, "cancelled");
    EXPECT_EQ(final_state["status"], "cancelled");
    EXPECT_EQ(final_state["error"]["code"], "cancelled");
    EXPECT_TRUE(final_state["result"].is_null());
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerSdcppApi, BadBodiesGet400NamingTheField) {
    ServerProcess server(test::tiny_server_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"sample_params", {{"sample_steps", "twenty"}}}}, "sample_params.sample_steps"},
        {{{"sample_params", {{"sample_method", "warp"}}}}, "sample_params.sample_method"},
        {{{"sample_params", {{"guidance", {{"txt_cfg", -3}}}}}}, "sample_params.guidance.txt_cfg"},
        {{{"sample_params", {{"guidance", {{"slg", {{"layers", {"x"}}}}}}}}}, "sample_params.guidance.slg.layers"},
        {{{"hires", {{"denoising_strength", 2}}}}, "hires.denoising_strength"},
        {{{"vae_tiling_params", {{"temporal_tiling", true}}}}, "vae_tiling_params.temporal_tiling"},
        {{{"lora", {{{"path", "x"}, {"multiplier", "much"}}}}}, "lora[0].multiplier"},
        {{{"ip_adapter_image", "aGVsbG8="}}, "ip_adapter_image"},
        {{{"output_format", "bmp"}}, "output_format"},
        {{{"model", "../secret.safetensors"}}, "model"},
    };
    for (const auto& [body, field] : cases) {
        auto r = client.Post("/sdcpp/v1/img_gen", body.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body.dump() << " " << r->body;
        EXPECT_EQ(error_param(r), field) << r->body;
    }
    auto empty = client.Post("/sdcpp/v1/img_gen", "", "application/json");
    ASSERT_TRUE(empty);
    EXPECT_EQ(empty->status, 400);
    // vid_gen with an image model: a 400 naming the model field.
    auto video = client.Post("/sdcpp/v1/vid_gen", "{}", "application/json");
    ASSERT_TRUE(video);
    EXPECT_EQ(video->status, 400);
    EXPECT_EQ(error_param(video), "model") << video->body;
    EXPECT_NE(video->body.find("makes images, not clips"), std::string::npos) << video->body;
    // The server still serves after them all.
    auto caps = client.Get("/sdcpp/v1/capabilities");
    ASSERT_TRUE(caps);
    EXPECT_EQ(caps->status, 200);
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// vid_gen with a video model (the tiny Wan): 202, polled to "completed"
// with one WebM file of the clip's frames (5 frames: 4k + 1), its fps and
// MIME type, as sd-server's document shows; the capabilities offer
// vid_gen; what kiln lacks (a start or end image, control frames, tiled
// clips) and bad high-noise fields are a 400 naming the field.
TEST(ServerSdcppApi, VidGenJobCompletesWithAWebmClip) {
    ServerProcess server(test::tiny_video_model_flags());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json caps = body_json(client.Get("/sdcpp/v1/capabilities"));
    EXPECT_EQ(caps["current_mode"], "vid_gen");
    EXPECT_EQ(caps["supported_modes"], json({"img_gen", "vid_gen"}));
    EXPECT_EQ(caps["output_formats_by_mode"]["vid_gen"], json({"webm", "webp", "avi"}));
    EXPECT_EQ(caps["defaults_by_mode"]["vid_gen"]["fps"], 16);

    const json body = {{"prompt", "a red cat"},
                       {"width", 64},
                       {"height", 48},
                       {"seed", 11},
                       {"video_frames", 6},
                       {"fps", 8},
                       {"init_image", nullptr},
                       {"control_frames", json::array()},
                       {"high_noise_sample_params", {{"sample_steps", -1}}},
                       {"sample_params", {{"sample_steps", 2}}}};
    auto posted = client.Post("/sdcpp/v1/vid_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json accepted = body_json(posted);
    EXPECT_EQ(accepted["kind"], "vid_gen");
    const json done = poll_until(client, accepted["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    EXPECT_EQ(done["kind"], "vid_gen");
    const json& result = done["result"];
    EXPECT_EQ(result["output_format"], "webm");
    EXPECT_EQ(result["mime_type"], "video/webm");
    EXPECT_EQ(result["fps"], 8);
    EXPECT_EQ(result["frame_count"], 5);
    const std::vector<uint8_t> file =
        base64_decode(result["b64_json"].get<std::string>()).value_or(std::vector<uint8_t>{});
    ASSERT_GE(file.size(), 4u);
    EXPECT_EQ(std::vector<uint8_t>(file.begin(), file.begin() + 4), (std::vector<uint8_t>{0x1a, 0x45, 0xdf, 0xa3}));

    const std::vector<std::pair<json, std::string>> refused = {
        {{{"end_image", "iVBORw0KGgo="}}, "end_image"},
        {{{"init_image", "iVBORw0KGgo="}}, "init_image"},
        {{{"control_frames", json::array({"iVBORw0KGgo="})}}, "control_frames[0]"},
        {{{"control_frames", "iVBORw0KGgo="}}, "control_frames"},
        {{{"vace_strength", 11}}, "vace_strength"},
        {{{"high_noise_sample_params", {{"sample_steps", -2}}}}, "high_noise_sample_params.sample_steps"},
        {{{"high_noise_sample_params", {{"guidance", {{"slg", {{"scale", 2.5}}}}}}}},
         "high_noise_sample_params.guidance.slg.scale"},
        {{{"moe_boundary", 1.5}}, "moe_boundary"},
        {{{"vae_tiling_params", {{"temporal_tiling", true}}}}, "vae_tiling_params.temporal_tiling"},
        {{{"output_format", "png"}}, "output_format"},
        {{{"video_frames", 0}}, "video_frames"},
    };
    for (const auto& [fields, param] : refused) {
        json bad = {{"prompt", "x"}};
        bad.update(fields);
        auto r = client.Post("/sdcpp/v1/vid_gen", bad.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << bad.dump() << " " << r->body;
        EXPECT_EQ(error_param(r), param) << r->body;
    }
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// sd-server's Wan 2.2 A14B job: a server started with the high-noise
// expert takes high_noise_sample_params and makes the clip kiln -M vid_gen
// makes with the same flags, frame for frame.
TEST(ServerSdcppApi, VidGenRunsWan22ExpertsAsTheCliDoes) {
    const std::string flags = test::tiny_video_model_flags() + " --high-noise-diffusion-model " +
                              test::golden_path("pipeline/wan_tiny/wan_dit_high_noise.safetensors");
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    const json body = {
        {"prompt", "a red cat"},
        {"width", 64},
        {"height", 48},
        {"seed", 11},
        {"video_frames", 5},
        {"fps", 8},
        {"sample_params", {{"sample_steps", 2}, {"sample_method", "euler"}, {"guidance", {{"txt_cfg", 6.0}}}}},
        {"high_noise_sample_params",
         {{"sample_steps", 2}, {"sample_method", "euler"}, {"guidance", {{"txt_cfg", 4.0}}}}}};
    auto posted = client.Post("/sdcpp/v1/vid_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json done = poll_until(client, body_json(posted)["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    expect_cli_frames(done, flags,
                      "-M vid_gen -p \"a red cat\" -W 64 -H 48 --steps 2 --cfg-scale 6 --high-noise-steps 2 "
                      "--high-noise-cfg-scale 4 --high-noise-sampling-method euler -s 11 --video-frames 5 --fps 8");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// sd-server's Wan 2.1 VACE job: init_image as the reference image,
// control_frames and vace_strength make the CLI's clip with -i,
// --control-video and --vace-strength.
TEST(ServerSdcppApi, VidGenMakesVaceClipsAsTheCliDoes) {
    const std::string part = test::golden_path("pipeline/wan_tiny/");
    const std::string flags = "-t 1 -m " + part + "wan_dit_vace.safetensors --vae " +
                              test::golden_path("models/wan_vae_tiny.safetensors") + " --t5xxl " + part +
                              "umt5.safetensors --tokenizer t5xxl=" + test::golden_path("text/umt5_like_spiece.model");
    test::TempDir dir;
    auto job = io::ModelFile::open({test::golden_path("pipeline/wan_tiny_vace.safetensors")});
    ASSERT_TRUE(job.ok());
    std::filesystem::create_directory(dir.file("control"));
    json frames = json::array();
    for (int i = 0; i < 3; ++i) {
        const std::string path = dir.file("control/" + std::to_string(i) + ".png");
        ASSERT_TRUE(image::write_image(path, test::wan_tiny_frame(*job, ("control" + std::to_string(i)).c_str())).ok());
        frames.push_back(base64_encode(test::read_bytes(path)));
    }
    ASSERT_TRUE(image::write_image(dir.file("ref.png"), test::wan_tiny_frame(*job, "ref_image")).ok());
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    auto features = client.Get("/sdcpp/v1/capabilities");
    ASSERT_TRUE(features);
    EXPECT_NE(features->body.find("\"control_frames\":true"), std::string::npos) << features->body;
    const json body = {{"prompt", "a red cat"},
                       {"width", 64},
                       {"height", 48},
                       {"seed", 11},
                       {"video_frames", 5},
                       {"fps", 8},
                       {"init_image", base64_encode(test::read_bytes(dir.file("ref.png")))},
                       {"control_frames", frames},
                       {"vace_strength", 0.8},
                       {"sample_params", {{"sample_steps", 2}, {"sample_method", "euler"}}}};
    auto posted = client.Post("/sdcpp/v1/vid_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json done = poll_until(client, body_json(posted)["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    expect_cli_frames(done, flags,
                      "-M vid_gen -p \"a red cat\" -W 64 -H 48 --steps 2 -s 11 --video-frames 5 --fps 8 -i " +
                          dir.file("ref.png") + " --control-video " + dir.file("control") + " --vace-strength 0.8");
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// sd-server's Wan 2.1 FLF2V job: init_image and end_image, on a server
// started with --clip_vision, make the CLI's clip with -i and --end-img.
TEST(ServerSdcppApi, VidGenMakesFirstLastFrameClipsAsTheCliDoes) {
    const std::string part = test::golden_path("pipeline/wan_tiny/");
    const std::string flags = "-t 1 -m " + part + "wan_dit_flf2v.safetensors --vae " +
                              test::golden_path("models/wan_vae_tiny.safetensors") + " --t5xxl " + part +
                              "umt5.safetensors --tokenizer t5xxl=" + test::golden_path("text/umt5_like_spiece.model") +
                              " --clip_vision " + part + "clip_vision.safetensors";
    test::TempDir dir;
    auto job = io::ModelFile::open({test::golden_path("pipeline/wan_tiny_flf2v.safetensors")});
    ASSERT_TRUE(job.ok());
    ASSERT_TRUE(image::write_image(dir.file("first.png"), test::wan_tiny_frame(*job, "image")).ok());
    ASSERT_TRUE(image::write_image(dir.file("last.png"), test::wan_tiny_frame(*job, "end_image")).ok());
    ServerProcess server(flags);
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    auto features = client.Get("/sdcpp/v1/capabilities");
    ASSERT_TRUE(features);
    EXPECT_NE(features->body.find("\"end_image\":true"), std::string::npos) << features->body;
    const json body = {{"prompt", "a red cat"},
                       {"width", 64},
                       {"height", 48},
                       {"seed", 11},
                       {"video_frames", 5},
                       {"fps", 8},
                       {"init_image", base64_encode(test::read_bytes(dir.file("first.png")))},
                       {"end_image", base64_encode(test::read_bytes(dir.file("last.png")))},
                       {"sample_params", {{"sample_steps", 2}, {"sample_method", "euler"}}}};
    auto posted = client.Post("/sdcpp/v1/vid_gen", body.dump(), "application/json");
    ASSERT_TRUE(posted);
    ASSERT_EQ(posted->status, 202) << posted->body;
    const json done = poll_until(client, body_json(posted)["id"], "completed");
    ASSERT_EQ(done["status"], "completed") << done.dump();
    expect_cli_frames(done, flags,
                      "-M vid_gen -p \"a red cat\" -W 64 -H 48 --steps 2 -s 11 --video-frames 5 --fps 8 -i " +
                          dir.file("first.png") + " --end-img " + dir.file("last.png"));
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln
