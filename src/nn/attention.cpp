#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::nn {
namespace {

// Joins `pieces` along `dim` as a balanced tree of concatenations, so each
// element is copied log2(pieces) times rather than up to pieces - 1.
ggml_tensor* concat_all(ggml_context* ctx, std::vector<ggml_tensor*> pieces, int dim) {
    while (pieces.size() > 1) {
        std::vector<ggml_tensor*> joined;
        for (size_t i = 0; i + 1 < pieces.size(); i += 2)
            joined.push_back(ggml_concat(ctx, pieces[i], pieces[i + 1], dim));
        if (pieces.size() % 2) joined.push_back(pieces.back());
        pieces = std::move(joined);
    }
    return pieces.front();
}

// softmax(q k^T * scale) v for contiguous q [head_dim, Nq, heads, B], k
// [head_dim, Nk, heads, B] and v [Nk, head_dim, heads, B], one head and one
// block of queries at a time (AttentionOptions::scores_block_bytes). Every
// block's scores are the same numbers the whole product makes, row by row.
// Returns [head_dim, Nq, heads, B].
ggml_tensor* attention_in_blocks(ggml_context* ctx, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v, float scale,
                                 int64_t scores_block_bytes, ggml_tensor* mask) {
    const int64_t head_dim = q->ne[0], n_q = q->ne[1], n_k = k->ne[1];
    const int64_t planes = q->ne[2] * q->ne[3];
    // Few enough blocks that the graph stays small (a block is six tensors):
    // past that, blocks grow beyond the byte size asked for.
    constexpr int64_t kMaxBlocks = 128;
    const int64_t blocks_per_head = std::max<int64_t>(1, kMaxBlocks / planes);
    const int64_t rows = std::clamp<int64_t>(scores_block_bytes / (n_k * static_cast<int64_t>(sizeof(float))),
                                             (n_q + blocks_per_head - 1) / blocks_per_head, n_q);
    std::vector<ggml_tensor*> heads;
    for (int64_t p = 0; p < planes; ++p) {
        ggml_tensor* k_p = ggml_view_2d(ctx, k, head_dim, n_k, k->nb[1], p * k->nb[2]);
        ggml_tensor* v_p = ggml_view_2d(ctx, v, n_k, head_dim, v->nb[1], p * v->nb[2]);
        std::vector<ggml_tensor*> blocks;
        for (int64_t first = 0; first < n_q; first += rows) {
            const int64_t n = std::min(rows, n_q - first);
            ggml_tensor* q_b = ggml_view_2d(ctx, q, head_dim, n, q->nb[1], p * q->nb[2] + first * q->nb[1]);
            // The mask's rows of these queries, for this plane's batch entry.
            ggml_tensor* mask_b =
                mask ? ggml_view_2d(ctx, mask, n_k, n, mask->nb[1], (p / q->ne[2]) * mask->nb[3] + first * mask->nb[1])
                     : nullptr;
            ggml_tensor* scores = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k_p, q_b), mask_b, scale, 0.0f);
            blocks.push_back(ggml_mul_mat(ctx, v_p, scores));  // [head_dim, n]
        }
        heads.push_back(concat_all(ctx, std::move(blocks), 1));  // [head_dim, Nq]
    }
    return ggml_reshape_4d(ctx, concat_all(ctx, std::move(heads), 2), head_dim, n_q, q->ne[2], q->ne[3]);
}

}  // namespace

ggml_tensor* attention(ggml_context* ctx, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v,
                       const AttentionOptions& options) {
    const int64_t dim = q->ne[0], n_q = q->ne[1], batch = q->ne[2];
    const int64_t n_k = k->ne[1];
    const int64_t heads = options.heads;
    const int64_t head_dim = dim / heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

    // [dim, N, B] -> [head_dim, N, heads, B]
    auto split_heads = [&](ggml_tensor* t, int64_t n) {
        return ggml_permute(ctx, ggml_reshape_4d(ctx, t, head_dim, heads, n, batch), 0, 2, 1, 3);
    };
    ggml_tensor* qh = split_heads(q, n_q);
    ggml_tensor* kh = split_heads(k, n_k);

    GGML_ASSERT(!options.mask || !options.causal);
    if (options.flash && !options.causal) {
        ggml_tensor* k16 = ggml_cast(ctx, kh, GGML_TYPE_F16);
        ggml_tensor* v16 = ggml_cast(ctx, split_heads(v, n_k), GGML_TYPE_F16);
        ggml_tensor* mask16 = options.mask ? ggml_cast(ctx, options.mask, GGML_TYPE_F16) : nullptr;
        ggml_tensor* out =
            ggml_flash_attn_ext(ctx, qh, k16, v16, mask16, scale, 0.0f, 0.0f);  // [head_dim, heads, Nq, B]
        return ggml_reshape_3d(ctx, out, dim, n_q, batch);
    }

    // Contiguous heads let the scheduler hand the product to BLAS (it takes
    // contiguous operands only); the copies cost far less than ggml's CPU
    // kernel on permuted views (measured: 4.5 against 60 GFLOP/s at 64x64).
    ggml_tensor* qc = ggml_cont(ctx, qh);  // [head_dim, Nq, heads, B]
    ggml_tensor* kc = ggml_cont(ctx, kh);  // [head_dim, Nk, heads, B]
    // v as [Nk, head_dim, heads, B] so the product contracts over Nk.
    auto v_by_keys = [&] {
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, v, head_dim, heads, n_k, batch), 1, 2, 0, 3));
    };
    const int64_t scores_bytes = n_q * n_k * heads * batch * static_cast<int64_t>(sizeof(float));
    if (!options.causal && options.scores_block_bytes > 0 && scores_bytes > 4 * options.scores_block_bytes) {
        ggml_tensor* out =
            attention_in_blocks(ctx, qc, kc, v_by_keys(), scale, options.scores_block_bytes, options.mask);
        out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));  // [head_dim, heads, Nq, B]
        return ggml_reshape_3d(ctx, out, dim, n_q, batch);
    }
    ggml_tensor* scores = ggml_mul_mat(ctx, kc, qc);  // [Nk, Nq, heads, B]
    if (options.causal) {
        scores = ggml_diag_mask_inf(ctx, ggml_scale(ctx, scores, scale), 0);
        scores = ggml_soft_max(ctx, scores);
    } else {
        scores = ggml_soft_max_ext(ctx, scores, options.mask, scale, 0.0f);
    }
    ggml_tensor* out = ggml_mul_mat(ctx, v_by_keys(), scores);  // [head_dim, Nq, heads, B]
    out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));   // [head_dim, heads, Nq, B]
    return ggml_reshape_3d(ctx, out, dim, n_q, batch);
}

}  // namespace kiln::nn
