#include "serve_command.h"

#include <cstdio>
#include <filesystem>

#include "cli.h"
#include "context_params.h"
#include "default_model.h"
#include "server_options.h"
#include "util/log.h"

namespace kiln::cli {

int run_serve(const Options& options) {
    server::ServerOptions so;
    so.listen_ip = options.listen_ip;
    so.listen_port = options.listen_port;
    so.model_dir = options.model_dir;
    so.model = options.model;
    so.api_key = options.api_key;
    so.host_names = options.host_names;
    so.cors_origins = options.cors_origins;
    so.max_queue = options.max_queue;
    so.max_loaded_models = options.max_loaded_models;
    so.result_ttl_seconds = options.result_ttl;
    so.max_results = options.max_results;
    so.output_dir = options.serve_output_dir;
    so.limits.max_pixels_factor = options.max_pixels_factor;
    so.limits.max_width = options.max_width;
    so.limits.max_height = options.max_height;
    so.limits.max_steps = options.max_steps;
    so.limits.max_batch = options.max_batch;
    so.limits.max_body_bytes = static_cast<size_t>(options.max_body_bytes);
    if (options.max_image_pixels > 0) so.limits.max_image_pixels = static_cast<uint64_t>(options.max_image_pixels);
    // Without --preview, jobs get proj previews where the model has the projection.
    if (options.preview_given) so.preview = options.preview;
    so.preview_interval = options.preview_interval;
    so.preview_noisy = options.preview_noisy;
    so.circular_x = options.circular_x;
    so.circular_y = options.circular_y;
    if (options.preview_path != Options{}.preview_path) {
        // On stderr, as the server's other warnings: its first line on stdout says where it listens.
        std::fprintf(stderr, "kiln serve: --preview-path is ignored: previews go to clients in the job's events and progress\n");
    }
    so.context = context_params_of(options);
    // A model folder's own LoRA folder (ComfyUI's loras/, A1111's Lora/)
    // when --lora-model-dir names none.
    std::string folder_loras;
    if (!so.model_dir.empty() && !so.context.lora_model_dir) {
        for (const char* name : {"loras", "Lora", "lora", "LoRA"}) {
            const std::filesystem::path candidate = std::filesystem::path(so.model_dir) / name;
            std::error_code ec;
            if (std::filesystem::is_directory(candidate, ec)) {
                folder_loras = candidate.string();
                so.context.lora_model_dir = folder_loras.c_str();
                break;
            }
        }
    }
    if (!so.model_dir.empty() && !so.model.empty()) {
        KILN_LOG_ERROR("serve: -m and --model-dir exclude each other (put the model in the folder)");
        return kExitUsage;
    }
    if (so.model_dir.empty() && so.model.empty()) {
        auto found = find_default_model();
        if (!found) {
            KILN_LOG_ERROR("serve: no -m or --model-dir and the default model %s was not found", kDefaultModelFile);
            return kExitFailure;
        }
        so.model = *found;
    }
    // Device flags fail here, not at the first request.
    char* error = nullptr;
    if (kiln_status st = kiln_context_params_check(&so.context, &error); st != KILN_OK) {
        KILN_LOG_ERROR("%s", error ? error : "bad context flags");
        kiln_free_string(error);
        return exit_code_of(st);
    }
    return server::run_server(so);
}

}  // namespace kiln::cli
