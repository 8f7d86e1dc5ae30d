// kiln-bench: one text-to-image job with a fixed seed, prompt, size, steps
// and sampler, timed module by module (text encoding, every denoising step,
// VAE decode), with peak memory, the diffusion network's and the text
// encoder's FLOP/s, the machine's GEMM limit to compare them with, and the
// kernel each matrix product reaches (issue 6; bench/README.md explains the
// output).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "gemm_timer.h"
#include "generation_report.h"
#include "io/tensor_convert.h"
#include "matmul_paths.h"
#include "model_path.h"
#include "pipeline/auto_fit.h"
#include "pipeline/conditioner.h"
#include "pipeline/generate.h"
#include "pipeline/loras.h"
#include "pipeline/model.h"
#include "pipeline/module_roles.h"
#include "pipeline/placement.h"
#include "pipeline/request.h"
#include "process_stats.h"
#include "report_text.h"
#include "runtime/device_budget.h"
#include "runtime/devices.h"
#include "runtime/graph_flops.h"
#include "text_encoder_graphs.h"
#include "unet_step_graph.h"
#include "util/log.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
    std::string model;  // "": kiln's default model
    std::string tokenizer;
    std::string prompt = "a red circle on a white background";
    int width = 0;            // 0: the model's default
    int height = 0;           // 0: the model's default
    int steps = 0;            // 0: the model's default
    int video_frames = 0;     // a video model's --video-frames; 0: one frame
    float cfg_scale = -1.0f;  // < 0: the model's default
    std::string sampler;      // "": the model's default
    std::string scheduler;    // "": the model's default
    int64_t seed = 42;
    int threads = 0;  // 0: every core
    int runs = 3;
    bool flash_attention = false;
    bool batch_cfg = true;
    std::string rpc;
    std::string backend;
    std::string params_backend;
    bool offload_to_cpu = false;
    runtime::BudgetSpec budgets;
    bool measure_limit = true;
    std::string json_path;
    std::string markdown_path;
    bool verbose = false;
    bool help = false;
    std::string weight_type;      // --type: "" keeps the file's
    std::string lora_dir;         // --lora-model-dir: for <lora:NAME:W> in the prompt
    std::string lora_apply_mode;  // --lora-apply-mode: "" is auto
};

