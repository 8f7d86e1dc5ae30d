// What kiln-bench measured for one generation job, and its two forms: JSON
// for scripts and plots, a markdown table for people (bench/README.md).
// Times of several runs are reported as their median; every run's times
// are kept in the JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "matmul_paths.h"

namespace kiln::bench {

// One generate() call.
struct RunTimes {
    double text_encoding_s = 0;
    double sampling_s = 0;  // every denoising step
    double vae_decode_s = 0;
    double total_s = 0;  // the whole generate() call
    std::vector<double> step_s;
};

struct DevicePeak {
    std::string device;                    // "CPU", "RPC0"
    uint64_t peak_managed_bytes = 0;       // the ledger's peak (runtime/device_budget.h)
    std::optional<uint64_t> budget_bytes;  // --max-vram, when given
};

struct GenerationBenchmark {
    // The job.
    std::string model;  // path
    std::string family;
    std::string diffusion_label = "UNet";  // what the report calls the diffusion network: "UNet" or "DiT"
    std::string placement;                 // pipeline::describe_placement
    std::string prompt;
    int width = 0, height = 0, steps = 0;
    int frames = 1;  // a video model's clip: its frames (4k + 1)
    float cfg_scale = 0;
    std::string sampler, scheduler;
    int64_t seed = 0;
    int threads = 0;
    bool flash_attention = false;

    // Start-up (part 5 of issue 6): the first run only.
    double load_s = 0;           // Model::load
    double to_first_step_s = 0;  // process start to the first denoising step starting
    uint64_t rss_at_first_step_bytes = 0;
    // ... and to its end: lazy loading reads the UNet's weights in that step.
    double to_first_step_done_s = 0;
    uint64_t rss_at_first_step_done_bytes = 0;

    std::vector<RunTimes> runs;
    uint64_t peak_rss_bytes = 0;
    std::vector<DevicePeak> devices;
    // One UNet evaluation's FLOPs (runtime/graph_flops.h; CFG's batch of two
    // included) and how many evaluations a run made: some samplers (heun,
    // dpm2) evaluate twice per step.
    uint64_t unet_flops_per_evaluation = 0;
    int unet_evaluations_per_run = 0;
    bool cfg_batched = true;  // CFG's passes ran as one batch of two
    int unet_segments = 1;    // segments of the UNet's last run (1: whole graph)

    // The machine's limit, when measured: OpenBLAS sgemm on the issue's
    // reference product ...
    std::optional<double> limit_flops_per_s;
    std::string limit_shape;
    std::string openblas_core;
    // ... and on the UNet's own products: every matrix product of one
    // evaluation's graph timed alone on OpenBLAS sgemm (best of 3), the time
    // a step would take if it did nothing but those products at the machine's
    // best GEMM. Their FLOPs over that time is the limit for this job's mix of
    // shapes (issue 6: the shapes the UNet actually uses).
    std::optional<double> unet_products_sgemm_s;  // per evaluation
    uint64_t unet_products_flops = 0;             // per evaluation, the same products

    // The text encoder(s), reported as the diffusion network is: the graphs
    // one run encodes (text_encoder_graphs.h; the prompt, and the negative
    // prompt with CFG), their FLOPs, the time of that encoding measured again
    // after the runs with the weights loaded (the first run's encoding also
    // reads them: lazy loading), and their products timed alone on sgemm.
    std::vector<std::string> text_encoder_graphs;  // one label per graph
    uint64_t text_encoder_flops_per_run = 0;
    std::vector<double> text_encode_s;                    // each encoding of the job's prompts, after the runs
    std::optional<double> text_encoder_products_sgemm_s;  // per run: every product of every graph
    uint64_t text_encoder_products_flops = 0;             // per run, the same products

    // Where the products of both networks run (matmul_paths.h), for modules
    // computed on the CPU; empty when none is.
    std::vector<MatmulPathRow> matmul_paths;
};

std::string to_json(const GenerationBenchmark& b);
std::string to_markdown(const GenerationBenchmark& b);

}  // namespace kiln::bench
