#include "nn/concat_rows_cpu.h"

#include <algorithm>
#include <cstring>

namespace kiln::nn {
namespace {

// Thread `ith` of `nth` copies a contiguous range of the first part's
// (channel, batch) planes into the top rows of the same planes of `dst`.
void copy_first_rows(ggml_tensor* dst, int ith, int nth, void*) {
    const ggml_tensor* part = dst->src[0];
    const int64_t planes = dst->ne[2] * dst->ne[3];
    const int64_t first = planes * ith / nth, last = planes * (ith + 1) / nth;
    for (int64_t p = first; p < last; ++p) {
        std::memcpy(static_cast<char*>(dst->data) + p * dst->nb[2],
                    static_cast<const char*>(part->data) + p * part->nb[2], part->nb[2]);
    }
}

}  // namespace

ggml_tensor* image_from_first_rows_cpu(ggml_context* ctx, ggml_tensor* first, int64_t rows) {
    GGML_ASSERT(first->type == GGML_TYPE_F32 && ggml_is_contiguous(first) && first->ne[1] <= rows);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, first->ne[0], rows, first->ne[2], first->ne[3], &first, 1,
                          copy_first_rows, GGML_N_TASKS_MAX, nullptr);
}

ggml_tensor* set_rows_cpu(ggml_context* ctx, ggml_tensor* image, ggml_tensor* part, int64_t first_row) {
    GGML_ASSERT(part->type == GGML_TYPE_F32 && ggml_is_contiguous(part));
    GGML_ASSERT(part->ne[0] == image->ne[0] && part->ne[2] == image->ne[2] && part->ne[3] == image->ne[3] &&
                first_row + part->ne[1] <= image->ne[1]);
    return ggml_set_inplace(ctx, image, part, image->nb[1], image->nb[2], image->nb[3],
                            static_cast<size_t>(first_row) * image->nb[1]);
}

ggml_tensor* concat_rows_cpu(ggml_context* ctx, const std::vector<ggml_tensor*>& parts) {
    GGML_ASSERT(!parts.empty());
    if (parts.size() == 1) return parts[0];
    int64_t rows = 0;
    for (const ggml_tensor* part : parts) rows += part->ne[1];
    // The whole image is made by the first part's copy, so that it is
    // allocated only then (a tensor without an op would be a graph leaf,
    // allocated for the whole graph); each later part is set into its rows
    // in place (views of that one tensor). Each part is freed once copied.
    ggml_tensor* joined = image_from_first_rows_cpu(ctx, parts[0], rows);
    int64_t first_row = parts[0]->ne[1];
    for (size_t i = 1; i < parts.size(); ++i) {
        joined = set_rows_cpu(ctx, joined, parts[i], first_row);
        first_row += parts[i]->ne[1];
    }
    return joined;
}

}  // namespace kiln::nn
