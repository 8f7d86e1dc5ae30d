#include "generation_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "report_text.h"
#include "util/format.h"

namespace kiln::bench {
namespace {

double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const size_t mid = values.size() / 2;
    return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

double mean(const std::vector<double>& values) {
    return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

// The medians over runs that both reports print.
struct Summary {
    double text_encoding_s = 0, sampling_s = 0, vae_decode_s = 0, total_s = 0;
    std::vector<double> step_s;  // step i: its median over the runs
    double step_median_s = 0, step_mean_s = 0;
    double unet_flops_per_step = 0;
    double unet_flops_per_s = 0;
    std::optional<double> fraction_of_limit;
    std::optional<double> unet_products_limit_flops_per_s;
    std::optional<double> fraction_of_unet_products_limit;
    double text_encode_s = 0;  // median of the encodings after the runs
    double text_encoder_flops_per_s = 0;
    std::optional<double> text_encoder_products_limit_flops_per_s;
    std::optional<double> fraction_of_text_encoder_products_limit;
};

Summary summarize(const GenerationBenchmark& b) {
    Summary s;
    auto over_runs = [&](double RunTimes::*field) {
        std::vector<double> values;
        for (const RunTimes& r : b.runs) values.push_back(r.*field);
        return median(values);
    };
    s.text_encoding_s = over_runs(&RunTimes::text_encoding_s);
    s.sampling_s = over_runs(&RunTimes::sampling_s);
    s.vae_decode_s = over_runs(&RunTimes::vae_decode_s);
    s.total_s = over_runs(&RunTimes::total_s);
    size_t steps = SIZE_MAX;
    for (const RunTimes& r : b.runs) steps = std::min(steps, r.step_s.size());
    for (size_t i = 0; i < steps && !b.runs.empty(); ++i) {
        std::vector<double> values;
        for (const RunTimes& r : b.runs) values.push_back(r.step_s[i]);
        s.step_s.push_back(median(values));
    }
    s.step_median_s = median(s.step_s);
    s.step_mean_s = mean(s.step_s);
    if (!s.step_s.empty()) {
        s.unet_flops_per_step = static_cast<double>(b.unet_flops_per_evaluation) * b.unet_evaluations_per_run /
                                static_cast<double>(s.step_s.size());
    }
    if (s.step_median_s > 0) s.unet_flops_per_s = s.unet_flops_per_step / s.step_median_s;
    if (b.limit_flops_per_s && *b.limit_flops_per_s > 0)
        s.fraction_of_limit = s.unet_flops_per_s / *b.limit_flops_per_s;
    if (b.unet_products_sgemm_s && *b.unet_products_sgemm_s > 0) {
        s.unet_products_limit_flops_per_s = static_cast<double>(b.unet_products_flops) / *b.unet_products_sgemm_s;
        s.fraction_of_unet_products_limit = s.unet_flops_per_s / *s.unet_products_limit_flops_per_s;
    }
    s.text_encode_s = median(b.text_encode_s);
    if (s.text_encode_s > 0)
        s.text_encoder_flops_per_s = static_cast<double>(b.text_encoder_flops_per_run) / s.text_encode_s;
    if (b.text_encoder_products_sgemm_s && *b.text_encoder_products_sgemm_s > 0) {
        s.text_encoder_products_limit_flops_per_s =
            static_cast<double>(b.text_encoder_products_flops) / *b.text_encoder_products_sgemm_s;
        if (s.text_encoder_flops_per_s > 0) {
            s.fraction_of_text_encoder_products_limit =
                s.text_encoder_flops_per_s / *s.text_encoder_products_limit_flops_per_s;
        }
    }
    return s;
}

std::string json_array(const std::vector<double>& values) {
    std::string out = "[";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_number(values[i]);
    return out + "]";
}

std::string json_strings(const std::vector<std::string>& values) {
    std::string out = "[";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_quote(values[i]);
    return out + "]";
}

std::string gflop(double flops) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g GFLOP", flops * 1e-9);
    return buf;
}

std::string percent(double fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100);
    return buf;
}

}  // namespace

