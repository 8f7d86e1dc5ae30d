// The `kiln` command line: flag names follow stable-diffusion.cpp's sd-cli
// for everything that exists, so an sd-cli user's commands carry over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "util/log.h"
#include "util/result.h"

namespace kiln::cli {

enum class Command {
    Generate,     // -M img_gen (default)
    Convert,      // -M convert: rewrite a model as GGUF, optionally re-quantised with --type
    Metadata,     // -M metadata -i IMAGE: print the generation parameters stored in an image
    Upscale,      // -M upscale -i IMAGE --upscale-model FILE: upscale an existing image
    Info,         // kiln info FILE|FOLDER...
    ListDevices,  // --list-devices: every ggml device (with --rpc-servers: the remote ones too)
    RpcServer,    // kiln rpc-server [--host H] [--port P] [--device NAME]
    Plan,         // kiln plan [generation options], or --dry-run: placement and memory forecast
    Pull,         // kiln pull REPO [...] | kiln pull --tokenizer NAME: download from a model hub
    Serve,        // kiln serve [context options] [--listen-port N] [--model-dir DIR] ...: the HTTP server
    Help,         // -h/--help
    Version,      // --version
};

struct Options {
    Command command = Command::Generate;
    Command help_topic = Command::Generate;  // -h after a command or -M MODE: that one's help
    bool quiet = false;                      // -q/--quiet: no progress, log level warn

    // Model files.
    std::string model;  // -m/--model: a full checkpoint or a diffusers folder
    std::string diffusion_model;
    std::string high_noise_diffusion_model;  // --high-noise-diffusion-model (Wan 2.2 A14B)
    std::string vae;
    std::string clip_l;
    std::string clip_g;
    std::string t5xxl;
    std::string llm;  // --llm
    std::string llm_vision;               // --llm_vision: Qwen2.5-VL's vision tower (an mmproj GGUF)
    std::string clip_vision;              // --clip_vision: CLIP vision (Wan 2.1 image-to-video's)
    bool qwen_image_zero_cond_t = false;  // --qwen-image-zero-cond-t
    std::string tokenizer;
    std::string embeddings_dir;  // --embd-dir
    std::string control_net;     // --control-net
    std::string lora_model_dir;  // --lora-model-dir
    std::string lora_apply_mode; // --lora-apply-mode
    std::string weight_type;     // --type, validated by the io layer
    std::string tensor_type_rules;  // --tensor-type-rules, validated by the io layer