std::vector<BenchFlag> bench_flags(BenchOptions& o) {
    return {
        {"-m", "--model", "PATH", "model file or diffusers folder (default: models/kiln-tiny.gguf)",
         text_setter(&o.model, "a path")},
        {nullptr, "--tokenizer", "SPEC",
         "as kiln's --tokenizer: CLIP's tokenizer, or per encoder clip_l=PATH,t5xxl=PATH,llm=PATH",
         text_setter(&o.tokenizer, "a path")},
        {nullptr, "--type", "TYPE", "weight type to compute with, as kiln's --type (default: the file's)",
         text_setter(&o.weight_type, "a type")},
        {nullptr, "--lora-model-dir", "PATH", "LoRA folder for <lora:NAME:W> tags in the prompt, as kiln's",
         text_setter(&o.lora_dir, "a path")},
        {nullptr, "--lora-apply-mode", "MODE", "auto, immediately or at_runtime, as kiln's",
         text_setter(&o.lora_apply_mode, "a mode")},
        {"-p", "--prompt", "TEXT", "prompt (default: \"a red circle on a white background\")",
         [&o](const std::string& v) -> std::optional<std::string> {
             o.prompt = v;
             return std::nullopt;
         }},
        {"-W", "--width", "N", "image width in pixels (default: the model's)",
         [&o](const std::string& v) { return parse_int(v, 8, 8192, &o.width); }},
        {"-H", "--height", "N", "image height in pixels (default: the model's)",
         [&o](const std::string& v) { return parse_int(v, 8, 8192, &o.height); }},
        {nullptr, "--steps", "N", "denoising steps (default: the model's)",
         [&o](const std::string& v) { return parse_int(v, 1, 10000, &o.steps); }},
        {nullptr, "--cfg-scale", "X",
         "classifier-free guidance scale; 1 runs no unconditional pass (default: the "
         "model's)",
         [&o](const std::string& v) { return parse_float(v, 0.0f, 100.0f, &o.cfg_scale); }},
        {nullptr, "--sampling-method", "NAME", "sampler (default: the model's)", text_setter(&o.sampler, "a sampler")},
        {nullptr, "--scheduler", "NAME", "scheduler (default: the model's)", text_setter(&o.scheduler, "a scheduler")},
        {nullptr, "--video-frames", "N", "a video model's frames per clip, made 4k + 1 (default 1)",
         [&o](const std::string& v) { return parse_int(v, 1, 1025, &o.video_frames); }},
        {"-s", "--seed", "N", "seed (default 42)",
         [&o](const std::string& v) { return parse_int64(v, 0, INT64_MAX, &o.seed); }},
        {"-t", "--threads", "N", "CPU threads (default: every core)",
         [&o](const std::string& v) { return parse_int(v, 1, 4096, &o.threads); }},
        {nullptr, "--diffusion-fa", nullptr, "flash attention in the diffusion network",
         switch_setter(&o.flash_attention, true)},
        {nullptr, "--no-cfg-batch", nullptr,
         "run CFG's conditional and unconditional passes one after the other (default: one batch of two)",
         switch_setter(&o.batch_cfg, false)},
        {nullptr, "--rpc-servers", "HOST:PORT[,...]", "add the devices of ggml RPC servers (RPC0, RPC1, ...)",
         [&o](const std::string& v) -> std::optional<std::string> {
             auto parsed = runtime::parse_rpc_endpoints(v);
             if (!parsed) {
                 const std::string& m = parsed.error().message;
                 return m.rfind("--rpc-servers: ", 0) == 0 ? m.substr(7) : m;
             }
             o.rpc = v;
             return std::nullopt;
         }},
        {nullptr, "--backend", "SPEC", "compute device for every module, or per module: diffusion=rpc0,te=cpu,vae=cpu",
         text_setter(&o.backend, "a device or module=device pairs")},
        {nullptr, "--params-backend", "SPEC", "where weights live between uses: cpu, disk or a device, or per module",
         text_setter(&o.params_backend, "cpu, disk, a device or module=location pairs")},
        {nullptr, "--offload-to-cpu", nullptr, "keep every module's weights in RAM",
         switch_setter(&o.offload_to_cpu, true)},
        {nullptr, "--max-vram", "GIB", "memory budget per device, as kiln's --max-vram (6, rpc0=0.5, 96M)",
         [&o](const std::string& v) -> std::optional<std::string> {
             auto parsed = runtime::parse_max_vram(v);
             if (!parsed) {
                 const std::string& m = parsed.error().message;
                 return m.rfind("--max-vram: ", 0) == 0 ? m.substr(12) : m;
             }
             o.budgets = std::move(parsed).value();
             return std::nullopt;
         }},
        {nullptr, "--runs", "N", "generate N times and report medians (default 3)",
         [&o](const std::string& v) { return parse_int(v, 1, 1000, &o.runs); }},
        {nullptr, "--no-limit", nullptr,
         "skip measuring the OpenBLAS sgemm limits (a few seconds for small models, minutes for large ones)",
         switch_setter(&o.measure_limit, false)},
        {nullptr, "--json", "PATH", "also write the results as JSON", text_setter(&o.json_path, "a path")},
        {nullptr, "--markdown", "PATH", "also write the markdown tables to a file",
         text_setter(&o.markdown_path, "a path")},
        {"-v", "--verbose", nullptr, "kiln's verbose log (placement, plans, loads)", switch_setter(&o.verbose, true)},
        {"-h", "--help", nullptr, "this help", switch_setter(&o.help, true)},
    };
}

