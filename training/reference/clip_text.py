"""PyTorch reference for the CLIP text encoders of SD1, SD2 and SDXL.

Two parameter namings, one computation (pre-LayerNorm transformer with a
causal mask):

  ClipTextHF      OpenAI CLIP as HF ``CLIPTextModel`` names it (SD1 checkpoints
                  store it under ``cond_stage_model.transformer.``); quick_gelu.
  ClipTextOpenClip  open_clip's ``TextTransformer`` names (SD2 checkpoints store
                  it under ``cond_stage_model.model.``); fused q/k/v
                  ``attn.in_proj_weight`` [3W, W]; exact (erf) GELU.

``forward(tokens, clip_skip)`` returns ``final_layer_norm`` applied to the
hidden state after layer ``L - clip_skip + 1`` (clip_skip 1: last layer, 2:
penultimate), which is what SD1 with clip skip and SD2's "penultimate" do.

``encode(tokens, layer_from_end, final_norm)`` returns ``(hidden, pooled)``:
the hidden state after layer ``L - layer_from_end + 1``, final-normed only when
asked (SDXL asks for layer_from_end 2 without the norm from both encoders:
sgm's FrozenCLIPEmbedder layer="hidden", layer_idx=11 is HF's
hidden_states[11], and FrozenOpenCLIPEmbedder2 layer="penultimate",
legacy=False is the input of the last resblock), and the pooled output:
``ln_final`` of the LAST layer's output at the position of the largest token
id (the EOS; torch's argmax takes the first), times ``text_projection``
(x @ P) when the model has one; ``pooled_token`` picks the first position
holding that id instead.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def causal_mask(n, dtype, device):
    m = torch.full((n, n), float("-inf"), dtype=dtype, device=device)
    return torch.triu(m, diagonal=1)


def attention(q, k, v, heads, mask):
    """q, k, v: [B, N, W] -> [B, N, W]; scaled dot product with additive mask."""
    b, n, w = q.shape
    d = w // heads
    q = q.reshape(b, n, heads, d).transpose(1, 2)
    k = k.reshape(b, n, heads, d).transpose(1, 2)
    v = v.reshape(b, n, heads, d).transpose(1, 2)
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    if mask is not None:
        s = s + mask
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, v)
    return o.transpose(1, 2).reshape(b, n, w)


def pool_positions(tokens, pooled_token=None):
    """[B] index of the position to pool for each prompt."""
    tokens = tokens.long()
    if pooled_token is None:
        return tokens.argmax(dim=-1)
    return (tokens == pooled_token).int().argmax(dim=-1)


def encode_layers(x, layers, mask, layer_from_end, final_norm, norm, pooled, projection, tokens,
                  pooled_token):
    """Shared by both namings: runs `layers` on embedded `x`."""
    check_clip_skip(layer_from_end, len(layers))
    keep = len(layers) - layer_from_end + 1
    hidden = None
    for i, layer in enumerate(layers):
        if i == keep and not pooled:
            break
        x = layer(x, mask)
        if i + 1 == keep:
            hidden = norm(x) if final_norm else x
    if not pooled:
        return hidden, None
    last = norm(x)
    p = last[torch.arange(last.shape[0]), pool_positions(tokens, pooled_token)]
    if projection is not None:
        p = p @ projection
    return hidden, p


def check_clip_skip(clip_skip, layers):
    if not 1 <= clip_skip <= layers:
        raise ValueError("clip_skip must be in [1, %d], got %d" % (layers, clip_skip))


# ---------------------------------------------------------------- HF naming


class _HFAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x, mask):
        o = attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads, mask)
        return self.out_proj(o)


class _HFMLP(nn.Module):
    def __init__(self, width, intermediate):
        super().__init__()
        self.fc1 = nn.Linear(width, intermediate)
        self.fc2 = nn.Linear(intermediate, width)

    def forward(self, x):
        return self.fc2(quick_gelu(self.fc1(x)))


class _HFLayer(nn.Module):
    def __init__(self, width, heads, intermediate):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(width, eps=1e-5)
        self.self_attn = _HFAttention(width, heads)
        self.layer_norm2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = _HFMLP(width, intermediate)

    def forward(self, x, mask):
        x = x + self.self_attn(self.layer_norm1(x), mask)
        x = x + self.mlp(self.layer_norm2(x))
        return x


class _HFEmbeddings(nn.Module):
    def __init__(self, vocab, width, positions):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(positions, width)

    def forward(self, tokens):
        n = tokens.shape[1]
        return self.token_embedding(tokens) + self.position_embedding.weight[:n].unsqueeze(0)


class _HFEncoder(nn.Module):
    def __init__(self, width, layers, heads, intermediate):
        super().__init__()
        self.layers = nn.ModuleList([_HFLayer(width, heads, intermediate) for _ in range(layers)])


class _HFTextModel(nn.Module):
    def __init__(self, vocab, width, layers, heads, positions, intermediate):
        super().__init__()
        self.embeddings = _HFEmbeddings(vocab, width, positions)
        self.encoder = _HFEncoder(width, layers, heads, intermediate)
        self.final_layer_norm = nn.LayerNorm(width, eps=1e-5)


class ClipTextHF(nn.Module):
    """OpenAI CLIP text tower with HF ``CLIPTextModel`` parameter names."""

    def __init__(self, vocab=49408, width=768, layers=12, heads=12, positions=77, intermediate=3072):
        super().__init__()
        self.num_layers = layers
        self.text_model = _HFTextModel(vocab, width, layers, heads, positions, intermediate)

    def forward(self, tokens, clip_skip=1):
        check_clip_skip(clip_skip, self.num_layers)
        tm = self.text_model
        x = tm.embeddings(tokens.long())
        mask = causal_mask(x.shape[1], x.dtype, x.device)
        for layer in tm.encoder.layers[: self.num_layers - clip_skip + 1]:
            x = layer(x, mask)
        return tm.final_layer_norm(x)

    def encode(self, tokens, layer_from_end=1, final_norm=True, pooled=False, pooled_token=None):
        tm = self.text_model
        x = tm.embeddings(tokens.long())
        mask = causal_mask(x.shape[1], x.dtype, x.device)
        return encode_layers(x, tm.encoder.layers, mask, layer_from_end, final_norm, tm.final_layer_norm, pooled,
                             None, tokens, pooled_token)


# ---------------------------------------------------------- open_clip naming


class _OCAttention(nn.Module):
    """nn.MultiheadAttention's parameter layout: fused in_proj, out_proj."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * width))
        self.out_proj = nn.Linear(width, width)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)

    def forward(self, x, mask):
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        return self.out_proj(attention(q, k, v, self.heads, mask))


