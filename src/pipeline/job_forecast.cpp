#include "pipeline/job_forecast.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"
#include "pipeline/image_to_video.h"
#include "pipeline/prompt_images.h"
#include "pipeline/reference_images.h"
#include "pipeline/vace_context.h"
#include "pipeline/vae_tiling.h"
#include "runtime/graph_session.h"
#include "util/format.h"

namespace kiln::pipeline {
namespace {

// Disk read speeds the plan states a step's streaming at: a fast NVMe SSD
// and a SATA one (or a fast network share).
constexpr double kFastDiskBytesPerSecond = 2e9;
constexpr double kSlowDiskBytesPerSecond = 0.5e9;
// The share of RAM's limit the page cache can be counted on to keep a
// mapped file in: the rest goes to the kernel, other processes and the
// pages the job itself touches (auto-fit keeps a tenth free as well).
constexpr double kPageCacheShare = 0.9;

// Where the params of the module that ran `m` live; none for a module that
// placement does not know. A vision tower computes on its role's device
// with its params in RAM (Model::place_modules), whatever the role's are.
std::optional<runtime::ParamsLocation> params_of(Model& model, const ModuleForecast& m) {
    if (model.has_vision() && m.module == model.vision_compute().module()) return runtime::ParamsLocation::Host;
    const std::string module = m.module.substr(0, m.module.find('.'));  // "te.t5xxl" is placed as "te"
    auto placed = std::find_if(model.placement().begin(), model.placement().end(),
                               [&](const ModulePlacement& p) { return p.module == module; });
    if (placed == model.placement().end()) return std::nullopt;
    return placed->params;
}

// A run of the diffusion network, or of Wan 2.2 A14B's high-noise expert
// ("diffusion.high_noise"): each runs at every step of its share.
bool is_diffusion(const ModuleForecast& m) { return m.module.substr(0, m.module.find('.')) == "diffusion"; }

// Which runs read their weights from disk. A module reads the mapped model
// file through the page cache (outside RAM's books) when its params are "on
// disk" (--params-backend disk, or auto-fit's choice when RAM cannot hold
// them), wherever it computes, and when it computes on the CPU with its
// params there. The page cache keeps the file only while RAM has room for
// it beside what the job holds (kPageCacheShare of the limit); past that room
// every run reads it from disk again. Weights converted by --type are RAM of
// their own and cannot be dropped and read again: past that room the job does not fit.
void mark_disk_streaming(Model& model, JobForecast& out) {
    runtime::DeviceLedger& ram = model.host_ledger();
    auto cpu = std::find_if(out.devices.begin(), out.devices.end(),
                            [&](const DeviceForecast& d) { return d.device == ram.device_name(); });
    const uint64_t held = cpu == out.devices.end() ? ram.managed() : cpu->peak;
    const uint64_t limit = cpu == out.devices.end() ? ram.limit() : cpu->limit;
    const uint64_t usable = static_cast<uint64_t>(static_cast<double>(limit) * kPageCacheShare);
    const uint64_t room = usable > held ? usable - held : 0;
    for (ModuleForecast& m : out.modules) {
        const std::optional<runtime::ParamsLocation> params = params_of(model, m);
        if (!params || m.run.weight_bytes <= room) continue;
        const bool mapped_on_cpu = m.device == ram.device_name() && (*params == runtime::ParamsLocation::Host ||
                                                                     *params == runtime::ParamsLocation::ComputeDevice);
        if (*params == runtime::ParamsLocation::Disk || (mapped_on_cpu && !model.converts_weights())) {
            m.streamed_from_disk = m.run.weight_bytes;
        } else if (mapped_on_cpu) {
            m.run.fits = false;
        }
        out.fits = out.fits && m.run.fits;
        if (is_diffusion(m) && m.streamed_from_disk > 0) {
            out.streams_from_disk = true;
            // CFG's passes one after the other read the file once each.
            out.streamed_per_step =
                std::max(out.streamed_per_step, m.streamed_from_disk * static_cast<uint64_t>(m.runs_per_step));
        }
    }
}

// Which runs upload their weights to a device again at every run: those cut
// into segments on a device that does not hold their params (on the CPU the
// params are read where they are). What the budget keeps of the last run's
// compute copies is not uploaded again, so the figure is an upper bound.
void mark_device_streaming(Model& model, JobForecast& out) {
    for (ModuleForecast& m : out.modules) {
        const std::optional<runtime::ParamsLocation> params = params_of(model, m);
        if (m.run.segments > 1 && m.device != model.host_ledger().device_name() && params &&
            *params != runtime::ParamsLocation::ComputeDevice) {
            m.streamed_to_device = m.run.weight_bytes;
        }
    }
}

// One prompt as the job's text encoding sees it.
struct PromptTokens {
    int64_t encoded = 0;                         // the tokens an LLM encodes under its chat template (0 without one)
    int64_t context = 0;                         // the diffusion network's context rows
    std::vector<models::TokenGrid> image_grids;  // the reference images' in the LLM's input
};

// `prompt` (null: the family's plan_tokens) with the edit job's reference
// images in it (`images`: their grids only; an LLM use without a vision
// module shows none), as conditioner.cpp's encode_llm builds it.
PromptTokens prompt_tokens(const Model& model, const std::string* prompt, const std::vector<PromptImage>& images) {
    PromptTokens out;
    out.context = context_length(model, prompt);
    for (const TextEncoder& encoder : model.text_encoders()) {
        const models::TextEncoderUse& use = *encoder.use;
        if (use.layout != models::PromptLayout::ChatTemplate) continue;
        const LlmPrompt plain = llm_prompt(model.llm_tokenizer(), use, prompt ? *prompt : std::string());
        // The encoder also reads the prefix the context leaves out.
        out.encoded = out.context + plain.dropped;
        if (images.empty() || use.vision_module.empty()) return out;
        const LlmImagePrompt input =
            llm_image_prompt(model.llm_tokenizer(), use, prompt ? *prompt : std::string(), images);
        out.encoded = static_cast<int64_t>(input.ids.size());
        // Without a prompt, the words of a typical one (plan_tokens less the template's).
        if (!prompt) out.encoded += std::max<int64_t>(0, use.plan_tokens - static_cast<int64_t>(plain.ids.size()));
        out.context = std::max<int64_t>(out.encoded - input.dropped, use.zero_pad_to);
        out.image_grids = input.grids;
        return out;
    }
    return out;
}

std::string seconds_at(uint64_t bytes, double bytes_per_second) {
    return std::to_string(std::llround(static_cast<double>(bytes) / bytes_per_second)) + " s";
}

}  // namespace

Result<JobForecast> forecast_job(Model& model, int width, int height, bool cfg, bool flash_attention,
                                 const std::string* prompt, const JobPasses& passes,
                                 const std::string& negative_prompt) {
    const SeamsScope seams(model, passes.seams);
    // Wan 2.2 A14B: the high-noise expert's steps, then (unless it takes
    // them all) the main network's; the negative prompt is encoded when
    // either runs CFG.
    const bool expert = model.has_high_noise_expert() && passes.high_noise_steps > 0;
    const bool main_runs = !expert || passes.high_noise_steps < passes.steps;
    cfg = main_runs && cfg;
    const bool any_cfg = cfg || (expert && passes.high_noise_cfg);
    const int64_t batch = any_cfg ? 2 : 1;
    const models::AutoencoderFormat& vc = model.vae().format();
    const int64_t lw = width / vc.downscale, lh = height / vc.downscale;
    JobForecast out;
    auto add = [&](runtime::Executor& executor, runtime::GraphSession& session, ggml_tensor* output,
                   const std::string& pass) -> Status {
        auto f = executor.forecast(session, output);
        if (!f.ok()) return f.error();
        ModuleForecast m;
        m.module = executor.module();
        m.device = executor.store().ledger().device_name();
        m.run = *f;
        m.pass = pass;
        out.modules.push_back(std::move(m));
        return Status::Ok();
    };
    // An edit model's reference images enter its LLM's prompt (the
    // negative's too) through its vision tower, each once, before the text
    // encoders run (generate). The plan needs their grids, not their rows.
    std::vector<PromptImage> prompt_images;
    if (model.has_vision()) {
        const models::VisionEncoderNetwork& tower = model.vision();
        for (const TextEncoder& encoder : model.text_encoders()) {
            if (encoder.use->vision_module.empty()) continue;
            for (size_t i = 0; i < passes.reference_images.size(); ++i) {
                const auto [given_w, given_h] = passes.reference_images[i];
                auto sizes =
                    vision_sizes(given_w, given_h, encoder.use->vision_area, static_cast<int>(tower.size_unit()));
                if (!sizes.ok()) return sizes.error().in_context("reference image " + std::to_string(i + 1) + ": ");
                const int64_t w = sizes->tower.width, h = sizes->tower.height;
                // The tower makes its patches from the pixels as it builds: zeros do.
                auto g = build_vision_graph(model, nullptr, w, h);
                if (!g.ok()) return g.error();
                KILN_TRY(add(model.vision_compute(), *g->session, g->out, "reference image encode"));
                PromptImage image;
                image.grid_rows = h / tower.size_unit();
                image.grid_cols = w / tower.size_unit();
                prompt_images.push_back(std::move(image));
            }
        }
    }
    // The prompt's and, with CFG, the negative prompt's lengths (an empty
    // negative is the prompt's zeroed for a family that zeroes it).
    const PromptTokens cond = prompt_tokens(model, prompt, prompt_images);
    const bool zeroed_negative = model.family().conditioning.zero_empty_negative && negative_prompt.empty();
    const PromptTokens uncond =
        any_cfg && !zeroed_negative ? prompt_tokens(model, &negative_prompt, prompt_images) : cond;
    for (const TextEncoder& encoder : model.text_encoders()) {
        // A chat template encodes one prompt at a time (conditioner.cpp):
        // the longer's figures hold for both.
        const bool whole_prompt = encoder.use->layout == models::PromptLayout::ChatTemplate;
        const PromptTokens& longer = uncond.encoded > cond.encoded ? uncond : cond;
        const int64_t length = whole_prompt ? longer.encoded
                               : encoder.use->layout == models::PromptLayout::FixedLength
                                   ? encoder.use->max_length
                                   : encoder.network->max_length();
        const std::vector<models::TokenGrid> no_images;
        // T5 and umT5 encode one prompt at a time too (encode_t5); CLIP's
        // chunks of one prompt run as a batch, planned as one per CFG pass.
        const bool one_sequence = whole_prompt || encoder.use->layout == models::PromptLayout::FixedLength;
        TextEncoderGraph g =
            build_text_encoder_graph(encoder, nullptr, length, one_sequence ? 1 : batch, encoder.use->default_layer,
                                     nullptr, whole_prompt ? longer.image_grids : no_images);
        KILN_TRY(add(*encoder.executor, *g.session, g.out, ""));
    }
    // The diffusion network's context length. CFG's two contexts of
    // different lengths are batched only by a UNet's cross-attention, and
    // only when one's CLIP chunks repeat to the other's (generate's
    // match_context_lengths); otherwise the passes run one after the other.
    int64_t context_tokens = cond.context;
    bool cfg_apart = false;
    if (any_cfg && uncond.context != cond.context) {
        const int64_t longer = std::max(cond.context, uncond.context);
        const int64_t shorter = std::min(cond.context, uncond.context);
        cfg_apart = model.diffusion().capabilities().joint_attention || shorter == 0 || longer % shorter != 0;
        context_tokens = longer;
        if (cfg_apart) out.cfg_contexts = std::make_pair(cond.context, uncond.context);
    }
    // The VAE, encoding an image of w x h pixels or decoding a w x h
    // latent; one that does not fit is retried in tiles (generate).
    const int64_t tile = VaeTiling{}.tile;
    auto add_vae = [&](bool decode, int64_t w, int64_t h, const std::string& pass) -> Status {
        auto graph = [&](int64_t gw, int64_t gh) {
            return decode ? build_vae_decode_graph(model, gw, gh, nullptr)
                          : build_vae_encode_graph(model, gw, gh, nullptr);
        };
        VaeGraph g = graph(w, h);
        KILN_TRY(add(model.vae_compute(), *g.session, g.out, pass));
        const int64_t side = decode ? tile : tile * vc.downscale;  // tiles are counted in latent pixels
        if (out.modules.back().run.fits || (w <= side && h <= side)) return Status::Ok();
        out.modules.pop_back();
        VaeGraph t = graph(std::min(w, side), std::min(h, side));
        KILN_TRY(add(model.vae_compute(), *t.session, t.out, pass));
        out.modules.back().tiled = true;
        return Status::Ok();
    };
    // A clip's decode: its first latent frame, then (a longer clip) a later
    // one with the history the first left, the hungrier of the two; one
    // that does not fit is planned in tiles, as generate retries it
    // (pipeline/clip_decode).
    auto add_clip_decode = [&](int64_t w, int64_t h, int64_t frames) -> Status {
        auto chunks_at = [&](int64_t cw, int64_t ch) -> Status {
            auto first = build_clip_chunk_graph(model, cw, ch, {});
            if (!first.ok()) return first.error();
            if (frames == 1) return add(model.vae_compute(), *first->session, first->out, "");
            std::vector<std::array<int64_t, 4>> history;
            for (const ggml_tensor* t : first->chunk.history)
                history.push_back({t->ne[0], t->ne[1], t->ne[2], t->ne[3]});
            auto later = build_clip_chunk_graph(model, cw, ch, history);
            if (!later.ok()) return later.error();
            return add(model.vae_compute(), *later->session, later->out, "");
        };
        KILN_TRY(chunks_at(w, h));
        if (out.modules.back().run.fits || (w <= tile && h <= tile)) return Status::Ok();
        out.modules.pop_back();
        KILN_TRY(chunks_at(std::min(w, tile), std::min(h, tile)));
        out.modules.back().tiled = true;
        return Status::Ok();
    };
    // Image-to-video's first frame, encoded a chunk at a time as the decode
    // goes: the first chunk, then (a longer clip) a later one with the
    // history the first left, the hungrier of the two.
    if (passes.first_latent) {
        auto first = build_clip_encode_chunk_graph(model, width, height, 1, {});
        if (!first.ok()) return first.error();
        KILN_TRY(add(model.vae_compute(), *first->session, first->out, "first frame encode"));
    }
    if (passes.first_frame || passes.vace) {
        const char* what = passes.vace ? "VACE context encode" : "first frame encode";
        auto first = build_clip_encode_chunk_graph(model, width, height, 1, {});
        if (!first.ok()) return first.error();
        if (passes.latent_frames - (passes.vace_reference ? kVaceReferenceFrames : 0) == 1) {
            KILN_TRY(add(model.vae_compute(), *first->session, first->out, what));
        } else {
            std::vector<std::array<int64_t, 4>> history;
            for (const ggml_tensor* t : first->chunk.history)
                history.push_back({t->ne[0], t->ne[1], t->ne[2], t->ne[3]});
            auto later = build_clip_encode_chunk_graph(model, width, height, vc.temporal_downscale, history);
            if (!later.ok()) return later.error();
            KILN_TRY(add(model.vae_compute(), *later->session, later->out, what));
        }
        // Wan 2.1 I2V and FLF2V: CLIP vision reads the frame (and the last),
        // one square at a time.
        if (takes_image_context(model) && model.has_vision()) {
            const int64_t side = model.vision().input_side();
            auto g = build_vision_graph(model, nullptr, side, side);
            if (!g.ok()) return g.error();
            KILN_TRY(add(model.vision_compute(), *g->session, g->out, "first frame CLIP vision"));
        }
    }
    if (passes.init_encode_size) {
        KILN_TRY(add_vae(/*decode=*/false, passes.init_encode_size->first, passes.init_encode_size->second,
                         "init image encode"));
    }
    // Kontext's and an edit model's reference images, each encoded at its
    // size (generate), their latents beside the image's tokens in every
    // evaluation of the DiT.
    std::vector<models::LatentSize> reference_latents;
    const int stride = model.size_stride();
    for (const auto& [given_w, given_h] : passes.reference_images) {
        ReferenceSize at{given_w, given_h};
        if (passes.auto_resize_references) at = auto_reference_size(given_w, given_h, width, height, stride);
        const int w = at.width / stride * stride, h = at.height / stride * stride;
        KILN_TRY(add_vae(/*decode=*/false, w, h, "reference image encode"));
        reference_latents.push_back({w / vc.downscale, h / vc.downscale});
    }
    // Chroma's DiT takes the padding mask as an input of its own.
    const bool masked = model.masks_text_padding();
    // With a ControlNet, it runs before the UNet at every step, at the same
    // batch, and the UNet takes its residuals as inputs.
    const bool control = model.has_control_net();
    auto add_unet_at = [&](int64_t w, int64_t h, int64_t b, const std::string& pass) -> Status {
        models::DiffusionShape shape{w, h, b, context_tokens, flash_attention, reference_latents, masked};
        shape.increase_ref_index = passes.increase_ref_index;
        shape.frames = passes.latent_frames;
        shape.image_context_rows = passes.first_frame ? image_context_rows(model) : 0;
        shape.clean_first_frame = passes.first_latent;
        if (control) {
            add_control_residuals(model, shape, 1.0f);
            auto c = build_control_graph(model, shape);
            if (!c.ok()) return c.error();
            KILN_TRY(add(model.control_compute(), *c->session, c->out, pass));
        }
        if (passes.block_stages && pass.empty()) {
            for (auto [stage, name] : {std::pair{models::BlockStage::Front, "block cache: front"},
                                       std::pair{models::BlockStage::Rest, "block cache: rest"},
                                       std::pair{models::BlockStage::Cached, "block cache: cached"}}) {
                shape.split = *passes.block_stages;
                shape.split.stage = stage;
                auto g = build_diffusion_graph(model, shape);
                if (!g.ok()) return g.error();
                KILN_TRY(add(model.diffusion_compute(), *g->session, g->out, name));
            }
            return Status::Ok();
        }
        auto g = build_diffusion_graph(model, shape);
        if (!g.ok()) return g.error();
        return add(model.diffusion_compute(), *g->session, g->out, pass);
    };
    // A CFG batch that does not fit, or whose contexts differ in length,
    // runs as two passes of one (generate), each reading the weights.
    auto add_unet = [&](int64_t w, int64_t h, const std::string& pass, bool with_cfg) -> Status {
        const size_t before = out.modules.size();
        if (!with_cfg) return add_unet_at(w, h, 1, pass);
        if (!cfg_apart) {
            KILN_TRY(add_unet_at(w, h, 2, pass));
            const bool batch_fits = std::all_of(out.modules.begin() + static_cast<long>(before), out.modules.end(),
                                                [](const ModuleForecast& m) { return m.run.fits; });
            if (batch_fits) return Status::Ok();
            out.modules.resize(before);
        }
        KILN_TRY(add_unet_at(w, h, 1, pass));
        for (size_t i = before; i < out.modules.size(); ++i) {
            out.modules[i].separate_cfg = true;
            out.modules[i].runs_per_step = 2;
        }
        return Status::Ok();
    };
    if (expert) {
        HighNoiseExpertScope high_noise(model);
        KILN_TRY(add_unet(lw, lh, "", passes.high_noise_cfg));
        out.expert_steps = std::make_pair(passes.high_noise_steps, passes.steps);
    }
    if (main_runs) KILN_TRY(add_unet(lw, lh, "", cfg));
    if (passes.video) {
        KILN_TRY(add_clip_decode(lw, lh, passes.latent_frames - (passes.vace_reference ? kVaceReferenceFrames : 0)));
    } else {
        KILN_TRY(add_vae(/*decode=*/true, lw, lh, ""));
    }
    if (const ValidatedHires* h = passes.hires) {
        // A pixel upscaler's result is encoded again at the hires size.
        if (h->upscaler != HiresUpscaler::Latent)
            KILN_TRY(add_vae(/*decode=*/false, h->width, h->height, "hires encode"));
        KILN_TRY(add_unet(h->latent_w, h->latent_h, "hires pass", cfg));
        KILN_TRY(add_vae(/*decode=*/true, h->latent_w, h->latent_h, "hires pass"));
    }
    for (const auto& [name, ledger] : model.ledgers()) {
        DeviceForecast d;
        d.device = name;
        d.budget = ledger->budget();
        d.limit = ledger->limit();
        d.peak = d.weights_kept = ledger->managed();
        // Modules run in job order; what one leaves on the device (compute
        // copies, idle workspace) stays until a later one needs the room. A
        // module that runs again (the VAE of a hires job) reuses its own
        // workspace, grown to the larger run.
        std::map<std::string, uint64_t> left_behind;
        for (const ModuleForecast& m : out.modules) {
            // A layer split's later devices hold their own ranges.
            for (const runtime::SplitShareForecast& share : m.run.split) {
                if (share.device == name && share.device != m.device) {
                    d.peak = std::max(d.peak, std::min(d.limit, d.weights_kept + share.peak));
                }
            }
            if (m.device != name) continue;
            uint64_t others = 0;
            for (const auto& [module, bytes] : left_behind) others += module == m.module ? 0 : bytes;
            d.peak = std::max(d.peak, std::min(d.limit, m.run.fixed + others + m.run.peak));
            left_behind[m.module] = std::max(left_behind[m.module], m.run.peak);
            if (m.run.fixed + m.run.largest_segment > d.needed) {
                d.needed = m.run.fixed + m.run.largest_segment;
                d.needed_by = m.module + (m.pass.empty() ? "" : " (" + m.pass + ")");
            }
        }
        out.devices.push_back(d);
    }
    for (const ModuleForecast& m : out.modules) out.fits = out.fits && m.run.fits;
    if (passes.upscaler) {
        // Held in RAM's books from before the first pass to the end.
        out.upscaler = passes.upscaler;
        runtime::DeviceLedger& ram = model.host_ledger();
        auto cpu = std::find_if(out.devices.begin(), out.devices.end(),
                                [&](const DeviceForecast& d) { return d.device == ram.device_name(); });
        if (cpu == out.devices.end()) {
            DeviceForecast d;
            d.device = ram.device_name();
            d.budget = ram.budget();
            d.limit = ram.limit();
            d.peak = d.weights_kept = ram.managed();
            cpu = out.devices.insert(out.devices.end(), d);
        }
        cpu->peak += passes.upscaler->second.total();
        out.fits = out.fits && cpu->peak <= cpu->limit;
    }
    mark_disk_streaming(model, out);
    mark_device_streaming(model, out);
    return out;
}

Result<JobPasses> passes_of(const GenerationRequest& request, const ValidatedRequest& job) {
    JobPasses passes;
    if (request.init_image && !job.init_image_in_clip()) {
        passes.init_encode_size = {request.init_image->width, request.init_image->height};
    }
    passes.first_frame = job.first_frame;
    passes.first_latent = job.first_latent;
    passes.vace = job.vace;
    passes.vace_reference = job.vace_reference;
    for (const image::Image& reference : request.ref_images)
        passes.reference_images.emplace_back(reference.width, reference.height);
    passes.auto_resize_references = request.auto_resize_ref_images;
    passes.increase_ref_index = request.increase_ref_index;
    passes.seams = request.seams;
    passes.video = job.video;
    passes.latent_frames = job.latent_frames;
    passes.high_noise_steps = job.high_noise_steps;
    passes.steps = job.steps;
    passes.high_noise_cfg = job.high_noise_cfg != 1.0f;
    if (is_block_cache(request.cache.mode)) {
        passes.block_stages =
            models::BlockSplit{models::BlockStage::Whole, request.cache.front_blocks, request.cache.back_blocks};
    }
    if (!job.hires) return passes;
    passes.hires = &*job.hires;
    if (job.hires->upscaler != HiresUpscaler::Model) return passes;
    auto upscaler = Upscaler::load(job.hires->model_path, 1);
    if (!upscaler.ok()) return upscaler.error().in_context("--hires-upscaler: ");
    const int repeats =
        repeats_to_reach((*upscaler)->scale(), job.width, job.height, job.hires->width, job.hires->height);
    auto memory = (*upscaler)->memory(job.width, job.height, request.hires->upscale_tile, repeats);
    if (!memory.ok()) return memory.error();
    passes.upscaler = std::make_pair((*upscaler)->name(), *memory);
    return passes;
}

std::string describe_forecast(const Model& model, const JobForecast& forecast) {
    std::string out = "placement:\n";
    const std::string placement = describe_placement(model.placement(), model.module_bytes());
    for (size_t start = 0; start < placement.size();) {
        const size_t end = placement.find('\n', start);
        out += "  " + placement.substr(start, end - start + 1);
        start = end + 1;
    }
    out += "modules:\n";
    // Two passes because the contexts differ: say which.
    const std::string contexts = forecast.cfg_contexts
                                     ? " (the prompt's " + std::to_string(forecast.cfg_contexts->first) +
                                           " context tokens and the negative prompt's " +
                                           std::to_string(forecast.cfg_contexts->second) + ")"
                                     : std::string();
    for (const ModuleForecast& m : forecast.modules) {
        const auto& r = m.run;
        const std::string per_step = m.runs_per_step == 2 ? " twice a step" : "";
        out += "  " + m.module + (m.pass.empty() ? std::string() : " (" + m.pass + ")") + " on " + m.device + ": " +
               (m.tiled ? std::string("in tiles, ") : std::string()) +
               (r.segments == 1 ? std::string("whole graph") : std::to_string(r.segments) + " segments") +
               (m.separate_cfg ? ", CFG passes one at a time" + contexts : std::string()) + ", compute " +
               human_bytes(r.whole_workspace) + " whole, hungriest part " + human_bytes(r.largest_segment) + " (" +
               r.largest_segment_name + ")" + (r.fits ? "" : " - DOES NOT FIT") +
               (m.streamed_to_device ? ", uploads up to " + human_bytes(m.streamed_to_device) + " of weights" +
                                           (per_step.empty() ? " a run" : per_step)
                                     : "") +
               (m.streamed_from_disk
                    ? ", reads its " + human_bytes(m.streamed_from_disk) + " of weights from disk" + per_step
                    : "") +
               "\n";
        for (const runtime::SplitShareForecast& share : r.split) {
            out +=
                "    layer split: " + share.device + " " +
                (share.first_segment.empty()
                     ? std::string("takes no share (no room beyond the compute reserve)")
                     : "runs '" + share.first_segment + "'..'" + share.last_segment + "', " +
                           human_bytes(share.weight_bytes) + " of weights, " +
                           (share.segments == 1 ? std::string("whole") : std::to_string(share.segments) + " segments") +
                           ", peak " + human_bytes(share.peak) + " of " + human_bytes(share.limit) +
                           (share.crossing_bytes ? ", receives " + human_bytes(share.crossing_bytes) + " a run" +
                                                       (per_step.empty() ? "" : " (" + per_step.substr(1) + ")")
                                                 : std::string()) +
                           (share.fits ? "" : " - DOES NOT FIT")) +
                "\n";
        }
    }
    if (forecast.expert_steps) {
        const auto [high, total] = *forecast.expert_steps;
        out += "  time share: diffusion.high_noise samples steps 1-" + std::to_string(high) + " of " +
               std::to_string(total) +
               (high < total ? ", then diffusion (the low-noise expert) the rest; one expert's weights at a time "
                               "are needed on the device, and a budget that cannot keep both evicts the first's "
                               "copies as the second's come in"
                             : "; the low-noise expert does not run") +
               "\n";
    }
    if (forecast.upscaler) {
        const auto& [name, m] = *forecast.upscaler;
        out += "  upscaler " + name + " on CPU: weights " + human_bytes(m.weights) + ", compute " +
               human_bytes(m.tile_compute) + " per " + std::to_string(m.tile_w) + "x" + std::to_string(m.tile_h) +
               " tile\n";
    }
    out += "devices:\n";
    for (const DeviceForecast& d : forecast.devices) {
        // The CPU's own weights are the mapped model file: RAM the ledger does not manage.
        // What it does count besides compute buffers is the job's images (kiln_plan's "images:").
        const std::string split = d.device == "CPU" ? " of compute buffers and images (weights: the mapped file)"
                                                    : " (weights kept there " + human_bytes(d.weights_kept) +
                                                          ", the rest compute copies, buffers and cached weights)";
        const std::string needed =
            d.needed ? ", needs at least " + human_bytes(std::min(d.needed, d.limit)) + " (" + d.needed_by + ")" : "";
        out += "  " + d.device + ": peak " + human_bytes(d.peak) + split + needed + "; " +
               (d.budget ? "budget " + human_bytes(*d.budget) : "no budget") + ", limit now " + human_bytes(d.limit) +
               "\n";
    }
    uint64_t per_run = 0;
    for (const ModuleForecast& m : forecast.modules) {
        if (is_diffusion(m)) per_run = std::max(per_run, m.streamed_from_disk);
    }
    const uint64_t per_step = forecast.streamed_per_step;
    if (!forecast.fits) {
        out += "fits: no\n";
    } else if (forecast.streams_from_disk) {
        out += "fits: only by streaming: every step reads " + human_bytes(per_run) +
               " of the diffusion model's weights from disk again" +
               (per_step > per_run ? ", once for each of CFG's two passes (" + human_bytes(per_step) + ")" : "") +
               ", about " + seconds_at(per_step, kFastDiskBytesPerSecond) + " a step at 2 GB/s (NVMe) and " +
               seconds_at(per_step, kSlowDiskBytesPerSecond) + " at 0.5 GB/s (SATA), on top of the compute\n";
    } else {
        out += "fits: yes\n";
    }
    return out;
}

}  // namespace kiln::pipeline
