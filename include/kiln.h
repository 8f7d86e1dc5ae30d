/*
 * kiln's C API: load a Stable Diffusion model once, generate images from it,
 * save them with their parameters. Every front-end (the kiln CLI, the server)
 * is a client of this header.
 *
 * Conventions:
 * - Functions that can fail return a kiln_status: KILN_OK (0) on success, a
 *   negative code saying what kind of failure it was otherwise; when `error`
 *   is not NULL, *error receives a message naming what was wrong (free it
 *   with kiln_free_string). A failed call leaves no partial result, and the
 *   context can run the next job. Decide on the code, never on the message.
 * - Strings passed in are UTF-8 and only read during the call.
 * - A kiln_context may be used by one thread at a time, except for
 *   kiln_cancel, which any thread may call at any time.
 * - Contexts of one process share each device's budget and books: two models
 *   on one GPU under --max-vram 6 share those 6 GiB.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_OK = 0,
    KILN_ERROR_INTERNAL = -1,        /* a failed graph or a bug */
    KILN_ERROR_INVALID_REQUEST = -2, /* a parameter out of range: fix the request */
    KILN_ERROR_BAD_FILE = -3,        /* a model, image or tokenizer file that cannot be used */
    KILN_ERROR_OUT_OF_MEMORY = -4,   /* the job does not fit the budget or the machine */
    KILN_ERROR_CANCELLED = -5,       /* kiln_cancel stopped the job */
} kiln_status;

/* "ok", "internal", "invalid request", "bad file", "out of memory", "cancelled". */
const char* kiln_status_name(kiln_status status);

typedef enum {
    KILN_LOG_DEBUG = 0,
    KILN_LOG_VERBOSE = 1,
    KILN_LOG_INFO = 2,
    KILN_LOG_WARN = 3,
    KILN_LOG_ERROR = 4,
} kiln_log_level;

/* Process-wide: messages below `level` are dropped. */
void kiln_set_log_level(kiln_log_level level);
/* Process-wide: colour the level tags of kiln's own log output. */
void kiln_set_log_color(int enabled);
/* Process-wide: receive each log line (no trailing newline) instead of
 * kiln printing it; NULL restores printing (errors to stderr, the rest to stdout). */
typedef void (*kiln_log_callback)(kiln_log_level level, const char* text, void* user_data);
void kiln_set_log_callback(kiln_log_callback callback, void* user_data);

