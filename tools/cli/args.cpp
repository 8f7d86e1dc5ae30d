#include "args.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "hub_client.h"
#include "kiln.h"
#include "pipeline/placement.h"
#include "runtime/device_budget.h"
#include "sd_cli_options.h"
#include "tokenizer_sources.h"
#include "util/files.h"
#include "util/format.h"

namespace kiln::cli {

std::optional<std::string> parse_integer(const std::string& text, long long min, long long max, long long* out) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') return "expected an integer, got '" + text + "'";
    if (errno == ERANGE || v < min || v > max) {
        return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " + text;
    }
    *out = v;
    return std::nullopt;
}

namespace {

// A prompt file larger than this is no prompt (CLIP reads 77 tokens a chunk).
constexpr size_t kMaxPromptFileBytes = size_t(1) << 20;

// Guidance scales past this are no use (real ones are below 30) and past
// float's range would be infinite.
constexpr double kMaxCfgScale = 1000.0;

// One flag: its names, what its value looks like, its help line, and how a
// value is stored. `apply` returns an error message for a bad value.
struct Flag {
    const char* short_name;  // "-m" or nullptr
    const char* long_name;   // "--model"
    const char* value_name;  // "PATH"; nullptr for a switch
    const char* help;
    std::function<std::optional<std::string>(Options&, const std::string&)> apply;
};

auto int_setter(int Options::*field, long long min, long long max) {
    return [field, min, max](Options& o, const std::string& v) -> std::optional<std::string> {
        long long parsed = 0;
        if (auto err = parse_integer(v, min, max, &parsed)) return err;
        o.*field = static_cast<int>(parsed);
        return std::nullopt;
    };
}

// A number, range-checked later by the request validation.
auto float_setter(float Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        char* end = nullptr;
        const float f = std::strtof(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !std::isfinite(f)) return "expected a number, got '" + v + "'";
        o.*field = f;
        return std::nullopt;
    };
}

// A number in [min, max], checked when parsed: the pipeline checks flags
// like these only when they take effect (--skip-layer-start without
// --slg-scale, --hires-denoising-strength without --hires), and a value no
// run could take must not pass silently because this run ignores it.
std::optional<std::string> parse_bounded_float(const std::string& v, float min, float max, float* out) {
    char* end = nullptr;
    *out = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(*out >= min && *out <= max)) {
        return "expected a number from " + format_number(min) + " to " + format_number(max) + ", got '" + v + "'";
    }
    return std::nullopt;
}

auto bounded_float_setter(float Options::*field, float min, float max) {
    return
        [field, min, max](Options& o, const std::string& v) { return parse_bounded_float(v, min, max, &(o.*field)); };
}

// The same, for a flag whose absence means "the default" (--eta).
auto bounded_optional_setter(std::optional<float> Options::*field, float min, float max) {
    return [field, min, max](Options& o, const std::string& v) -> std::optional<std::string> {
        float f = 0.0f;
        if (auto err = parse_bounded_float(v, min, max, &f)) return err;
        o.*field = f;
        return std::nullopt;
    };
}

auto string_setter(std::string Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        o.*field = v;
        return std::nullopt;
    };
}

// A name checked by the parser that uses it (parse_sampler, ...), whose
// errors start with "--flag: ", so a bad value is a usage error at parse time.
// A flag whose value kiln checks while the command line is parsed
// (kiln_check_value), before any model is loaded.
auto checked_setter(std::string Options::*field, kiln_value_kind kind) {
    return [field, kind](Options& o, const std::string& v) -> std::optional<std::string> {
        char* error = nullptr;
        if (kiln_check_value(kind, v.c_str(), &error) != KILN_OK) {
            std::string message = error ? error : "invalid value";
            kiln_free_string(error);
            return message;
        }
        o.*field = v;
        return std::nullopt;
    };
}

auto path_setter(std::string Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        if (v.empty()) return std::string("expected a path, got an empty string");
        o.*field = v;
        return std::nullopt;
    };
}

// A factor on a network's residuals or hints (--control-strength, --vace-strength): 0 to 10.
auto strength_setter(float Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        char* end = nullptr;
        const double f = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !(f >= 0 && f <= 10)) return "expected a number from 0 to 10, got '" + v + "'";
        o.*field = static_cast<float>(f);
        return std::nullopt;
    };
}

// sd-cli's list values ("[7, 8,9]", "14.6,7.8,0"): the comma-separated
// items, brackets around the list allowed, each trimmed (empty ones kept).
std::vector<std::string> list_items(const std::string& value) {
    std::string list = value;
    if (!list.empty() && list.front() == '[') list.erase(0, 1);
    if (!list.empty() && list.back() == ']') list.pop_back();
    std::vector<std::string> items;
    std::stringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
        const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        items.push_back(b == std::string::npos ? std::string() : item.substr(b, e - b + 1));
    }
    return items;
}

// sd-cli's sigma lists ("14.6,7.8,3.5,0", brackets allowed); the values
// are checked against the model with the request.
auto sigmas_setter(std::vector<float> Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        std::vector<float> values;
        for (const std::string& item : list_items(v)) {
            if (item.empty()) return "an empty value in '" + v + "'";
            char* end = nullptr;
            const float f = std::strtof(item.c_str(), &end);
            if (*end != '\0' || !std::isfinite(f)) return "'" + item + "' is not a number";
            values.push_back(f);
        }
        if (values.empty()) return "expected comma-separated numbers, got '" + v + "'";
        o.*field = std::move(values);
        return std::nullopt;
    };
}

// sd-cli's --prompt-file: the file's text, less its final line break.
auto text_file_setter(std::string Options::*field) {
    return [field](Options& o, const std::string& v) -> std::optional<std::string> {
        if (v.empty()) return std::string("expected a path, got an empty string");
        auto text = read_whole_file(v, kMaxPromptFileBytes, "prompt");
        if (!text.ok()) return text.error().message;
        std::string prompt = std::move(text).value();
        while (!prompt.empty() && (prompt.back() == '\n' || prompt.back() == '\r')) prompt.pop_back();
        o.*field = std::move(prompt);
        return std::nullopt;
    };
}

// A switch that sets `field`.
auto switch_setter(bool Options::*field) {
    return [field](Options& o, const std::string&) -> std::optional<std::string> {
        o.*field = true;
        return std::nullopt;
    };
}

// sd-cli's --clip-on-cpu and the like: `module` joins the modules that compute on the CPU.
auto module_on_cpu(const char* module) {
    return [module](Options& o, const std::string&) -> std::optional<std::string> {
        o.modules_on_cpu += (o.modules_on_cpu.empty() ? "" : ",") + std::string(module);
        return std::nullopt;
    };
}

// sd-cli's --model-args "chroma_use_dit_mask=false,...": the context
// parameters of sd-cli's API by name, each set as its flag would set it.
std::optional<std::string> apply_model_args(Options& o, const std::string& list) {
    for (const std::string& item : list_items(list)) {
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string::npos) return "expected key=value, got '" + item + "'";
        const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
        if (key == "chroma_t5_mask_pad") {
            long long pad = 0;
            if (auto err = parse_integer(value, 0, 512, &pad)) return key + ": " + *err;
            o.chroma_t5_mask_pad = static_cast<int>(pad);
            continue;
        }
        bool on = false;
        if (value == "true" || value == "1") {
            on = true;
        } else if (value != "false" && value != "0") {
            return key + ": expected true or false, got '" + value + "'";
        }
        if (key == "chroma_use_dit_mask") {
            o.chroma_disable_dit_mask = !on;
        } else if (key == "chroma_use_t5_mask") {
            o.chroma_enable_t5_mask = on;
        } else if (key == "diffusion_flash_attn" || key == "flash_attn") {
            o.diffusion_fa = on;
        } else if (key == "qwen_image_zero_cond_t") {
            o.qwen_image_zero_cond_t = on;
        } else if (key == "offload_params_to_cpu") {
            o.offload_to_cpu = on;
        } else if (key == "clip_on_cpu" || key == "vae_on_cpu" || key == "control_net_cpu") {
            if (on) module_on_cpu(key == "clip_on_cpu" ? "te" : key == "vae_on_cpu" ? "vae" : "control")(o, "");
        } else if (key != "enable_mmap" && key != "vae_conv_direct" && key != "diffusion_conv_direct" &&
                   key != "force_sdxl_vae_conv_scale") {
            return "'" + key + "' is no model argument kiln knows";
        }
    }
    return std::nullopt;
}

