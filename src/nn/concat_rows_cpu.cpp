#include "nn/concat_rows_cpu.h"

#include <algorithm>
#include <cstring>

namespace kiln::nn {
namespace {

// The most sources ggml_custom_4d takes (it asserts n_args < GGML_MAX_SRC).
constexpr size_t kMaxParts = GGML_MAX_SRC - 1;

// Thread `ith` of `nth` copies a contiguous range of the output's (channel,
// batch) planes, each plane's rows from its sources in order.
void copy_rows(ggml_tensor* dst, int ith, int nth, void*) {
    const int64_t planes = dst->ne[2] * dst->ne[3];
    const int64_t first = planes * ith / nth, last = planes * (ith + 1) / nth;
    for (int64_t p = first; p < last; ++p) {
        char* out = static_cast<char*>(dst->data) + p * dst->nb[2];
        for (int i = 0; i < GGML_MAX_SRC && dst->src[i]; ++i) {
            const ggml_tensor* part = dst->src[i];
            const size_t bytes = part->nb[2];  // one plane of the part: its rows, whole
            std::memcpy(out, static_cast<const char*>(part->data) + p * part->nb[2], bytes);
            out += bytes;
        }
    }
}

ggml_tensor* concat_group(ggml_context* ctx, std::vector<ggml_tensor*> parts) {
    int64_t rows = 0;
    for (const ggml_tensor* part : parts) {
        GGML_ASSERT(part->type == GGML_TYPE_F32 && ggml_is_contiguous(part));
        GGML_ASSERT(part->ne[0] == parts[0]->ne[0] && part->ne[2] == parts[0]->ne[2] &&
                    part->ne[3] == parts[0]->ne[3]);
        rows += part->ne[1];
    }
    return ggml_custom_4d(ctx, GGML_TYPE_F32, parts[0]->ne[0], rows, parts[0]->ne[2], parts[0]->ne[3], parts.data(),
                          static_cast<int>(parts.size()), copy_rows, GGML_N_TASKS_MAX, nullptr);
}

}  // namespace

ggml_tensor* concat_rows_cpu(ggml_context* ctx, const std::vector<ggml_tensor*>& parts) {
    GGML_ASSERT(!parts.empty());
    if (parts.size() == 1) return parts[0];
    if (parts.size() <= kMaxParts) return concat_group(ctx, parts);
    std::vector<ggml_tensor*> groups;
    for (size_t first = 0; first < parts.size(); first += kMaxParts) {
        const size_t end = std::min(parts.size(), first + kMaxParts);
        groups.push_back(concat_rows_cpu(ctx, {parts.begin() + first, parts.begin() + end}));
    }
    return concat_rows_cpu(ctx, groups);
}

}  // namespace kiln::nn