typedef struct {
    const char* model_path;           /* -m: checkpoint or diffusers folder */
    const char* diffusion_model_path; /* --diffusion-model, or NULL */
    /* --high-noise-diffusion-model: Wan 2.2 A14B's high-noise expert (diffusion_model_path is the low-noise
     * one), or NULL */
    const char* high_noise_diffusion_model_path;
    const char* vae_path;             /* --vae, or NULL */
    const char* clip_l_path;          /* --clip_l, or NULL */
    const char* clip_g_path;          /* --clip_g (SDXL's OpenCLIP ViT-bigG), or NULL */
    const char* t5xxl_path;           /* --t5xxl (Flux's and Chroma's T5-XXL), or NULL */
    const char* llm_path;             /* --llm (Z-Image's Qwen3-4B), or NULL */
    /* --llm_vision: Qwen2.5-VL's vision tower for Qwen-Image-Edit's reference images (llama.cpp's mmproj GGUF,
     * or HF's visual.*), or NULL: the --llm file's visual.* when it has them */
    const char* llm_vision_path;
    /* --clip_vision: CLIP vision (clip_vision_h.safetensors) for Wan 2.1's image-to-video and
     * first-last-frame DiTs, or NULL */
    const char* clip_vision_path;
    int qwen_image_zero_cond_t;       /* Qwen-Image-Edit-2511's reference tokens at timestep 0 (else from the file) */
    const char* control_net_path;     /* --control-net: a ControlNet for the UNet (SD1.x, SD2.x, SDXL), or NULL */
    /* --tokenizer: CLIP's tokenizer, or per encoder "t5xxl=PATH,llm=PATH,clip_l=PATH"; NULL: the model's */
    const char* tokenizer_path;
    const char* embeddings_dir;       /* --embd-dir: textual-inversion embeddings, or NULL */
    /* --taesd: a tiny autoencoder's decoder (TAESD, TAESDXL, TAEF1; madebyollin's taesd_decoder.safetensors or
     * diffusers' AutoencoderTiny), or NULL. It makes KILN_PREVIEW_TAE previews and, unless taesd_preview_only,
     * decodes the final images instead of the VAE, as sd-cli's --taesd does. */
    const char* taesd_path;
    int taesd_preview_only; /* --taesd-preview-only: the final images still come from the VAE */
    /* --lora-model-dir: where a prompt's <lora:NAME:WEIGHT> finds NAME.safetensors (.ckpt, .pt, .gguf),
     * or NULL. The tags leave the prompt; the next job may name other LoRAs at no reload. */
    const char* lora_model_dir;
    const char* lora_apply_mode; /* --lora-apply-mode: "auto" (default), "immediately", "at_runtime" */
    const char* weight_type;          /* --type ("f32", "q8_0", ...), or NULL to keep the file's */
    /* --tensor-type-rules "PATTERN=TYPE,...": the type of the matrices whose names match a pattern (a regular
     * expression, the first matching rule decides, before weight_type), or NULL */
    const char* tensor_type_rules;
    const char* prediction;           /* "eps", "v", or NULL (the model's) */
    const char* rpc_servers;          /* --rpc-servers "host:port[,host:port]": remote ggml devices, or NULL */
    const char* backend;              /* --backend "rpc0" or "diffusion=rpc0,te=cpu,vae=cpu", or NULL (CPU);
                                       * "diffusion=rpc0&rpc1" splits a module's blocks across devices */
    const char* split_mode;           /* --split-mode "layer" (default), "row", or "diffusion=row,te=layer" */
    int n_threads;                    /* <= 0: all cores */
    /* The memory system (docs/memory.md). Zero means the default everywhere. */
    const char* params_backend;    /* --params-backend "cpu", "disk", a device, or module=location pairs */
    int offload_to_cpu;            /* --offload-to-cpu: every module's weights stay in RAM */
    /* sd-cli's --clip-on-cpu, --vae-on-cpu, --control-net-cpu: "te", "vae", "control", comma-separated,
     * compute on the CPU (weights in RAM) whatever backend or auto-fit chose; or NULL */
    const char* modules_on_cpu;
    int disable_auto_fit;          /* --auto-fit off (also off whenever backend or params_backend is set) */
    const char* max_vram;          /* --max-vram "6", "-1", "rpc0=0.5,cuda0=6" (GiB; K/M/G suffixes allowed) */
    int disable_prefetch;          /* --disable-prefetch */
    int disable_segmented_compute; /* --disable-segmented-compute */
    int eager_load;                /* --eager-load: read every module's weights at start */
    int plan_only;                 /* place the modules but load no weights (for kiln_plan only) */
    int job_width, job_height;     /* the job auto-fit checks its placement against; 0: the model's defaults */
    /* ... and its hires fix, whose second pass runs at the larger size: as kiln_generation_params'
     * hires, hires_scale, hires_width and hires_height (a latent upscaler assumed) */
    int job_hires;
    float job_hires_scale;
    int job_hires_width, job_hires_height;
} kiln_context_params;

void kiln_context_params_init(kiln_context_params* params);

typedef struct kiln_context kiln_context;

/* Checks the parameters that need no model file (devices, --rpc-servers,
 * --backend, --params-backend, --max-vram, --type, --prediction) so a
 * front-end can refuse them before a slow load. kiln_context_create runs
 * the same checks. */
kiln_status kiln_context_params_check(const kiln_context_params* params, char** error);

/* One flag's value, checked for its syntax alone (no model, no connection),
 * so a front-end can refuse it while parsing its command line. */
