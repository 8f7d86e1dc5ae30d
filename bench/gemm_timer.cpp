#include "gemm_timer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#if __has_include("ggml-blas.h")
#include "ggml-blas.h"
#endif
#ifdef KILN_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Values in [-1, 1), cheap to make even for gigabytes of operands; any
// normal numbers time the same.
void fill_random(float* data, size_t count, uint32_t seed) {
    uint32_t state = seed * 2654435761u + 1;
    for (size_t i = 0; i < count; ++i) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        data[i] = static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

// The best of at least `repetitions` timed runs after a warm-up. Products
// of microseconds run on until 0.1 s has passed (at most 1000 runs), so a
// preempted run or a timer tick does not decide their rate.
template <typename Run>
double best_time(Run run, int repetitions) {
    run();  // warm-up: first-touch page faults, thread start-up, caches
    constexpr double kMinTotalSeconds = 0.1;
    constexpr int kMaxRuns = 1000;
    double best = 1e300, total = 0;
    for (int r = 0; r < repetitions || (total < kMinTotalSeconds && r < kMaxRuns); ++r) {
        const Clock::time_point start = Clock::now();
        run();
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        best = std::min(best, seconds);
        total += seconds;
    }
    return best;
}

#ifdef KILN_BENCH_OPENBLAS
// The product ggml's BLAS backend makes (ggml-blas.cpp): row-major
// activations [m, k] times the transposed weights [n, k], one sgemm per batch.
double time_sgemm(const MatmulShape& s, int threads, int repetitions) {
    std::vector<float> activations(static_cast<size_t>(s.m * s.k * s.batch));
    std::vector<float> weights(static_cast<size_t>(s.n * s.k * s.weight_batch));
    std::vector<float> result(static_cast<size_t>(s.m * s.n * s.batch));
    fill_random(activations.data(), activations.size(), 1);
    fill_random(weights.data(), weights.size(), 2);
    openblas_set_num_threads(threads);
    const int64_t batches_per_weight = s.batch / s.weight_batch;
    return best_time(
        [&] {
            for (int64_t b = 0; b < s.batch; ++b) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                            static_cast<int>(s.k), 1.0f, activations.data() + b * s.m * s.k, static_cast<int>(s.k),
                            weights.data() + (b / batches_per_weight) * s.n * s.k, static_cast<int>(s.k), 0.0f,
                            result.data() + b * s.m * s.n, static_cast<int>(s.n));
            }
        },
        repetitions);
}
#endif

// One ggml_mul_mat in a graph of its own, computed by `backend` on operands
// in host memory.
std::optional<double> time_ggml(ggml_backend_t backend, ggml_type weight_type, const MatmulShape& s, int repetitions) {
    ggml_init_params params{};
    params.mem_size = 3 * ggml_tensor_overhead() + ggml_graph_overhead();
    params.no_alloc = true;
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* weights = ggml_new_tensor_4d(ctx, weight_type, s.k, s.n, s.weight_batch, 1);
    ggml_tensor* activations = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.k, s.m, s.batch, 1);
    ggml_tensor* product = ggml_mul_mat(ctx, weights, activations);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, product);
    std::optional<double> seconds;
    ggml_backend_buffer_t buffer = nullptr;
    if (ggml_backend_supports_op(backend, product)) {
        buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    }
    if (buffer) {
        {
            // Staging for the operands, freed before the timing starts.
            std::vector<float> values(
                static_cast<size_t>(std::max(ggml_nelements(weights), ggml_nelements(activations))));
            fill_random(values.data(), static_cast<size_t>(ggml_nelements(activations)), 1);
            ggml_backend_tensor_set(activations, values.data(), 0, ggml_nbytes(activations));
            fill_random(values.data(), static_cast<size_t>(ggml_nelements(weights)), 2);
            if (weight_type == GGML_TYPE_F16) {
                std::vector<ggml_fp16_t> halves(static_cast<size_t>(ggml_nelements(weights)));
                ggml_fp32_to_fp16_row(values.data(), halves.data(), ggml_nelements(weights));
                ggml_backend_tensor_set(weights, halves.data(), 0, ggml_nbytes(weights));
            } else {
                ggml_backend_tensor_set(weights, values.data(), 0, ggml_nbytes(weights));
            }
        }
        seconds = best_time([&] { ggml_backend_graph_compute(backend, graph); }, repetitions);
        ggml_backend_buffer_free(buffer);
    }
    ggml_free(ctx);
    return seconds;
}

}  // namespace