const std::vector<Flag>& flags() {
    static const std::vector<Flag> table = {
        {"-M", "--mode", "MODE",
         "run mode: img_gen (default), vid_gen (a video model's clip: Wan), convert, metadata (list what an image "
         "or video file carries: -i or --image), or upscale (-i with --upscale-model)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             // kiln plan -M vid_gen plans that job: the mode names the job, plan stays.
             const bool planning = o.command == Command::Plan;
             if (v == "img_gen" || v == "txt2img" || v == "img2img") {
                 if (!planning) o.command = Command::Generate;
             } else if (v == "convert") {
                 o.command = Command::Convert;
             } else if (v == "metadata") {
                 o.command = Command::Metadata;
             } else if (v == "upscale") {
                 o.command = Command::Upscale;
             } else if (v == "vid_gen") {
                 if (!planning) o.command = Command::Generate;
                 o.video_mode = true;
             } else {
                 return "unknown mode '" + v + "' (valid: img_gen, vid_gen, convert, metadata, upscale)";
             }
             return std::nullopt;
         }},
        {"-m", "--model", "PATH", "model: a checkpoint (.safetensors, .gguf, .ckpt) or a diffusers folder",
         path_setter(&Options::model)},
        {nullptr, "--diffusion-model", "PATH", "standalone diffusion model (UNet/transformer) weights",
         path_setter(&Options::diffusion_model)},
        {nullptr, "--high-noise-diffusion-model", "PATH",
         "Wan 2.2 A14B's high-noise expert, which samples the first steps (--diffusion-model: the low-noise one)",
         path_setter(&Options::high_noise_diffusion_model)},
        {nullptr, "--vae", "PATH", "standalone VAE weights", path_setter(&Options::vae)},
        {nullptr, "--vae-format", "FORMAT",
         "auto only: kiln reads a VAE's latent format (channels, scale, shift) from its weights",
         [](Options&, const std::string& v) -> std::optional<std::string> {
             if (v == "auto") return std::nullopt;
             if (v == "flux" || v == "sd3" || v == "flux2") {
                 return "kiln reads the VAE's latent format from its weights and cannot override it with '" + v +
                        "'; leave --vae-format out (or auto)";
             }
             return "expected auto, flux, sd3 or flux2, got '" + v + "'";
         }},
        {nullptr, "--clip_l", "PATH", "standalone CLIP-L text encoder weights", path_setter(&Options::clip_l)},
        {nullptr, "--clip_g", "PATH", "standalone CLIP-G text encoder weights", path_setter(&Options::clip_g)},
        {nullptr, "--t5xxl", "PATH", "standalone T5-XXL text encoder weights", path_setter(&Options::t5xxl)},
        {nullptr, "--llm", "PATH", "standalone LLM text encoder weights (Z-Image's Qwen3-4B: GGUF or safetensors)",
         path_setter(&Options::llm)},
        {nullptr, "--qwen2vl", "PATH", "alias of --llm (sd-cli's older name)", path_setter(&Options::llm)},
        {nullptr, "--llm_vision", "PATH",
         "Qwen2.5-VL's vision tower for Qwen-Image-Edit's -r images (llama.cpp's mmproj GGUF; not needed when --llm "
         "holds visual.*)",
         path_setter(&Options::llm_vision)},
        {nullptr, "--qwen2vl_vision", "PATH", "alias of --llm_vision (sd-cli's older name)",
         path_setter(&Options::llm_vision)},
        {nullptr, "--clip_vision", "PATH",
         "CLIP vision (clip_vision_h.safetensors) for Wan 2.1's image-to-video and first-last-frame DiTs",
         path_setter(&Options::clip_vision)},
        {nullptr, "--qwen-image-zero-cond-t", nullptr,
         "Qwen-Image-Edit-2511's reference tokens at timestep 0 (found in files that carry __index_timestep_zero__)",
         switch_setter(&Options::qwen_image_zero_cond_t)},
        {nullptr, "--tokenizer", "PATH",
         "CLIP tokenizer data (tokenizer.json, vocab.json + merges.txt, or a folder), or per encoder "
         "t5xxl=PATH (spiece.model or a T5 tokenizer.json), llm=PATH (a GGUF, tokenizer.json or vocab.json) and "
         "clip_l=PATH, comma-separated",
         path_setter(&Options::tokenizer)},
        {nullptr, "--embd-dir", "PATH",
         "folder of textual-inversion embeddings (.pt, .safetensors); use a file's name in the prompt",
         path_setter(&Options::embeddings_dir)},
        {nullptr, "--control-net", "PATH",
         "ControlNet weights for the UNet (SD1.x, SD2.x, SDXL; needs --control-image)",
         path_setter(&Options::control_net)},
        {nullptr, "--lora-model-dir", "PATH",
         "folder of LoRA/LoHa/LoKr files (.safetensors, .ckpt, .pt, .gguf); apply one with <lora:NAME:WEIGHT> "
         "in the prompt",
         path_setter(&Options::lora_model_dir)},
        {nullptr, "--lora-apply-mode", "MODE",
         "auto (default: merged into float weights, at run time beside quantized ones), immediately (merged), "
         "or at_runtime",
         checked_setter(&Options::lora_apply_mode, KILN_VALUE_LORA_APPLY_MODE)},
        {nullptr, "--type", "TYPE",
         "weight type to compute with: f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, q2_K..q6_K",
         string_setter(&Options::weight_type)},
        {nullptr, "--tensor-type-rules", "RULES",
         "weight type per tensor pattern, before --type: \"^vae\\.=f16,model\\.diffusion_model\\.=q8_0\" (regular "
         "expressions; docs/weight_types.md)",
         string_setter(&Options::tensor_type_rules)},
        {"-p", "--prompt", "TEXT", "the prompt", string_setter(&Options::prompt)},
        {"-n", "--negative-prompt", "TEXT", "the negative prompt", string_setter(&Options::negative_prompt)},
        {nullptr, "--prompt-file", "PATH", "read the prompt from a file (its last line break dropped)",
         text_file_setter(&Options::prompt)},
        {nullptr, "--negative-prompt-file", "PATH", "read the negative prompt from a file",
         text_file_setter(&Options::negative_prompt)},
        {"-o", "--output", "PATH",
         "output image (default output.png; .png added to a name without .png, .jpg or .webp); a batch is "
         "NAME_0.png, NAME_1.png, ... or fills one %d / %03d field; with -M vid_gen, the video (default "
         "output.avi: .avi, .webm, .webp) or a frame pattern (frame_%03d.png); with -M convert, the GGUF to write",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a path, got an empty string");
             o.output = v;
             o.output_given = true;
             return std::nullopt;
         }},
        {nullptr, "--output-begin-idx", "N", "the number of a batch's first image in its names (default 0)",
         int_setter(&Options::output_begin_idx, 0, 1000000000)},
        {nullptr, "--disable-image-metadata", nullptr,
         "write no generation parameters into the images (by default PNG carries A1111's \"parameters\" text)",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.embed_metadata = false;
             return std::nullopt;
         }},
        {nullptr, "--metadata-format", "FORMAT",
         "-M metadata's report: text (default) or json, as sd-cli's; or parameters (the A1111 text alone)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v != "text" && v != "json" && v != "parameters") {
                 return "expected text, json or parameters, got '" + v + "'";
             }
             o.metadata_format = v;
             return std::nullopt;
         }},
        {nullptr, "--metadata-raw", nullptr, "-M metadata: a hex preview of the entries kiln does not parse",
         switch_setter(&Options::metadata_raw)},
        {nullptr, "--metadata-brief", nullptr, "-M metadata: cut text values past 240 characters",
         switch_setter(&Options::metadata_brief)},
        {nullptr, "--metadata-all", nullptr, "-M metadata: list the structural entries too (IHDR, IDAT, ...)",
         switch_setter(&Options::metadata_all)},
        {"-i", "--init-img", "PATH", "initial image for image-to-image (with -M metadata: the image to read)",
         path_setter(&Options::init_image)},
        {nullptr, "--image", "PATH", "the image -M metadata reads (as -i)", path_setter(&Options::init_image)},
        {nullptr, "--end-img", "PATH", "an image-to-video clip's last frame (first-last-frame video; -i is its first)",
         path_setter(&Options::end_image)},
        {nullptr, "--control-video", "DIR",
         "a Wan VACE DiT's control clip: the folder's images in file-name order are its first frames (-i is then "
         "VACE's reference image)",
         path_setter(&Options::control_video)},
        {nullptr, "--vace-strength", "X", "factor on a Wan VACE DiT's hints, 0 to 10 (default 1)",
         strength_setter(&Options::vace_strength)},
        {nullptr, "--mask", "PATH", "inpainting mask for -i: white repaints, black keeps", path_setter(&Options::mask)},
        {nullptr, "--max-image-pixels", "N",
         "largest -i / --mask image to decode, in pixels (default 67108864 = 8192x8192), checked from the "
         "file's header",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             long long parsed = 0;
             if (auto err = parse_integer(v, 1, 16384LL * 16384, &parsed)) return err;
             o.max_image_pixels = parsed;
             return std::nullopt;
         }},
        {nullptr, "--strength", "X", "image-to-image: share of the schedule to run, in (0, 1] (default 0.75)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const float f = std::strtof(v.c_str(), &end);
             if (v.empty() || *end != '\0' || !(f > 0.0f && f <= 1.0f))
                 return "expected a number in (0, 1], got '" + v + "'";
             o.strength = f;
             o.strength_given = true;
             return std::nullopt;
         }},
        {"-W", "--width", "N", "image width in pixels (default: the model's)", int_setter(&Options::width, 8, 16384)},
        {"-H", "--height", "N", "image height in pixels (default: the model's)",
         int_setter(&Options::height, 8, 16384)},
        {nullptr, "--steps", "N", "denoising steps (default: the model's)", int_setter(&Options::steps, 1, 10000)},
        {"-b", "--batch-count", "N", "number of images to generate", int_setter(&Options::batch_count, 1, 10000)},
        {nullptr, "--video-frames", "N",
         "a video model's frames per clip, made 4k + 1 as sd-cli makes them (default 1: an image)",
         int_setter(&Options::video_frames, 1, 1000000)},
        {nullptr, "--fps", "N", "frames a second of the video file (default 16)", int_setter(&Options::fps, 1, 1000)},
        {"-t", "--threads", "N", "CPU threads (default: all cores)", int_setter(&Options::threads, 1, 1024)},
        {"-s", "--seed", "N", "RNG seed; -1 picks one at random (default 42)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             long long parsed = 0;
             if (auto err = parse_integer(v, -1, LLONG_MAX, &parsed)) return err;
             o.seed = parsed;
             return std::nullopt;
         }},
        {nullptr, "--cfg-scale", "X", "classifier-free guidance scale, 0 to 1000 (default: the model's)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const double f = std::strtod(v.c_str(), &end);
             if (v.empty() || *end != '\0' || !(f >= 0 && f <= kMaxCfgScale)) {
                 return "expected a number from 0 to 1000, got '" + v + "'";
             }
             o.cfg_scale = static_cast<float>(f);
             o.cfg_scale_given = true;
             return std::nullopt;
         }},
        {nullptr, "--guidance", "X",
         "distilled guidance of Flux-dev and Kontext, 0 to 100 (default 3.5; schnell and Chroma have none)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const double f = std::strtod(v.c_str(), &end);
             if (v.empty() || *end != '\0' || !(f >= 0 && f <= 100.0)) {
                 return "expected a number from 0 to 100, got '" + v + "'";
             }
             o.guidance = static_cast<float>(f);
             o.guidance_given = true;
             return std::nullopt;
         }},
        {nullptr, "--flow-shift", "X",
         "time shift of a flow model's schedule, as sd-cli's (Flux: mu; default 1.15 at 1024x1024 for dev, "
         "scaled with the image's size; 0 for schnell)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const double f = std::strtod(v.c_str(), &end);
             if (v.empty() || *end != '\0' || !(f >= -20 && f <= 20)) {
                 return "expected a number from -20 to 20, got '" + v + "'";
             }
             o.flow_shift = static_cast<float>(f);
             o.flow_shift_given = true;
             return std::nullopt;
         }},
        {"-r", "--ref-image", "PATH", "reference image for Flux.1-Kontext (repeatable)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a path, got an empty string");
             o.ref_images.push_back(v);
             return std::nullopt;
         }},
        {nullptr, "--disable-auto-resize-ref-image", nullptr,
         "encode each -r image at its own size, not resized to about the output's area (at most 1024x1024)",
         switch_setter(&Options::disable_auto_resize_ref_image)},
        {nullptr, "--increase-ref-index", nullptr,
         "give the -r images the position indices 1, 2, ... in order, instead of placing them side by side at 1",
         switch_setter(&Options::increase_ref_index)},
        {nullptr, "--circular", nullptr,
         "a seamless image: its left and right edges meet, and its top and bottom (UNet families and the DiTs "
         "with positions on the image's grid)",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.circular_x = o.circular_y = true;
             return std::nullopt;
         }},
        {nullptr, "--circularx", nullptr, "a seamless image across its left and right edges",
         switch_setter(&Options::circular_x)},
        {nullptr, "--circulary", nullptr, "a seamless image across its top and bottom edges",
         switch_setter(&Options::circular_y)},
        {nullptr, "--chroma-disable-dit-mask", nullptr,
         "Chroma: let the DiT attend to T5's padding (by default it sees only the text, EOS and one pad token)",
         switch_setter(&Options::chroma_disable_dit_mask)},
        {nullptr, "--chroma-enable-t5-mask", nullptr, "Chroma: mask the padding in T5's own attention too",
         switch_setter(&Options::chroma_enable_t5_mask)},
        {nullptr, "--chroma-t5-mask-pad", "N", "Chroma: pad tokens after EOS the DiT still sees (default 1)",
         int_setter(&Options::chroma_t5_mask_pad, 0, 512)},
        {nullptr, "--max-sequence-length", "N",
         "T5's tokens per prompt, at most the family's (Flux.1-dev: 512 as BFL; 256 gives sd-cli's image)",
         int_setter(&Options::max_sequence_length, 1, 512)},
        {nullptr, "--model-args", "LIST",
         "sd-cli's model arguments, key=value comma-separated: chroma_use_dit_mask, chroma_use_t5_mask, "
         "chroma_t5_mask_pad, diffusion_flash_attn, flash_attn, offload_params_to_cpu, clip_on_cpu, vae_on_cpu, "
         "control_net_cpu; enable_mmap and the conv_direct ones are accepted and ignored",
         apply_model_args},
        {nullptr, "--control-image", "PATH",
         "the ControlNet's condition (edges, depth, pose, ...), of the output's aspect ratio",
         path_setter(&Options::control_image)},
        {nullptr, "--control-strength", "X", "factor on the ControlNet's residuals, 0 to 10 (default 0.9)",
         strength_setter(&Options::control_strength)},
        {nullptr, "--canny", nullptr,
         "replace the control image by its edges, as sd-cli's canny preprocessor finds them",
         switch_setter(&Options::canny)},
        {nullptr, "--sampling-method", "NAME",
         "sampler: euler, euler_a, heun, dpm2, dpm++2s_a, dpm++2m, dpm++2mv2, ipndm, lcm, ddim_trailing, tcd",
         checked_setter(&Options::sampling_method, KILN_VALUE_SAMPLER)},
        {nullptr, "--scheduler", "NAME", "sigma schedule: discrete, karras, exponential, ays, sgm_uniform, simple",
         checked_setter(&Options::scheduler, KILN_VALUE_SCHEDULER)},
        {nullptr, "--rng", "NAME",
         "noise generator: cuda (torch CUDA's Philox, default), cpu (torch CPU's mt19937) or std_default "
         "(sd-cli's C++ std::default_random_engine)",
         checked_setter(&Options::rng, KILN_VALUE_RNG)},
        {nullptr, "--sampler-rng", "NAME",
         "noise generator of the stochastic samplers' steps (euler_a, dpm++2s_a, lcm, ddim_trailing, tcd), "
         "seeded as --rng (default: --rng's stream, continued)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* error = nullptr;
             if (kiln_check_value(KILN_VALUE_RNG, v.c_str(), &error) != KILN_OK) {
                 std::string message = error ? error : "invalid value";
                 kiln_free_string(error);
                 if (message.rfind("--rng: ", 0) == 0) message.erase(0, 7);
                 return message;
             }
             o.sampler_rng = v;
             return std::nullopt;
         }},
        {nullptr, "--eta", "X",
         "noise share of the stochastic steps in [0, 1]: DDIM's eta, TCD's gamma, the ancestral samplers' "
         "(default: 0 for ddim_trailing and tcd, 1 for euler_a and dpm++2s_a)",
         bounded_optional_setter(&Options::eta, 0.0f, 1.0f)},
        {nullptr, "--high-noise-steps", "N",
         "the high-noise expert's steps, run before --steps; -1 (default): the steps of --steps whose sigma is at "
         "least --moe-boundary",
         int_setter(&Options::high_noise_steps, -1, 10000)},
        {nullptr, "--high-noise-cfg-scale", "X", "the high-noise expert's guidance scale (default: --cfg-scale's)",
         bounded_optional_setter(&Options::high_noise_cfg_scale, 0.0f, static_cast<float>(kMaxCfgScale))},
        {nullptr, "--high-noise-sampling-method", "NAME",
         "the high-noise expert's sampler (default: --sampling-method's)",
         checked_setter(&Options::high_noise_sampling_method, KILN_VALUE_SAMPLER)},
        {nullptr, "--high-noise-eta", "X", "the high-noise expert's --eta (default: its sampler's)",
         bounded_optional_setter(&Options::high_noise_eta, 0.0f, 1.0f)},
        {nullptr, "--moe-boundary", "X",
         "the flow sigma at which the low-noise expert takes over when --high-noise-steps is -1 (default 0.875, "
         "Wan 2.2 T2V's)",
         bounded_float_setter(&Options::moe_boundary, 0.0f, 1.0f)},
        {nullptr, "--timestep-shift", "N",
         "NitroFusion's SDXL models: the UNet sees timestep round(t * N / 1000) (sd-cli's; NitroSD-Realism "
         "about 250, NitroSD-Vibrant 500; default 0, none)",
         int_setter(&Options::timestep_shift, 0, 1000)},
        {nullptr, "--slg-scale", "X",
         "skip-layer guidance for Flux and Chroma: a pass without --skip-layers adds X times its difference "
         "from the conditional one (default 0, off)",
         float_setter(&Options::slg_scale)},
        {nullptr, "--skip-layers", "LIST",
         "the DiT blocks skip-layer guidance leaves out, double blocks first then single, e.g. \"[7,8,9]\" "
         "(the default)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             std::vector<int> layers;
             for (const std::string& item : list_items(v)) {
                 if (item.empty()) continue;
                 long long layer = 0;
                 if (auto err = parse_integer(item, 0, 1000, &layer)) return err;
                 layers.push_back(static_cast<int>(layer));
             }
             o.skip_layers = std::move(layers);
             return std::nullopt;
         }},
        {nullptr, "--skip-layer-start", "X", "share of the schedule where skip-layer guidance starts (default 0.01)",
         bounded_float_setter(&Options::skip_layer_start, 0, 1)},
        {nullptr, "--skip-layer-end", "X", "share of the schedule where skip-layer guidance ends (default 0.2)",
         bounded_float_setter(&Options::skip_layer_end, 0, 1)},
        {nullptr, "--sigmas", "LIST",
         "the noise schedule itself, comma-separated and descending to 0, e.g. \"14.6,7.8,3.5,0\" (brackets "
         "allowed); replaces --scheduler, and --steps becomes the count less one",
         sigmas_setter(&Options::sigmas)},
        {nullptr, "--clip-skip", "N", "text encoder layer to use, counted from the end (default: the model's)",
         int_setter(&Options::clip_skip, 1, 12)},
        {nullptr, "--prediction", "TYPE", "what the model predicts: eps or v (default: the model's)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v != "eps" && v != "v") return "unknown prediction '" + v + "' (valid: eps, v)";
             o.prediction = v;
             return std::nullopt;
         }},
        {nullptr, "--vae-tiling", nullptr, "decode and encode the VAE in overlapping tiles (less memory)",
         switch_setter(&Options::vae_tiling)},
        {nullptr, "--vae-tile-size", "N", "VAE tile side in latent pixels, N or NxN (default 32)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             std::string side = v;
             if (const auto x = v.find('x'); x != std::string::npos) {
                 if (v.substr(0, x) != v.substr(x + 1)) return "only square tiles are supported, got '" + v + "'";
                 side = v.substr(0, x);
             }
             long long parsed = 0;
             if (auto err = parse_integer(side, 8, 4096, &parsed)) return err;
             o.vae_tile_size = static_cast<int>(parsed);
             return std::nullopt;
         }},
        {nullptr, "--vae-relative-tile-size", "X[xY]",
         "VAE tile sides relative to the latent's: a share of the side if <= 1, tiles per side if > 1 "
         "(overrides --vae-tile-size)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             const size_t x = v.find('x');
             const std::string sides[2] = {v.substr(0, x), x == std::string::npos ? v : v.substr(x + 1)};
             float values[2] = {};
             for (int i = 0; i < 2; ++i) {
                 char* end = nullptr;
                 values[i] = std::strtof(sides[i].c_str(), &end);
                 if (sides[i].empty() || *end != '\0' || !(values[i] > 0.0f && values[i] <= 1000.0f))
                     return "expected X or XxY with numbers in (0, 1000], got '" + v + "'";
             }
             o.vae_relative_tile_w = values[0];
             o.vae_relative_tile_h = values[1];
             return std::nullopt;
         }},
        {nullptr, "--vae-tile-overlap", "X", "share of a VAE tile overlapping its neighbour, in [0, 1) (default 0.5)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             char* end = nullptr;
             const float f = std::strtof(v.c_str(), &end);
             if (v.empty() || *end != '\0' || !(f >= 0.0f && f < 1.0f))
                 return "expected a number in [0, 1), got '" + v + "'";
             o.vae_tile_overlap = f;
             return std::nullopt;
         }},
        {nullptr, "--upscale-model", "PATH",
         "ESRGAN / Real-ESRGAN upscaler (.safetensors, .pth, .gguf) run on the generated images, or on -i "
         "with -M upscale",
         path_setter(&Options::upscale_model)},
        {nullptr, "--upscale-repeats", "N", "run the upscaler this many times, 1 to 8 (default 1)",
         int_setter(&Options::upscale_repeats, 1, 8)},
        {nullptr, "--upscale-tile-size", "N", "upscaler tile side in pixels (default 128)",
         int_setter(&Options::upscale_tile_size, 0, 1 << 20)},
        {nullptr, "--hires", nullptr,
         "hires fix: upscale the first pass and denoise it again at the larger size (text-to-image)",
         switch_setter(&Options::hires)},
        {nullptr, "--hires-scale", "X", "hires size as a multiple of the first pass's (default 2)",
         float_setter(&Options::hires_scale)},
        {nullptr, "--hires-width", "N", "hires width in pixels; 0 uses --hires-scale (default 0)",
         int_setter(&Options::hires_width, -(1 << 20), 1 << 20)},
        {nullptr, "--hires-height", "N", "hires height in pixels; 0 uses --hires-scale (default 0)",
         int_setter(&Options::hires_height, -(1 << 20), 1 << 20)},
        {nullptr, "--hires-steps", "N", "second pass steps; 0 reuses --steps (default 0)",
         int_setter(&Options::hires_steps, -(1 << 20), 1 << 20)},
        {nullptr, "--hires-denoising-strength", "X",
         "share of the second pass's schedule to run, in [0, 1] (default 0.7; 0: upscale only)",
         bounded_float_setter(&Options::hires_denoising_strength, 0, 1)},
        {nullptr, "--hires-upscaler", "NAME",
         "latent (bilinear, default), latent-nearest, latent-nearest-exact, lanczos, or an ESRGAN model file",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected latent, latent-nearest or a model file");
             o.hires_upscaler = v;
             return std::nullopt;
         }},
        {nullptr, "--hires-upscalers-dir", "DIR",
         "folder of ESRGAN models: --hires-upscaler NAME may name one by file name, with or without its "
         "extension",
         path_setter(&Options::hires_upscalers_dir)},
        {nullptr, "--hires-sigmas", "LIST",
         "the second pass's schedule as it runs, comma-separated and descending to 0 (e.g. "
         "\"0.85,0.725,0.42,0\"); replaces --hires-steps and --hires-denoising-strength",
         sigmas_setter(&Options::hires_sigmas)},
        {nullptr, "--hires-upscale-tile-size", "N", "tile side of a model --hires-upscaler in pixels (default 128)",
         int_setter(&Options::hires_upscale_tile_size, 0, 1 << 20)},
        {nullptr, "--taesd", "PATH",
         "tiny autoencoder decoder (TAESD, TAESDXL, TAEF1): decodes the final image instead of the VAE (fast, "
         "lower quality) and makes --preview tae previews",
         path_setter(&Options::taesd)},
        {nullptr, "--tae", "PATH", "alias of --taesd", path_setter(&Options::taesd)},
        {nullptr, "--taesd-preview-only", nullptr,
         "use --taesd for --preview tae only; the final image still comes from the VAE",
         switch_setter(&Options::taesd_preview_only)},
        {nullptr, "--preview", "MODE",
         "live preview while sampling: none (default), proj (latent-to-RGB projection, latent-sized), tae "
         "(--taesd), vae (the full VAE); kiln serve: the default of its jobs (default proj)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (auto err = checked_setter(&Options::preview, KILN_VALUE_PREVIEW)(o, v)) return err;
             o.preview_given = true;
             return std::nullopt;
         }},
        {nullptr, "--preview-path", "PATH",
         "where the preview image goes, replaced at each update (default "
         "preview.png)",
         path_setter(&Options::preview_path)},
        {nullptr, "--preview-interval", "N", "update the preview every N denoising steps (default 1)",
         int_setter(&Options::preview_interval, 1, 10000)},
        {nullptr, "--preview-noisy", nullptr,
         "preview the noisy latent the network is given instead of the denoised estimate",
         switch_setter(&Options::preview_noisy)},
        {nullptr, "--cache-mode", "MODE",
         "a step cache that reuses or forecasts work between steps: ucache (UNets), easycache, dbcache, "
         "taylorseer, cache-dit (DiTs) or spectrum (both); default none (docs/caching.md)",
         string_setter(&Options::cache_mode)},
        {nullptr, "--cache-option", "LIST",
         "the cache's settings, \"key=value,...\": threshold, start, end, decay, relative, reset (ucache), "
         "threshold, start, end (easycache), Fn, Bn, threshold, warmup (dbcache, taylorseer, cache-dit), "
         "w, m, lam, window, flex, warmup, stop (spectrum)",
         string_setter(&Options::cache_option)},
        {nullptr, "--scm-mask", "LIST",
         "dbcache, taylorseer and cache-dit: one 1 (compute) or 0 (may cache) per step, e.g. \"1,1,0,1\"",
         string_setter(&Options::scm_mask)},
        {nullptr, "--scm-policy", "POLICY",
         "a 0 step of --scm-mask checks the threshold (dynamic, the default) or caches outright (static)",
         string_setter(&Options::scm_policy)},
        {nullptr, "--diffusion-fa", nullptr, "use flash attention in the diffusion model",
         switch_setter(&Options::diffusion_fa)},
        {nullptr, "--fa", nullptr,
         "flash attention: kiln uses it in the diffusion model (as --diffusion-fa); the encoders' and VAE's "
         "attention is small beside it",
         switch_setter(&Options::diffusion_fa)},
        {nullptr, "--list-devices", nullptr,
         "list every compute device (name, type, free and total memory), --rpc-servers ones included",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.command = Command::ListDevices;
             return std::nullopt;
         }},
        {nullptr, "--rpc-servers", "HOST:PORT[,...]",
         "add the devices of ggml RPC servers (see 'kiln rpc-server'); they are named RPC0, RPC1, ...",
         checked_setter(&Options::rpc_servers, KILN_VALUE_RPC_SERVERS)},
        {nullptr, "--backend", "SPEC",
         "compute device for every module (cuda0), or per module: diffusion=rpc0,te=cpu,vae=cpu "
         "(modules: diffusion, te, vae, clip_vision); diffusion=rpc0&rpc1 splits the module's blocks across "
         "devices (layer split; diffusion and te)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a device or module=device pairs, got an empty string");
             o.backend = v;
             return std::nullopt;
         }},
        {nullptr, "--split-mode", "MODE",
         "how a module listed with several devices is split: layer (default) or row, for every module or "
         "per module: diffusion=row,te=layer; row runs as layer split where the devices offer no split buffers",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             auto modes = pipeline::parse_split_mode(v);
             // The message names the flag already; the caller adds it again.
             if (!modes.ok()) return modes.error().message.substr(std::string("--split-mode: ").size());
             o.split_mode = v;
             return std::nullopt;
         }},
        {nullptr, "--params-backend", "SPEC",
         "where weights live between uses: cpu (RAM), disk, or a device; for every module or per module: "
         "diffusion=cpu,vae=disk. Turns auto-fit off",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected cpu, disk, a device or module=location pairs");
             o.params_backend = v;
             return std::nullopt;
         }},
        {nullptr, "--clip-on-cpu", nullptr, "the text encoders compute on the CPU, as sd-cli's flag",
         module_on_cpu("te")},
        {nullptr, "--vae-on-cpu", nullptr, "the VAE computes on the CPU, as sd-cli's flag", module_on_cpu("vae")},
        {nullptr, "--control-net-cpu", nullptr, "the ControlNet computes on the CPU, as sd-cli's flag",
         module_on_cpu("control")},
        {nullptr, "--offload-to-cpu", nullptr, "keep every module's weights in RAM (--params-backend cpu)",
         switch_setter(&Options::offload_to_cpu)},
        {nullptr, "--max-vram", "GIB",
         "memory budget per device in GiB: 6 (a managed budget), 0 (free memory), -N (free memory at "
         "start minus N GiB, e.g. -1 or -0.5), or per device: cuda0=6,rpc0=0.5,cpu=-2; K/M/G suffixes "
         "allowed (96M); at most 1e9 GiB either way",
         checked_setter(&Options::max_vram, KILN_VALUE_MAX_VRAM)},
        {nullptr, "--auto-fit", "on|off",
         "choose placement and params locations automatically (default on; --backend or --params-backend "
         "turn it off)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v != "on" && v != "off") return "expected on or off, got '" + v + "'";
             o.auto_fit = v == "on";
             return std::nullopt;
         }},
        {nullptr, "--eager-load", nullptr, "read every module's weights at start instead of on first use",
         switch_setter(&Options::eager_load)},
        {nullptr, "--disable-prefetch", nullptr,
         "do not upload the next segment's weights while the current one computes",
         switch_setter(&Options::disable_prefetch)},
        {nullptr, "--disable-segmented-compute", nullptr,
         "always run graphs whole (a graph that does not fit is an error)",
         switch_setter(&Options::disable_segmented_compute)},
        {nullptr, "--dry-run", nullptr,
         "print the placement, predicted memory per device and segments per module, then stop (kiln plan)",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.command = Command::Plan;
             return std::nullopt;
         }},
        {"-v", "--verbose", nullptr, "verbose logging (same as --log-level verbose)",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.log_level = LogLevel::Verbose;
             return std::nullopt;
         }},
        {nullptr, "--log-level", "LEVEL", "debug, verbose, info (default), warn or error",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             auto level = parse_log_level(v);
             if (!level) return "unknown log level '" + v + "' (valid: debug, verbose, info, warn, error)";
             o.log_level = *level;
             return std::nullopt;
         }},
        {nullptr, "--color", nullptr, "colour the log level tags", switch_setter(&Options::color)},
        {"-q", "--quiet", nullptr, "only warnings and errors: no progress, no \"saved\" lines",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.quiet = true;
             o.log_level = LogLevel::Warn;
             return std::nullopt;
         }},
        {"-h", "--help", nullptr, "show this help (after a command or -M MODE: that one's options)",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.help_topic = o.command;
             o.command = Command::Help;
             return std::nullopt;
         }},
        {nullptr, "--version", nullptr, "print the version",
         [](Options& o, const std::string&) -> std::optional<std::string> {
             o.command = Command::Version;
             return std::nullopt;
         }},
    };
    return table;
}