typedef enum {
    KILN_VALUE_SAMPLER,     /* "euler_a", ... */
    KILN_VALUE_SCHEDULER,   /* "discrete", "karras", ... */
    KILN_VALUE_RNG,         /* "cuda", "cpu", "std_default" */
    KILN_VALUE_RPC_SERVERS, /* "host:port[,host:port]" */
    KILN_VALUE_MAX_VRAM,    /* "6", "-1", "rpc0=0.5,cuda0=6", "96M" */
    KILN_VALUE_LORA_APPLY_MODE, /* "auto", "immediately", "at_runtime" */
    KILN_VALUE_PREVIEW,         /* "none", "proj", "tae", "vae" */
} kiln_value_kind;
/* KILN_OK, or KILN_ERROR_INVALID_REQUEST with *error saying what is wrong
 * (without the flag's name: the caller knows it). */
kiln_status kiln_check_value(kiln_value_kind kind, const char* value, char** error);

/* Loads the model into *ctx (NULL on failure). */
kiln_status kiln_context_create(const kiln_context_params* params, kiln_context** ctx, char** error);
void kiln_context_free(kiln_context* ctx);

/* Stops the context's running kiln_generate at its next denoising step or
 * segment boundary: that call frees what the job took and returns
 * KILN_ERROR_CANCELLED. Thread-safe; a no-op when nothing runs (the next
 * job is not affected). */
void kiln_cancel(kiln_context* ctx);
/* A1111's interrupt: the running kiln_generate stops sampling at its next
 * denoising step and ends with what it has. The image being sampled is
 * decoded from the last step's denoised estimate (no hires pass after an
 * interrupted first pass), the batch's later images are not made, and the
 * call returns KILN_OK with the images made. Thread-safe; a no-op when
 * nothing runs. kiln_cancel wins over it. */
void kiln_interrupt(kiln_context* ctx);
/* A1111's skip: as kiln_interrupt for the image being made alone (it ends
 * with what it has, without a hires pass); the batch's later images are
 * made as usual. */
void kiln_skip(kiln_context* ctx);

/* The model's defaults, for front-ends that show them. */
typedef struct {
    int width, height, steps;
    float cfg_scale;
    char sampler[32];
    char scheduler[32];
    char family[64];
    int latent_preview; /* 1 when KILN_PREVIEW_PROJ works: the family's latent-to-RGB factors fit the model's latent */
    int taesd;          /* 1 when a tiny autoencoder (--taesd) is loaded; without one KILN_PREVIEW_TAE decodes with the VAE */
    /* the size the family is trained at (width and height above may come from the file's kiln.default.* metadata) */
    int trained_width, trained_height;
    int video; /* 1: a video model (Wan): kiln_generate makes clips (video_frames frames each) */
    /* 1: an image-to-video model: init_image is each clip's first frame (and needed); 2: a model that takes
     * init_image as the clip's first frame when given (Wan 2.2 TI2V-5B) */
    int first_frame;
    int high_noise_expert; /* 1: Wan 2.2 A14B's high-noise expert is loaded (the high_noise_* parameters apply) */
    int vace; /* 1: a Wan VACE DiT: control_frames and vace_strength apply, init_image is its reference image */
} kiln_model_info;
void kiln_context_info(const kiln_context* ctx, kiln_model_info* info);

/* An 8-bit image, rows from the top, channels interleaved (3 = RGB). */
typedef struct {
    uint32_t width, height, channels;
    uint8_t* data;
    char* parameters; /* A1111 "parameters" text; NULL if none */
} kiln_image;

/* Called with step 0 when an image's sampling starts, then after each
 * denoising step: image index in the batch, steps done, total. */
typedef void (*kiln_progress_callback)(int image, int step, int steps, void* user_data);

/* What a live preview shows (sd-cli's --preview). */
typedef enum {
    KILN_PREVIEW_NONE = 0,
    KILN_PREVIEW_PROJ = 1, /* the latent-to-RGB projection of the model's latent format: latent-sized, free */
    KILN_PREVIEW_TAE = 2,  /* the context's --taesd decoder (the VAE when it has none): image-sized, cheap */
    KILN_PREVIEW_VAE = 3,  /* the model's VAE: image-sized, as slow as the final decode */
} kiln_preview_mode;

/* Called after every preview_interval-th denoising step (step counts from 1,
 * as kiln_progress_callback's) with an RGB preview of the image being made:
 * image index in the batch, steps done, the preview (parameters NULL). The
 * preview and its pixels belong to kiln and are valid only during the call. */
