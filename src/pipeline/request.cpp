#include "pipeline/request.h"

#include <cmath>
#include <filesystem>

#include "pipeline/image_to_video.h"
#include "pipeline/loras.h"
#include "pipeline/model.h"
#include "pipeline/prompt_weights.h"
#include "pipeline/vace_context.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

Status check_sigmas(const std::vector<float>& sigmas, bool flow, const std::string& flag);

std::string size_text(int width, int height) { return std::to_string(width) + "x" + std::to_string(height); }

// `size` rounded to the nearest multiple of `stride`, at least one stride.
int round_to_stride(double size, int stride) {
    return std::max(stride, static_cast<int>(std::lround(size / stride)) * stride);
}

// The diffusion network's own limit on the image's sides (an MMDiT's
// position embedding): `what` names the size in the error.
Status check_network_size(const Model& model, int width, int height, const std::string& what) {
    const int64_t latent_side = model.diffusion().capabilities().max_latent_side;
    const int64_t side = latent_side * model.vae().format().downscale;
    if (latent_side > 0 && (width > side || height > side)) {
        return Error::invalid_request(what + " must be at most " + std::to_string(side) + " a side for this model (" +
                                      model.family_label() + ": its position embedding covers no more), got " +
                                      size_text(width, height));
    }
    return Status::Ok();
}

// VACE's inputs: control frames only for a VACE DiT, each a sound image;
// the strength finite and in range. The reference image's latent frame
// joins the clip's.
Status check_vace(const GenerationRequest& r, ValidatedRequest& p) {
    if (!std::isfinite(r.vace_strength) || r.vace_strength < 0 || r.vace_strength > kMaxVaceStrength) {
        return Error::invalid_request("--vace-strength must be in [0, " + format_number(kMaxVaceStrength) + "], got " +
                                      format_number(r.vace_strength));
    }
    if (!p.vace) {
        if (!r.control_frames.empty()) {
            return Error::invalid_request(
                "--control-video is for a Wan VACE DiT (vace_blocks, e.g. wan2.1_vace_1.3B); this DiT has no VACE "
                "blocks");
        }
        return Status::Ok();
    }
    for (size_t i = 0; i < r.control_frames.size(); ++i) {
        const std::string what = "--control-video frame " + std::to_string(i + 1);
        if (Status s = image::validate_image(r.control_frames[i], what); !s.ok())
            return s.error().as(ErrorKind::InvalidRequest);
    }
    if (static_cast<int>(r.control_frames.size()) > p.frames) {
        KILN_LOG_WARN("--control-video has %zu frames; the clip has %d, so the rest are not used",
                      r.control_frames.size(), p.frames);
    }
    if (p.vace_reference) p.latent_frames += kVaceReferenceFrames;
    return Status::Ok();
}