    // Generation.
    std::string prompt;
    std::string negative_prompt;
    std::string output = "output.png";
    bool embed_metadata = true;  // false: --disable-image-metadata
    int output_begin_idx = 0;  // --output-begin-idx
    // -M vid_gen: a video model's clip (default output output.avi);
    // --video-frames (0: the model's 1) and --fps of the video file.
    bool video_mode = false;
    int video_frames = 0;
    int fps = 16;
    bool output_given = false;  // -o was passed (-M convert requires it)
    std::string init_image;  // -i/--init-img; with -M metadata (also --image): the image to read
    std::string end_image;   // --end-img: an image-to-video clip's last frame
    // VACE: --control-video, a folder of the control clip's frames (read in
    // file-name order); --vace-strength, the factor on the VACE hints.
    std::string control_video;
    float vace_strength = 1.0f;
    std::string mask;
    long long max_image_pixels = 0;  // --max-image-pixels; 0: the C API's default (8192x8192)
    int width = 0;                   // 0: the model's default
    int height = 0;                  // 0: the model's default
    int steps = 0;                   // 0: the model's default
    int batch_count = 1;
    int threads = 0;  // 0: all physical cores
    int64_t seed = 42;
    float cfg_scale = 7.0f;
    bool cfg_scale_given = false;  // else the model's default
    float guidance = 3.5f;         // --guidance: Flux-dev's distilled guidance
    bool guidance_given = false;
    float flow_shift = 0.0f;  // --flow-shift: the flow time shift
    bool flow_shift_given = false;
    std::vector<std::string> ref_images;  // -r/--ref-image, repeatable
    bool disable_auto_resize_ref_image = false;
    bool increase_ref_index = false;
    bool circular_x = false;  // --circularx, --circular
    bool circular_y = false;  // --circulary, --circular
    bool chroma_disable_dit_mask = false;
    bool chroma_enable_t5_mask = false;
    int chroma_t5_mask_pad = -1;  // -1: the family's
    int max_sequence_length = 0;  // 0: the family's
    std::string control_image;            // --control-image
    float control_strength = 0.9f;        // --control-strength (sd-cli's default)
    bool canny = false;                   // --canny
    std::string sampling_method;
    std::string scheduler;
    std::string rng = "cuda";
    std::string sampler_rng;     // --sampler-rng; empty: --rng's stream
    std::optional<float> eta;    // --eta; unset: the sampler's
    // Wan 2.2 A14B's high-noise expert: --high-noise-steps (-1: from
    // --moe-boundary), --high-noise-cfg-scale (unset: --cfg-scale's),
    // --high-noise-sampling-method (empty: --sampling-method's), --high-noise-eta.
    int high_noise_steps = -1;
    std::optional<float> high_noise_cfg_scale;
    std::string high_noise_sampling_method;
    std::optional<float> high_noise_eta;
    float moe_boundary = 0.875f;
    int timestep_shift = 0;      // --timestep-shift
    float slg_scale = 0.0f;      // --slg-scale and the skip-layer options
    std::vector<int> skip_layers = {7, 8, 9};
    float skip_layer_start = 0.01f, skip_layer_end = 0.2f;
    std::vector<float> sigmas;   // --sigmas; empty: the scheduler's
    float vae_relative_tile_w = 0.0f, vae_relative_tile_h = 0.0f;  // --vae-relative-tile-size
    std::string prediction;  // "", "eps" or "v"
    int clip_skip = 0;       // 0: the model's default
    float strength = 0.75f;
    bool strength_given = false;  // --strength was passed (it needs -i)
    bool diffusion_fa = false;
    // Live previews (docs/preview.md), as sd-cli's flags.
    std::string preview = "none";  // --preview none|proj|tae|vae, checked at parse time
    bool preview_given = false;    // kiln serve's default differs (docs/server.md)
    std::string preview_path = "preview.png";
    int preview_interval = 1;
    bool preview_noisy = false;
    // Step caches, as sd-cli's (pipeline/step_cache_options.h); checked with the request.
    std::string cache_mode, cache_option, scm_mask, scm_policy;
    std::string taesd;                // --taesd
    bool taesd_preview_only = false;  // --taesd-preview-only
    bool vae_tiling = false;
    int vae_tile_size = 32;
    float vae_tile_overlap = 0.5f;

    // ESRGAN upscaling: after generation, or of -i with -M upscale.
    std::string upscale_model;  // --upscale-model
    int upscale_repeats = 1;    // --upscale-repeats
    int upscale_tile_size = 128;

    // The hires fix. Values are checked by the request validation (kiln.h),
    // the one place that knows the model's size stride.
    bool hires = false;
    float hires_scale = 2.0f;
    int hires_width = 0;
    int hires_height = 0;
    int hires_steps = 0;
    float hires_denoising_strength = 0.7f;
    std::string hires_upscaler = "latent";
    std::string hires_upscalers_dir;  // --hires-upscalers-dir: where --hires-upscaler NAME is looked up
    std::vector<float> hires_sigmas;  // --hires-sigmas
    int hires_upscale_tile_size = 128;

    // Devices. Both strings are validated when used (src/runtime/devices.h):
    // devices are only known once the --rpc-servers servers have been added.
    std::string rpc_servers;  // --rpc-servers host:port[,host:port]
    std::string backend;      // --backend DEVICE or module=device,...

    // The memory system (docs/memory.md).
    std::string split_mode;      // --split-mode layer|row or module=mode,...
    std::string params_backend;  // --params-backend cpu|disk|DEVICE or module=...,...
    std::string modules_on_cpu;  // --clip-on-cpu, --vae-on-cpu, --control-net-cpu: "te,vae,control"
    bool offload_to_cpu = false;
    std::string max_vram;  // --max-vram, validated at parse time
    bool auto_fit = true;  // --auto-fit on|off
    bool disable_prefetch = false;
    bool disable_segmented_compute = false;
    bool eager_load = false;