typedef void (*kiln_preview_callback)(int image, int step, const kiln_image* preview, void* user_data);

/* The phases of a job besides sampling (whose steps go to the progress callback). */
typedef enum {
    KILN_PHASE_ENCODE = 1, /* the prompts, once per job (reading the text encoders' weights when not loaded yet) */
    KILN_PHASE_DECODE = 2, /* an image's latent to pixels (the VAE, or TAESD) */
    KILN_PHASE_HIRES = 3,  /* an image's hires fix: upscale, then its own steps (reported as progress) and decode */
} kiln_phase;
/* Called as a job enters a phase: the phase and the image it is for (0 for ENCODE). */
typedef void (*kiln_phase_callback)(kiln_phase phase, int image, void* user_data);

/* A video's decode: image index, frames decoded so far, the clip's frames. */
typedef void (*kiln_decode_callback)(int image, int frames_done, int frames, void* user_data);

typedef struct {
    const char* prompt;
    const char* negative_prompt;
    int width, height, steps; /* 0: the model's default */
    float cfg_scale;          /* < 0: the model's default */
    int64_t seed;             /* image i uses seed + i */
    int batch_count;
    const char* sampler;          /* NULL: the model's default */
    const char* scheduler;        /* NULL: the model's default */
    const char* rng;              /* "cuda" (default), "cpu" or "std_default" */
    const char* sampler_rng;      /* --sampler-rng: the sampler's noise stream, as rng; NULL: rng's */
    float eta;                    /* --eta: ancestral, DDIM and TCD noise share in [0, 1]; < 0: the sampler's */
    int timestep_shift;           /* --timestep-shift N in [0, 1000]: NitroFusion's SDXL models; 0: none */
    /* Skip-layer guidance for Flux and Chroma, as sd-cli: --slg-scale (0: off), --skip-layers (the
     * DiT's blocks, double then single; NULL: 7, 8, 9), --skip-layer-start and --skip-layer-end
     * (shares of the schedule, default 0.01 and 0.2) */
    float slg_scale;
    const int* skip_layers;
    int n_skip_layers;
    float skip_layer_start, skip_layer_end;
    /* --sigmas: the schedule itself, n_sigmas values descending to a last 0 (n_sigmas - 1 steps);
     * NULL: the scheduler's */
    const float* sigmas;
    int n_sigmas;
    int clip_skip;                /* <= 0: the model's default */
    int flash_attention;          /* --diffusion-fa */
    const kiln_image* init_image; /* image-to-image, or NULL */
    float strength;               /* with init_image: share of the schedule to run, (0, 1] */
    /* A1111's resize_mode 3: init_image keeps its own size (multiples of the size stride), is
     * encoded there and its latent resized (bilinear) to width x height; not with a mask.
     * 0: init_image is the output's size. */
    int init_latent_resize;
    const kiln_image* mask;       /* inpainting (needs init_image): white repaints, black keeps; or NULL */
    /* --end-img: an image-to-video clip's last frame (init_image its first), or NULL */
    const kiln_image* end_image;
    int vae_tiling;               /* decode/encode the VAE in tiles */
    int vae_tile_size;            /* latent pixels per tile side (default 32) */
    float vae_tile_overlap;       /* share of a tile overlapping its neighbour, [0, 1) (default 0.5) */
    /* --vae-relative-tile-size: a tile side as a share of the latent's (< 1) or as tiles per side
     * (>= 1), overriding vae_tile_size on that axis; 0: vae_tile_size */
    float vae_relative_tile_w, vae_relative_tile_h;
    float guidance;               /* --guidance: Flux-dev's distilled guidance; < 0: the model's (3.5) */
    int flow_shift_given;         /* --flow-shift given: use flow_shift instead of the model's time shift */
    float flow_shift;             /* the flow time shift mu (Flux: 1.15 at 1024x1024) */
    const kiln_image* ref_images; /* -r: Flux.1-Kontext reference images, n_ref_images of them, or NULL */
    int n_ref_images;
    /* --disable-auto-resize-ref-image: encode each at its own size, not at about the output's area
     * (sd-cli's default); --increase-ref-index: index them 1, 2, ... instead of side by side at 1 */
    int disable_auto_resize_ref_image;
    int increase_ref_index;
    /* sd-cli's --circularx and --circulary: the left and right, or the top and bottom, edges of the image
     * meet, so it tiles seamlessly (--circular: both) */
    int circular_x;
    int circular_y;
    /* Chroma's T5 padding mask, as sd-cli's flags: --chroma-disable-dit-mask (none in the DiT's
     * attention), --chroma-enable-t5-mask (also in T5's own), --chroma-t5-mask-pad (pad tokens after
     * EOS the DiT still sees; < 0: 1, the default) */
    int chroma_disable_dit_mask;
    int chroma_enable_t5_mask;
    int chroma_t5_mask_pad;
    /* --max-sequence-length: T5's token count for every prompt (diffusers' max_sequence_length), at
     * most the family's (Flux.1-dev 512, as BFL; sd-cli encodes 256); 0: the family's. */
    int max_sequence_length;
    /* --control-image: the ControlNet's condition (needs control_net_path), of the output's aspect
     * ratio (resized to its size), or NULL; --control-strength: the factor on its residuals, [0, 10]
     * (default 0.9, as sd-cli). */
    const kiln_image* control_image;
    float control_strength;
    /* --canny: the control image, at the output's size, replaced by its edges as sd-cli's canny
     * preprocessor finds them (white on black). */
    int control_canny;
    kiln_progress_callback progress;
    void* progress_user_data;
    /* The hires fix (sd-cli's --hires, A1111's "Hires. fix"), text-to-image only: the first
     * pass is upscaled to the hires size and denoised again there as image-to-image. */
    int hires;                      /* --hires: run the second pass */
    float hires_scale;              /* used when hires_width and hires_height are 0 (default 2) */
    int hires_width, hires_height;  /* the hires size; one alone keeps the aspect; 0: from the scale */
    int hires_steps;                /* the second schedule's steps; 0: steps */
    float hires_denoising_strength; /* share of the second schedule run, [0, 1] (default 0.7); 0: upscale only */
    /* "latent" (bilinear, the default), "latent-nearest", or the path of an ESRGAN model file;
     * A1111's names "Latent" and "Latent (nearest)" are accepted too. NULL: "latent". */
    const char* hires_upscaler;
    int hires_upscale_tile_size; /* a model upscaler's tile side in pixels (default 128) */
    /* --hires-sigmas: the second pass's schedule as it runs, n_hires_sigmas values descending to a
     * last 0 (replacing hires_steps and hires_denoising_strength); NULL: the scheduler's */
    const float* hires_sigmas;
    int n_hires_sigmas;
    /* Live previews: made only when preview_mode is not KILN_PREVIEW_NONE and preview is set. */
    kiln_preview_mode preview_mode;
    int preview_interval; /* every N-th step, N in [1, 10000]; <= 0: 1 */
    int preview_noisy;    /* --preview-noisy: the noisy latent the network was given, not the denoised estimate */
    kiln_preview_callback preview;
    void* preview_user_data;
    /* Step caches, as sd-cli's: --cache-mode ("ucache", "easycache", "dbcache", "taylorseer",
     * "cache-dit", "spectrum"; NULL, "" or "disabled": none), --cache-option ("key=value,..." of
     * the mode's keys), --scm-mask ("1,0,...", one per step) and --scm-policy ("dynamic", the
     * default, or "static"); NULL: none. The image's parameters say "Cache: MODE, skipped N/M". */
    const char* cache_mode;
    const char* cache_option;
    const char* scm_mask;
    const char* scm_policy;
    /* The images' parameters carry A1111's "Model hash" (of the -m file) and "Lora hashes" (of the
     * prompt's <lora:...> files), each file hashed once and cached in <kiln cache>/hashes.json;
     * 1: neither, no file is read to hash it (for a front-end that writes no metadata:
     * --disable-image-metadata). */
    int disable_file_hashes;
    kiln_phase_callback phase; /* or NULL */
    void* phase_user_data;
    /* A video model's frames per clip (sd-cli's --video-frames), made 4k + 1 as sd-cli makes them;
     * 0: 1. An image model refuses any other count than 1. */
    int video_frames;
    /* A clip's decode (after KILN_PHASE_DECODE), a latent frame at a time: called after each with
     * the frames decoded so far and the clip's frame count. Or NULL. */
    kiln_decode_callback decode;
    void* decode_user_data;
    /* Wan 2.2 A14B's high-noise expert (high_noise_diffusion_model_path), as sd-cli's --high-noise-* flags:
     * its steps (< 0, the default: the first of `steps` whose sigma is at least moe_boundary; N >= 0: N
     * steps before `steps`), cfg scale (< 0: cfg_scale), sampler (NULL: sampler) and eta (< 0: the
     * sampler's); --moe-boundary, a flow sigma in [0, 1] (default 0.875, Wan 2.2 T2V's). */
    int high_noise_steps;
    float high_noise_cfg_scale;
    const char* high_noise_sampler;
    float high_noise_eta;
    float moe_boundary;
    /* VACE (a Wan VACE DiT; init_image is then its reference image): sd-cli's --control-video frames,
     * n_control_frames of them in order (the clip's first frames; resized to its size), or NULL;
     * --vace-strength, the factor on the VACE hints, [0, 10] (default 1). */
    const kiln_image* control_frames;
    int n_control_frames;
    float vace_strength;
} kiln_generation_params;

