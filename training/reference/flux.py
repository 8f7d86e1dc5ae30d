"""PyTorch reference for the Flux.1 DiT (Black Forest Labs' flux/model.py,
modules/layers.py, math.py) and Chroma's variant of it (lodestone's Chroma, as
ComfyUI's comfy/ldm/chroma runs it), written from their semantics.

Parameter names are BFL's, so ``Flux(...).state_dict()`` is a
flux1-dev.safetensors (no prefix) and, prefixed with
``model.diffusion_model.``, the diffusion model of a ComfyUI all-in-one file.

What the network computes (ne-free notation, tokens last but one):

- ``timestep_embedding(t, dim)``: ``t * 1000`` (BFL's time_factor), then
  ``cat([cos(t f), sin(t f)])`` with ``f_i = exp(-ln(10000) i / (dim / 2))``.
- ``vec = time_in(emb(t, 256)) + guidance_in(emb(g, 256)) + vector_in(y)``,
  each an MLPEmbedder ``out_layer(silu(in_layer(x)))`` (guidance_in only with
  ``guidance_embed``: dev and Kontext; schnell has none).
- RoPE: every token has three integer positions (index, row, col): text
  tokens (0, 0, 0), image tokens (0, row, col) per 2x2 patch, reference
  latents (Kontext) (1, row + h_off, col + w_off). Axis ``a`` owns
  ``axes_dim[a]`` consecutive head dimensions, rotated in consecutive pairs by
  ``pos * theta ** (-2j / axes_dim[a])`` (BFL's rope / apply_rope).
- Double block: image and text streams each with their own Modulation
  (``lin(silu(vec))`` chunked shift1, scale1, gate1, shift2, scale2, gate2),
  LayerNorm without affine (eps 1e-6), qkv in the "B L (K H D)" layout,
  QKNorm (RMSNorm over head_dim with ``.scale``, eps 1e-6), joint attention
  over cat(txt, img) with RoPE on q and k, scale 1/sqrt(head_dim), output
  projection and a tanh-GELU MLP, both added through their gates.
- Single block over cat(txt, img): one Modulation (shift, scale, gate),
  ``linear1`` -> (q, k, v, mlp), ``linear2(cat(attention, gelu_tanh(mlp)))``,
  gate residual.
- Final layer: ``adaLN_modulation.1(silu(vec))`` -> (shift, scale), LayerNorm
  without affine, ``(1 + scale) * x + shift``, ``linear``.
- Patchify "b c (h ph) (w pw) -> b (h w) (c ph pw)" and its inverse.

Chroma (``chroma=True``) has no time_in, vector_in, guidance_in, img_mod,
txt_mod, modulation or final_layer.adaLN_modulation. A
``distilled_guidance_layer`` (in_proj; layers.N MLPEmbedders each behind an
RMSNorm ``norms.N`` as residuals; out_proj) maps one 64-wide input per
modulation vector, ``cat(emb(t, 16), emb(guidance, 16), emb(index, 32))``
with ``index`` 0..M-1 (M = 3 single + 12 double + 2: 344 for Chroma's 19/38
blocks), to M vectors of width hidden, laid out as ComfyUI slices them:
single block i at 3i (shift, scale, gate); double block i's image stream at
3S + 6i (mod1, mod2), its text stream at 3S + 6D + 6i; the final layer's
shift and scale at M-2 and M-1. Chroma masks the T5 padding: an additive
mask over the keys (0 for real tokens and image tokens, -inf for padding).

Everything here computes in the dtype of the inputs (run it in float64);
timestep and index embeddings are computed in float64 too (BFL and ComfyUI
compute them in float32: for Chroma's index embedding, whose arguments reach
343000, float32 rounding moves them by up to ~0.02).

``Flux.forward(x, context, timesteps, y=None, guidance=None, refs=(),
txt_mask=None)`` takes NCHW latents and returns ``(velocity, blocks)`` with
``blocks["double_blocks.N"]`` = cat(txt, img) after double block N and
``blocks["single_blocks.N"]`` after single block N (the token streams kiln
marks as cuts; reference tokens included).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def timestep_embedding(t, dim, max_period=10000, time_factor=1000.0):
    """BFL's sinusoidal embedding of t * time_factor: cat([cos, sin]), float64."""
    t = time_factor * t.to(torch.float64)
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope(pos, dim, theta):
    """pos [..., n] -> [..., n, dim/2, 2, 2]: the rotation [[cos, -sin], [sin, cos]] of each pair."""
    assert dim % 2 == 0
    scale = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    omega = 1.0 / (theta ** scale)
    out = pos.to(torch.float64)[..., None] * omega
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    return out.reshape(*out.shape[:-1], 2, 2)