int usage_error(const std::string& message) {
    KILN_LOG_ERROR("%s (see kiln-bench --help)", message.c_str());
    return kExitUsage;
}

// The flags' placement request, checked against the registered devices
// (after --rpc-servers has added its own). Errors are usage errors.
Result<pipeline::PlacementRequest> placement_request(const BenchOptions& o) {
    pipeline::PlacementRequest request;
    if (!o.backend.empty()) {
        auto assignments = pipeline::parse_backend_assignments(o.backend);
        if (!assignments) return assignments.error();
        request.backend = std::move(assignments).value();
    }
    if (!o.params_backend.empty()) {
        auto where = pipeline::parse_params_backend(o.params_backend, runtime::registered_device_names());
        if (!where) return where.error();
        request.params_backend = std::move(where).value();
    }
    request.offload_to_cpu = o.offload_to_cpu;
    request.budgets = o.budgets;
    return request;
}

int run(const std::vector<std::string>& args) {
    BenchOptions o;
    const std::vector<BenchFlag> flags = bench_flags(o);
    if (auto error = parse_flags(args, flags)) return usage_error(*error);
    if (o.help) {
        std::cout << "usage: kiln-bench [options]   time one generation module by module (bench/README.md)\n\n"
                     "options:\n"
                  << flags_help(flags);
        return kExitOk;
    }
    log_set_level(o.verbose ? LogLevel::Verbose : LogLevel::Warn);
    log_capture_ggml();

    auto model_path = resolve_model_path(o.model);
    if (!model_path) {
        KILN_LOG_ERROR("%s", model_path.error().message.c_str());
        return kExitFailure;
    }
    o.model = *model_path;
    if (!o.rpc.empty()) {
        if (Status s = runtime::add_rpc_servers(o.rpc); !s) {
            KILN_LOG_ERROR("%s", s.error().message.c_str());
            return kExitFailure;
        }
    }
    auto placement = placement_request(o);
    if (!placement) return usage_error(placement.error().message);

    pipeline::ModelPaths paths;
    paths.model.push_back(o.model);
    paths.tokenizer = o.tokenizer;
    pipeline::ModelOptions model_options;
    model_options.threads = o.threads;
    model_options.placement = std::move(placement).value();
    model_options.job_width = o.width;  // auto-fit checks its placement against this job (0: the defaults)
    model_options.job_height = o.height;
    model_options.lora_dir = o.lora_dir;
    if (!o.weight_type.empty()) {
        auto type = io::parse_weight_type(o.weight_type);
        if (!type) return usage_error("--type: " + type.error().message);
        model_options.weight_type = *type;
    }
    if (!o.lora_apply_mode.empty()) {
        auto mode = pipeline::parse_lora_apply_mode(o.lora_apply_mode);
        if (!mode) return usage_error("--lora-apply-mode: " + mode.error().message);
        model_options.lora_apply_mode = *mode;
    }
    const Clock::time_point load_start = Clock::now();
    auto loaded = pipeline::load_model(paths, model_options);
    if (!loaded) {
        KILN_LOG_ERROR("%s", loaded.error().message.c_str());
        return kExitFailure;
    }
    pipeline::Model& model = **loaded;

    GenerationBenchmark b;
    b.load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
    const pipeline::ModelDefaults& defaults = model.defaults();
    b.model = o.model;
    b.family = model.family_label();
    b.placement = pipeline::describe_placement(model.placement(), model.module_bytes());
    b.prompt = o.prompt;
    b.width = o.width > 0 ? o.width : defaults.width;
    b.height = o.height > 0 ? o.height : defaults.height;
    b.steps = o.steps > 0 ? o.steps : defaults.steps;
    b.cfg_scale = o.cfg_scale >= 0 ? o.cfg_scale : defaults.cfg_scale;
    b.sampler = o.sampler.empty() ? defaults.sampler : o.sampler;
    b.scheduler = o.scheduler.empty() ? defaults.scheduler : o.scheduler;
    b.seed = o.seed;
    b.threads = model.diffusion_compute().compute().threads();
    b.flash_attention = o.flash_attention;

    pipeline::GenerationRequest request;
    request.prompt = o.prompt;
    request.width = b.width;
    request.height = b.height;
    request.steps = b.steps;
    request.cfg_scale = b.cfg_scale;
    request.sampler = b.sampler;
    request.scheduler = b.scheduler;
    request.seed = o.seed;
    request.flash_attention = o.flash_attention;
    request.batch_cfg = o.batch_cfg;
    if (o.video_frames > 0) request.video_frames = o.video_frames;
    auto validated = pipeline::validate_request(model, request);
    if (!validated) {
        KILN_LOG_ERROR("%s", validated.error().message.c_str());
        return kExitUsage;
    }
    b.frames = validated->frames;
    // Part 5 of issue 6, from the first run: what it takes to start denoising.
    bool first_run = true;
    const pipeline::StepCallback on_step = [&](int image, int step, int) {
        if (!first_run || image != 0) return;
        if (step == 0) {
            b.to_first_step_s = seconds_since_process_start();
            b.rss_at_first_step_bytes = peak_rss_bytes();
        } else if (step == 1) {
            b.to_first_step_done_s = seconds_since_process_start();
            b.rss_at_first_step_done_bytes = peak_rss_bytes();
        }
    };
    for (int r = 0; r < o.runs; ++r) {
        pipeline::GenerationTimings timings;
        const int evaluations_before = model.diffusion_compute().stats().runs;
        const Clock::time_point start = Clock::now();
        auto images = pipeline::generate(model, request, on_step, &timings);
        if (!images) {
            KILN_LOG_ERROR("%s", images.error().message.c_str());
            return kExitFailure;
        }
        b.unet_evaluations_per_run = model.diffusion_compute().stats().runs - evaluations_before;
        b.unet_segments = model.diffusion_compute().stats().last_segments;
        b.cfg_batched = b.cfg_scale != 1.0f && !timings.cfg_passes_apart;
        RunTimes times;
        times.total_s = std::chrono::duration<double>(Clock::now() - start).count();
        times.text_encoding_s = timings.text_encoding_s;
        times.sampling_s = timings.sampling_s;
        times.vae_decode_s = timings.vae_s;
        times.step_s = timings.step_s;
        std::fprintf(stderr, "kiln-bench: run %d/%d: %s\n", r + 1, o.runs, human_seconds(times.total_s).c_str());
        b.runs.push_back(std::move(times));
        first_run = false;
    }
    // Peaks before the limit measurement, whose operands would count too.
    b.peak_rss_bytes = peak_rss_bytes();
    for (const auto& [name, ledger] : model.ledgers()) b.devices.push_back({name, ledger->peak(), ledger->budget()});

    // Encoding the job's prompts again, now that the weights are loaded: the
    // first run's encoding also read them (lazy loading), and a one-run
    // benchmark has no other encoding to take.
    const std::vector<std::string> prompts =
        encoded_prompts(model, request.prompt, request.negative_prompt, b.cfg_scale);
    constexpr int kTextEncodings = 3;
    for (int r = 0; r < kTextEncodings; ++r) {
        const Clock::time_point start = Clock::now();
        for (const std::string& prompt : prompts) {
            auto encoded = pipeline::encode_prompt(model, prompt, request.clip_skip);
            if (!encoded) {
                KILN_LOG_ERROR("%s", encoded.error().message.c_str());
                return kExitFailure;
            }
        }
        b.text_encode_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }

    // One evaluation's graph: the batch of two, or one pass when they run
    // apart (evaluations_per_run counts both passes then). An LLM's context
    // is as long as its prompt, so apart, the unconditional pass has the
    // negative prompt's length: its graph is averaged in when it differs.
    b.diffusion_label = model.diffusion().capabilities().label;
    const UnetStepGraph unet = build_unet_step_graph(model, b.width, b.height, b.cfg_batched, o.flash_attention,
                                                     &request.prompt, validated->latent_frames);
    std::vector<ggml_cgraph*> step_graphs;
    uint64_t step_flops = 0;
    if (unet.graph) {
        step_graphs.push_back(unet.graph);
        step_flops = runtime::graph_flops(unet.graph);
    }
    UnetStepGraph uncond;
    if (unet.graph && b.cfg_scale != 1.0f && !b.cfg_batched) {
        uncond = build_unet_step_graph(model, b.width, b.height, false, o.flash_attention, &request.negative_prompt,
                                       validated->latent_frames);
        if (uncond.graph && runtime::graph_flops(uncond.graph) != step_flops) {
            step_graphs.push_back(uncond.graph);
            step_flops += runtime::graph_flops(uncond.graph);
        }
    }
    if (!step_graphs.empty()) b.unet_flops_per_evaluation = step_flops / step_graphs.size();

    const std::vector<TextEncoderJobGraph> text_graphs = build_text_encoder_graphs(model, prompts);
    std::vector<ggml_cgraph*> text_cgraphs;
    for (const TextEncoderJobGraph& g : text_graphs) {
        b.text_encoder_graphs.push_back(g.label);
        b.text_encoder_flops_per_run += runtime::graph_flops(g.cgraph);
        text_cgraphs.push_back(g.cgraph);
    }

    // The kernels the products reach, for modules computed on the CPU.
    const bool blas = cpu_scheduler_has_blas();
    if (model.diffusion_compute().compute().device_name() == "CPU") {
        add_matmul_paths("diffusion (" + b.diffusion_label + ")", step_graphs, blas, &b.matmul_paths);
    }
    for (const TextEncoderJobGraph& g : text_graphs) {
        if (g.encoder->executor->compute().device_name() == "CPU") {
            add_matmul_paths("text encoder", {g.cgraph}, blas, &b.matmul_paths);
        }
    }

    if (o.measure_limit) {
        const MatmulShape shape = reference_shape();
        if (auto seconds = time_matmul(GemmPath::OpenBlasSgemm, shape, b.threads, 3)) {
            b.limit_flops_per_s = static_cast<double>(matmul_flops(shape)) / *seconds;
            b.limit_shape = describe_shape(shape);
            b.openblas_core = openblas_info().corename;
            double step_seconds = 0;
            uint64_t products_flops = 0;
            bool timed = true;
            for (ggml_cgraph* graph : step_graphs) {
                uint64_t f = 0;
                const auto t = time_graph_products(graph, GemmPath::OpenBlasSgemm, b.threads, 3, &f);
                timed = timed && t.has_value();
                step_seconds += t.value_or(0);
                products_flops += f;
            }
            if (timed && !step_graphs.empty()) {
                b.unet_products_sgemm_s = step_seconds / static_cast<double>(step_graphs.size());
                b.unet_products_flops = products_flops / step_graphs.size();
            }
            double text_seconds = 0;
            timed = true;
            for (ggml_cgraph* graph : text_cgraphs) {
                uint64_t f = 0;
                const auto t = time_graph_products(graph, GemmPath::OpenBlasSgemm, b.threads, 3, &f);
                timed = timed && t.has_value();
                text_seconds += t.value_or(0);
                b.text_encoder_products_flops += f;
            }
            if (timed && !text_cgraphs.empty()) b.text_encoder_products_sgemm_s = text_seconds;
        } else {
            KILN_LOG_WARN("kiln-bench was built without OpenBLAS: no GEMM limit to compare with");
        }
    }

    if (Status s = publish_report(to_markdown(b), o.markdown_path, to_json(b), o.json_path); !s) {
        KILN_LOG_ERROR("%s", s.error().message.c_str());
        return kExitFailure;
    }
    return kExitOk;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) { return kiln::bench::run(std::vector<std::string>(argv + 1, argv + argc)); }
