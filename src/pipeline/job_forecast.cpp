#include "pipeline/job_forecast.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"
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
        const std::string module = m.module.substr(0, m.module.find('.'));  // "te.t5xxl" is placed as "te"
        auto placed = std::find_if(model.placement().begin(), model.placement().end(),
                                   [&](const ModulePlacement& p) { return p.module == module; });
        if (placed == model.placement().end() || m.run.weight_bytes <= room) continue;
        const bool mapped_on_cpu =
            m.device == ram.device_name() && (placed->params == runtime::ParamsLocation::Host ||
                                              placed->params == runtime::ParamsLocation::ComputeDevice);
        if (placed->params == runtime::ParamsLocation::Disk || (mapped_on_cpu && !model.converts_weights())) {
            m.streamed_from_disk = m.run.weight_bytes;
        } else if (mapped_on_cpu) {
            m.run.fits = false;
        }
        out.fits = out.fits && m.run.fits;
        out.streams_from_disk = out.streams_from_disk || (m.module == "diffusion" && m.streamed_from_disk > 0);
    }
}

std::string seconds_at(uint64_t bytes, double bytes_per_second) {
    return std::to_string(std::llround(static_cast<double>(bytes) / bytes_per_second)) + " s";
}

}  // namespace

Result<JobForecast> forecast_job(Model& model, int width, int height, bool cfg, bool flash_attention,
                                 const std::string* prompt, const JobPasses& passes) {
    const int64_t batch = cfg ? 2 : 1;
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
    const int64_t context_tokens = context_length(model, prompt);
    for (const TextEncoder& encoder : model.text_encoders()) {
        // A chat template encodes one prompt at a time (conditioner.cpp).
        const bool whole_prompt = encoder.use->layout == models::PromptLayout::ChatTemplate;
        // The encoder also reads the prefix the context leaves out.
        const int64_t dropped = whole_prompt ? llm_prompt(model.llm_tokenizer(), *encoder.use, "").dropped : 0;
        const int64_t length = whole_prompt ? context_tokens + dropped
                               : encoder.use->layout == models::PromptLayout::FixedLength
                                   ? encoder.use->max_length
                                   : encoder.network->max_length();
        TextEncoderGraph g =
            build_text_encoder_graph(encoder, nullptr, length, whole_prompt ? 1 : batch, encoder.use->default_layer);
        KILN_TRY(add(*encoder.executor, *g.session, g.out, ""));
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
    if (passes.init_encode_size) {
        KILN_TRY(add_vae(/*decode=*/false, passes.init_encode_size->first, passes.init_encode_size->second,
                         "init image encode"));
    }
    // Chroma's DiT takes the padding mask as an input of its own.
    const bool masked = model.masks_text_padding();
    // With a ControlNet, it runs before the UNet at every step, at the same
    // batch, and the UNet takes its residuals as inputs.
    const bool control = model.has_control_net();
    auto add_unet_at = [&](int64_t w, int64_t h, int64_t b, const std::string& pass) -> Status {
        models::DiffusionShape shape{w, h, b, context_tokens, flash_attention, {}, masked};
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
    // A CFG batch that does not fit runs as two passes of one (generate).
    auto add_unet = [&](int64_t w, int64_t h, const std::string& pass) -> Status {
        const size_t before = out.modules.size();
        KILN_TRY(add_unet_at(w, h, batch, pass));
        const bool batch_fits = std::all_of(out.modules.begin() + static_cast<long>(before), out.modules.end(),
                                            [](const ModuleForecast& m) { return m.run.fits; });
        if (batch_fits || batch != 2) return Status::Ok();
        out.modules.resize(before);
        KILN_TRY(add_unet_at(w, h, 1, pass));
        for (size_t i = before; i < out.modules.size(); ++i) out.modules[i].separate_cfg = true;
        return Status::Ok();
    };
    KILN_TRY(add_unet(lw, lh, ""));
    KILN_TRY(add_vae(/*decode=*/true, lw, lh, ""));
    if (const ValidatedHires* h = passes.hires) {
        // A pixel upscaler's result is encoded again at the hires size.
        if (h->upscaler != HiresUpscaler::Latent)
            KILN_TRY(add_vae(/*decode=*/false, h->width, h->height, "hires encode"));
        KILN_TRY(add_unet(h->latent_w, h->latent_h, "hires pass"));
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
    return out;
}

Result<JobPasses> passes_of(const GenerationRequest& request, const ValidatedRequest& job) {
    JobPasses passes;
    if (request.init_image) passes.init_encode_size = {request.init_image->width, request.init_image->height};
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
    for (const ModuleForecast& m : forecast.modules) {
        const auto& r = m.run;
        out +=
            "  " + m.module + (m.pass.empty() ? std::string() : " (" + m.pass + ")") + " on " + m.device + ": " +
            (m.tiled ? std::string("in tiles, ") : std::string()) +
            (m.separate_cfg ? std::string("CFG passes one at a time, ") : std::string()) +
            (r.segments == 1 ? std::string("whole graph") : std::to_string(r.segments) + " segments") + ", compute " +
            human_bytes(r.whole_workspace) + " whole, hungriest part " + human_bytes(r.largest_segment) + " (" +
            r.largest_segment_name + ")" +
            (m.streamed_from_disk ? ", reads its " + human_bytes(m.streamed_from_disk) + " of weights from disk" : "") +
            (r.fits ? "" : " - DOES NOT FIT") + "\n";
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
    uint64_t per_step = 0;
    for (const ModuleForecast& m : forecast.modules) {
        if (m.module == "diffusion") per_step = std::max(per_step, m.streamed_from_disk);
    }
    if (!forecast.fits) {
        out += "fits: no\n";
    } else if (forecast.streams_from_disk) {
        out += "fits: only by streaming: every step reads " + human_bytes(per_step) +
               " of the diffusion model's weights from disk again, about " +
               seconds_at(per_step, kFastDiskBytesPerSecond) + " a step at 2 GB/s (NVMe) and " +
               seconds_at(per_step, kSlowDiskBytesPerSecond) + " at 0.5 GB/s (SATA), on top of the compute\n";
    } else {
        out += "fits: yes\n";
    }
    return out;
}

}  // namespace kiln::pipeline