std::string to_json(const GenerationBenchmark& b) {
    const Summary s = summarize(b);
    std::ostringstream j;
    j << "{\n";
    j << "  \"benchmark\": \"kiln-bench\",\n";
    j << "  \"job\": {\"model\": " << json_quote(b.model) << ", \"family\": " << json_quote(b.family)
      << ", \"prompt\": " << json_quote(b.prompt) << ", \"width\": " << b.width << ", \"height\": " << b.height
      << ", \"frames\": " << b.frames << ", \"steps\": " << b.steps << ", \"cfg_scale\": " << json_number(b.cfg_scale)
      << ", \"sampler\": " << json_quote(b.sampler) << ", \"scheduler\": " << json_quote(b.scheduler)
      << ", \"seed\": " << b.seed << ", \"threads\": " << b.threads
      << ", \"flash_attention\": " << (b.flash_attention ? "true" : "false") << ", \"runs\": " << b.runs.size()
      << "},\n";
    j << "  \"placement\": " << json_quote(b.placement) << ",\n";
    j << "  \"diffusion_network\": " << json_quote(b.diffusion_label) << ",\n";
    j << "  \"startup\": {\"load_s\": " << json_number(b.load_s)
      << ", \"to_first_step_s\": " << json_number(b.to_first_step_s)
      << ", \"rss_at_first_step_bytes\": " << b.rss_at_first_step_bytes
      << ", \"to_first_step_done_s\": " << json_number(b.to_first_step_done_s)
      << ", \"rss_at_first_step_done_bytes\": " << b.rss_at_first_step_done_bytes << "},\n";
    j << "  \"median\": {\"text_encoding_s\": " << json_number(s.text_encoding_s)
      << ", \"sampling_s\": " << json_number(s.sampling_s) << ", \"vae_decode_s\": " << json_number(s.vae_decode_s)
      << ", \"total_s\": " << json_number(s.total_s) << ", \"step_median_s\": " << json_number(s.step_median_s)
      << ", \"step_mean_s\": " << json_number(s.step_mean_s) << ", \"step_s\": " << json_array(s.step_s) << "},\n";
    j << "  \"unet\": {\"flops_per_evaluation\": " << b.unet_flops_per_evaluation
      << ", \"evaluations_per_run\": " << b.unet_evaluations_per_run
      << ", \"cfg_batched\": " << (b.cfg_batched ? "true" : "false") << ", \"segments\": " << b.unet_segments
      << ", \"flops_per_step\": " << json_number(s.unet_flops_per_step)
      << ", \"flops_per_s\": " << json_number(s.unet_flops_per_s) << "},\n";
    if (b.limit_flops_per_s) {
        j << "  \"limit\": {\"path\": \"openblas_sgemm\", \"openblas_core\": " << json_quote(b.openblas_core)
          << ", \"shape\": " << json_quote(b.limit_shape) << ", \"flops_per_s\": " << json_number(*b.limit_flops_per_s)
          << "},\n";
    } else {
        j << "  \"limit\": null,\n";
    }
    j << "  \"unet_fraction_of_limit\": " << (s.fraction_of_limit ? json_number(*s.fraction_of_limit) : "null")
      << ",\n";
    if (s.unet_products_limit_flops_per_s) {
        j << "  \"unet_products_limit\": {\"path\": \"openblas_sgemm\", \"seconds_per_evaluation\": "
          << json_number(*b.unet_products_sgemm_s) << ", \"flops_per_evaluation\": " << b.unet_products_flops
          << ", \"flops_per_s\": " << json_number(*s.unet_products_limit_flops_per_s) << "},\n";
    } else {
        j << "  \"unet_products_limit\": null,\n";
    }
    j << "  \"unet_fraction_of_unet_products_limit\": "
      << (s.fraction_of_unet_products_limit ? json_number(*s.fraction_of_unet_products_limit) : "null") << ",\n";
    j << "  \"text_encoder\": {\"graphs\": " << json_strings(b.text_encoder_graphs)
      << ", \"flops_per_run\": " << b.text_encoder_flops_per_run << ", \"encode_s\": " << json_array(b.text_encode_s)
      << ", \"encode_median_s\": " << json_number(s.text_encode_s)
      << ", \"flops_per_s\": " << json_number(s.text_encoder_flops_per_s) << "},\n";
    if (s.text_encoder_products_limit_flops_per_s) {
        j << "  \"text_encoder_products_limit\": {\"path\": \"openblas_sgemm\", \"seconds_per_run\": "
          << json_number(*b.text_encoder_products_sgemm_s) << ", \"flops_per_run\": " << b.text_encoder_products_flops
          << ", \"flops_per_s\": " << json_number(*s.text_encoder_products_limit_flops_per_s) << "},\n";
    } else {
        j << "  \"text_encoder_products_limit\": null,\n";
    }
    j << "  \"text_encoder_fraction_of_products_limit\": "
      << (s.fraction_of_text_encoder_products_limit ? json_number(*s.fraction_of_text_encoder_products_limit) : "null")
      << ",\n";
    j << "  \"matmul_paths\": [";
    for (size_t i = 0; i < b.matmul_paths.size(); ++i) {
        const MatmulPathRow& r = b.matmul_paths[i];
        j << (i ? ",\n    " : "\n    ") << "{\"network\": " << json_quote(r.network)
          << ", \"type\": " << json_quote(r.type) << ", \"path\": " << json_quote(r.path)
          << ", \"products\": " << r.products << ", \"flops\": " << r.flops << "}";
    }
    j << (b.matmul_paths.empty() ? "],\n" : "\n  ],\n");
    j << "  \"memory\": {\"peak_rss_bytes\": " << b.peak_rss_bytes << ", \"devices\": [";
    for (size_t i = 0; i < b.devices.size(); ++i) {
        const DevicePeak& d = b.devices[i];
        j << (i ? ", " : "") << "{\"device\": " << json_quote(d.device)
          << ", \"peak_managed_bytes\": " << d.peak_managed_bytes
          << ", \"budget_bytes\": " << (d.budget_bytes ? std::to_string(*d.budget_bytes) : "null") << "}";
    }
    j << "]},\n";
    j << "  \"runs\": [\n";
    for (size_t i = 0; i < b.runs.size(); ++i) {
        const RunTimes& r = b.runs[i];
        j << "    {\"text_encoding_s\": " << json_number(r.text_encoding_s)
          << ", \"sampling_s\": " << json_number(r.sampling_s) << ", \"vae_decode_s\": " << json_number(r.vae_decode_s)
          << ", \"total_s\": " << json_number(r.total_s) << ", \"step_s\": " << json_array(r.step_s) << "}"
          << (i + 1 < b.runs.size() ? "," : "") << "\n";
    }
    j << "  ]\n}\n";
    return j.str();
}