    // `kiln rpc-server`.
    std::string rpc_host = "127.0.0.1";  // an IPv4 address ("localhost" is turned into 127.0.0.1)
    int rpc_port = 50052;                // ggml's rpc-server default
    std::string rpc_max_alloc;           // rpc-server --max-alloc; empty: the device's memory
    std::string rpc_mem;                 // rpc-server --mem; empty: report the device's own memory
    bool rpc_cache = false;              // rpc-server -c/--cache: a tensor cache in kiln's cache folder
    std::string rpc_cache_dir;           // rpc-server --cache-dir: the tensor cache's folder
    std::string rpc_device;              // "": the CPU

    // `kiln serve` (tools/server/server_options.h says what each means).
    std::string listen_ip = "127.0.0.1";
    int listen_port = 1234;  // 0: any free port (printed at start)
    std::string model_dir;
    std::string api_key;
    std::vector<std::string> host_names;    // --host-name (repeatable)
    std::vector<std::string> cors_origins;  // --cors-origin (repeatable)
    int max_queue = 16;
    int max_loaded_models = 2;
    int max_width = 2048;
    int max_height = 2048;
    int max_steps = 150;
    int max_batch = 8;
    long long max_body_bytes = 64ll << 20;
    int result_ttl = 600;
    int max_results = 64;
    std::string serve_output_dir;   // --output-dir: the gallery's folder
    float max_pixels_factor = 9.0f;  // --max-pixels: times the model's trained pixel count

    // -M metadata: sd-cli's report (--metadata-format text|json) or kiln's
    // parameters alone (--metadata-format parameters).
    std::string metadata_format = "text";
    bool metadata_raw = false, metadata_brief = false, metadata_all = false;

    // sd-cli options accepted without effect (tools/cli/sd_cli_options.h),
    // as given: the run names them in its verbose log.
    std::vector<std::string> ignored_sd_cli_options;

    // `kiln info`.
    std::vector<std::string> info_paths;
    bool info_list_tensors = false;
    // kiln plan --ram: plan for a machine with this much RAM available ("32G"); empty: this one's.
    std::string plan_ram;

    // `kiln pull` (docs/pull.md).
    std::string pull_repo;                   // OWNER/NAME
    std::vector<std::string> pull_includes;  // --include PATTERN (repeatable; none: every file)
    std::string pull_revision = "main";      // --revision
    bool pull_revision_given = false;
    std::string pull_hub_url;    // --hub-url; "": $HF_ENDPOINT, else https://huggingface.co
    std::string pull_tokenizer;  // --tokenizer NAME (tools/cli/tokenizer_sources.h)
    std::string pull_to;         // --to DIR; "": kiln's cache
    uint64_t pull_max_bytes = uint64_t(1) << 40;  // --max-size: a file of no known size stops there (1 TiB)

    // Logging; the last of -v/--verbose/--log-level wins.
    LogLevel log_level = LogLevel::Info;
    bool color = false;
};

// A command-line mistake: printed with the hint, exit code 2.
struct UsageError {
    std::string message;
    std::string hint;  // "did you mean '--vae'?" or "see 'kiln --help'"
};

// Parses argv[1..]. Never exits or prints.
std::variant<Options, UsageError> parse_args(const std::vector<std::string>& args);

// A flag's integer value in [min, max]; the error says what was expected
// ("expected an integer from 1 to 4096, got 0"). Shared with bench/.
std::optional<std::string> parse_integer(const std::string& text, long long min, long long max, long long* out);

// What kiln does with an sd-cli option name ("--mmap", "-p"), and in a
// line what it means: the flag's help, or why kiln ignores or refuses it.
// docs/sd_cli.md lists every one of sd-cli's options by this.
enum class SdCliSupport { Implemented, Ignored, Refused, Unknown };
struct SdCliSupportNote {
    SdCliSupport support = SdCliSupport::Unknown;
    std::string note;
    bool takes_value = false;
};
SdCliSupportNote sd_cli_support(const std::string& name);

// The --help text: the whole of it, or a command's own options (`kiln serve
// --help`, `kiln -M metadata --help`) for `topic`.
std::string help_text(Command topic = Command::Generate);
// The main options --help's groups leave out (none, unless a flag was added
// without a group).
std::vector<std::string> flags_outside_help_groups();

}  // namespace kiln::cli
