// kiln-attention-bench: one multi-head attention over N tokens on the CPU,
// timed alone, through the same nn::attention a DiT block runs (Flux at
// 1024x1024: 4096 image + 512 text tokens, 24 heads of 128). Not a test: it
// prints measurements (bench/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "runtime/compute.h"
#include "runtime/graph_session.h"

namespace {

struct Options {
    int64_t tokens = 4096 + 512;
    int heads = 24;
    int64_t head_dim = 128;
    int runs = 3;
    int threads = 0;
    bool flash = false;
    int64_t scores_block_mib = 0;  // AttentionOptions::scores_block_bytes, in MiB; 0: the scores whole
};

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&](long long lo, long long hi, long long& out) {
            if (i + 1 >= argc) return false;
            char* end = nullptr;
            out = std::strtoll(argv[++i], &end, 10);
            return *end == '\0' && out >= lo && out <= hi;
        };
        long long v = 0;
        if (a == "--tokens" && next(1, 1 << 16, v)) {
            o.tokens = v;
        } else if (a == "--heads" && next(1, 256, v)) {
            o.heads = static_cast<int>(v);
        } else if (a == "--head-dim" && next(1, 1024, v)) {
            o.head_dim = v;
        } else if (a == "--runs" && next(1, 100, v)) {
            o.runs = static_cast<int>(v);
        } else if ((a == "-t" || a == "--threads") && next(0, 1024, v)) {
            o.threads = static_cast<int>(v);
        } else if (a == "--flash") {
            o.flash = true;
        } else if (a == "--scores-block" && next(1, 4096, v)) {
            o.scores_block_mib = v;
        } else {
            std::fprintf(stderr,
                         "usage: kiln-attention-bench [--tokens N (4608)] [--heads N (24)] [--head-dim N (128)] "
                         "[--runs N (3)] [-t N] [--flash] [--scores-block MIB (queries in blocks of about MIB of "
                         "scores)]\n");
            return false;
        }
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (!parse(argc, argv, o)) return 2;
    auto compute = kiln::runtime::Compute::create(o.threads);
    if (!compute.ok()) {
        std::fprintf(stderr, "error: %s\n", compute.error().message.c_str());
        return 1;
    }
    const int64_t dim = o.heads * o.head_dim;
    std::vector<float> values(static_cast<size_t>(dim * o.tokens));
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : values) x = normal(gen);

    kiln::runtime::GraphSession session;
    ggml_tensor* q = session.input(GGML_TYPE_F32, {dim, o.tokens, 1}, values.data(), "q");
    ggml_tensor* k = session.input(GGML_TYPE_F32, {dim, o.tokens, 1}, values.data(), "k");
    ggml_tensor* v = session.input(GGML_TYPE_F32, {dim, o.tokens, 1}, values.data(), "v");
    kiln::nn::AttentionOptions options;
    options.heads = o.heads;
    options.flash = o.flash;
    options.scores_block_bytes = o.scores_block_mib << 20;
    ggml_tensor* out = kiln::nn::attention(session.ctx(), q, k, v, options);

    std::vector<double> seconds;
    for (int run = 0; run <= o.runs; ++run) {  // run 0 warms up (and allocates)
        const auto start = std::chrono::steady_clock::now();
        const kiln::Status ran = session.run(**compute, out);
        if (!ran.ok()) {
            std::fprintf(stderr, "error: %s\n", ran.error().message.c_str());
            return 1;
        }
        if (run > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    // q k^T and the weighted sum of v: 2 N^2 dim multiply-adds each.
    const double flop = 4.0 * static_cast<double>(o.tokens) * static_cast<double>(o.tokens) * static_cast<double>(dim);
    const std::string blocks =
        o.scores_block_mib > 0 ? ", scores in blocks of " + std::to_string(o.scores_block_mib) + " MiB" : "";
    std::printf(
        "attention, %lld tokens, %d heads of %lld%s%s, %d threads: %.3f s (median of %d), %.1f GFLOP, %.1f "
        "GFLOP/s\n",
        static_cast<long long>(o.tokens), o.heads, static_cast<long long>(o.head_dim), o.flash ? ", flash" : "",
        blocks.c_str(), (*compute)->threads(), median, o.runs, flop / 1e9, flop / median / 1e9);
    return 0;
}