// `kiln info` has options of its own.
const std::vector<Flag>& info_flags() {
    static const std::vector<Flag> table = {
        {nullptr, "--tensors", nullptr, "list every tensor: name, dtype, shape, byte range",
         switch_setter(&Options::info_list_tensors)},
    };
    return table;
}

// `kiln plan` has one option of its own.
const std::vector<Flag>& plan_flags() {
    static const std::vector<Flag> table = {
        {nullptr, "--ram", "SIZE",
         "plan for a machine with SIZE of RAM available (GiB or with a K/M/G suffix), not this one: which "
         "weights stay in RAM and which stream from disk",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a size such as 32G, got an empty string");
             o.plan_ram = v;
             return std::nullopt;
         }},
    };
    return table;
}

// `kiln rpc-server` has options of its own.
const std::vector<Flag>& rpc_server_flags() {
    static const std::vector<Flag> table = {
        {nullptr, "--host", "ADDRESS",
         "IPv4 address to listen on (default 127.0.0.1; any other address lets other machines in, unauthenticated)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             const std::string host = v == "localhost" ? "127.0.0.1" : v;
             in_addr addr{};
             if (inet_pton(AF_INET, host.c_str(), &addr) != 1 || host == "255.255.255.255")
                 return "expected an IPv4 address such as 127.0.0.1 or 0.0.0.0, got '" + v + "'";
             o.rpc_host = host;
             return std::nullopt;
         }},
        {nullptr, "--port", "N", "TCP port to listen on (default 50052)", int_setter(&Options::rpc_port, 1, 65535)},
        {nullptr, "--device", "NAME", "device to serve (default: CPU; see --list-devices)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a device name, got an empty string");
             o.rpc_device = v;
             return std::nullopt;
         }},
        {nullptr, "--max-alloc", "SIZE",
         "largest buffer a client may allocate, GiB or with a K/M/G suffix (default: the device's total memory)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a size such as 2G or 512M, got an empty string");
             o.rpc_max_alloc = v;
             return std::nullopt;
         }},
        {nullptr, "--mem", "SIZE",
         "memory to report to clients as the device's free and total, GiB or with a K/M/G suffix (default: the "
         "device's own): kiln plan on the client then plans for a device of that size; buffers still come from "
         "this device",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a size such as 32G or 512M, got an empty string");
             o.rpc_mem = v;
             return std::nullopt;
         }},
        {"-c", "--cache", nullptr,
         "keep the large tensors (10 MiB and more) clients send, by hash, in $KILN_CACHE/rpc (else "
         "~/.cache/kiln/rpc): a client's next upload of one sends only its hash",
         switch_setter(&Options::rpc_cache)},
        {nullptr, "--cache-dir", "DIR", "the tensor cache's folder (turns the cache on; made when missing)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a folder, got an empty string");
             o.rpc_cache_dir = v;
             return std::nullopt;
         }},
    };
    return table;
}

