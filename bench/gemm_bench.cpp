// kiln-gemm-bench: the machine's matrix-multiply limit (issue 6, part 2).
// Times the UNet's own product shapes, and the reference product,
// on every path a CPU run could take: OpenBLAS sgemm called directly, ggml's
// CPU backend with F32 and F16 weights, and ggml's BLAS backend (which kiln's
// scheduler gives the large products) with F32 and F16 weights.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "gemm_timer.h"
#include "matmul_shapes.h"
#include "model_path.h"
#include "pipeline/auto_fit.h"
#include "pipeline/model.h"
#include "report_text.h"
#include "unet_step_graph.h"
#include "util/log.h"

namespace kiln::bench {
namespace {

struct GemmOptions {
    int threads = 0;  // 0: every core
    int repetitions = 3;
    bool reference = true;  // --shapes reference
    bool sd15 = true;       // --shapes sd15
    bool llm = false;       // --shapes llm
    bool model_set = true;  // --shapes model
    std::string model;      // "": kiln's default model
    std::string tokenizer;
    int width = 0;   // 0: the model's default
    int height = 0;  // 0: the model's default
    int top = 10;    // the model's largest products (by total FLOPs); 0: all
    std::string json_path;
    std::string markdown_path;
    bool list_only = false;
    bool help = false;
};

// One set of shapes and what each path measured, in seconds.
struct ShapeSet {
    std::string title;
    std::vector<MatmulShape> shapes;
    std::vector<std::map<GemmPath, std::optional<double>>> seconds;  // per shape
};

std::vector<BenchFlag> gemm_flags(GemmOptions& o) {
    return {
        {"-t", "--threads", "N", "threads for every path (default: every core)",
         [&o](const std::string& v) { return parse_int(v, 1, 4096, &o.threads); }},
        {nullptr, "--reps", "N", "timed repetitions per product after one warm-up; the best counts (default 3)",
         [&o](const std::string& v) { return parse_int(v, 1, 1000, &o.repetitions); }},
        {nullptr, "--shapes", "LIST",
         "which products: reference, sd15, llm, model, comma-separated (default: reference, sd15, model)",
         [&o](const std::string& v) -> std::optional<std::string> {
             o.reference = o.sd15 = o.llm = o.model_set = false;
             std::istringstream items(v);
             std::string item;
             bool any = false;
             while (std::getline(items, item, ',')) {
                 if (item == "reference") {
                     o.reference = true;
                 } else if (item == "sd15") {
                     o.sd15 = true;
                 } else if (item == "llm") {
                     o.llm = true;
                 } else if (item == "model") {
                     o.model_set = true;
                 } else {
                     return "unknown shape set '" + item + "' (valid: reference, sd15, llm, model)";
                 }
                 any = true;
             }
             if (!any) return std::string("expected reference, sd15, llm or model, got an empty list");
             return std::nullopt;
         }},
        {"-m", "--model", "PATH",
         "the model whose UNet products the 'model' set lists (default: models/kiln-tiny.gguf)",
         text_setter(&o.model, "a path")},
        {nullptr, "--tokenizer", "SPEC", "as kiln's --tokenizer: CLIP's, or clip_l=PATH,t5xxl=PATH,llm=PATH",
         text_setter(&o.tokenizer, "a path")},
        {"-W", "--width", "N", "image width of the model's job (default: the model's)",
         [&o](const std::string& v) { return parse_int(v, 8, 8192, &o.width); }},
        {"-H", "--height", "N", "image height of the model's job (default: the model's)",
         [&o](const std::string& v) { return parse_int(v, 8, 8192, &o.height); }},
        {nullptr, "--top", "N", "time the model's N largest products by total FLOPs; 0: all (default 10)",
         [&o](const std::string& v) { return parse_int(v, 0, 100000, &o.top); }},
        {nullptr, "--json", "PATH", "also write the results as JSON", text_setter(&o.json_path, "a path")},
        {nullptr, "--markdown", "PATH", "also write the markdown tables to a file",
         text_setter(&o.markdown_path, "a path")},
        {nullptr, "--list", nullptr, "print the products and their shapes, time nothing",
         switch_setter(&o.list_only, true)},
        {"-h", "--help", nullptr, "this help", switch_setter(&o.help, true)},
    };
}

// The products of the model's UNet step (CFG as a batch of two when the
// model's default guidance uses it), from its graph; the weights are not read.
Result<ShapeSet> model_shapes(const GemmOptions& o) {
    pipeline::ModelPaths paths;
    paths.model.push_back(o.model);
    paths.tokenizer = o.tokenizer;
    pipeline::ModelOptions options;
    options.plan_only = true;
    auto model = pipeline::load_model(paths, options);
    if (!model) return model.error();
    const pipeline::ModelDefaults& d = (*model)->defaults();
    const int width = o.width > 0 ? o.width : d.width;
    const int height = o.height > 0 ? o.height : d.height;
    const bool cfg = d.cfg_scale != 1.0f;
    const UnetStepGraph unet = build_unet_step_graph(**model, width, height, cfg, /*flash_attention=*/false,
                                                     /*prompt=*/nullptr);  // an LLM: kiln plan's prompt length
    ShapeSet set;
    set.title = std::filesystem::path(o.model).filename().string() + " UNet step at " + std::to_string(width) + "x" +
                std::to_string(height) + (cfg ? ", CFG batch 2" : "") + " (from its graph)";
    set.shapes = graph_matmul_shapes(unet.graph);
    if (o.top > 0 && set.shapes.size() > static_cast<size_t>(o.top)) set.shapes.resize(static_cast<size_t>(o.top));
    return set;
}

void time_set(ShapeSet& set, int threads, int repetitions) {
    for (const MatmulShape& shape : set.shapes) {
        std::fprintf(stderr, "kiln-gemm-bench: %s: %s\n", shape.label.c_str(), describe_shape(shape).c_str());
        std::map<GemmPath, std::optional<double>> seconds;
        for (GemmPath path : kAllGemmPaths) seconds[path] = time_matmul(path, shape, threads, repetitions);
        set.seconds.push_back(std::move(seconds));
    }
}

// What kiln's scheduler would take for a shape on a ggml BLAS path: the
// BLAS time where the BLAS backend takes the product, else the CPU's.
std::optional<double> as_scheduled(GemmPath path, const std::map<GemmPath, std::optional<double>>& seconds) {
    const std::optional<double>& t = seconds.at(path);
    if (t) return t;
    if (path == GemmPath::GgmlBlasF32) return seconds.at(GemmPath::GgmlCpuF32);
    if (path == GemmPath::GgmlBlasF16) return seconds.at(GemmPath::GgmlCpuF16);
    return std::nullopt;
}

// FLOP/s of the whole set, each product weighted by its count: the rate a
// step made of exactly these products would reach on that path.
std::optional<double> weighted_rate(const ShapeSet& set, GemmPath path) {
    double flops = 0, seconds = 0;
    for (size_t i = 0; i < set.shapes.size(); ++i) {
        const auto t = as_scheduled(path, set.seconds[i]);
        if (!t) return std::nullopt;
        flops += static_cast<double>(matmul_flops(set.shapes[i])) * set.shapes[i].count;
        seconds += *t * set.shapes[i].count;
    }
    return seconds > 0 ? std::optional<double>(flops / seconds) : std::nullopt;
}

std::string gflops_cell(std::optional<double> flops_per_s) {
    if (!flops_per_s) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", *flops_per_s * 1e-9);
    return buf;
}

std::optional<double> rate(const MatmulShape& shape, std::optional<double> seconds) {
    if (!seconds || *seconds <= 0) return std::nullopt;
    return static_cast<double>(matmul_flops(shape)) / *seconds;
}

std::string to_markdown(const std::vector<ShapeSet>& sets, const OpenBlasInfo& blas, int threads, int repetitions) {
    std::ostringstream m;
    m << "### kiln-gemm-bench: " << threads << " threads, best of " << repetitions << " after a warm-up\n\n";
    m << "OpenBLAS: core " << (blas.corename.empty() ? "(not linked)" : blas.corename) << "; " << blas.config
      << "\n\nGFLOP/s; one multiply-add is 2 FLOPs. \"-\": the path cannot take the product (see bench/README.md).\n";
    for (const ShapeSet& set : sets) {
        m << "\n#### " << set.title << "\n\n| product | shape (M x K by K x N) | count | GFLOP |";
        for (GemmPath path : kAllGemmPaths) m << " " << gemm_path_name(path) << " |";
        m << "\n|---|---|---:|---:|";
        for (size_t i = 0; i < std::size(kAllGemmPaths); ++i) m << "---:|";
        m << "\n";
        for (size_t i = 0; i < set.shapes.size(); ++i) {
            const MatmulShape& s = set.shapes[i];
            char gflop[32];
            std::snprintf(gflop, sizeof gflop, "%.3g", static_cast<double>(matmul_flops(s)) * 1e-9);
            m << "| " << s.label << " | " << describe_shape(s) << " | " << s.count << " | " << gflop << " |";
            for (GemmPath path : kAllGemmPaths) m << " " << gflops_cell(rate(s, set.seconds[i].at(path))) << " |";
            m << "\n";
        }
        if (set.shapes.size() > 1) {
            m << "| all of the above, weighted by FLOPs x count | | | |";
            for (GemmPath path : kAllGemmPaths) m << " " << gflops_cell(weighted_rate(set, path)) << " |";
            m << "\n";
        }
    }
    return m.str();
}

std::string to_json(const std::vector<ShapeSet>& sets, const OpenBlasInfo& blas, int threads, int repetitions) {
    auto rates = [](const std::map<GemmPath, std::optional<double>>& by_path) {
        std::string out = "{";
        bool first = true;
        for (GemmPath path : kAllGemmPaths) {
            out += std::string(first ? "" : ", ") + "\"" + gemm_path_key(path) + "\": ";
            out += by_path.at(path) ? json_number(*by_path.at(path)) : "null";
            first = false;
        }
        return out + "}";
    };
    std::ostringstream j;
    j << "{\n  \"benchmark\": \"kiln-gemm-bench\",\n  \"threads\": " << threads
      << ",\n  \"repetitions\": " << repetitions << ",\n  \"openblas\": {\"corename\": " << json_quote(blas.corename)
      << ", \"config\": " << json_quote(blas.config) << ", \"threads\": " << blas.threads << "},\n  \"sets\": [\n";
    for (size_t si = 0; si < sets.size(); ++si) {
        const ShapeSet& set = sets[si];
        j << "    {\"title\": " << json_quote(set.title) << ", \"products\": [\n";
        for (size_t i = 0; i < set.shapes.size(); ++i) {
            const MatmulShape& s = set.shapes[i];
            std::map<GemmPath, std::optional<double>> flops_per_s;
            for (GemmPath path : kAllGemmPaths) flops_per_s[path] = rate(s, set.seconds[i].at(path));
            j << "      {\"label\": " << json_quote(s.label) << ", \"m\": " << s.m << ", \"k\": " << s.k
              << ", \"n\": " << s.n << ", \"batch\": " << s.batch << ", \"weight_batch\": " << s.weight_batch
              << ", \"count\": " << s.count << ", \"flops\": " << matmul_flops(s)
              << ", \"seconds\": " << rates(set.seconds[i]) << ", \"flops_per_s\": " << rates(flops_per_s) << "}"
              << (i + 1 < set.shapes.size() ? "," : "") << "\n";
        }
        std::map<GemmPath, std::optional<double>> weighted;
        for (GemmPath path : kAllGemmPaths) weighted[path] = weighted_rate(set, path);
        j << "    ], \"weighted_flops_per_s\": " << rates(weighted) << "}" << (si + 1 < sets.size() ? "," : "") << "\n";
    }
    j << "  ]\n}\n";
    return j.str();
}

int run(const std::vector<std::string>& args) {
    GemmOptions o;
    const std::vector<BenchFlag> flags = gemm_flags(o);
    if (auto error = parse_flags(args, flags)) {
        KILN_LOG_ERROR("%s (see kiln-gemm-bench --help)", error->c_str());
        return kExitUsage;
    }
    if (o.help) {
        std::cout << "usage: kiln-gemm-bench [options]   the machine's matrix-multiply limit (bench/README.md)\n\n"
                     "options:\n"
                  << flags_help(flags);
        return kExitOk;
    }
    log_set_level(LogLevel::Warn);
    log_capture_ggml();
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

    std::vector<ShapeSet> sets;
    if (o.model_set) {
        // Load first: a missing model fails before minutes of timing.
        auto model_path = resolve_model_path(o.model);
        if (!model_path) {
            KILN_LOG_ERROR("%s", model_path.error().message.c_str());
            return kExitFailure;
        }
        o.model = *model_path;
        auto set = model_shapes(o);
        if (!set) {
            KILN_LOG_ERROR("%s", set.error().message.c_str());
            return kExitFailure;
        }
        sets.push_back(std::move(set).value());
    }
    if (o.llm) sets.insert(sets.begin(), {"Qwen3-4B layer over a prompt (thin products)", llm_matmul_shapes(), {}});
    if (o.sd15)
        sets.insert(sets.begin(), {"SD1.5 UNet at 512x512, CFG batch 2 (representative)", sd15_matmul_shapes(), {}});
    if (o.reference) sets.insert(sets.begin(), {"issue 6 reference", {reference_shape()}, {}});
    if (o.list_only) {
        for (const ShapeSet& set : sets) {
            std::cout << set.title << ":\n";
            for (const MatmulShape& s : set.shapes) {
                std::cout << "  " << describe_shape(s) << "  x" << s.count << "  " << s.label << "\n";
            }
        }
        return kExitOk;
    }
    for (ShapeSet& set : sets) time_set(set, threads, o.repetitions);

    // Read after the runs: OpenBLAS reports the thread count it last used.
    const OpenBlasInfo blas = openblas_info();
    const std::string markdown = to_markdown(sets, blas, threads, o.repetitions);
    const std::string json = to_json(sets, blas, threads, o.repetitions);
    if (Status s = publish_report(markdown, o.markdown_path, json, o.json_path); !s) {
        KILN_LOG_ERROR("%s", s.error().message.c_str());
        return kExitFailure;
    }
    return kExitOk;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) { return kiln::bench::run(std::vector<std::string>(argv + 1, argv + argc)); }
