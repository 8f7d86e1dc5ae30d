// Multi-head scaled dot-product attention, on ggml's matmul + softmax or on
// its fused flash-attention kernel (--diffusion-fa).
#pragma once

#include "ggml.h"

namespace kiln::nn {

// The scores a CPU attention makes at once (AttentionOptions::scores_block_bytes):
// blocks of 8 MiB leave room for the operands in a 32 MiB L3 (full-size
// SD1.5 at 512x512, 2 threads: UNet step 13.9 s -> 13.5 s, peak RSS of the
// first step 2.96 GiB -> 2.21 GiB; Wan 1.3B's self-attention over 14040
// tokens: 113 GFLOP/s, where ggml's flash kernel makes 87 and the whole
// 9.5 GB of scores 125).
constexpr int64_t kCpuScoresBlockBytes = 8ll << 20;

struct AttentionOptions {
    int heads = 1;
    bool causal = false;  // CLIP's text encoder masks future tokens
    bool flash = false;   // ggml_flash_attn_ext (K/V in F16: faster, not bit-identical)
    // 0: the scores of every head are one tensor. Otherwise, when they are
    // larger than 4 such blocks, each head is taken on its own and its
    // queries in blocks whose scores fit in this many bytes: a block's scores
    // are made, normalised and used while they are still in the CPU's cache
    // (a full-size SD1.5 at 512x512 makes 1 GiB of scores per self-attention)
    // instead of going through memory four times, and compute memory holds
    // one block of scores, not all of them. Not for causal attention.
    int64_t scores_block_bytes = 0;
    // Optional F32 additive mask, ne [Nk, Nq, 1, B], added to the scaled
    // scores of every head (0 attend, -inf ignore). Not with causal.
    ggml_tensor* mask = nullptr;
};

// q: ne [dim, Nq, B]; k, v: ne [dim, Nk, B] (dim = heads * head_dim).
// Returns ne [dim, Nq, B]: softmax(q k^T / sqrt(head_dim)) v per head.
ggml_tensor* attention(ggml_context* ctx, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v,
                       const AttentionOptions& options);

}  // namespace kiln::nn