void kiln_generation_params_init(kiln_generation_params* params);

/* Generates params->batch_count images into *images (free with kiln_images_free);
 * for a video model (kiln_model_info.video), batch_count clips: every frame of
 * the first clip, then the next's, each frame with the clip's parameters.
 * The request is validated before anything runs (KILN_ERROR_INVALID_REQUEST). */
kiln_status kiln_generate(kiln_context* ctx, const kiln_generation_params* params, kiln_image** images, int* n_images,
                          char** error);
void kiln_images_free(kiln_image* images, int n_images);

/* An ESRGAN / Real-ESRGAN upscaler (an RRDBNet in ESRGAN's or BasicSR's
 * names, x1 to x8, configured from its weights), run on the CPU in
 * overlapping tiles so memory stays bounded. One thread at a time. */
typedef struct kiln_upscaler kiln_upscaler;

typedef struct {
    const char* model_path; /* --upscale-model: .safetensors, .pth/.ckpt (read without running code) or .gguf */
    int n_threads;          /* <= 0: all cores */
    int tile_size;          /* --upscale-tile-size: input pixels per tile side, [32, 16384] (default 128) */
} kiln_upscaler_params;

void kiln_upscaler_params_init(kiln_upscaler_params* params);
/* Loads the upscaler into *upscaler (NULL on failure): KILN_ERROR_BAD_FILE for
 * a file that cannot be read or is not an RRDBNet (the message names the
 * missing tensor), KILN_ERROR_INVALID_REQUEST for a bad tile size. */