// `kiln pull` has options of its own and takes only the logging and help
// flags besides (its --tokenizer names a tokenizer to fetch, not a path).
const std::vector<Flag>& pull_flags() {
    static const std::vector<Flag> table = {
        {nullptr, "--include", "PATTERN",
         "pull only files whose path matches PATTERN ('*' also matches '/'; repeatable, any may match)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a file pattern such as '*.json', got an empty string");
             o.pull_includes.push_back(v);
             return std::nullopt;
         }},
        {nullptr, "--revision", "REV", "branch, tag or commit to pull (default main)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (auto problem = check_revision(v)) return problem;
             o.pull_revision = v;
             o.pull_revision_given = true;
             return std::nullopt;
         }},
        {nullptr, "--hub-url", "URL", "the hub (default $HF_ENDPOINT, else https://huggingface.co)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.rfind("http://", 0) != 0 && v.rfind("https://", 0) != 0)
                 return "expected an http:// or https:// URL, got '" + v + "'";
             o.pull_hub_url = v;
             return std::nullopt;
         }},
        {nullptr, "--tokenizer", "NAME",
         "fetch the tokenizer files a text encoder needs into kiln's cache, where later runs find them",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (!find_tokenizer_source(v))
                 return "unknown tokenizer '" + v + "' (valid: " + tokenizer_source_names() + ")";
             o.pull_tokenizer = v;
             return std::nullopt;
         }},
        {nullptr, "--to", "DIR", "write the files under DIR instead of kiln's cache (e.g. a server's --model-dir)",
         path_setter(&Options::pull_to)},
        {nullptr, "--max-size", "SIZE",
         "largest file whose size neither the hub nor its server gives, GiB or with a K/M/G suffix (default 1024)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             auto gib = runtime::parse_gib_amount(v);
             if (!gib.ok()) return gib.error().message;
             if (!(*gib > 0) || *gib > 1e9) return "expected a size from 1K to 1e9G, got '" + v + "'";
             o.pull_max_bytes = static_cast<uint64_t>(*gib * 1024.0 * 1024.0 * 1024.0);
             return std::nullopt;
         }},
    };
    return table;
}