// --video-frames: a video model's frames, made 4k + 1 as sd-cli makes them
// ((n - 1) / 4 * 4 + 1: the VAE's first latent frame is one frame, each
// later one temporal_downscale frames), and what a clip cannot take.
Status check_video_frames(const Model& model, const GenerationRequest& r, ValidatedRequest& p) {
    p.video = model.diffusion().capabilities().video;
    if (!p.video) {
        if (r.end_image) {
            return Error::invalid_request("--end-img is the last frame of an image-to-video clip; " +
                                          model.family_label() + " makes images");
        }
        if (r.video_frames && *r.video_frames != 1) {
            return Error::invalid_request("--video-frames is for video models (Wan); " + model.family_label() +
                                          " makes images");
        }
        if (!r.control_frames.empty()) {
            return Error::invalid_request("--control-video is for a Wan VACE DiT; " + model.family_label() +
                                          " makes images");
        }
        return Status::Ok();
    }
    const int frames = r.video_frames.value_or(1);
    if (frames < 1 || frames > kMaxVideoFrames) {
        return Error::invalid_request("--video-frames must be in [1, " + std::to_string(kMaxVideoFrames) + "], got " +
                                      std::to_string(frames));
    }
    const int step = model.vae().format().temporal_downscale;
    if (step <= 0) {
        return Error::invalid_request(model.family_label() +
                                      " makes video but its VAE decodes single images: give "
                                      "the family's video VAE with --vae");
    }
    p.frames = (frames - 1) / step * step + 1;
    p.latent_frames = (p.frames - 1) / step + 1;
    if (p.frames != frames) {
        KILN_LOG_WARN("--video-frames %d: the model makes %d k + 1 frames; making %d", frames, step, p.frames);
    }
    p.first_frame = takes_first_frame(model);
    p.first_latent = r.init_image && takes_first_latent(model);
    p.vace = takes_vace_context(model);
    p.vace_reference = p.vace && r.init_image;
    if (r.mask || r.hires || r.control_image || !r.ref_images.empty() || (r.init_image && !p.init_image_in_clip())) {
        return Error::invalid_request(model.family_label() +
                                      " jobs take -i only as an image-to-video DiT's first frame or a VACE DiT's "
                                      "reference image (this one is text-to-video); --mask, --hires, "
                                      "--control-image and -r are not taken yet");
    }
    KILN_TRY(check_vace(r, p));
    if (p.first_latent && p.latent_frames < 2) {
        return Error::invalid_request("-i is the clip's first frame: a clip of " + std::to_string(p.frames) +
                                      " frame would be the image alone; ask for --video-frames " +
                                      std::to_string(1 + step) + " or more");
    }
    if (p.first_frame && !r.init_image) {
        return Error::invalid_request("this " + model.family_label() +
                                      " DiT is image-to-video (its input takes a first frame's latent and mask): "
                                      "pass the first frame with -i");
    }
    if (r.end_image && !p.first_frame) {
        return Error::invalid_request("--end-img is the last frame of an image-to-video DiT's clip; this " +
                                      model.family_label() + " DiT is text-to-video");
    }
    if (r.end_image && p.latent_frames < 2) {
        return Error::invalid_request("--end-img: a clip of " + std::to_string(p.frames) +
                                      " frame has no last frame apart from its first; ask for --video-frames " +
                                      std::to_string(1 + step) + " or more");
    }
    if (r.end_image) {
        if (Status s = image::validate_image(*r.end_image, "--end-img"); !s.ok())
            return s.error().as(ErrorKind::InvalidRequest);
    }
    p.last_frame = r.end_image.has_value();
    const models::DiffusionCapabilities& can = model.diffusion().capabilities();
    if (can.image_context_width > 0 && !model.has_vision()) {
        return Error::invalid_request("this " + model.family_label() +
                                      " DiT (Wan 2.1 I2V or FLF2V: img_emb) reads the first frame through CLIP "
                                      "vision: pass --clip_vision (clip_vision_h.safetensors)");
    }
    if (can.image_context_images == 2 && !r.end_image) {
        return Error::invalid_request("this " + model.family_label() +
                                      " DiT is first-last-frame-to-video (FLF2V: img_emb.emb_pos): pass the last "
                                      "frame with --end-img");
    }
    return Status::Ok();
}