kiln_status kiln_upscaler_create(const kiln_upscaler_params* params, kiln_upscaler** upscaler, char** error);
void kiln_upscaler_free(kiln_upscaler* upscaler);
/* Output pixels per input pixel along each side, for one run (2, 4, ...). */
int kiln_upscaler_scale(const kiln_upscaler* upscaler);
/* Upscales `image` `repeats` times (sd-cli's --upscale-repeats, [1, 8]) into
 * *result (free with kiln_images_free(*result, 1)), RGB. Its parameters are
 * image->parameters with A1111's "Postprocess upscale by: F, Postprocess
 * upscaler: NAME" added (NAME: the model file's stem). Errors:
 * KILN_ERROR_INVALID_REQUEST for bad repeats, an invalid image or a result
 * over 16384 pixels a side. */
kiln_status kiln_upscale(kiln_upscaler* upscaler, const kiln_image* image, int repeats, kiln_image** result,
                         char** error);
/* What kiln_upscale of a width x height image takes in RAM besides the images: *weights and one
 * tile's compute buffers (*compute), its graph measured, not run. KILN_ERROR_INVALID_REQUEST for
 * sizes below 1 or bad repeats. */
kiln_status kiln_upscaler_memory(kiln_upscaler* upscaler, int width, int height, int repeats, uint64_t* weights,
                                 uint64_t* compute, char** error);