std::string to_markdown(const GenerationBenchmark& b) {
    const Summary s = summarize(b);
    const double flops = s.unet_flops_per_step;
    const std::string& net = b.diffusion_label;
    std::ostringstream m;
    m << "### kiln-bench: " << b.model << " (" << b.family << "), " << b.width << "x" << b.height
      << (b.frames > 1 ? "x" + std::to_string(b.frames) + " frames" : std::string()) << ", " << b.steps << " steps, "
      << b.sampler << ", cfg " << b.cfg_scale << ", seed " << b.seed << ", " << b.threads
      << (b.threads == 1 ? " thread" : " threads") << (b.flash_attention ? ", flash attention" : "")
      << (b.cfg_scale != 1.0f && !b.cfg_batched ? ", CFG passes apart" : "")
      << (b.unet_segments > 1 ? ", " + net + " in " + std::to_string(b.unet_segments) + " segments" : std::string())
      << "; median of " << b.runs.size() << " run" << (b.runs.size() == 1 ? "" : "s") << "\n\n";
    std::string placement = b.placement;  // one line per module
    while (!placement.empty() && placement.back() == '\n') placement.pop_back();
    for (size_t at = placement.find('\n'); at != std::string::npos; at = placement.find('\n', at)) {
        placement.replace(at, 1, "; ");
    }
    m << "Placement: " << placement << "\n\n";
    m << "| module | time | FLOPs | FLOP/s |\n|---|---:|---:|---:|\n";
    m << "| text encoding | " << human_seconds(s.text_encoding_s) << " | | |\n";
    if (!b.text_encode_s.empty()) {
        const double te_flops = static_cast<double>(b.text_encoder_flops_per_run);
        m << "| text encoding again, weights loaded (median of " << b.text_encode_s.size() << " after the runs) | "
          << human_seconds(s.text_encode_s) << " | " << gflop(te_flops) << " | "
          << human_gflops(te_flops, s.text_encode_s) << " |\n";
    }
    m << "| denoising step (median) | " << human_seconds(s.step_median_s) << " | " << gflop(flops) << " | "
      << human_gflops(flops, s.step_median_s) << " |\n";
    m << "| denoising step (mean) | " << human_seconds(s.step_mean_s) << " | " << gflop(flops) << " | "
      << human_gflops(flops, s.step_mean_s) << " |\n";
    m << "| denoising, all " << s.step_s.size() << " steps | " << human_seconds(s.sampling_s) << " | | |\n";
    m << "| VAE decode | " << human_seconds(s.vae_decode_s) << " | | |\n";
    m << "| whole generation | " << human_seconds(s.total_s) << " | | |\n\n";
    if (!b.text_encoder_graphs.empty()) {
        m << "Text-encoder graphs of a run: ";
        for (size_t i = 0; i < b.text_encoder_graphs.size(); ++i) m << (i ? "; " : "") << b.text_encoder_graphs[i];
        m << "\n\n";
    }

    m << "| start-up, memory, limit | value |\n|---|---:|\n";
    m << "| model load | " << human_seconds(b.load_s) << " |\n";
    m << "| process start to the first denoising step | " << human_seconds(b.to_first_step_s) << " |\n";
    m << "| peak RSS at the first denoising step | " << human_bytes(b.rss_at_first_step_bytes) << " |\n";
    m << "| process start to the end of the first denoising step | " << human_seconds(b.to_first_step_done_s) << " |\n";
    m << "| peak RSS at the end of the first denoising step | " << human_bytes(b.rss_at_first_step_done_bytes)
      << " |\n";
    m << "| peak RSS | " << human_bytes(b.peak_rss_bytes) << " |\n";
    for (const DevicePeak& d : b.devices) {
        m << "| peak managed bytes on " << d.device << " | " << human_bytes(d.peak_managed_bytes);
        if (d.budget_bytes) m << " of " << human_bytes(*d.budget_bytes);
        m << " |\n";
    }
    if (b.limit_flops_per_s) {
        char rate[32];
        std::snprintf(rate, sizeof rate, "%.1f GFLOP/s", *b.limit_flops_per_s * 1e-9);
        m << "| GEMM limit: OpenBLAS sgemm (" << b.openblas_core << "), " << b.limit_shape << " | " << rate << " |\n";
        m << "| " << net << " step FLOP/s as a fraction of that | "
          << (s.fraction_of_limit ? percent(*s.fraction_of_limit) : "-") << " |\n";
    }
    if (s.unet_products_limit_flops_per_s) {
        char rate[32];
        std::snprintf(rate, sizeof rate, "%.1f GFLOP/s", *s.unet_products_limit_flops_per_s * 1e-9);
        m << "| GEMM limit on the " << net << "'s own products: OpenBLAS sgemm, each product of a step alone | " << rate
          << " (" << human_seconds(*b.unet_products_sgemm_s) << " per evaluation) |\n";
        m << "| " << net << " step FLOP/s as a fraction of that (issue 6's target: at least 70%) | "
          << percent(*s.fraction_of_unet_products_limit) << " |\n";
    }
    if (s.text_encoder_products_limit_flops_per_s) {
        char rate[32];
        std::snprintf(rate, sizeof rate, "%.1f GFLOP/s", *s.text_encoder_products_limit_flops_per_s * 1e-9);
        m << "| GEMM limit on the text encoder's own products: OpenBLAS sgemm, each product of a run alone | " << rate
          << " (" << human_seconds(*b.text_encoder_products_sgemm_s) << " per run) |\n";
        m << "| text encoding FLOP/s (weights loaded) as a fraction of that (target: at least 70%) | "
          << (s.fraction_of_text_encoder_products_limit ? percent(*s.fraction_of_text_encoder_products_limit) : "-")
          << " |\n";
    }
    if (!b.matmul_paths.empty()) {
        m << "\n| network | weight type | matrix-product path on the CPU | products | share of the network's FLOPs |\n"
             "|---|---|---|---:|---:|\n";
        for (const MatmulPathRow& r : b.matmul_paths) {
            uint64_t total = 0;
            for (const MatmulPathRow& o : b.matmul_paths) total += o.network == r.network ? o.flops : 0;
            m << "| " << r.network << " | " << r.type << " | " << r.path << " | " << r.products << " | "
              << (total > 0 ? percent(static_cast<double>(r.flops) / static_cast<double>(total)) : "-") << " |\n";
        }
    }
    m << "\n| step | time (median) |\n|---:|---:|\n";
    for (size_t i = 0; i < s.step_s.size(); ++i) m << "| " << i + 1 << " | " << human_seconds(s.step_s[i]) << " |\n";
    return m.str();
}

}  // namespace kiln::bench
