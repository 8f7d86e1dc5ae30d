// kiln serve with --model-dir: models listed with their family, chosen per
// request, loaded on first use and evicted past --max-loaded-models; names
// resolve only inside the folder.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "server_test_support.h"
#include "test_files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::body_json;
using test::error_param;
using test::json;
using test::ServerProcess;

// A model folder with two tiny models, a folder that is no model, and
// symlinks in and out of it.
struct ModelFolder {
    test::TempDir outside;
    test::TempDir dir;
    ModelFolder() {
        fs::create_directories(dir.file("sd2"));
        fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file("sd1_tiny.safetensors"));
        fs::copy_file(test::golden_path("models/sd2_tiny.safetensors"), dir.file("sd2/sd2_tiny.safetensors"));
        dir.write("notes/readme.txt", "not a model");
        fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), outside.file("secret.safetensors"));
        fs::create_symlink(outside.file("secret.safetensors"), dir.file("escape.safetensors"));
        fs::create_symlink(dir.file("sd1_tiny.safetensors"), dir.file("alias.safetensors"));
    }
};

TEST(ServerModels, TwoModelsFromTheFolderRequestedAlternately) {
    ModelFolder folder;
    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + folder.dir.path() +
                         " --max-loaded-models 1");
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    const json models = body_json(client.Get("/kiln/v1/models"))["models"];
    ASSERT_EQ(models.size(), 3u) << models.dump();
    EXPECT_EQ(models[0]["name"], "alias.safetensors");  // a symlink inside the folder counts
    EXPECT_EQ(models[1]["name"], "sd1_tiny.safetensors");
    EXPECT_EQ(models[1]["family"], "SD1.x");
    EXPECT_EQ(models[2]["name"], "sd2/sd2_tiny.safetensors");
    EXPECT_EQ(models[2]["family"], "SD2.x");

    const std::string args = "-W 32 -H 32 --steps 2 -s 4 --cfg-scale 3 --sampling-method euler -p \"a red circle\"";
    const image::Image sd1 = test::cli_image("-t 1 " + test::tokenizer_flag() + "-m " + folder.dir.file("sd1_tiny.safetensors"), args);
    const image::Image sd2 =
        test::cli_image("-t 1 " + test::tokenizer_flag() + "-m " + folder.dir.file("sd2/sd2_tiny.safetensors"), args);
    ASSERT_FALSE(sd1.pixels.empty());
    ASSERT_NE(sd1.pixels, sd2.pixels);
    for (const char* model : {"sd1_tiny.safetensors", "sd2/sd2_tiny.safetensors", "sd1_tiny", "sd2/sd2_tiny.safetensors"}) {
        const json request = {{"model", model}, {"prompt", "a red circle"}, {"size", "32x32"}, {"steps", 2},
                              {"seed", 4},      {"cfg_scale", 3},          {"sampler", "euler"}};
        auto r = client.Post("/v1/images/generations", request.dump(), "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const image::Image got = test::decode_base64_image(body_json(r)["data"][0]["b64_json"]);
        EXPECT_EQ(got.pixels, std::string(model).rfind("sd1", 0) == 0 ? sd1.pixels : sd2.pixels) << model;
        // --max-loaded-models 1: only the last one stays loaded.
        const json listed = body_json(client.Get("/kiln/v1/models"))["models"];
        int loaded = 0;
        for (const json& m : listed) loaded += m["loaded"].get<bool>() ? 1 : 0;
        EXPECT_EQ(loaded, 1);
    }
    // A1111's options switch the default model.
    auto set = client.Post("/sdapi/v1/options", R"({"sd_model_checkpoint": "sd2/sd2_tiny.safetensors"})", "application/json");
    ASSERT_TRUE(set);
    EXPECT_EQ(set->status, 200);
    auto txt2img = client.Post("/sdapi/v1/txt2img",
                               R"({"prompt": "a red circle", "width": 32, "height": 32, "steps": 2, "seed": 4,
                                   "cfg_scale": 3, "sampler_name": "Euler"})",
                               "application/json");
    ASSERT_TRUE(txt2img);
    ASSERT_EQ(txt2img->status, 200) << txt2img->body;
    EXPECT_EQ(test::decode_base64_image(body_json(txt2img)["images"][0]).pixels, sd2.pixels);

    for (const char* name : {"../" , "../outside.safetensors", "sd2/../../x.safetensors", "/etc/passwd",
                             "escape.safetensors", "notes", "notes/readme.txt", "missing.gguf"}) {
        const json request = {{"model", name}, {"prompt", "x"}};
        auto r = client.Post("/kiln/v1/jobs", request.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << name;
        EXPECT_EQ(error_param(r), "model") << r->body;
    }
    EXPECT_EQ(server.stop(SIGINT), 0);
}