// The hires fix's sizes, steps and upscaler; `p` is the first pass's.
Result<ValidatedHires> validate_hires(const Model& model, const GenerationRequest& r, const ValidatedRequest& p) {
    const HiresFix& h = *r.hires;
    ValidatedHires v;
    if (r.init_image) return Error::invalid_request("--hires is for text-to-image; it cannot be used with -i");
    const int stride = model.size_stride();
    if (h.width < 0 || h.height < 0) {
        return Error::invalid_request("--hires-width and --hires-height must be positive, got " +
                                      size_text(h.width, h.height));
    }
    if (h.width == 0 && h.height == 0) {
        if (!std::isfinite(h.scale) || !(h.scale > 0.0f && h.scale <= kMaxHiresScale)) {
            return Error::invalid_request("--hires-scale must be a number in (0, " + format_number(kMaxHiresScale) +
                                          "], got " + format_number(h.scale));
        }
        v.width = round_to_stride(p.width * static_cast<double>(h.scale), stride);
        v.height = round_to_stride(p.height * static_cast<double>(h.scale), stride);
    } else {
        // One side given: the other keeps the first pass's aspect ratio (A1111's rule).
        v.width = h.width > 0 ? h.width : round_to_stride(static_cast<double>(h.height) * p.width / p.height, stride);
        v.height = h.height > 0 ? h.height : round_to_stride(static_cast<double>(h.width) * p.height / p.width, stride);
        if (v.width % stride != 0 || v.height % stride != 0) {
            return Error::invalid_request("--hires-width and --hires-height must be multiples of " +
                                          std::to_string(stride) + " for this model (" + model.family_label() +
                                          "), got " + size_text(v.width, v.height));
        }
    }
    if (v.width > image::kMaxDimension || v.height > image::kMaxDimension) {
        return Error::invalid_request("the hires size must be at most " + std::to_string(image::kMaxDimension) +
                                      " a side, got " + size_text(v.width, v.height));
    }
    KILN_TRY(check_network_size(model, v.width, v.height, "the hires size"));
    v.latent_w = v.width / model.vae().format().downscale;
    v.latent_h = v.height / model.vae().format().downscale;
    if (h.steps < 0 || h.steps > kMaxSteps) {
        return Error::invalid_request("--hires-steps must be in [0, " + std::to_string(kMaxSteps) +
                                      "] (0: the first pass's steps), got " + std::to_string(h.steps));
    }
    v.steps = h.steps > 0 ? h.steps : p.steps;
    if (!h.sigmas.empty()) {
        const bool flow = model.noise_schedule(v.width, v.height, v.steps, r.flow_shift)->flow();
        KILN_TRY(check_sigmas(h.sigmas, flow, "--hires-sigmas"));
        v.sigmas = h.sigmas;
        v.steps = static_cast<int>(h.sigmas.size()) - 1;
    }
    if (!(h.denoising_strength >= 0.0f && h.denoising_strength <= 1.0f)) {
        return Error::invalid_request("--hires-denoising-strength must be in [0, 1], got " +
                                      format_number(h.denoising_strength));
    }
    // kiln's name, A1111's (which the parameters text records), what it does.
    struct BuiltIn {
        const char* name;
        const char* a1111;
        HiresUpscaler upscaler;
        LatentResize latent_mode;
    };
    static const BuiltIn kBuiltIn[] = {
        {"latent", "Latent", HiresUpscaler::Latent, LatentResize::Bilinear},
        {"latent-nearest", "Latent (nearest)", HiresUpscaler::Latent, LatentResize::Nearest},
        {"latent-nearest-exact", "Latent (nearest-exact)", HiresUpscaler::Latent, LatentResize::NearestExact},
        {"lanczos", "Lanczos", HiresUpscaler::Lanczos, LatentResize::Bilinear},
    };
    const BuiltIn* built_in = nullptr;
    for (const BuiltIn& b : kBuiltIn) {
        if (h.upscaler == b.name || h.upscaler == b.a1111) built_in = &b;
    }
    if (built_in) {
        v.upscaler = built_in->upscaler;
        v.latent_mode = built_in->latent_mode;
        v.label = built_in->a1111;
    } else {
        std::error_code ec;
        if (h.upscaler.empty() || !std::filesystem::is_regular_file(h.upscaler, ec)) {
            return Error::invalid_request("--hires-upscaler: '" + h.upscaler +
                                          "' is none of latent, latent-nearest, latent-nearest-exact, lanczos and "
                                          "no ESRGAN model file");
        }
        KILN_TRY(validate_upscale_tile(h.upscale_tile, "--hires-upscale-tile-size"));
        v.upscaler = HiresUpscaler::Model;
        v.model_path = h.upscaler;
        v.label = std::filesystem::path(h.upscaler).stem().string();
    }
    if (!model.vae().format().has_encoder && v.upscaler != HiresUpscaler::Latent && h.denoising_strength > 0.0f) {
        return Error::invalid_request("this model's VAE has no encoder: a hires fix with an image upscaler (" +
                                      v.label + ") needs one");
    }
    return v;
}