/* Writes `image` as PNG, JPEG or WebP, chosen by the extension; PNG carries
 * image->parameters as an A1111 "parameters" text chunk. The file appears
 * only when complete. */
kiln_status kiln_image_save(const kiln_image* image, const char* path, char** error);
/* Writes n_frames frames (RGB, one size) at `fps` frames a second as a video chosen by the
 * extension, as sd-cli writes them: .avi (MJPEG), .webm (VP8), .webp (animated), or a name with
 * one integer field such as frame_%03d.png (one image per frame, numbered from first_index).
 * frames[0].parameters goes into the container's metadata (each image's, for a sequence). The
 * file appears only when complete; a sequence that fails part-way leaves none of its frames. */
kiln_status kiln_video_save(const kiln_image* frames, int n_frames, int fps, int first_index, const char* path,
                            char** error);
/* Reads an image file (PNG, JPEG, WebP) as RGB; free with kiln_images_free(image, 1).
 * Images of more than 8192x8192 pixels are refused from their header, before
 * decoding; kiln_image_load_limited sets that limit (0: the default). */
kiln_status kiln_image_load(const char* path, kiln_image** image, char** error);
kiln_status kiln_image_load_limited(const char* path, uint64_t max_pixels, kiln_image** image, char** error);
/* An image file's bytes in memory, for front-ends that send images rather
 * than write them (kiln-server). kiln_image_encode writes `format` ("png",
 * "jpeg" or "webp") with image->parameters as kiln_image_save does; free
 * *bytes with kiln_free_bytes. kiln_image_decode is kiln_image_load_limited
 * on bytes (PNG, JPEG or WebP by signature, refused from the header past
 * max_pixels, 0: the default), except that an image with alpha comes back
 * RGBA (channels 4); its errors start with `label`. */
kiln_status kiln_image_encode(const kiln_image* image, const char* format, uint8_t** bytes, size_t* size,
                              char** error);
kiln_status kiln_image_decode(const void* bytes, size_t size, const char* label, uint64_t max_pixels,
                              kiln_image** image, char** error);
void kiln_free_bytes(void* bytes);
/* `image` resampled to width x height (Lanczos 3, as A1111 resizes init
 * images; alpha premultiplied), into *result (free with
 * kiln_images_free(*result, 1)); parameters are not kept. Errors:
 * KILN_ERROR_INVALID_REQUEST for an invalid image or a size outside
 * [1, 8192]. */
kiln_status kiln_image_resize(const kiln_image* image, int width, int height, kiln_image** result, char** error);
/* As kiln_image_load_limited, for a job of `ctx`: the decoded size, read
 * from the file's header, is checked against what RAM's books leave (the
 * CPU's --max-vram budget, else free memory, less what kiln holds there)
 * before a pixel is decoded; an image that does not fit is
 * KILN_ERROR_OUT_OF_MEMORY naming the file. kiln_generate and kiln_plan
 * count the job's images in those books while they run. */
kiln_status kiln_context_image_load(kiln_context* ctx, const char* path, uint64_t max_pixels, kiln_image** image,
                                    char** error);
/* The generation parameters stored in an image file, as text. */
kiln_status kiln_image_read_parameters(const char* path, char** text, char** error);

/* What a model holds, as `kiln info` prints it: files, metadata, family,
 * components; with list_tensors, every tensor. `path` is a file, a split
 * file's first part, or a folder. */
kiln_status kiln_model_describe(const char* path, int list_tensors, char** text, char** error);

