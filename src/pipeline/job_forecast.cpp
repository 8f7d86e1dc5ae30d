#include "pipeline/job_forecast.h"

#include <algorithm>

#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"
#include "pipeline/vae_tiling.h"
#include "runtime/graph_session.h"
#include "util/format.h"

namespace kiln::pipeline {

Result<JobForecast> forecast_job(Model& model, int width, int height, bool cfg, bool flash_attention,
                                 const std::string* prompt) {
    const int64_t batch = cfg ? 2 : 1;
    const auto& vc = model.vae().config();
    const int64_t lw = width / vc.downscale(), lh = height / vc.downscale();
    JobForecast out;
    auto add = [&](runtime::Executor& executor, runtime::GraphSession& session, ggml_tensor* output) -> Status {
        auto f = executor.forecast(session, output);
        if (!f.ok()) return f.error();
        out.modules.push_back({executor.module(), executor.store().ledger().device_name(), *f});
        return Status::Ok();
    };
    const int64_t context_tokens = context_length(model, prompt);
    for (const TextEncoder& encoder : model.text_encoders()) {
        const int64_t length = encoder.t5    ? encoder.use->max_length
                               : encoder.llm ? context_tokens
                                             : encoder.network->config().context;
        // An LLM encodes one prompt at a time (conditioner.cpp).
        TextEncoderGraph g =
            build_text_encoder_graph(encoder, nullptr, length, encoder.llm ? 1 : batch, encoder.use->default_layer);
        KILN_TRY(add(*encoder.executor, *g.session, g.out));
    }
    // Chroma's DiT takes the padding mask as an input of its own.
    bool masked = false;
    for (const TextEncoder& encoder : model.text_encoders()) masked = masked || encoder.use->mask_padding;
    // With a ControlNet, it runs before the UNet at every step, at the same
    // batch, and the UNet takes its residuals as inputs.
    const bool control = model.has_control_net();
    auto add_unet = [&](int64_t b) -> Status {
        DiffusionShape shape{lw, lh, b, context_tokens, flash_attention, {}, masked};
        shape.control = control;
        if (control) {
            auto c = build_control_graph(model, shape);
            if (!c.ok()) return c.error();
            KILN_TRY(add(model.control_compute(), *c->session, c->out));
        }
        auto g = build_diffusion_graph(model, shape);
        if (!g.ok()) return g.error();
        return add(model.diffusion_compute(), *g->session, g->out);
    };
    const size_t before_unet = out.modules.size();
    KILN_TRY(add_unet(batch));
    // A CFG batch that does not fit runs as two passes of one (generate).
    const bool batch_fits = std::all_of(out.modules.begin() + static_cast<long>(before_unet), out.modules.end(),
                                        [](const ModuleForecast& m) { return m.run.fits; });
    if (!batch_fits && batch == 2) {
        out.modules.resize(before_unet);
        KILN_TRY(add_unet(1));
        for (size_t i = before_unet; i < out.modules.size(); ++i) out.modules[i].separate_cfg = true;
    }
    // The VAE decode; one that does not fit is retried in tiles (generate).
    auto add_decoder = [&](int64_t w, int64_t h) -> Status {
        VaeGraph g = build_vae_decode_graph(model, w, h, nullptr);
        return add(model.vae_compute(), *g.session, g.out);
    };
    KILN_TRY(add_decoder(lw, lh));
    const int64_t tile = VaeTiling{}.tile;
    if (!out.modules.back().run.fits && (lw > tile || lh > tile)) {
        out.modules.pop_back();
        KILN_TRY(add_decoder(std::min(lw, tile), std::min(lh, tile)));
        out.modules.back().tiled = true;
    }
    for (const auto& [name, ledger] : model.ledgers()) {
        DeviceForecast d;
        d.device = name;
        d.budget = ledger->budget();
        d.limit = ledger->limit();
        d.peak = d.weights_kept = ledger->managed();
        // Modules run in job order; what one leaves on the device (compute
        // copies, idle workspace) stays until a later one needs the room.
        uint64_t left_behind = 0;
        for (const ModuleForecast& m : out.modules) {
            if (m.device != name) continue;
            d.peak = std::max(d.peak, std::min(d.limit, m.run.fixed + left_behind + m.run.peak));
            left_behind += m.run.peak;
        }
        out.devices.push_back(d);
    }
    for (const ModuleForecast& m : out.modules) out.fits = out.fits && m.run.fits;
    return out;
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
        out += "  " + m.module + " on " + m.device + ": " + (m.tiled ? std::string("in tiles, ") : std::string()) +
               (m.separate_cfg ? std::string("CFG passes one at a time, ") : std::string()) +
               (r.segments == 1 ? std::string("whole graph") : std::to_string(r.segments) + " segments") +
               ", compute " + human_bytes(r.whole_workspace) + " whole, hungriest part " +
               human_bytes(r.largest_segment) + " (" + r.largest_segment_name + ")" +
               (r.fits ? "" : " - DOES NOT FIT") + "\n";
    }
    out += "devices:\n";
    for (const DeviceForecast& d : forecast.devices) {
        // The CPU's own weights are the mapped model file: RAM the ledger does not manage.
        // What it does count besides compute buffers is the job's images (kiln_plan's "images:").
        const std::string split = d.device == "CPU" ? " of compute buffers and images (weights: the mapped file)"
                                                    : " (weights kept there " + human_bytes(d.weights_kept) +
                                                          ", the rest compute copies and buffers)";
        out += "  " + d.device + ": peak " + human_bytes(d.peak) + split + "; " +
               (d.budget ? "budget " + human_bytes(*d.budget) : "no budget") + ", limit now " + human_bytes(d.limit) +
               "\n";
    }
    out += forecast.fits ? "fits: yes\n" : "fits: no\n";
    return out;
}

}  // namespace kiln::pipeline
