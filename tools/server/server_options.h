// What `kiln serve` is told on its command line (tools/cli/serve_command.cpp
// fills it): where to listen, which models, who may call, and the limits a
// request must stay within before any work is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln.h"

namespace kiln::server {

struct ServerLimits {
    int max_width = 2048;
    int max_height = 2048;
    int max_steps = 150;
    int max_batch = 8;                            // images per request (A1111: batch_size x n_iter; OpenAI: n)
    int max_ref_images = 8;                       // reference images per request, refused before decoding
    size_t max_body_bytes = size_t(64) << 20;     // refused with 413 from Content-Length, before reading
    size_t max_prompt_chars = 16384;              // prompt and negative prompt, in bytes of UTF-8
    uint64_t max_image_pixels = 4096ull * 4096;  // an uploaded init image or mask, refused from its header
    // A job's pixels (each pass's width x height) as a multiple of the
    // size the model's family is trained at: past it a request
    // is refused (--max-pixels). SD1.x is trained at 512x512, so 9 lets it
    // run at up to 1536x1536, as far as a hires fix of 768x768 goes.
    double max_pixels_factor = 9.0;
};

struct ServerOptions {
    std::string listen_ip = "127.0.0.1";
    int listen_port = 1234;
    // Every model file and diffusers folder under model_dir is served by its
    // path relative to it; without model_dir, `model` (-m) is the one model.
    std::string model_dir;
    std::string model;
    std::string api_key;  // empty: no key asked (warned about off loopback)
    // Who may call from where (request_origin.h): names besides the listen
    // address and localhost that a request's Host may give (--host-name),
    // and the origins of other sites' pages allowed to call (--cors-origin;
    // "*" for any).
    std::vector<std::string> host_names;
    std::vector<std::string> cors_origins;
    int max_queue = 16;   // jobs waiting, the running one not counted; past it: 429
    int max_loaded_models = 2;
    int result_ttl_seconds = 600;  // finished jobs (and their images) are dropped after this ...
    int max_results = 64;          // ... or when more than this many have finished
    // --output-dir: every finished image is also written here, and the web
    // page's gallery lists this folder (tools/server/gallery.h); "" for none.
    std::string output_dir;
    ServerLimits limits;
    // Live previews of jobs that do not choose (docs/server.md), from kiln's
    // --preview and --preview-interval: "none", "proj", "tae", "vae", or ""
    // for proj on every model that has a latent-to-RGB projection (all
    // families kiln loads; none otherwise).
    std::string preview;
    int preview_interval = 1;
    bool preview_noisy = false;  // --preview-noisy: previews of the noisy latent
    // --circular, --circularx, --circulary: every job's seams (sd-server's
    // behaviour), unless the request sets its own.
    bool circular_x = false, circular_y = false;
    // kiln's context flags (-t, --vae, --tokenizer, --max-vram, ...) for
    // every model; model_path is set per model. The strings belong to the caller.
    kiln_context_params context{};
};

// Serves until SIGINT or SIGTERM: then stops accepting, cancels the running
// job at its next step, answers the queued ones 503 and returns 0. Returns 1
// when the address cannot be bound, 2 for a bad --model-dir.
int run_server(const ServerOptions& options);

}  // namespace kiln::server
