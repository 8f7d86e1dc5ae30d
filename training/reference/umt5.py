"""PyTorch reference for the umT5 encoder (Wan 2.1's text encoder, umT5-XXL),
transcribed from Wan's own ``wan/modules/t5.py`` (``T5Encoder`` with
``shared_pos=False``, as ``umt5_xxl`` builds it), encoder only, dropout left
out (inference).

umT5 is T5 v1.1 with a relative position table in EVERY block: block i adds
its own ``pos_embedding`` [buckets, heads], looked up at the bidirectional
bucket of ``key - query``, to its scores (T5 v1.1 has one table, block 0's,
shared by all blocks). The rest is T5 v1.1's:

  h = RMSNorm(x)                     x * rsqrt(mean(x^2) + 1e-6) * weight
  x = x + o(softmax(q.k (NO 1/sqrt(d) scaling) + block's position bias + mask) v)
  h = RMSNorm(x)
  x = x + fc2(fc1(h) * gelu_tanh(gate.0(h)))

then a final RMSNorm. The mask (1 real, 0 padding) gives padded keys the
dtype's lowest value, as Wan does.

Parameter names are Wan's (``models_t5_umt5-xxl-enc-bf16.pth``):
``token_embedding``, ``blocks.N.{norm1,attn.{q,k,v,o},norm2,ffn.{gate.0,fc1,fc2},
pos_embedding.embedding}``, ``norm``. ``hf_name`` maps them to HF's
``UMT5EncoderModel`` names (``shared.weight``, ``encoder.block.N.layer.0.
SelfAttention.{q,k,v,o,relative_attention_bias}``, ...), which ComfyUI's
``umt5_xxl_*.safetensors`` use.

``forward(ids, mask=None)`` returns ``(out, blocks)``: the final-normed output
[B, N, dim] and each block's output before the final norm.
"""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F


def relative_position_bucket(rel_pos, num_buckets=32, max_dist=128):
    """Wan's T5RelativeEmbedding._relative_position_bucket, bidirectional:
    half of the buckets for keys after the query; in each half, distances
    below half / 2 have their own bucket, larger ones log-spaced buckets
    (float32 log, truncated) up to max_dist, then the half's last."""
    num_buckets = num_buckets // 2
    rel_buckets = (rel_pos > 0).long() * num_buckets
    rel_pos = torch.abs(rel_pos)
    max_exact = num_buckets // 2
    rel_pos_large = max_exact + (torch.log(rel_pos.float() / max_exact) / math.log(max_dist / max_exact) *
                                 (num_buckets - max_exact)).long()
    rel_pos_large = torch.min(rel_pos_large, torch.full_like(rel_pos_large, num_buckets - 1))
    return rel_buckets + torch.where(rel_pos < max_exact, rel_pos, rel_pos_large)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class T5LayerNorm(nn.Module):

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps))


class T5Attention(nn.Module):

    def __init__(self, dim, dim_attn, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim_attn // num_heads
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)

    def forward(self, x, mask, pos_bias):
        """x [B, L, C]; mask [B, L] or None; pos_bias [1, heads, L, L]."""
        b, n, c = x.size(0), self.num_heads, self.head_dim
        q = self.q(x).view(b, -1, n, c)
        k = self.k(x).view(b, -1, n, c)
        v = self.v(x).view(b, -1, n, c)
        attn_bias = x.new_zeros(b, n, q.size(1), k.size(1)) + pos_bias
        if mask is not None:
            attn_bias.masked_fill_(mask.view(b, 1, 1, -1) == 0, torch.finfo(x.dtype).min)
        attn = torch.einsum('binc,bjnc->bnij', q, k) + attn_bias  # T5 does not scale
        attn = F.softmax(attn, dim=-1)
        x = torch.einsum('bnij,bjnc->binc', attn, v)
        return self.o(x.reshape(b, -1, n * c))


class T5FeedForward(nn.Module):

    def __init__(self, dim, dim_ffn):
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False))  # gate.0; Wan's gate[1] is the GELU
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x) * gelu_tanh(self.gate(x)))


class T5RelativeEmbedding(nn.Module):

    def __init__(self, num_buckets, num_heads, max_dist=128):
        super().__init__()
        self.num_buckets, self.max_dist = num_buckets, max_dist
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, lq, lk):
        rel_pos = torch.arange(lk).unsqueeze(0) - torch.arange(lq).unsqueeze(1)
        embeds = self.embedding(relative_position_bucket(rel_pos, self.num_buckets, self.max_dist))
        return embeds.permute(2, 0, 1).unsqueeze(0).contiguous()  # [1, heads, Lq, Lk]


class T5SelfAttention(nn.Module):
    """One encoder block with its own position table (shared_pos=False)."""

    def __init__(self, dim, dim_attn, dim_ffn, num_heads, num_buckets):
        super().__init__()
        self.norm1 = T5LayerNorm(dim)
        self.attn = T5Attention(dim, dim_attn, num_heads)
        self.norm2 = T5LayerNorm(dim)
        self.ffn = T5FeedForward(dim, dim_ffn)
        self.pos_embedding = T5RelativeEmbedding(num_buckets, num_heads)

    def forward(self, x, mask=None):
        e = self.pos_embedding(x.size(1), x.size(1))
        x = x + self.attn(self.norm1(x), mask, e)
        return x + self.ffn(self.norm2(x))


class UMT5Encoder(nn.Module):
    """Wan's T5Encoder(shared_pos=False); umT5-XXL: vocab 256384, dim 4096,
    dim_attn 4096, dim_ffn 10240, 64 heads, 24 layers, 32 buckets."""

    def __init__(self, vocab=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64, num_layers=24,
                 num_buckets=32):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            [T5SelfAttention(dim, dim_attn, dim_ffn, num_heads, num_buckets) for _ in range(num_layers)])
        self.norm = T5LayerNorm(dim)

    def forward(self, ids, mask=None):
        x = self.token_embedding(ids.long())
        blocks = []
        for block in self.blocks:
            x = block(x, mask)
            blocks.append(x)
        return self.norm(x), blocks


_HF_BLOCK_NAMES = {
    "norm1": "layer.0.layer_norm",
    "attn.q": "layer.0.SelfAttention.q",
    "attn.k": "layer.0.SelfAttention.k",
    "attn.v": "layer.0.SelfAttention.v",
    "attn.o": "layer.0.SelfAttention.o",
    "pos_embedding.embedding": "layer.0.SelfAttention.relative_attention_bias",
    "norm2": "layer.1.layer_norm",
    "ffn.gate.0": "layer.1.DenseReluDense.wi_0",
    "ffn.fc1": "layer.1.DenseReluDense.wi_1",
    "ffn.fc2": "layer.1.DenseReluDense.wo",
}


def hf_name(wan):
    """A Wan parameter name as HF's UMT5EncoderModel names it."""
    if wan == "token_embedding.weight":
        return "shared.weight"
    if wan == "norm.weight":
        return "encoder.final_layer_norm.weight"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)\.weight", wan)
    assert m and m.group(2) in _HF_BLOCK_NAMES, wan
    return "encoder.block.%s.%s.weight" % (m.group(1), _HF_BLOCK_NAMES[m.group(2)])