// A job that fails in the worker (a model file that cannot be loaded) is
// reported as failed with its kind; the next job runs.
TEST(ServerModels, AFailedJobLeavesTheServerServing) {
    test::TempDir dir;
    fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file("good.safetensors"));
    dir.write("broken.safetensors", "this is not a safetensors file");
    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + dir.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);
    auto broken = client.Post("/kiln/v1/jobs", json{{"model", "broken.safetensors"}, {"prompt", "x"}}.dump(),
                              "application/json");
    ASSERT_TRUE(broken);
    ASSERT_EQ(broken->status, 202);
    const std::string id = body_json(broken)["id"];
    EXPECT_EQ(test::wait_for_state(client, id, "failed"), "failed");
    const json state = body_json(client.Get(("/kiln/v1/jobs/" + id).c_str()));
    EXPECT_EQ(state["error"]["kind"], "bad file");
    EXPECT_NE(state["error"]["message"].get<std::string>().find("broken.safetensors"), std::string::npos) << state;
    // The synchronous APIs answer a failed job with its status.
    auto sync = client.Post("/v1/images/generations",
                            json{{"model", "broken.safetensors"}, {"prompt", "x"}}.dump(), "application/json");
    ASSERT_TRUE(sync);
    EXPECT_EQ(sync->status, 500);
    EXPECT_EQ(body_json(sync)["error"]["type"], "server_error");
    auto good = client.Post("/v1/images/generations",
                            json{{"model", "good.safetensors"}, {"prompt", "x"}, {"size", "32x32"}, {"steps", 1}}.dump(),
                            "application/json");
    ASSERT_TRUE(good);
    EXPECT_EQ(good->status, 200) << good->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerModels, BadFolderOrFlagsFailAtStart) {
    auto missing = test::run_command(std::string(KILN_BIN) + " serve --model-dir /no/such/folder --listen-port 0");
    EXPECT_EQ(missing.exit_code, 2);
    EXPECT_NE(missing.err.find("--model-dir"), std::string::npos) << missing.err;
    auto both = test::run_command(std::string(KILN_BIN) + " serve -m x.gguf --model-dir /tmp --listen-port 0");
    EXPECT_EQ(both.exit_code, 2);
    auto bad_port = test::run_command(std::string(KILN_BIN) + " serve --listen-port 70000");
    EXPECT_EQ(bad_port.exit_code, 2);
    EXPECT_NE(bad_port.err.find("--listen-port"), std::string::npos) << bad_port.err;
}