// `kiln serve` has options of its own; kiln's context flags (-m, --vae, -t, ...) apply too.
const std::vector<Flag>& serve_flags() {
    static const std::vector<Flag> table = {
        {nullptr, "--listen-ip", "ADDRESS",
         "address to listen on (default 127.0.0.1; any other lets other machines in: use --api-key)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             const std::string ip = v == "localhost" ? "127.0.0.1" : v;
             in_addr addr{};
             in6_addr addr6{};
             if (inet_pton(AF_INET, ip.c_str(), &addr) != 1 && inet_pton(AF_INET6, ip.c_str(), &addr6) != 1)
                 return "expected an IP address such as 127.0.0.1 or 0.0.0.0, got '" + v + "'";
             o.listen_ip = ip;
             return std::nullopt;
         }},
        {nullptr, "--listen-port", "N", "TCP port (default 1234; 0 picks a free one and prints it)",
         int_setter(&Options::listen_port, 0, 65535)},
        {nullptr, "--model-dir", "DIR",
         "serve every model file and diffusers folder under DIR, chosen per request by its path in DIR",
         path_setter(&Options::model_dir)},
        {nullptr, "--api-key", "KEY", "require 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' on every request",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a key, got an empty string");
             // HTTP drops a header value's outer whitespace, and control
             // characters cannot be sent at all: no client could match such a key.
             const auto blank = [](unsigned char c) { return c == ' ' || c == '\t'; };
             if (blank(v.front()) || blank(v.back()))
                 return std::string("the key begins or ends with whitespace, which HTTP clients cannot send");
             for (unsigned char c : v) {
                 if (c < 0x20 || c == 0x7f)
                     return std::string("the key has a control character, which HTTP clients cannot send");
             }
             o.api_key = v;
             return std::nullopt;
         }},
        {nullptr, "--host-name", "NAME",
         "a name the server is reached by besides its address and localhost (repeatable); without --api-key, other "
         "Host headers get 421",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             if (v.empty() || v.find_first_of(" \t/:[]@") != std::string::npos)
                 return "expected a host name such as kiln.lan, got '" + v + "'";
             o.host_names.push_back(v);
             return std::nullopt;
         }},
        {nullptr, "--cors-origin", "ORIGIN",
         "let pages from ORIGIN (http://host[:port], or * for any) call the server (repeatable)",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             const auto scheme = v.find("://");
             const bool origin = scheme != std::string::npos && scheme > 0 && v.size() > scheme + 3 &&
                                 v.find_first_of("/ \t", scheme + 3) == std::string::npos;
             if (v != "*" && !origin)
                 return "expected an origin such as http://localhost:3000 (no path), or *, got '" + v + "'";
             o.cors_origins.push_back(v);
             return std::nullopt;
         }},
        {nullptr, "--max-queue", "N", "jobs that may wait (default 16); past it requests get 429",
         int_setter(&Options::max_queue, 1, 100000)},
        {nullptr, "--max-loaded-models", "N", "models kept loaded at once (default 2; least recently used goes first)",
         int_setter(&Options::max_loaded_models, 1, 64)},
        {nullptr, "--max-width", "N", "widest image a request may ask for (default 2048)",
         int_setter(&Options::max_width, 8, 16384)},
        {nullptr, "--max-height", "N", "tallest image a request may ask for (default 2048)",
         int_setter(&Options::max_height, 8, 16384)},
        {nullptr, "--max-steps", "N", "most steps a request may ask for (default 150)",
         int_setter(&Options::max_steps, 1, 10000)},
        {nullptr, "--max-batch", "N", "most images per request (default 8)", int_setter(&Options::max_batch, 1, 10000)},
        {nullptr, "--max-body-bytes", "N", "largest request body (default 67108864); larger ones get 413",
         [](Options& o, const std::string& v) -> std::optional<std::string> {
             long long parsed = 0;
             if (auto err = parse_integer(v, 1024, 1ll << 34, &parsed)) return err;
             o.max_body_bytes = parsed;
             return std::nullopt;
         }},
        {nullptr, "--result-ttl", "SECONDS", "how long finished jobs and their images are kept (default 600)",
         int_setter(&Options::result_ttl, 1, 604800)},
        {nullptr, "--max-results", "N", "how many finished jobs are kept (default 64)",
         int_setter(&Options::max_results, 1, 100000)},
        {nullptr, "--output-dir", "DIR",
         "also write every finished image to DIR (created when missing); the web page's gallery lists it",
         path_setter(&Options::serve_output_dir)},
        {nullptr, "--max-pixels", "FACTOR",
         "refuse jobs with more than FACTOR times the pixels the model is trained at (default 9: SD1.x up to "
         "1536x1536, SDXL and Flux up to 3072x3072)",
         bounded_float_setter(&Options::max_pixels_factor, 1, 1000)},
    };
    return table;
}