/* Called after each tensor written by kiln_model_convert. */
typedef void (*kiln_convert_progress)(int done, int total, void* user_data);
/* Rewrites the model made of `paths` as one GGUF file at out_path, tensor by
 * tensor, converted to weight_type ("q8_0", ...; NULL keeps each tensor's
 * compute type) or, for the names a rule of tensor_type_rules matches (as
 * kiln_context_params' field; NULL for none), the rule's type. `tokenizer` is --tokenizer's value or NULL: its
 * t5xxl=PATH (spiece.model, a T5 tokenizer.json or its folder) or llm=PATH (a GGUF, tokenizer.json, vocab.json +
 * merges.txt or their folder) is written into the file (tokenizer.ggml.*), so a converted T5 or LLM needs no
 * --tokenizer; naming both is an invalid request. No file appears unless it is complete. */
kiln_status kiln_model_convert(const char* const* paths, int n_paths, const char* out_path, const char* weight_type,
                               const char* tensor_type_rules, const char* tokenizer, kiln_convert_progress progress,
                               void* user_data, char** error);

void kiln_free_string(char* text);

/* `kiln plan` / --dry-run: the placement, the predicted peak per device,
 * the segment count per module and whether `params` fits, without
 * generating. The request gets kiln_generate's validation. *text (free
 * with kiln_free_string) gets the report; *fits (if not NULL) gets 1 (fits),
 * 2 (fits only by reading the diffusion model's weights from disk at every
 * step: the CPU's RAM cannot keep them beside the job) or 0 (does not fit). */
kiln_status kiln_plan(kiln_context* ctx, const kiln_generation_params* params, char** text, int* fits, char** error);

/* The memory system's books since the context was created: one line per
 * device ("RPC0 peak 12.5 MiB now 3.1 MiB budget 16.0 MiB"), then each
 * module's peak compute buffers. Free with kiln_free_string. */
char* kiln_memory_report(kiln_context* ctx);

/* One device's books, as kiln_memory_report prints them, in bytes. The
 * books belong to the device: every context of the process that uses it
 * counts in them, and they live while one of those contexts does. */
typedef struct kiln_device_memory {
    char name[32];     /* the device ("RPC0", "CPU") */
    uint64_t managed;  /* counted now: weights kept there, compute copies, workspaces, kept activations */
    uint64_t peak;     /* the most counted at once since the books were opened */
    uint64_t budget;   /* the --max-vram budget; 0 when there is none */
} kiln_device_memory;
/* Writes the books of up to `max` of the devices ctx uses to out[] and
 * returns how many devices it uses (more than `max`: the rest were left
 * out). Any thread may call it, also while a job runs on ctx (the counters
 * are read atomically), but not while ctx is being created or freed. */
int kiln_memory_devices(kiln_context* ctx, kiln_device_memory* out, int max);

/* `kiln --list-devices`: adds the RPC servers of `rpc_servers` (or NULL),
 * then *text gets one line per ggml device (name, type, free and total
 * memory, description). */
kiln_status kiln_list_devices(const char* rpc_servers, char** text, char** error);

/* `kiln rpc-server`: serves `device` (NULL: the CPU) on host:port over ggml's
 * RPC protocol with n_threads (<= 0: every core). A client's buffer larger
 * than max_alloc ("2G", "512M" as for --max-vram; NULL: the device's total
 * memory) is refused. With cache_dir (NULL: none), tensors of 10 MiB or more
 * that a client sends are kept there by hash, and a client sending one
 * again sends only its hash (ggml's RPC tensor cache); the folder is made
 * when missing. With reported_memory (a size as max_alloc; NULL: the
 * device's own), the device tells clients it has that much free and in
 * total, so they plan for a device of that size; each buffer still comes
 * from the device. Blocks for the life of the server and returns only on
 * failure. */
kiln_status kiln_rpc_server_run(const char* host, int port, const char* device, int n_threads, const char* max_alloc,
                                const char* reported_memory, const char* cache_dir, char** error);
const char* kiln_version(void);

/* The kernel set OpenBLAS runs ("Haswell", "SkylakeX"; "" without OpenBLAS). */
const char* kiln_blas_core(void);
/* The OPENBLAS_CORETYPE a program should restart with before its first job,
 * or NULL: OpenBLAS did not know this CPU and fell back to SSE kernels
 * (several times slower) while the CPU has AVX2 or AVX-512. OpenBLAS reads
 * the variable only as it loads; `kiln` restarts itself with it. */
const char* kiln_blas_core_to_request(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_H */