def embed_nd(ids, axes_dim, theta):
    """ids [B, L, n_axes] -> pe [B, 1, L, head_dim/2, 2, 2] (axis 0's pairs first)."""
    return torch.cat([rope(ids[..., i], axes_dim[i], theta) for i in range(ids.shape[-1])], dim=-3).unsqueeze(1)


def apply_rope(x, pe):
    """x [B, H, L, D]: rotates consecutive pairs (x[2j], x[2j+1]) by pe."""
    xs = x.reshape(*x.shape[:-1], -1, 1, 2)
    out = pe[..., 0] * xs[..., 0] + pe[..., 1] * xs[..., 1]
    return out.reshape(*x.shape).to(x.dtype)


def attention(q, k, v, pe, mask=None):
    """q, k, v [B, H, L, D]; mask: additive [B, L] over the keys, or None. Returns [B, L, H*D]."""
    q, k = apply_rope(q, pe), apply_rope(k, pe)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask[:, None, None, :].to(scores.dtype)
    x = torch.softmax(scores, dim=-1) @ v
    B, H, L, D = x.shape
    return x.permute(0, 2, 1, 3).reshape(B, L, H * D)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def layer_norm(x):
    """LayerNorm without affine parameters, eps 1e-6."""
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def modulate(x, shift, scale):
    return (1 + scale) * x + shift


def split_heads(qkv, heads):
    """[B, L, 3 * H * D] in the "B L (K H D)" layout -> q, k, v [B, H, L, D]."""
    B, L, _ = qkv.shape
    qkv = qkv.reshape(B, L, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim, hidden_dim):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim)
        self.out_layer = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x):
        return self.out_layer(F.silu(self.in_layer(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6) * self.scale


class QKNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, qkv_bias):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.norm = QKNorm(dim // heads)
        self.proj = nn.Linear(dim, dim)

    def qkv_heads(self, x):
        q, k, v = split_heads(self.qkv(x), self.heads)
        return self.norm.query_norm(q), self.norm.key_norm(k), v


class Modulation(nn.Module):
    """lin(silu(vec)) chunked into (shift, scale, gate) x (2 if double else 1), each [B, 1, dim]."""

    def __init__(self, dim, double):
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim)

    def forward(self, vec):
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return [tuple(out[i:i + 3]) for i in range(0, self.multiplier, 3)]


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_hidden, qkv_bias, chroma):
        super().__init__()
        if not chroma:
            self.img_mod = Modulation(hidden, double=True)
            self.txt_mod = Modulation(hidden, double=True)
        self.img_attn = SelfAttention(hidden, heads, qkv_bias)
        self.img_mlp = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(mlp_hidden, hidden))
        self.txt_attn = SelfAttention(hidden, heads, qkv_bias)
        self.txt_mlp = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(approximate="tanh"),
                                     nn.Linear(mlp_hidden, hidden))

    def forward(self, img, txt, pe, mask, img_mods, txt_mods):
        """*_mods: [(shift1, scale1, gate1), (shift2, scale2, gate2)]."""
        (i_sh1, i_sc1, i_g1), (i_sh2, i_sc2, i_g2) = img_mods
        (t_sh1, t_sc1, t_g1), (t_sh2, t_sc2, t_g2) = txt_mods
        img_q, img_k, img_v = self.img_attn.qkv_heads(modulate(layer_norm(img), i_sh1, i_sc1))
        txt_q, txt_k, txt_v = self.txt_attn.qkv_heads(modulate(layer_norm(txt), t_sh1, t_sc1))
        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe, mask)
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img = img + i_g1 * self.img_attn.proj(img_attn)
        img = img + i_g2 * self.img_mlp(modulate(layer_norm(img), i_sh2, i_sc2))
        txt = txt + t_g1 * self.txt_attn.proj(txt_attn)
        txt = txt + t_g2 * self.txt_mlp(modulate(layer_norm(txt), t_sh2, t_sc2))
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_hidden, chroma):
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.mlp_hidden = mlp_hidden
        self.linear1 = nn.Linear(hidden, 3 * hidden + mlp_hidden)
        self.linear2 = nn.Linear(hidden + mlp_hidden, hidden)
        self.norm = QKNorm(hidden // heads)
        if not chroma:
            self.modulation = Modulation(hidden, double=False)

    def forward(self, x, pe, mask, mod):
        shift, scale, gate = mod
        qkv, mlp = torch.split(self.linear1(modulate(layer_norm(x), shift, scale)),
                               [3 * self.hidden, self.mlp_hidden], dim=-1)
        q, k, v = split_heads(qkv, self.heads)
        q, k = self.norm.query_norm(q), self.norm.key_norm(k)
        out = self.linear2(torch.cat((attention(q, k, v, pe, mask), gelu_tanh(mlp)), dim=2))
        return x + gate * out


class LastLayer(nn.Module):
    def __init__(self, hidden, out_channels, chroma):
        super().__init__()
        self.linear = nn.Linear(hidden, out_channels)
        if not chroma:
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x, shift, scale):
        return self.linear(modulate(layer_norm(x), shift, scale))