// --sigmas: a schedule the samplers can run. Strictly descending (equal
// neighbours would make a step of zero length, which some samplers divide
// by), every value finite and positive but the last, which is 0: kiln's
// samplers end on the clean latent (sd-cli would decode a still-noisy one).
// A flow model's sigmas are shares of noise, so at most 1.
Status check_sigmas(const std::vector<float>& sigmas, bool flow, const std::string& flag) {
    if (sigmas.size() < 2 || sigmas.size() > static_cast<size_t>(kMaxSteps) + 1) {
        return Error::invalid_request(flag + ": expected 2 to " + std::to_string(kMaxSteps + 1) + " values, got " +
                                      std::to_string(sigmas.size()));
    }
    const float most = flow ? 1.0f : kMaxSigma;
    for (size_t i = 0; i < sigmas.size(); ++i) {
        const float s = sigmas[i];
        const bool last = i + 1 == sigmas.size();
        if (!std::isfinite(s) || s < 0.0f || s > most) {
            return Error::invalid_request(flag + ": value " + std::to_string(i + 1) + " is " + format_number(s) +
                                          "; each must be in [0, " + format_number(most) + "]" +
                                          (flow ? " for a flow model" : ""));
        }
        if (last && s != 0.0f) {
            return Error::invalid_request(flag + ": the last value must be 0 (the clean image), got " +
                                          format_number(s));
        }
        if (!last && !(s > sigmas[i + 1])) {
            return Error::invalid_request(flag + ": values must descend, but value " + std::to_string(i + 1) + " (" +
                                          format_number(s) + ") is not above the next (" +
                                          format_number(sigmas[i + 1]) + ")");
        }
    }
    return Status::Ok();
}

// An edit model's reference images also enter its prompt through a vision
// tower (Qwen-Image-Edit): the tower must be loaded and the tokenizer must
// have the tokens its template writes.
Status check_prompt_images(const Model& model) {
    for (const TextEncoder& te : model.text_encoders()) {
        const models::TextEncoderUse& use = *te.use;
        if (use.vision_module.empty()) continue;
        if (!model.has_vision()) {
            return Error::invalid_request(
                "-r/--ref-image: an edit on " + model.family_label() +
                " reads its reference images with Qwen2.5-VL's vision tower, and none was given: pass "
                "--llm_vision (llama.cpp's mmproj GGUF, e.g. Qwen2.5-VL-7B-Instruct-mmproj) or an --llm file that "
                "holds visual.* (ComfyUI's qwen_2.5_vl_7b.safetensors)");
        }
        if (model.vision().out_width() != te.network->width()) {
            return Error::invalid_request("-r/--ref-image: the vision tower's rows are " +
                                          std::to_string(model.vision().out_width()) + " wide but the " + use.module +
                                          " text encoder is " + std::to_string(te.network->width()) +
                                          " wide: they are not one Qwen2.5-VL");
        }
        // The special tokens of the image's text (<|...|>).
        for (size_t at = use.image_prompt.find("<|"); at != std::string::npos; at = use.image_prompt.find("<|", at)) {
            const size_t end = use.image_prompt.find("|>", at);
            const std::string token = use.image_prompt.substr(at, end + 2 - at);
            at = end + 2;
            if (model.llm_tokenizer().token_id(token) < 0) {
                return Error::invalid_request("-r/--ref-image: the " + use.module + " tokenizer has no " + token +
                                              " token, which " + model.family_label() +
                                              "'s edit prompt writes (use Qwen2.5-VL's tokenizer)");
            }
        }
    }
    return Status::Ok();
}

}  // namespace