// The flags of the main table that every subcommand takes.
bool is_common_flag(const Flag& f) {
    const std::string name = f.long_name;
    return name == "--verbose" || name == "--log-level" || name == "--color" || name == "--help";
}

// The parts of a `kiln pull` command line that only make sense together.
std::optional<UsageError> check_pull(const Options& o) {
    const UsageError usage{"",
                           "usage: kiln pull REPO [--include PATTERN]... [--revision R] [--hub-url URL] [--to DIR] "
                           "| kiln pull --tokenizer NAME"};
    if (o.pull_repo.empty() && o.pull_tokenizer.empty()) {
        return UsageError{"pull: name a repository (OWNER/NAME) or --tokenizer NAME", usage.hint};
    }
    if (!o.pull_repo.empty() && !o.pull_tokenizer.empty()) {
        return UsageError{
            "pull: '" + o.pull_repo + "' and --tokenizer " + o.pull_tokenizer + " both name what to pull; give one",
            usage.hint};
    }
    if (!o.pull_tokenizer.empty() && (!o.pull_includes.empty() || o.pull_revision_given)) {
        return UsageError{"pull: --tokenizer " + o.pull_tokenizer +
                              " fetches fixed files from a fixed repository; --include and --revision apply to "
                              "a repository pull",
                          usage.hint};
    }
    return std::nullopt;
}

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

