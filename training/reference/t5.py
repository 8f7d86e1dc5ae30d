"""PyTorch reference for the T5 v1.1 text encoder (T5-XXL is Flux's and SD3's
second text encoder), written from the T5 paper (Raffel et al. 2020, section
2.1) and the v1.1 changes (gated-GELU feed-forward, no parameter sharing
between embedding and classifier, which the encoder alone does not see).

Parameter names are HF ``T5EncoderModel``'s, so ``state_dict()`` is an HF
encoder file (``shared.weight``, ``encoder.block.N.layer.0.SelfAttention.*``,
``encoder.block.N.layer.1.DenseReluDense.*``, ``encoder.final_layer_norm``);
the tied ``encoder.embed_tokens.weight`` alias is not stored.

The computation, per block (pre-norm, residual adds, no biases anywhere):

  h = RMSNorm(x)                     x * rsqrt(mean(x^2) + 1e-6) * weight (no mean subtraction)
  x = x + o(attention(q h, k h, v h) with scores q.k (NO 1/sqrt(d) scaling)
          + relative position bias + key mask)
  h = RMSNorm(x)
  x = x + wo(gelu_tanh(wi_0 h) * wi_1 h)

then a final RMSNorm. The position bias is block 0's table
``relative_attention_bias`` [buckets, heads] looked up at
``relative_position_bucket(key - query)`` and added to every block's scores.
The key mask (HF's attention_mask: 1 for real tokens, 0 for padding) gives
padded keys -inf in every attention.

``forward(tokens, key_mask=None)`` returns ``(out, blocks)``: the final-normed
output [B, N, d_model] and each block's output (``blocks[i]``, before the final
norm).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
    """Bidirectional buckets of ``key - query`` (an integer tensor).

    Half of the buckets for keys after the query (positive), half for the rest.
    In each half the first ``max_exact`` = half / 2 distances have a bucket of
    their own; larger ones share log-spaced buckets up to ``max_distance``,
    beyond which everything falls in the half's last bucket. The log is taken
    in float32, as HF does, so a C++ port that uses the same float32
    arithmetic gets the same buckets.
    """
    half = num_buckets // 2
    bucket = (relative_position > 0).to(torch.long) * half
    distance = relative_position.abs()
    max_exact = half // 2
    scaled = (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact))
    large = max_exact + scaled.to(torch.long)  # truncation; the value is >= 0 where it is used
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return bucket + torch.where(distance < max_exact, distance, large)


def exact_bucket(relative_position, num_buckets=32, max_distance=128):
    """The same bucket of one integer from exact integer arithmetic: the
    log-spaced part is the largest k with (d / max_exact)^steps >=
    (max_distance / max_exact)^k, steps = half - max_exact. The fixture
    generator checks the float32 path against it (the boundaries fall on
    powers of two for 32 buckets and distance 128)."""
    half = num_buckets // 2
    max_exact = half // 2
    d = abs(relative_position)
    base = half if relative_position > 0 else 0
    if d < max_exact:
        return base + d
    # largest k with max_exact * (max_distance / max_exact)^(k / (half - max_exact)) <= d,
    # i.e. (d / max_exact)^(half - max_exact) >= (max_distance / max_exact)^k (integers)
    k = 0
    steps = half - max_exact
    while k + 1 <= steps and (d ** steps) * (max_exact ** (k + 1)) >= (max_distance ** (k + 1)) * (max_exact ** steps):
        k += 1
    return base + min(max_exact + k, half - 1)


def relative_bucket_table(n, num_buckets=32, max_distance=128):
    """[n_query, n_key] buckets of key - query."""
    pos = torch.arange(n, dtype=torch.long)
    return relative_position_bucket(pos[None, :] - pos[:, None], num_buckets, max_distance)


class T5LayerNorm(nn.Module):
    """RMSNorm: scale only, no mean subtraction, no bias."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, heads, num_buckets, has_relative_bias):
        super().__init__()
        inner = heads * d_kv
        self.heads, self.d_kv = heads, d_kv
        self.q = nn.Linear(d_model, inner, bias=False)
        self.k = nn.Linear(d_model, inner, bias=False)
        self.v = nn.Linear(d_model, inner, bias=False)
        self.o = nn.Linear(inner, d_model, bias=False)
        if has_relative_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, heads)

    def forward(self, x, bias):
        """x [B, N, d_model]; bias [B or 1, heads, N, N] added to the scores."""
        b, n, _ = x.shape

        def split(t):
            return t.reshape(b, n, self.heads, self.d_kv).transpose(1, 2)  # [B, H, N, d_kv]

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) + bias  # no 1/sqrt(d_kv): T5 folds it into the init
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.o(out.transpose(1, 2).reshape(b, n, self.heads * self.d_kv))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, d_model, d_kv, heads, num_buckets, has_relative_bias):
        super().__init__()
        self.SelfAttention = T5Attention(d_model, d_kv, heads, num_buckets, has_relative_bias)
        self.layer_norm = T5LayerNorm(d_model)

    def forward(self, x, bias):
        return x + self.SelfAttention(self.layer_norm(x), bias)


class T5DenseGatedActDense(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class T5LayerFF(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(d_model, d_ff)
        self.layer_norm = T5LayerNorm(d_model)

    def forward(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, d_model, d_kv, heads, d_ff, num_buckets, has_relative_bias):
        super().__init__()
        self.layer = nn.ModuleList([
            T5LayerSelfAttention(d_model, d_kv, heads, num_buckets, has_relative_bias),
            T5LayerFF(d_model, d_ff),
        ])

    def forward(self, x, bias):
        return self.layer[1](self.layer[0](x, bias))


class T5Stack(nn.Module):
    def __init__(self, d_model, d_kv, heads, d_ff, layers, num_buckets):
        super().__init__()
        self.block = nn.ModuleList(
            [T5Block(d_model, d_kv, heads, d_ff, num_buckets, has_relative_bias=(i == 0)) for i in range(layers)])
        self.final_layer_norm = T5LayerNorm(d_model)


class T5EncoderV11(nn.Module):
    """The encoder of T5 v1.1 with HF ``T5EncoderModel`` parameter names."""

    def __init__(self, vocab=32128, d_model=4096, d_kv=64, heads=64, d_ff=10240, layers=24, num_buckets=32,
                 max_distance=128):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.shared = nn.Embedding(vocab, d_model)
        self.encoder = T5Stack(d_model, d_kv, heads, d_ff, layers, num_buckets)

    def position_bias(self, n, dtype):
        """[1, heads, N, N] from block 0's table."""
        table = self.encoder.block[0].layer[0].SelfAttention.relative_attention_bias
        buckets = relative_bucket_table(n, self.num_buckets, self.max_distance)
        return table(buckets).permute(2, 0, 1).unsqueeze(0).to(dtype)

    def forward(self, tokens, key_mask=None):
        """tokens [B, N] ids; key_mask [B, N] (1 real, 0 padding) or None.
        Returns (final-normed output [B, N, d_model], list of block outputs)."""
        x = self.shared(tokens.long())
        n = tokens.shape[1]
        bias = self.position_bias(n, x.dtype)
        if key_mask is not None:
            pad = torch.zeros(key_mask.shape, dtype=x.dtype).masked_fill(key_mask == 0, float("-inf"))
            bias = bias + pad[:, None, None, :]
        blocks = []
        for block in self.encoder.block:
            x = block(x, bias)
            blocks.append(x)
        return self.encoder.final_layer_norm(x), blocks
