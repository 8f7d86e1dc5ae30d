// What the kiln serve tests share: the tiny SD1 model's server flags, HTTP
// helpers, and decoding a base64 PNG from a reply.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "golden.h"
#include "image/image_io.h"
#include "server_process.h"
#include "test_files.h"

namespace kiln::test {

using nlohmann::json;

// One thread: ctest runs tests in parallel (see cli_generate_test.cpp).
inline std::string tokenizer_flag() { return std::string("--tokenizer ") + KILN_FIXTURES_DIR + "/tiny_tokenizer "; }
inline std::string tiny_server_flags() {
    return "-t 1 -m " + golden_path("models/sd1_tiny.safetensors") + " " + tokenizer_flag();
}

// Qwen-Image-Edit's tiny parts (tests/unit/qwen_image_edit_test.cpp), with
// the vision tower: a model that takes reference images.
inline std::string tiny_edit_model_flags() {
    const std::string parts = golden_path("pipeline/qwen_image_edit_tiny/");
    return "-t 1 -m " + golden_path("pipeline/qwen_image_tiny/qwen_image_dit.safetensors") + " --vae " +
           golden_path("pipeline/qwen_image_tiny/qwen_image_vae.safetensors") + " --llm " + parts +
           "qwen_2.5_vl.safetensors --llm_vision " + parts + "qwen_2.5_vl_vision.safetensors --tokenizer llm=" + parts +
           "tokenizer";
}

// kiln serve on the tiny Wan of tests/golden/pipeline/wan_tiny (a video model).
inline std::string tiny_video_model_flags() {
    return "-t 1 -m " + golden_path("pipeline/wan_tiny/wan_dit.safetensors") + " --vae " +
           golden_path("models/wan_vae_tiny.safetensors") + " --t5xxl " +
           golden_path("pipeline/wan_tiny/umt5.safetensors") +
           " --tokenizer t5xxl=" + golden_path("text/umt5_like_spiece.model");
}

// A clip's frames decoded with ffmpeg into PREFIX_0.png, PREFIX_1.png, ...:
// "" or ffmpeg's error (scripts/setup.sh installs it).
inline std::string decode_video_frames(const std::string& video, const std::string& prefix) {
    auto ffmpeg = run_command("ffmpeg -v error -i " + video + " -start_number 0 " + prefix + "_%d.png");
    return ffmpeg.exit_code == 0 ? "" : "ffmpeg: " + ffmpeg.err + " (run scripts/setup.sh)";
}

inline json body_json(const httplib::Result& r) { return r ? json::parse(r->body, nullptr, false) : json(); }

// The field a 400 names, from the error body.
inline std::string error_param(const httplib::Result& r) {
    const json j = body_json(r);
    return j.contains("error") && j["error"]["param"].is_string() ? j["error"]["param"].get<std::string>() : "";
}

// A base64 image from a reply, decoded.
image::Image decode_base64_image(const std::string& text);

// `kiln -p PROMPT ...` with the same model, for the image a job must equal.
image::Image cli_image(const std::string& model_flags, const std::string& args);

// One server-sent event of a job's stream.
struct ServerEvent {
    std::string type;
    json data;
};
// POSTs a native job; its id, or "" when it was not accepted (*status: the reply's status, 0 for none).
std::string post_job(httplib::Client& client, const json& job, int* status = nullptr);

// Reads a job's server-sent events until its last one, in order.
std::vector<ServerEvent> read_event_stream(int port, const std::string& job_id, const httplib::Headers& headers = {});
// The same events' types.
std::vector<std::string> read_events(int port, const std::string& job_id, const httplib::Headers& headers = {});

// Polls the job until its state is `state` (or it finished otherwise); returns the last state,
// or "HTTP 404" (any status but 200) when the server does not know the job.
std::string wait_for_state(httplib::Client& client, const std::string& job_id, const std::string& state);

// Sends `request` as it is (curl's -X POST without a body sends no
// Content-Length, which httplib's client always does) and returns the
// response's status line, or "" when none came.
std::string raw_status_line(int port, const std::string& request);

}  // namespace kiln::test