class _OCMLP(nn.Module):
    def __init__(self, width, intermediate):
        super().__init__()
        self.c_fc = nn.Linear(width, intermediate)
        self.c_proj = nn.Linear(intermediate, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class _OCResBlock(nn.Module):
    def __init__(self, width, heads, intermediate):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = _OCAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = _OCMLP(width, intermediate)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class _OCTransformer(nn.Module):
    def __init__(self, width, layers, heads, intermediate):
        super().__init__()
        self.resblocks = nn.ModuleList([_OCResBlock(width, heads, intermediate) for _ in range(layers)])


class ClipTextOpenClip(nn.Module):
    """open_clip text tower (SD2: ViT-H/14, width 1024, 16 heads, 24 layers;
    SDXL: ViT-bigG/14, width 1280, 20 heads, 32 layers, text_projection
    [1280, 1280]).

    ``with_projection`` adds ``text_projection`` [W, W] and the scalar
    ``logit_scale`` that SD2 checkpoints carry (unused by SD's conditioning).
    """

    def __init__(self, vocab=49408, width=1024, layers=24, heads=16, positions=77, intermediate=None,
                 with_projection=True):
        super().__init__()
        intermediate = intermediate or 4 * width
        self.num_layers = layers
        self.token_embedding = nn.Embedding(vocab, width)
        self.positional_embedding = nn.Parameter(torch.empty(positions, width))
        nn.init.normal_(self.positional_embedding, std=0.01)
        self.transformer = _OCTransformer(width, layers, heads, intermediate)
        self.ln_final = nn.LayerNorm(width, eps=1e-5)
        if with_projection:
            self.text_projection = nn.Parameter(torch.empty(width, width))
            nn.init.normal_(self.text_projection, std=width ** -0.5)
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, tokens, clip_skip=1):
        check_clip_skip(clip_skip, self.num_layers)
        n = tokens.shape[1]
        x = self.token_embedding(tokens.long()) + self.positional_embedding[:n].unsqueeze(0)
        mask = causal_mask(n, x.dtype, x.device)
        for block in self.transformer.resblocks[: self.num_layers - clip_skip + 1]:
            x = block(x, mask)
        return self.ln_final(x)

    def encode(self, tokens, layer_from_end=1, final_norm=True, pooled=False, pooled_token=None):
        n = tokens.shape[1]
        x = self.token_embedding(tokens.long()) + self.positional_embedding[:n].unsqueeze(0)
        mask = causal_mask(n, x.dtype, x.device)
        return encode_layers(x, self.transformer.resblocks, mask, layer_from_end, final_norm, self.ln_final, pooled,
                             getattr(self, "text_projection", None), tokens, pooled_token)