TEST(ServerModels, NonLoopbackWithoutKeyWarns) {
    ServerProcess server(test::tiny_server_flags() + " --listen-ip 0.0.0.0");
    ASSERT_TRUE(server.started()) << server.log();
    EXPECT_NE(server.log().find("WARNING: listening on 0.0.0.0 without --api-key"), std::string::npos) << server.log();
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A folder kept as ComfyUI keeps one: the models in checkpoints/ are
// offered; the parts and add-ons in vae/, loras/, upscale_models/ ... are
// not, nor a LoRA lying loose; a symlinked folder inside is followed, one
// leading out is not, and the log says so once however often the folder is
// listed.
TEST(ServerModels, AComfyUiFolderOffersItsRunnableModelsOnly) {
    test::TempDir outside;
    test::TempDir dir;
    fs::create_directories(dir.file("checkpoints"));
    fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), dir.file("checkpoints/sd1_tiny.safetensors"));
    const auto lora = test::build_safetensors({{"lora_unet_down.lora_up.weight", "F32", {2, 2}, test::f32_bytes(4)}});
    dir.write("loras/style.safetensors", lora);
    dir.write("loose_lora.safetensors", lora);
    fs::create_directories(dir.file("upscale_models"));
    fs::copy_file(test::golden_path("models/rrdbnet_x2.safetensors"), dir.file("upscale_models/x2.safetensors"));
    fs::copy_file(test::golden_path("models/sd2_tiny.safetensors"), outside.file("sd2_tiny.safetensors"));
    fs::create_directory_symlink(outside.path(), dir.file("shared"));
    fs::create_directory_symlink(dir.file("checkpoints"), dir.file("more"));

    ServerProcess server("-t 1 " + test::tokenizer_flag() + "--model-dir " + dir.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    json listed;
    for (int listing = 0; listing < 2; ++listing) listed = body_json(client.Get("/kiln/v1/models"));
    std::vector<std::string> names;
    for (const json& m : listed["models"]) names.push_back(m["name"]);
    EXPECT_EQ(names, (std::vector<std::string>{"checkpoints/sd1_tiny.safetensors", "more/sd1_tiny.safetensors"}))
        << listed.dump();
    EXPECT_EQ(listed["default"], "checkpoints/sd1_tiny.safetensors");
    const std::string log = server.log();
    const std::string warning = "shared: a symlink out of the model folder";
    ASSERT_NE(log.find(warning), std::string::npos) << log;
    EXPECT_EQ(log.find(warning, log.find(warning) + 1), std::string::npos) << "said once: " << log;

    auto r = client.Post(
        "/v1/images/generations",
        json{{"model", "more/sd1_tiny.safetensors"}, {"prompt", "x"}, {"size", "32x32"}, {"steps", 1}}.dump(),
        "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    // The folder's loras/ is where prompts' <lora:NAME:W> look (no --lora-model-dir given).
    const json loras = body_json(client.Get("/sdapi/v1/loras"));
    ASSERT_EQ(loras.size(), 1u) << loras;
    EXPECT_EQ(loras[0]["name"], "style");
    auto part = client.Post("/v1/images/generations",
                            json{{"model", "loras/style.safetensors"}, {"prompt", "x"}}.dump(), "application/json");
    ASSERT_TRUE(part);
    EXPECT_EQ(part->status, 400);
    EXPECT_EQ(error_param(part), "model") << part->body;
    EXPECT_EQ(server.stop(SIGTERM), 0);
}

// ComfyUI's layout: a DiT in diffusion_models/, its text encoder and VAE
// in their folders. A request names the parts; one that names none is told,
// in its own terms, which field it lacks.
TEST(ServerModels, ComfyUiLayoutRunsADitWithThePartsTheRequestNames) {
    test::TempDir dir;
    test::TempDir outside;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"flux2_tiny.safetensors", "diffusion_models/flux2_tiny.safetensors"},
             {"flux2_ae_tiny.safetensors", "vae/flux2_ae_tiny.safetensors"},
             {"flux2_klein_qwen3_tiny.safetensors", "text_encoders/qwen3_tiny.safetensors"},
             {"rrdbnet_x2.safetensors", "upscale_models/x2.safetensors"}}) {
        fs::create_directories(fs::path(dir.file(to)).parent_path());
        fs::copy_file(test::golden_path("models/" + from), dir.file(to));
    }
    fs::copy_file(test::golden_path("models/sd1_tiny.safetensors"), outside.file("secret.safetensors"));
    fs::create_symlink(outside.file("secret.safetensors"), dir.file("vae/escape.safetensors"));
    const std::string tokenizer = "--tokenizer llm=" + test::golden_path("pipeline/z_image_tiny/tokenizer") + " ";
    ServerProcess server("-t 1 " + tokenizer + "--model-dir " + dir.path());
    ASSERT_TRUE(server.started()) << server.log();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(120, 0);

    const json listed = body_json(client.Get("/kiln/v1/models"));
    ASSERT_EQ(listed["models"].size(), 1u) << listed;
    EXPECT_EQ(listed["models"][0]["name"], "diffusion_models/flux2_tiny.safetensors");
    EXPECT_EQ(listed["models"][0]["family"], "FLUX.2-klein");
    EXPECT_EQ(listed["default"], "diffusion_models/flux2_tiny.safetensors");
    EXPECT_EQ(listed["parts"],
              (json::array({{{"name", "text_encoders/qwen3_tiny.safetensors"}, {"kind", "text_encoder"}},
                            {{"name", "vae/flux2_ae_tiny.safetensors"}, {"kind", "vae"}}})));

    // Without its parts the job fails, and says which request field names them.
    const json bare = {{"prompt", "a cat"}, {"width", 32}, {"height", 32}, {"steps", 2}, {"seed", 7}};
    const std::string failed = test::post_job(client, bare);
    ASSERT_EQ(test::wait_for_state(client, failed, "failed"), "failed");
    const std::string message = body_json(client.Get("/kiln/v1/jobs/" + failed))["error"]["message"];
    EXPECT_NE(message.find("the request's \"llm\" field"), std::string::npos) << message;
    EXPECT_EQ(message.find("--llm"), std::string::npos) << message;

    // Named by their path in the folder, or in their kind's folder.
    json named = bare;
    named["llm"] = "qwen3_tiny.safetensors";
    named["vae"] = "vae/flux2_ae_tiny.safetensors";
    const std::string id = test::post_job(client, named);
    ASSERT_EQ(test::wait_for_state(client, id, "done"), "done") << server.log();
    const json done = body_json(client.Get("/kiln/v1/jobs/" + id));
    const image::Image served = test::decode_base64_image(done["results"][0]["image"]);
    const image::Image cli = test::cli_image(
        "-t 1 " + tokenizer + "-m " + dir.file("diffusion_models/flux2_tiny.safetensors") + " --llm " +
            dir.file("text_encoders/qwen3_tiny.safetensors") + " --vae " + dir.file("vae/flux2_ae_tiny.safetensors"),
        "-p \"a cat\" -W 32 -H 32 --steps 2 -s 7");
    ASSERT_FALSE(cli.pixels.empty());
    EXPECT_EQ(served.pixels, cli.pixels);
    const json plan = body_json(
        client.Get("/kiln/v1/plan?width=32&height=32&llm=qwen3_tiny.safetensors&vae=flux2_ae_tiny.safetensors"));
    EXPECT_EQ(plan["family"], "FLUX.2-klein") << plan;
    EXPECT_EQ(plan["fits"], "yes") << plan["report"].get<std::string>();

    for (const auto& [field, name] :
         std::vector<std::pair<std::string, std::string>>{{"llm", "nothing.safetensors"},
                                                          {"vae", "escape.safetensors"},
                                                          {"vae", "../../etc/passwd"},
                                                          {"clip_l", "upscale_models/x2.safetensors"}}) {
        SCOPED_TRACE(field + "=" + name);
        json bad = bare;
        bad[field] = name;
        auto r = client.Post("/kiln/v1/jobs", bad.dump(), "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << r->body;
        EXPECT_EQ(error_param(r), field) << r->body;
    }
}

}  // namespace
}  // namespace kiln