Result<ValidatedRequest> validate_request(const Model& model, const GenerationRequest& r) {
    ValidatedRequest p;
    const ModelDefaults& d = model.defaults();
    // The prompts' size first: a BREAK storm would otherwise cost the text
    // encoder minutes and gigabytes (prompt_weights.h bounds the chunks).
    KILN_TRY(check_prompt_size(r.prompt, "--prompt"));
    KILN_TRY(check_prompt_size(r.negative_prompt, "--negative-prompt"));
    // <lora:NAME:W> tags: their syntax, and a file for each name.
    auto tagged = extract_lora_tags(r.prompt);
    if (!tagged.ok()) return tagged.error();
    if (!tagged->unclosed.empty()) {
        KILN_LOG_WARN("prompt: '%s' has no closing '>': it is kept as prompt text, not read as a LoRA tag",
                      escaped(tagged->unclosed).c_str());
    }
    for (const LoraRequest& lora : tagged->loras) {
        if (lora.strength == 0.0f) continue;
        auto found = find_lora_file(model.lora_dir(), lora.name);
        if (!found.ok()) return found.error();
    }
    if (r.width < 0 || r.height < 0) {
        return Error::invalid_request("width and height must be positive, got " + size_text(r.width, r.height));
    }
    p.width = r.width > 0 ? r.width : d.width;
    p.height = r.height > 0 ? r.height : d.height;
    if (r.init_image && !takes_first_frame(model) && !takes_first_latent(model) && !takes_vace_context(model)) {
        // Image-to-image works at the init image's size (stable-diffusion.cpp's rule).
        const image::Image& init = *r.init_image;
        if (r.init_latent_resize) {
            // The init image is encoded at its own size, and only its latent resized.
            if (r.mask) return Error::invalid_request("a mask cannot be used when the init image's latent is resized");
            const int stride = model.size_stride();
            if (init.width % stride != 0 || init.height % stride != 0) {
                return Error::invalid_request("init image is " + size_text(init.width, init.height) +
                                              ": its latent is resized, so its sides must be multiples of " +
                                              std::to_string(stride) + " for this model (" + model.family_label() +
                                              ")");
            }
            if (init.width > image::kMaxDimension || init.height > image::kMaxDimension) {
                return Error::invalid_request("init image is " + size_text(init.width, init.height) +
                                              ": its sides must be at most " + std::to_string(image::kMaxDimension));
            }
            p.width = r.width > 0 ? r.width : init.width;
            p.height = r.height > 0 ? r.height : init.height;
        } else if ((r.width > 0 && r.width != init.width) || (r.height > 0 && r.height != init.height)) {
            return Error::invalid_request("init image is " + size_text(init.width, init.height) +
                                          " but the requested size is " + size_text(p.width, p.height));
        } else {
            p.width = init.width;
            p.height = init.height;
        }
        if (r.mask && (r.mask->width != init.width || r.mask->height != init.height)) {
            return Error::invalid_request("mask is " + size_text(r.mask->width, r.mask->height) +
                                          " but the init image is " + size_text(init.width, init.height));
        }
        if (!(r.strength > 0.0f && r.strength <= 1.0f)) {
            return Error::invalid_request("strength must be in (0, 1], got " + format_number(r.strength));
        }
    } else if (r.mask) {
        return Error::invalid_request("--mask needs an init image (-i)");
    }
    const int stride = model.size_stride();
    if (p.width % stride != 0 || p.height % stride != 0) {
        return Error::invalid_request("width and height must be multiples of " + std::to_string(stride) +
                                      " for this model (" + model.family_label() + "), got " +
                                      size_text(p.width, p.height));
    }
    if (p.width > image::kMaxDimension || p.height > image::kMaxDimension) {
        return Error::invalid_request("width and height must be at most " + std::to_string(image::kMaxDimension) +
                                      ", got " + size_text(p.width, p.height));
    }
    KILN_TRY(check_network_size(model, p.width, p.height, "width and height"));
    p.latent_w = p.width / model.vae().format().downscale;
    p.latent_h = p.height / model.vae().format().downscale;
    KILN_TRY(check_video_frames(model, r, p));

    p.steps = r.steps != 0 ? r.steps : d.steps;
    if (p.steps < 1 || p.steps > kMaxSteps) {
        return Error::invalid_request("steps must be in [1, " + std::to_string(kMaxSteps) + "], got " +
                                      std::to_string(p.steps));
    }
    // --high-noise-steps N: N steps of the high-noise expert before --steps (sd-cli's schedule).
    if (model.has_high_noise_expert() && r.high_noise.steps > 0 && r.sigmas.empty()) {
        if (r.high_noise.steps > kMaxSteps - p.steps) {
            return Error::invalid_request("--steps and --high-noise-steps must make at most " +
                                          std::to_string(kMaxSteps) + " steps, got " + std::to_string(p.steps) +
                                          " and " + std::to_string(r.high_noise.steps));
        }
        p.steps += r.high_noise.steps;
    }
    if (!r.sigmas.empty()) {
        KILN_TRY(
            check_sigmas(r.sigmas, model.noise_schedule(p.width, p.height, p.steps, std::nullopt)->flow(), "--sigmas"));
        p.steps = static_cast<int>(r.sigmas.size()) - 1;
    }
    if (r.t5_options.length != 0) {
        // The family's T5 length is what kiln plan and the placement assumed,
        // so a job may shorten it (sd-cli's 256 for Flux.1-dev) but not exceed it.
        int family_length = 0;
        for (const TextEncoder& te : model.text_encoders()) {
            if (te.use->layout == models::PromptLayout::FixedLength) family_length = te.use->max_length;
        }
        for (const models::TextEncoderUse* use : model.absent_text_encoders()) {
            if (use->layout == models::PromptLayout::FixedLength) family_length = use->max_length;
        }
        if (family_length == 0) {
            return Error::invalid_request("--max-sequence-length is T5's token count, and " + model.family_label() +
                                          " has no T5");
        }
        if (r.t5_options.length < 1 || r.t5_options.length > family_length) {
            return Error::invalid_request("--max-sequence-length must be in [1, " + std::to_string(family_length) +
                                          "] for " + model.family_label() + ", got " +
                                          std::to_string(r.t5_options.length));
        }
    }
    if (r.t5_options.pad_tokens > kMaxT5MaskPad) {
        return Error::invalid_request("--chroma-t5-mask-pad must be at most " + std::to_string(kMaxT5MaskPad) +
                                      ", got " + std::to_string(r.t5_options.pad_tokens));
    }
    if (r.slg.scale != 0.0f) {
        const SkipLayerGuidance& g = r.slg;
        if (!std::isfinite(g.scale) || g.scale < 0 || g.scale > kMaxCfgScale) {
            return Error::invalid_request("--slg-scale must be a number in [0, " + format_number(kMaxCfgScale) +
                                          "], got " + format_number(g.scale));
        }
        if (!(g.start >= 0.0f && g.start <= 1.0f && g.end >= 0.0f && g.end <= 1.0f)) {
            return Error::invalid_request("--skip-layer-start and --skip-layer-end must be in [0, 1], got " +
                                          format_number(g.start) + " and " + format_number(g.end));
        }
        for (int b : g.blocks) {
            if (b < 0 || b > kMaxSkipLayer) {
                return Error::invalid_request("--skip-layers: a layer must be in [0, " + std::to_string(kMaxSkipLayer) +
                                              "], got " + std::to_string(b));
            }
        }
        if (!model.diffusion().capabilities().skip_layers) {
            return Error::invalid_request(
                "--slg-scale is skip-layer guidance for DiTs that take a skip list "
                "(Flux, Chroma, FLUX.2, SD3); " +
                model.family_label() + "'s " + model.diffusion().capabilities().label + " does not");
        }
    }
    if (r.seams.any() && !model.diffusion().capabilities().seams) {
        return Error::invalid_request(
            "--circular makes a seamless image with networks that can wrap their edges (SD1.x, SD2.x, SDXL, Flux, "
            "Chroma, FLUX.2, Z-Image, Qwen-Image, Wan); " +
            model.family_label() + "'s " + model.diffusion().capabilities().label + " cannot");
    }
    {
        const models::DiffusionCapabilities& can = model.diffusion().capabilities();
        KILN_TRY(validate_step_cache(
            r.cache, {model.family_label(), std::string(can.label) == "UNet", can.cache_blocks}, p.steps));
    }
    if (r.timestep_shift < 0 || r.timestep_shift > 1000) {
        return Error::invalid_request("--timestep-shift must be in [0, 1000], got " + std::to_string(r.timestep_shift));
    }
    if (r.eta && !(*r.eta >= 0.0f && *r.eta <= 1.0f)) {
        return Error::invalid_request("--eta must be a number in [0, 1], got " + format_number(*r.eta));
    }
    p.cfg = r.cfg_scale >= 0 ? r.cfg_scale : d.cfg_scale;
    if (!std::isfinite(r.cfg_scale) || !(p.cfg >= 0 && p.cfg <= kMaxCfgScale)) {
        return Error::invalid_request("cfg scale must be a number in [0, " + format_number(kMaxCfgScale) + "], got " +
                                      format_number(r.cfg_scale));
    }
    if (r.batch_count < 1 || r.batch_count > kMaxBatchCount) {
        return Error::invalid_request("batch count must be in [1, " + std::to_string(kMaxBatchCount) + "], got " +
                                      std::to_string(r.batch_count));
    }
    auto sampler = parse_sampler(r.sampler.empty() ? d.sampler : r.sampler);
    if (!sampler.ok()) return sampler.error().as(ErrorKind::InvalidRequest);
    p.sampler = *sampler;
    auto scheduler = parse_scheduler(r.scheduler.empty() ? d.scheduler : r.scheduler);
    if (!scheduler.ok()) return scheduler.error().as(ErrorKind::InvalidRequest);
    p.scheduler = *scheduler;
    if (r.vae_tiling) {
        if (Status s = validate_tiling(*r.vae_tiling); !s.ok()) return s.error().as(ErrorKind::InvalidRequest);
    }
    for (const TextEncoder& te : model.text_encoders()) {
        const int64_t layers = te.network->clip_skip_layers();
        if (layers > 0 && r.clip_skip > layers) {
            return Error::invalid_request("clip skip must be at most " + std::to_string(layers) + " for this model's " +
                                          te.use->module + " text encoder, got " + std::to_string(r.clip_skip));
        }
    }
    if ((r.init_image || !r.ref_images.empty()) && !model.vae().format().has_encoder) {
        return Error::invalid_request("this model's VAE has no encoder: image-to-image needs one");
    }
    if (r.guidance && (!std::isfinite(*r.guidance) || *r.guidance < 0 || *r.guidance > kMaxCfgScale)) {
        return Error::invalid_request("--guidance must be a number in [0, " + format_number(kMaxCfgScale) + "], got " +
                                      format_number(*r.guidance));
    }
    if (model.diffusion().capabilities().guidance) p.guidance = r.guidance.value_or(d.guidance);
    if (r.flow_shift && (!std::isfinite(*r.flow_shift) || std::fabs(*r.flow_shift) > kMaxFlowShift)) {
        return Error::invalid_request("--flow-shift must be a number in [-" + format_number(kMaxFlowShift) + ", " +
                                      format_number(kMaxFlowShift) + "], got " + format_number(*r.flow_shift));
    }
    if (r.flow_shift && model.family().schedule.flow_shift_factor && !(*r.flow_shift > 0.0f)) {
        return Error::invalid_request("--flow-shift is a factor for " + model.family_label() +
                                      " (sd-cli's: 3 for Z-Image) and must be positive, got " +
                                      format_number(*r.flow_shift));
    }
    if (!r.ref_images.empty()) {
        if (!model.family().reference_images) {
            return Error::invalid_request("-r/--ref-image: " + model.family_label() +
                                          " takes no reference images (Flux.1-Kontext-dev does)");
        }
        const int family_max = model.family().max_reference_images;
        const size_t max_refs = family_max > 0 ? static_cast<size_t>(family_max) : kMaxReferenceImages;
        if (r.ref_images.size() > max_refs) {
            return Error::invalid_request(
                "-r/--ref-image: " + (family_max > 0 ? model.family_label() + " takes" : std::string("kiln takes")) +
                " at most " + std::to_string(max_refs) + (max_refs == 1 ? " reference image" : " reference images") +
                ", got " + std::to_string(r.ref_images.size()));
        }
        KILN_TRY(check_prompt_images(model));
        for (const image::Image& ref : r.ref_images) {
            if (ref.width < stride || ref.height < stride || ref.width > image::kMaxDimension ||
                ref.height > image::kMaxDimension) {
                return Error::invalid_request("-r/--ref-image: a reference image is " +
                                              size_text(ref.width, ref.height) + "; each side must be in [" +
                                              std::to_string(stride) + ", " + std::to_string(image::kMaxDimension) +
                                              "]");
            }
        }
    }
    if (r.hires) {
        auto hires = validate_hires(model, r, p);
        if (!hires.ok()) return hires.error();
        p.hires = std::move(hires).value();
    }
    if (!std::isfinite(r.control_strength) || r.control_strength < 0 || r.control_strength > kMaxControlStrength) {
        return Error::invalid_request("--control-strength must be a number in [0, " +
                                      format_number(kMaxControlStrength) + "], got " +
                                      format_number(r.control_strength));
    }
    if (r.control_image) {
        if (!model.has_control_net()) {
            return Error::invalid_request("--control-image needs a ControlNet: pass --control-net FILE");
        }
        const image::Image& control = *r.control_image;
        if (Status s = image::validate_image(control, "--control-image"); !s.ok())
            return s.error().as(ErrorKind::InvalidRequest);
        // Same aspect ratio: it is resized to the output size; another one
        // would stretch the condition out of register with the image.
        if (static_cast<int64_t>(control.width) * p.height != static_cast<int64_t>(control.height) * p.width) {
            return Error::invalid_request("--control-image is " + size_text(control.width, control.height) +
                                          ", another aspect ratio than the " + size_text(p.width, p.height) +
                                          " output; crop it or pass -W/-H of its aspect");
        }
    }
    if (r.preview.interval < 1 || r.preview.interval > kMaxPreviewInterval) {
        return Error::invalid_request("--preview-interval must be in [1, " + std::to_string(kMaxPreviewInterval) +
                                      "], got " + std::to_string(r.preview.interval));
    }
    if (r.preview.mode == PreviewMode::Proj && !model.has_latent_projection()) {
        return Error::invalid_request("--preview proj: no latent-to-RGB projection is known for " +
                                      model.family_label() + "'s " + std::to_string(model.latent_channels()) +
                                      "-channel latent (use --preview vae)");
    }
    KILN_TRY(validate_high_noise(model, r, p));
    return p;
}

uint64_t request_image_bytes(const GenerationRequest& request) {
    auto bytes = [](const image::Image& img) {
        const uint64_t pixels = static_cast<uint64_t>(img.width) * static_cast<uint64_t>(img.height);
        return static_cast<uint64_t>(img.pixels.size()) + pixels * 3 * (1 + sizeof(float));
    };
    uint64_t total = 0;
    if (request.init_image) total += bytes(*request.init_image);
    if (request.end_image) total += bytes(*request.end_image);
    if (request.mask) total += bytes(*request.mask);
    for (const image::Image& ref : request.ref_images) total += bytes(ref);
    return total;
}

Result<runtime::LedgerReservation> reserve_request_images(Model& model, const GenerationRequest& request) {
    return runtime::LedgerReservation::make(model.host_ledger(), request_image_bytes(request),
                                            "the job's decoded images (init image, mask, references)");
}

}  // namespace kiln::pipeline
