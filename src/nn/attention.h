// Multi-head scaled dot-product attention, on ggml's matmul + softmax or on
// its fused flash-attention kernel (--diffusion-fa).
#pragma once

#include "ggml.h"

namespace kiln::nn {

struct AttentionOptions {
    int heads = 1;
    bool causal = false;  // CLIP's text encoder masks future tokens
    bool flash = false;   // ggml_flash_attn_ext (K/V in F16: faster, not bit-identical)
};

// q: ne [dim, Nq, B]; k, v: ne [dim, Nk, B] (dim = heads * head_dim).
// Returns ne [dim, Nq, B]: softmax(q k^T / sqrt(head_dim)) v per head.
ggml_tensor* attention(ggml_context* ctx, ggml_tensor* q, ggml_tensor* k, ggml_tensor* v,
                       const AttentionOptions& options);

}  // namespace kiln::nn