std::string suggestion_for(const std::string& unknown, const std::vector<const Flag*>& candidates) {
    std::string best;
    size_t best_distance = SIZE_MAX;
    for (const Flag* f : candidates) {
        const size_t d = edit_distance(unknown, f->long_name);
        if (d < best_distance) {
            best_distance = d;
            best = f->long_name;
        }
    }
    if (!best.empty() && best_distance <= std::max<size_t>(2, unknown.size() / 3))
        return "did you mean '" + best + "'?";
    return "see 'kiln --help'";
}

const Flag* find_flag(const std::string& name, const std::vector<const Flag*>& candidates) {
    for (const Flag* f : candidates) {
        if ((f->short_name && name == f->short_name) || name == f->long_name) return f;
    }
    return nullptr;
}

}  // namespace

std::variant<Options, UsageError> parse_args(const std::vector<std::string>& args) {
    Options options;
    std::vector<const Flag*> known;
    for (const Flag& f : flags()) known.push_back(&f);

    size_t i = 0;
    if (!args.empty() && args[0] == "info") {
        options.command = Command::Info;
        for (const Flag& f : info_flags()) known.push_back(&f);
        i = 1;
    } else if (!args.empty() && args[0] == "plan") {
        options.command = Command::Plan;
        for (const Flag& f : plan_flags()) known.push_back(&f);
        i = 1;
    } else if (!args.empty() && args[0] == "pull") {
        options.command = Command::Pull;
        known.clear();
        for (const Flag& f : pull_flags()) known.push_back(&f);
        for (const Flag& f : flags()) {
            if (is_common_flag(f)) known.push_back(&f);
        }
        i = 1;
    } else if (!args.empty() && args[0] == "serve") {
        options.command = Command::Serve;
        for (const Flag& f : serve_flags()) known.push_back(&f);
        i = 1;
    } else if (!args.empty() && args[0] == "rpc-server") {
        options.command = Command::RpcServer;
        for (const Flag& f : rpc_server_flags()) known.push_back(&f);
        i = 1;
    }
    for (; i < args.size(); ++i) {
        std::string arg = args[i];
        if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
            if (options.command == Command::Info) {
                options.info_paths.push_back(arg);
                continue;
            }
            if (options.command == Command::Pull && options.pull_repo.empty() && arg != "--") {
                if (auto problem = check_repo_name(arg)) return UsageError{"pull: " + *problem, "see 'kiln --help'"};
                options.pull_repo = arg;
                continue;
            }
            return UsageError{"unexpected argument '" + arg + "'",
                              arg == "info"         ? "'info' must come first: kiln info FILE..."
                              : arg == "rpc-server" ? "'rpc-server' must come first: kiln rpc-server --port P"
                              : arg == "pull"       ? "'pull' must come first: kiln pull REPO"
                                                    : "see 'kiln --help'"};
        }
        std::optional<std::string> inline_value;
        if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
            inline_value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
        }
        const Flag* flag = find_flag(arg, known);
        if (!flag) {
            const SdCliOption* sd_cli = find_sd_cli_option(arg);
            for (const Flag& f : plan_flags()) {
                if (!sd_cli && arg == f.long_name)
                    return UsageError{arg + " is an option of kiln plan", "kiln plan " + arg + " SIZE [options]"};
            }
            if (!sd_cli) return UsageError{"unknown option '" + arg + "'", suggestion_for(arg, known)};
            if (sd_cli->stance == SdCliStance::Refused) {
                return UsageError{arg + " " + sd_cli->why, "see docs/sd_cli.md"};
            }
            if (!sd_cli->takes_value && inline_value) return UsageError{arg + " takes no value", "see 'kiln --help'"};
            if (sd_cli->takes_value && !inline_value && ++i >= args.size()) {
                return UsageError{arg + ": missing value", "see 'kiln --help'"};
            }
            options.ignored_sd_cli_options.push_back(arg);
            continue;
        }
        std::string value;
        if (flag->value_name) {
            if (inline_value) {
                value = *inline_value;
            } else if (i + 1 < args.size()) {
                value = args[++i];
            } else {
                return UsageError{std::string(flag->long_name) + ": missing value " + flag->value_name,
                                  "see 'kiln --help'"};
            }
        } else if (inline_value) {
            return UsageError{std::string(flag->long_name) + " takes no value", "see 'kiln --help'"};
        }
        if (auto err = flag->apply(options, value)) {
            return UsageError{std::string(flag->long_name) + ": " + *err, "see 'kiln --help'"};
        }
    }
    if (options.command == Command::Pull) {
        if (auto usage = check_pull(options)) return *usage;
    }
    return options;
}

SdCliSupportNote sd_cli_support(const std::string& name) {
    for (const Flag& f : flags()) {
        if ((f.short_name && name == f.short_name) || name == f.long_name) {
            return {SdCliSupport::Implemented, f.help, f.value_name != nullptr};
        }
    }
    if (const SdCliOption* o = find_sd_cli_option(name)) {
        if (o->stance == SdCliStance::Ignored) return {SdCliSupport::Ignored, o->why, o->takes_value};
        return {SdCliSupport::Refused, name + " " + o->why, o->takes_value};
    }
    return {};
}

