#include "pipeline/job_forecast.h"

#include <algorithm>

#include "pipeline/vae_tiling.h"
#include "runtime/graph_session.h"
#include "util/format.h"

namespace kiln::pipeline {

Result<JobForecast> forecast_job(StableDiffusionModel& model, int width, int height, bool cfg, bool flash_attention) {
    const int64_t batch = cfg ? 2 : 1;
    const auto& cc = model.text_encoder().config();
    const auto& uc = model.unet().config();
    const auto& vc = model.vae().config();
    const int64_t lw = width / vc.downscale(), lh = height / vc.downscale();
    JobForecast out;
    auto add = [&](runtime::Executor& executor, runtime::GraphSession& session, ggml_tensor* output) -> Status {
        auto f = executor.forecast(session, output);
        if (!f.ok()) return f.error();
        out.modules.push_back({executor.module(), executor.store().ledger().device_name(), *f});
        return Status::Ok();
    };
    {
        runtime::GraphSession session;
        const std::vector<int32_t> ids(static_cast<size_t>(cc.context * batch), 0);
        ggml_tensor* tokens = session.input(GGML_TYPE_I32, {cc.context, batch}, ids.data(), "tokens");
        ggml_tensor* hidden = model.text_encoder().build(session.ctx(), tokens, model.default_clip_skip());
        KILN_TRY(add(model.text_encoder_compute(), session, hidden));
    }
    auto add_unet = [&](int64_t b) -> Status {
        runtime::GraphSession session;
        const std::vector<float> x(static_cast<size_t>(lw * lh * uc.in_channels * b), 0.0f);
        const std::vector<float> t(static_cast<size_t>(b), 0.0f);
        const std::vector<float> c(static_cast<size_t>(uc.context_dim * cc.context * b), 0.0f);
        ggml_tensor* xin = session.input(GGML_TYPE_F32, {lw, lh, uc.in_channels, b}, x.data(), "x");
        ggml_tensor* tin = session.input(GGML_TYPE_F32, {b}, t.data(), "timesteps");
        ggml_tensor* cin = session.input(GGML_TYPE_F32, {uc.context_dim, cc.context, b}, c.data(), "context");
        ggml_tensor* eps = model.unet().build(session.ctx(), xin, tin, cin, flash_attention);
        return add(model.diffusion_compute(), session, eps);
    };
    KILN_TRY(add_unet(batch));
    // A CFG batch that does not fit runs as two passes of one (generate).
    if (!out.modules.back().run.fits && batch == 2) {
        out.modules.pop_back();
        KILN_TRY(add_unet(1));
        out.modules.back().separate_cfg = true;
    }
    // The VAE decode; one that does not fit is retried in tiles (generate).
    auto add_decoder = [&](int64_t w, int64_t h) -> Status {
        runtime::GraphSession session;
        const std::vector<float> z(static_cast<size_t>(w * h * vc.latent_channels), 0.0f);
        ggml_tensor* in = session.input(GGML_TYPE_F32, {w, h, vc.latent_channels, 1}, z.data(), "latent");
        ggml_tensor* image = model.vae().build_decoder(session.ctx(), in);
        return add(model.vae_compute(), session, image);
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

std::string describe_forecast(const StableDiffusionModel& model, const JobForecast& forecast) {
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
        const std::string split = d.device == "CPU" ? " of compute buffers (weights: the mapped file)"
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