class Approximator(nn.Module):
    """Chroma's distilled_guidance_layer."""

    def __init__(self, in_dim, hidden_dim, out_dim, n_layers):
        super().__init__()
        self.in_proj = nn.Linear(in_dim, hidden_dim)
        self.layers = nn.ModuleList([MLPEmbedder(hidden_dim, hidden_dim) for _ in range(n_layers)])
        self.norms = nn.ModuleList([RMSNorm(hidden_dim) for _ in range(n_layers)])
        self.out_proj = nn.Linear(hidden_dim, out_dim)

    def forward(self, x):
        x = self.in_proj(x)
        for layer, norm in zip(self.layers, self.norms):
            x = x + layer(norm(x))
        return self.out_proj(x)


def patchify(x, p=2):
    """[B, C, H, W] -> [B, (H/p)(W/p), C p p]."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(x, h, w, p=2):
    """[B, h w, C p p] -> [B, C, h p, w p]."""
    B, _, D = x.shape
    C = D // (p * p)
    x = x.reshape(B, h, w, C, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, C, h * p, w * p)


def image_ids(h, w, index=0, h_offset=0, w_offset=0):
    """[h w, 3] positions (index, row + h_offset, col + w_offset), row-major."""
    ids = torch.zeros(h, w, 3, dtype=torch.float64)
    ids[..., 0] = index
    ids[..., 1] = torch.arange(h, dtype=torch.float64)[:, None] + h_offset
    ids[..., 2] = torch.arange(w, dtype=torch.float64)[None, :] + w_offset
    return ids.reshape(h * w, 3)


def reference_ids(grids):
    """Kontext reference latents, grids [(h, w)] in patches: index 1 for all
    (BFL's single reference: (1, row, col)); each further one is placed beside
    the ones before it, to the right when that keeps the layout squarer, else
    below (ComfyUI's default "offset" method, in patch units)."""
    ids, h_used, w_used = [], 0, 0
    for h, w in grids:
        h_off = w_off = 0
        if h + h_used > w + w_used:
            w_off = w_used
        else:
            h_off = h_used
        ids.append(image_ids(h, w, 1, h_off, w_off))
        h_used = max(h_used, h + h_off)
        w_used = max(w_used, w + w_off)
    return torch.cat(ids) if ids else torch.zeros(0, 3, dtype=torch.float64)


def token_ids(txt_tokens, grid, ref_grids=()):
    """[txt + img + refs, 3]: text (0, 0, 0), the image, then the references."""
    return torch.cat([torch.zeros(txt_tokens, 3, dtype=torch.float64), image_ids(*grid), reference_ids(ref_grids)])


def chroma_modulation_count(depth, depth_single):
    return 3 * depth_single + 12 * depth + 2


class Flux(nn.Module):
    def __init__(self, in_channels=64, out_channels=64, vec_in_dim=768, context_in_dim=4096, hidden_size=3072,
                 mlp_hidden=12288, num_heads=24, depth=19, depth_single_blocks=38, axes_dim=(16, 56, 56),
                 theta=10000, qkv_bias=True, guidance_embed=True, chroma=False, approximator_hidden=5120,
                 approximator_layers=5, patch=2):
        super().__init__()
        assert hidden_size % num_heads == 0 and sum(axes_dim) == hidden_size // num_heads
        self.hidden = hidden_size
        self.heads = num_heads
        self.axes_dim = tuple(axes_dim)
        self.theta = theta
        self.guidance_embed = guidance_embed and not chroma
        self.chroma = chroma
        self.patch = patch
        self.depth, self.depth_single = depth, depth_single_blocks
        self.img_in = nn.Linear(in_channels, hidden_size)
        if chroma:
            self.distilled_guidance_layer = Approximator(64, approximator_hidden, hidden_size, approximator_layers)
        else:
            self.time_in = MLPEmbedder(256, hidden_size)
            self.vector_in = MLPEmbedder(vec_in_dim, hidden_size)
            if guidance_embed:
                self.guidance_in = MLPEmbedder(256, hidden_size)
        self.txt_in = nn.Linear(context_in_dim, hidden_size)
        self.double_blocks = nn.ModuleList(
            [DoubleStreamBlock(hidden_size, num_heads, mlp_hidden, qkv_bias, chroma) for _ in range(depth)])
        self.single_blocks = nn.ModuleList(
            [SingleStreamBlock(hidden_size, num_heads, mlp_hidden, chroma) for _ in range(depth_single_blocks)])
        self.final_layer = LastLayer(hidden_size, out_channels, chroma)

    def chroma_input(self, timesteps, guidance):
        """[B, M, 64]: cat(emb(t, 16), emb(guidance, 16), emb(index, 32)) per modulation index."""
        B = timesteps.shape[0]
        M = chroma_modulation_count(self.depth, self.depth_single)
        tg = torch.cat([timestep_embedding(timesteps, 16), timestep_embedding(guidance, 16)], dim=-1)
        index = timestep_embedding(torch.arange(M, dtype=torch.float64), 32)
        return torch.cat([tg[:, None, :].expand(B, M, 32), index[None].expand(B, M, 32)], dim=-1)

    def forward_tokens(self, img, ids, txt, timesteps, y, guidance, mask, skip=()):
        """img [B, N, in_channels] (image then reference tokens), ids [txt + N, 3];
        skip: blocks left out (sd.cpp's skip-layer guidance: double block i as i,
        single block j as depth + j). Returns (tokens [B, N, out_channels], blocks)."""
        blocks = {}
        img = self.img_in(img)
        txt = self.txt_in(txt)
        T = txt.shape[1]
        pe = embed_nd(ids[None], self.axes_dim, self.theta).to(img.dtype)
        if self.chroma:
            g = guidance if guidance is not None else torch.zeros_like(timesteps)
            mods = self.distilled_guidance_layer(self.chroma_input(timesteps, g).to(img.dtype))  # [B, M, hidden]
            S, D = self.depth_single, self.depth

            def at(i):  # (shift, scale, gate) starting at modulation i
                return tuple(mods[:, i + j:i + j + 1, :] for j in range(3))

            double_mods = [([at(3 * S + 6 * i), at(3 * S + 6 * i + 3)],
                            [at(3 * S + 6 * D + 6 * i), at(3 * S + 6 * D + 6 * i + 3)]) for i in range(D)]
            single_mods = [at(3 * i) for i in range(S)]
            final_shift, final_scale = mods[:, -2:-1, :], mods[:, -1:, :]
        else:
            vec = self.time_in(timestep_embedding(timesteps, 256).to(img.dtype))
            if self.guidance_embed:
                vec = vec + self.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
            vec = vec + self.vector_in(y)
            double_mods = [(b.img_mod(vec), b.txt_mod(vec)) for b in self.double_blocks]
            single_mods = [b.modulation(vec)[0] for b in self.single_blocks]
            final_shift, final_scale = self.final_layer.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)
        for i, block in enumerate(self.double_blocks):
            if i in skip:
                continue
            img, txt = block(img, txt, pe, mask, *double_mods[i])
            blocks["double_blocks.%d" % i] = torch.cat((txt, img), dim=1)
        x = torch.cat((txt, img), dim=1)
        for i, block in enumerate(self.single_blocks):
            if len(self.double_blocks) + i in skip:
                continue
            x = block(x, pe, mask, single_mods[i])
            blocks["single_blocks.%d" % i] = x
        return self.final_layer(x[:, T:], final_shift, final_scale), blocks

    def forward(self, x, context, timesteps, y=None, guidance=None, refs=(), txt_mask=None, skip=()):
        """x [B, C, H, W]; context [B, T, context_dim]; timesteps, guidance [B] (sigma in [0, 1]
        and the distilled guidance); y [B, vec_in_dim]; refs: Kontext reference latents
        [B, C, h_i, w_i]; txt_mask [B, T] (1 real, 0 padding; Chroma). Returns
        (velocity [B, C_out, H, W], blocks)."""
        if self.guidance_embed and guidance is None:
            raise ValueError("this Flux needs the distilled guidance")
        p = self.patch
        B, _, H, W = x.shape
        grid = (H // p, W // p)
        ref_grids = [(r.shape[2] // p, r.shape[3] // p) for r in refs]
        img = torch.cat([patchify(x, p)] + [patchify(r, p) for r in refs], dim=1)
        ids = token_ids(context.shape[1], grid, ref_grids)
        mask = None
        if txt_mask is not None:
            keys = torch.cat([txt_mask.to(torch.float64), torch.ones(B, img.shape[1], dtype=torch.float64)], dim=1)
            mask = torch.where(keys > 0, torch.zeros_like(keys), torch.full_like(keys, -math.inf))
        out, blocks = self.forward_tokens(img, ids, context, timesteps, y, guidance, mask, skip)
        n = grid[0] * grid[1]
        return unpatchify(out[:, :n], grid[0], grid[1], p), blocks