namespace {

// --help's groups of the main options, in the order a person reads them;
// every flag of flags() is in one (tests/unit/args_test.cpp checks).
struct HelpGroup {
    const char* title;
    std::vector<const char*> flags;
};

const std::vector<HelpGroup>& help_groups() {
    static const std::vector<HelpGroup> groups = {
        {"model files",
         {"--mode",
          "--model",
          "--diffusion-model",
          "--high-noise-diffusion-model",
          "--vae",
          "--vae-format",
          "--clip_l",
          "--clip_g",
          "--t5xxl",
          "--llm",
          "--qwen2vl",
          "--llm_vision",
          "--qwen2vl_vision",
          "--clip_vision",
          "--qwen-image-zero-cond-t",
          "--tokenizer",
          "--embd-dir",
          "--lora-model-dir",
          "--lora-apply-mode",
          "--type",
          "--tensor-type-rules",
          "--model-args",
          "--prediction"}},
        {"generation",
         {"--prompt",
          "--negative-prompt",
          "--prompt-file",
          "--negative-prompt-file",
          "--width",
          "--height",
          "--steps",
          "--batch-count",
          "--video-frames",
          "--fps",
          "--seed",
          "--cfg-scale",
          "--guidance",
          "--flow-shift",
          "--clip-skip",
          "--threads",
          "--ref-image",
          "--disable-auto-resize-ref-image",
          "--increase-ref-index",
          "--circular",
          "--circularx",
          "--circulary",
          "--chroma-disable-dit-mask",
          "--chroma-enable-t5-mask",
          "--chroma-t5-mask-pad",
          "--max-sequence-length",
          "--diffusion-fa",
          "--fa"}},
        {"sampling",
         {"--sampling-method",
          "--scheduler",
          "--rng",
          "--sampler-rng",
          "--eta",
          "--timestep-shift",
          "--sigmas",
          "--slg-scale",
          "--skip-layers",
          "--skip-layer-start",
          "--skip-layer-end",
          "--cache-mode",
          "--cache-option",
          "--scm-mask",
          "--scm-policy",
          "--high-noise-steps",
          "--high-noise-cfg-scale",
          "--high-noise-sampling-method",
          "--high-noise-eta",
          "--moe-boundary"}},
        {"img2img, inpainting, ControlNet and VACE",
         {"--init-img", "--image", "--end-img", "--mask", "--strength", "--max-image-pixels", "--control-net",
          "--control-image", "--control-strength", "--canny", "--control-video", "--vace-strength"}},
        {"hires fix and upscaling",
         {"--hires", "--hires-scale", "--hires-width", "--hires-height", "--hires-steps", "--hires-denoising-strength",
          "--hires-upscaler", "--hires-upscalers-dir", "--hires-sigmas", "--hires-upscale-tile-size", "--upscale-model",
          "--upscale-repeats", "--upscale-tile-size"}},
        {"VAE and previews",
         {"--vae-tiling", "--vae-tile-size", "--vae-relative-tile-size", "--vae-tile-overlap", "--taesd", "--tae",
          "--taesd-preview-only", "--preview", "--preview-path", "--preview-interval", "--preview-noisy"}},
        {"memory and devices (docs/memory.md, docs/devices.md)",
         {"--list-devices", "--rpc-servers", "--backend", "--split-mode", "--params-backend", "--clip-on-cpu",
          "--vae-on-cpu", "--control-net-cpu", "--offload-to-cpu", "--max-vram", "--auto-fit", "--eager-load",
          "--disable-prefetch", "--disable-segmented-compute", "--dry-run"}},
        {"output",
         {"--output", "--output-begin-idx", "--disable-image-metadata", "--metadata-format", "--metadata-raw",
          "--metadata-brief", "--metadata-all"}},
        {"logging", {"--verbose", "--quiet", "--log-level", "--color", "--help", "--version"}},
    };
    return groups;
}

// One option's line: its names in a column of 30, then what it does.
void print_row(std::ostringstream& out, const std::string& names, const std::string& help) {
    out << "  " << names;
    for (size_t pad = names.size(); pad < 30; ++pad) out << ' ';
    out << ' ' << help << '\n';
}

void print_flag(std::ostringstream& out, const Flag& f) {
    std::string names = f.short_name ? std::string(f.short_name) + ", " : "    ";
    names += f.long_name;
    if (f.value_name) names += std::string(" ") + f.value_name;
    print_row(out, names, f.help);
}

void print_flags(std::ostringstream& out, const std::vector<Flag>& table) {
    for (const Flag& f : table) print_flag(out, f);
}

// The main options whose names are `names`, in that order.
void print_named(std::ostringstream& out, const std::vector<const char*>& names) {
    for (const char* name : names) {
        for (const Flag& f : flags()) {
            if (name == std::string(f.long_name)) print_flag(out, f);
        }
    }
}

}  // namespace

std::vector<std::string> flags_outside_help_groups() {
    std::vector<std::string> out;
    for (const Flag& f : flags()) {
        bool grouped = false;
        for (const HelpGroup& g : help_groups()) {
            for (const char* name : g.flags) grouped = grouped || name == std::string(f.long_name);
        }
        if (!grouped) out.push_back(f.long_name);
    }
    return out;
}

std::string help_text(Command topic) {
    std::ostringstream out;
    switch (topic) {
        case Command::Info:
            out << "usage: kiln info [--tensors] [FILE|FOLDER...]   (no file: the default model)\n\n";
            print_flags(out, info_flags());
            return out.str();
        case Command::RpcServer:
            out << "usage: kiln rpc-server [--host ADDRESS] [--port N] [--device NAME] [--max-alloc SIZE]\n"
                   "ggml's RPC protocol has no authentication: keep it on 127.0.0.1 or a trusted network.\n\n";
            print_flags(out, rpc_server_flags());
            return out.str();
        case Command::Pull:
            out << "usage: kiln pull REPO [--include PATTERN]... [--revision R] [--hub-url URL] [--to DIR]\n"
                   "       kiln pull --tokenizer NAME\n"
                   "HF_TOKEN is sent as a bearer token when set; files go to $KILN_CACHE, else ~/.cache/kiln "
                   "(docs/pull.md).\n\n";
            print_flags(out, pull_flags());
            out << "  tokenizers:\n";
            for (const TokenizerSource& s : tokenizer_sources()) {
                std::string files;
                for (const std::string& f : s.files) files += (files.empty() ? "" : " + ") + f;
                out << "    " << s.name << std::string(s.name.size() < 8 ? 8 - s.name.size() : 1, ' ') << s.repo << ": "
                    << files << "; " << s.used_by << "\n";
            }
            return out.str();
        case Command::Serve:
            out << "usage: kiln serve [-m MODEL | --model-dir DIR] [--listen-port N] [--api-key KEY] ...\n"
                   "The model options of kiln --help (--tokenizer, --vae, --max-vram, ...) apply to every model "
                   "served (docs/server.md).\n\n";
            print_flags(out, serve_flags());
            return out.str();
        case Command::Plan:
            out << "usage: kiln plan [generation options]   will the job fit, and how? (same as --dry-run)\n"
                   "It takes every option of kiln --help and reads no weight (docs/memory.md).\n\n";
            print_flags(out, plan_flags());
            for (const HelpGroup& g : help_groups()) {
                if (std::string(g.title).rfind("memory", 0) == 0) print_named(out, g.flags);
            }
            return out.str();
        case Command::Metadata:
            out << "usage: kiln -M metadata -i IMAGE [--metadata-format text|json|parameters] [--metadata-raw] "
                   "[--metadata-brief] [--metadata-all]\n\n";
            print_named(out, {"--init-img", "--image", "--metadata-format", "--metadata-raw", "--metadata-brief",
                              "--metadata-all"});
            return out.str();
        case Command::Convert:
            out << "usage: kiln -M convert -m MODEL -o OUT.gguf [--type TYPE]   (or --diffusion-model, --vae, ... "
                   "for one part)\n\n";
            print_named(out, {"--model", "--diffusion-model", "--vae", "--clip_l", "--clip_g", "--t5xxl", "--llm",
                              "--tokenizer", "--type", "--tensor-type-rules", "--output"});
            return out.str();
        case Command::Upscale:
            out << "usage: kiln -M upscale -i IMAGE --upscale-model FILE [-o OUT]\n\n";
            print_named(out, {"--init-img", "--upscale-model", "--upscale-repeats", "--upscale-tile-size", "--output"});
            return out.str();
        default: break;
    }
    out << "usage: kiln [options]                 generate an image\n"
           "       kiln -M convert -m MODEL -o OUT.gguf [--type TYPE]\n"
           "       kiln -M metadata -i IMAGE\n"
           "       kiln -M upscale -i IMAGE --upscale-model FILE [-o OUT]\n"
           "       kiln info [--tensors] [FILE|FOLDER...]   (no file: the default model)\n"
           "       kiln --list-devices [--rpc-servers HOST:PORT,...]\n"
           "       kiln plan [options]                  will the job fit, and how? (same as --dry-run)\n"
           "       kiln rpc-server [--host ADDRESS] [--port N] [--device NAME] [--max-alloc SIZE]   serve a device\n"
           "       kiln pull REPO [--include PATTERN]... [--revision R] [--to DIR]   download from a model hub\n"
           "       kiln pull --tokenizer NAME           fetch a tokenizer into kiln's cache (docs/pull.md)\n"
           "       kiln serve [-m MODEL | --model-dir DIR] [--listen-port N] [--api-key KEY] ...   the HTTP server\n"
           "Each command, and -M MODE, has its own --help (kiln serve --help, kiln -M metadata --help).\n";
    for (const HelpGroup& g : help_groups()) {
        out << "\n" << g.title << ":\n";
        print_named(out, g.flags);
    }
    out << "\nsd-cli options kiln accepts and ignores (docs/sd_cli.md lists every sd-cli option):\n";
    for (const SdCliOption& o : sd_cli_options_without_kiln_flag()) {
        if (o.stance == SdCliStance::Ignored) print_row(out, std::string("    ") + o.name, o.why);
    }
    // Then each command's own help, as `kiln COMMAND --help` prints it.
    for (Command command : {Command::Info, Command::RpcServer, Command::Pull, Command::Serve}) {
        out << "\n" << help_text(command);
    }
    return out.str();
}

}  // namespace kiln::cli
