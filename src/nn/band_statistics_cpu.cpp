#include "nn/band_statistics_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kiln::nn {
namespace {

// Thread `ith` of `nth` takes groups in turn: for each image, the previous
// total plus this band's sums, a row at a time in double.
void add_sums(ggml_tensor* dst, int ith, int nth, void*) {
    const ggml_tensor* band = dst->src[0];
    const ggml_tensor* total = dst->src[1];  // null for the first band
    const int64_t W = band->ne[0], rows = band->ne[1], C = band->ne[2], N = band->ne[3];
    const int64_t groups = dst->ne[1];
    const int64_t per_group = (C + groups - 1) / groups;  // as ggml_group_norm splits them
    for (int64_t g = ith; g < groups; g += nth) {
        const int64_t start = std::min(g * per_group, C), end = std::min(start + per_group, C);
        for (int64_t n = 0; n < N; ++n) {
            double* out = static_cast<double*>(dst->data) + 3 * (n * groups + g);
            double sum = 0.0, squares = 0.0;
            for (int64_t c = start; c < end; ++c) {
                for (int64_t h = 0; h < rows; ++h) {
                    const float* in = reinterpret_cast<const float*>(static_cast<const char*>(band->data) +
                                                                     n * band->nb[3] + c * band->nb[2] + h * band->nb[1]);
                    double row_sum = 0.0, row_squares = 0.0;
                    for (int64_t i = 0; i < W; ++i) {
                        const double v = in[i];
                        row_sum += v;
                        row_squares += v * v;
                    }
                    sum += row_sum;
                    squares += row_squares;
                }
            }
            const double count = static_cast<double>(W * rows * (end - start));
            const double* before = total ? static_cast<const double*>(total->data) + 3 * (n * groups + g) : nullptr;
            out[0] = (before ? before[0] : 0.0) + sum;
            out[1] = (before ? before[1] : 0.0) + squares;
            out[2] = (before ? before[2] : 0.0) + count;
        }
    }
}

// Each group's mean and scale from its totals, in the layout and float
// operations of group_norm_statistics_cpu: mean and variance rounded to
// float, then 1 / sqrt(variance + eps) in float.
void statistics_of_sums(ggml_tensor* dst, int ith, int nth, void* userdata) {
    float eps;
    const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(userdata));
    std::memcpy(&eps, &bits, sizeof eps);
    const double* total = static_cast<const double*>(dst->src[0]->data);
    const int64_t entries = dst->ne[1] * dst->ne[2];
    for (int64_t e = ith; e < entries; e += nth) {
        const double* t = total + 3 * e;
        const double mean = t[0] / t[2];
        const float variance = static_cast<float>(std::max(0.0, t[1] / t[2] - mean * mean));
        float* out = static_cast<float*>(dst->data) + 2 * e;
        out[0] = static_cast<float>(mean);
        out[1] = 1.0f / std::sqrt(variance + eps);
    }
}

}  // namespace

ggml_tensor* add_group_sums_cpu(ggml_context* ctx, ggml_tensor* total, ggml_tensor* band, int groups) {
    GGML_ASSERT(band->type == GGML_TYPE_F32 && ggml_is_contiguous(band) && groups >= 1);
    GGML_ASSERT(!total || (total->type == GGML_TYPE_F64 && total->ne[1] == groups && total->ne[2] == band->ne[3]));
    ggml_tensor* args[] = {band, total};
    return ggml_custom_4d(ctx, GGML_TYPE_F64, 3, groups, band->ne[3], 1, args, total ? 2 : 1, add_sums,
                          GGML_N_TASKS_MAX, nullptr);
}

ggml_tensor* group_norm_statistics_of_sums_cpu(ggml_context* ctx, ggml_tensor* total, float eps) {
    GGML_ASSERT(total->type == GGML_TYPE_F64 && total->ne[0] == 3);
    uint32_t bits;
    std::memcpy(&bits, &eps, sizeof bits);
    ggml_tensor* args[] = {total};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, 2, total->ne[1], total->ne[2], 1, args, 1, statistics_of_sums,
                          GGML_N_TASKS_MAX, reinterpret_cast<void*>(static_cast<uintptr_t>(bits)));
}

}  // namespace kiln::nn