const char* gemm_path_name(GemmPath path) {
    switch (path) {
        case GemmPath::OpenBlasSgemm: return "OpenBLAS sgemm";
        case GemmPath::GgmlCpuF32: return "ggml CPU f32";
        case GemmPath::GgmlCpuF16: return "ggml CPU f16";
        case GemmPath::GgmlBlasF32: return "ggml BLAS f32";
        case GemmPath::GgmlBlasF16: return "ggml BLAS f16";
    }
    return "?";
}

const char* gemm_path_key(GemmPath path) {
    switch (path) {
        case GemmPath::OpenBlasSgemm: return "openblas_sgemm";
        case GemmPath::GgmlCpuF32: return "ggml_cpu_f32";
        case GemmPath::GgmlCpuF16: return "ggml_cpu_f16";
        case GemmPath::GgmlBlasF32: return "ggml_blas_f32";
        case GemmPath::GgmlBlasF16: return "ggml_blas_f16";
    }
    return "?";
}

std::optional<double> time_matmul(GemmPath path, const MatmulShape& shape, int threads, int repetitions) {
    switch (path) {
        case GemmPath::OpenBlasSgemm:
#ifdef KILN_BENCH_OPENBLAS
            return time_sgemm(shape, threads, repetitions);
#else
            return std::nullopt;
#endif
        case GemmPath::GgmlCpuF32:
        case GemmPath::GgmlCpuF16: {
            ggml_backend_t cpu = ggml_backend_cpu_init();
            if (!cpu) return std::nullopt;
            ggml_backend_cpu_set_n_threads(cpu, threads);
            auto seconds =
                time_ggml(cpu, path == GemmPath::GgmlCpuF16 ? GGML_TYPE_F16 : GGML_TYPE_F32, shape, repetitions);
            ggml_backend_free(cpu);
            return seconds;
        }
        case GemmPath::GgmlBlasF32:
        case GemmPath::GgmlBlasF16: {
#ifdef GGML_USE_BLAS
            ggml_backend_t blas = ggml_backend_blas_init();
            if (!blas) return std::nullopt;
            ggml_backend_blas_set_n_threads(blas, threads);
            auto seconds =
                time_ggml(blas, path == GemmPath::GgmlBlasF16 ? GGML_TYPE_F16 : GGML_TYPE_F32, shape, repetitions);
            ggml_backend_free(blas);
            return seconds;
#else
            return std::nullopt;
#endif
        }
    }
    return std::nullopt;
}

std::optional<double> time_graph_products(ggml_cgraph* graph, GemmPath path, int threads, int repetitions,
                                          uint64_t* flops) {
    const std::vector<MatmulShape> shapes = graph_matmul_shapes(graph);
    double seconds = 0;
    *flops = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
        const MatmulShape& shape = shapes[i];
        std::fprintf(stderr, "\rkiln-bench: timing the graph's products on %s: %zu/%zu", gemm_path_name(path), i + 1,
                     shapes.size());
        const std::optional<double> one = time_matmul(path, shape, threads, repetitions);
        if (!one) {
            std::fprintf(stderr, "\n");
            return std::nullopt;
        }
        seconds += *one * shape.count;
        *flops += matmul_flops(shape) * static_cast<uint64_t>(shape.count);
    }
    std::fprintf(stderr, "\n");
    return seconds;
}

OpenBlasInfo openblas_info() {
    OpenBlasInfo info;
#ifdef KILN_BENCH_OPENBLAS
    info.corename = openblas_get_corename();
    info.config = openblas_get_config();
    info.threads = openblas_get_num_threads();
#endif
    return info;
}

}  // namespace kiln::bench
