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

ggml_tensor* concat_rows_cpu(ggml_context* ctx, const std::vector<ggml_tensor*>& parts) {
    GGML_ASSERT(!parts.empty());
    if (parts.size() == 1) return parts[0];
    int64_t rows = 0;
    for (const ggml_tensor* part : parts) {
        GGML_ASSERT(part->type == GGML_TYPE_F32 && ggml_is_contiguous(part));
        GGML_ASSERT(part->ne[0] == parts[0]->ne[0] && part->ne[2] == parts[0]->ne[2] &&
                    part->ne[3] == parts[0]->ne[3]);
        rows += part->ne[1];
    }
    // The whole image is made by the first part's copy, so that it is
    // allocated only then (a tensor without an op would be a graph leaf,
    // allocated for the whole graph); each later part is set into its rows
    // in place (views of that one tensor). Each part is freed once copied.
    ggml_tensor* first = parts[0];
    ggml_tensor* joined = ggml_custom_4d(ctx, GGML_TYPE_F32, first->ne[0], rows, first->ne[2], first->ne[3], &first,
                                         1, copy_first_rows, GGML_N_TASKS_MAX, nullptr);
    const size_t nb1 = joined->nb[1], nb2 = joined->nb[2], nb3 = joined->nb[3];
    size_t offset = static_cast<size_t>(first->ne[1]) * nb1;
    for (size_t i = 1; i < parts.size(); ++i) {
        joined = ggml_set_inplace(ctx, joined, parts[i], nb1, nb2, nb3, offset);
        offset += static_cast<size_t>(parts[i]->ne[1]) * nb1;
    }
    return joined;
}

}  // namespace kiln::nn
