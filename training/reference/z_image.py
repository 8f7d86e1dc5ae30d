"""PyTorch reference for the Z-Image diffusion transformer (Z-Image-Turbo and
Z-Image Base, 6B; NextDiT / Lumina-Image-2.0 lineage), written from Tongyi-MAI's
Z-Image src/zimage/transformer.py and diffusers' ZImageTransformer2DModel
(transformer_z_image.py), cross-checked against ComfyUI's comfy/ldm/lumina
(NextDiT with z_image_modulation) and stable-diffusion.cpp's z_image.hpp.

Parameter names are the original's (= diffusers' transformer/ folder):
all_x_embedder.2-1, all_final_layer.2-1.{linear, adaLN_modulation.1},
t_embedder.mlp.{0,2}, cap_embedder.{0,1}, x_pad_token, cap_pad_token,
{noise_refiner, context_refiner, layers}.N.{attention.{to_q, to_k, to_v,
to_out.0, norm_q, norm_k}, attention_norm1/2, ffn_norm1/2,
feed_forward.w1/w2/w3, adaLN_modulation.0}. ``comfy_names(state_dict)`` gives
the single-file layout ComfyUI and stable-diffusion.cpp read
(z_image_turbo_bf16.safetensors): x_embedder, final_layer.*, attention.qkv
(to_q, to_k, to_v rows stacked), attention.out, attention.q_norm / k_norm.

What the network computes (tokens last but one):

- ``t_emb = t_embedder(emb(t * 1000))``: emb = cat([cos, sin]) of
  ``t f_i``, ``f_i = exp(-ln(10000) i / 128)`` (256 wide); t_embedder is
  Linear(256, 1024), SiLU, Linear(1024, min(dim, 256)). ``t`` is the model's
  time, 1 - sigma (the diffusers pipeline passes (1000 - sigma*1000) / 1000;
  ComfyUI computes 1 - sigma itself).
- Image: patchify "c (h ph) (w pw) -> (h w) (ph pw c)" (the channel fastest;
  not Flux's (c ph pw)), x_embedder, then pad tokens up to a multiple of 32
  (SEQ_MULTI_OF), each replaced by x_pad_token.
- Caption (L real tokens, LLM hidden states): cap_embedder = RMSNorm(cap_dim)
  + Linear(cap_dim, dim), then cap_pad_token up to a multiple of 32.
- Pad tokens of both kinds are real sequence members: they are attended to.
- Positions (t, row, col): caption slot i (pads included) (i + 1, 0, 0);
  image token (Lp + 1, row, col) with Lp the padded caption length; image pad
  tokens (0, 0, 0). RoPE: axis a owns axes_dims[a] consecutive head
  dimensions (axis 0 first), rotating pair (x[2j], x[2j+1]) as a complex
  number by pos * theta^(-2j / axes_dims[a]), theta 256. The angle is rounded
  to float32 before its cosine and sine (the original's precompute_freqs_cis:
  ``torch.outer(...).float()``).
- Block (RMSNorms eps 1e-5, QK-RMSNorm over head_dim eps 1e-5, no biases in
  attention or FFN): with modulation, ``adaLN_modulation.0(t_emb)`` (no SiLU)
  chunked scale_msa, gate_msa, scale_mlp, gate_mlp;
  x += tanh(gate_msa) * attention_norm2(attn(attention_norm1(x) * (1 + scale_msa)));
  x += tanh(gate_mlp) * ffn_norm2(w2(silu(w1 h) * w3 h)), h = ffn_norm1(x) * (1 + scale_mlp).
  Without modulation (context_refiner) the same with scales 1 and gates 1.
- noise_refiner: image tokens alone (with t_emb); context_refiner: caption
  tokens alone; layers: per item cat(image tokens, caption tokens) (image
  first, as the original and diffusers order them; ComfyUI and
  stable-diffusion.cpp put the caption first, which attention does not see).
- Final layer: LayerNorm without affine (eps 1e-6) * (1 + adaLN_modulation
  (SiLU, Linear)(t_emb)), linear; the image's tokens unpatchified. The
  pipelines negate it: ``-out`` is the rectified-flow velocity noise - x0.

A batch whose captions pad to different lengths is padded (as pad_sequence
does) to the longest, with zero tokens and zero rotations, and those slots are
masked as keys (additive -inf) in the context refiner and the main layers.

Everything here computes in the dtype of the inputs (run it in float64).

``ZImage.forward(x, t, captions)`` takes NCHW latents, the model time t [B]
and the captions as a list of [L_i, cap_dim]; returns (out [B, C, H, W],
blocks, tables): blocks["noise_refiner.N"] = image tokens [B, Np, dim],
blocks["context_refiner.N"] = caption slots [B, Tp, dim], blocks["layers.N"]
= [B, Np + Tp, dim]; tables["caption_valid"] [B, Tp] (1 for a slot of the
item's padded caption, 0 for batch padding, whose values no real token
reads), tables["rope"] [B, Np + Tp, head_dim / 2] (complex rotations of every
slot, image first) and tables["mask"] [B, Np + Tp] (the additive key mask of
the main layers). ``velocity(model, x, sigma, captions)`` is ``-out`` at
t = 1 - sigma.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SEQ_MULTI_OF = 32
ADALN_EMBED_DIM = 256
FREQUENCY_EMBEDDING_SIZE = 256


def padded(n):
    """n rounded up to a multiple of SEQ_MULTI_OF."""
    return -(-n // SEQ_MULTI_OF) * SEQ_MULTI_OF


def timestep_embedding(t, dim=FREQUENCY_EMBEDDING_SIZE, max_period=10000):
    """cat([cos, sin]) of t * exp(-ln(max_period) i / (dim / 2)), float64."""
    t = t.to(torch.float64)
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope_angles(ids, axes_dims, theta):
    """ids [..., 3] integer positions -> [..., head_dim / 2] angles (axis 0's
    pairs first), rounded to float32 as the original's table is."""
    parts = []
    for a, d in enumerate(axes_dims):
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        parts.append(ids[..., a].to(torch.float64)[..., None] * freqs)
    return torch.cat(parts, dim=-1).to(torch.float32).to(torch.float64)


def rope_complex(ids, axes_dims, theta):
    """[..., head_dim / 2] complex128 rotations exp(i angle)."""
    angles = rope_angles(ids, axes_dims, theta)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary(x, freqs):
    """x [B, L, H, D]; freqs [B, L, D/2] complex: pair (x[2j], x[2j+1]) as x[2j] + i x[2j+1], times freqs."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * freqs[:, :, None, :]).flatten(3).to(x.dtype)


def patchify(x, p=2):
    """[B, C, H, W] -> [B, (H/p)(W/p), p p C] ("c (h ph) (w pw) -> (h w) (ph pw c)")."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(x, h, w, p=2):
    """[B, h w, p p C] -> [B, C, h p, w p]."""
    B, _, D = x.shape
    C = D // (p * p)
    x = x.reshape(B, h, w, p, p, C).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(B, C, h * p, w * p)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads, eps):
        super().__init__()
        self.heads = heads
        head_dim = dim // heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim, bias=False)])
        self.norm_q = RMSNorm(head_dim, eps)
        self.norm_k = RMSNorm(head_dim, eps)

    def forward(self, x, mask, freqs):
        """x [B, L, dim]; mask additive [B, L] over the keys or None; freqs [B, L, D/2]."""
        q = self.norm_q(self.to_q(x).unflatten(-1, (self.heads, -1)))
        k = self.norm_k(self.to_k(x).unflatten(-1, (self.heads, -1)))
        v = self.to_v(x).unflatten(-1, (self.heads, -1))
        q, k = apply_rotary(q, freqs), apply_rotary(k, freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores + mask[:, None, None, :].to(scores.dtype)
        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).flatten(2)
        return self.to_out[0](out)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, ffn_hidden, eps, adaln_dim, modulation):
        super().__init__()
        self.attention = Attention(dim, heads, eps)
        self.feed_forward = FeedForward(dim, ffn_hidden)
        self.attention_norm1 = RMSNorm(dim, eps)
        self.ffn_norm1 = RMSNorm(dim, eps)
        self.attention_norm2 = RMSNorm(dim, eps)
        self.ffn_norm2 = RMSNorm(dim, eps)
        self.modulation = modulation
        if modulation:
            self.adaLN_modulation = nn.ModuleList([nn.Linear(adaln_dim, 4 * dim)])

    def forward(self, x, mask, freqs, t_emb=None):
        if self.modulation:
            scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaLN_modulation[0](t_emb)[:, None, :].chunk(4, dim=-1)
            attn = self.attention(self.attention_norm1(x) * (1 + scale_msa), mask, freqs)
            x = x + torch.tanh(gate_msa) * self.attention_norm2(attn)
            ffn = self.feed_forward(self.ffn_norm1(x) * (1 + scale_mlp))
            return x + torch.tanh(gate_mlp) * self.ffn_norm2(ffn)
        x = x + self.attention_norm2(self.attention(self.attention_norm1(x), mask, freqs))
        return x + self.ffn_norm2(self.feed_forward(self.ffn_norm1(x)))


class FinalLayer(nn.Module):
    def __init__(self, dim, out_channels, adaln_dim):
        super().__init__()
        self.linear = nn.Linear(dim, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(adaln_dim, dim))

    def forward(self, x, t_emb):
        scale = 1 + self.adaLN_modulation(t_emb)[:, None, :]
        return self.linear(F.layer_norm(x, (x.shape[-1],), eps=1e-6) * scale)


class TimestepEmbedder(nn.Module):
    def __init__(self, out_dim, mid_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQUENCY_EMBEDDING_SIZE, mid_dim), nn.SiLU(), nn.Linear(mid_dim, out_dim))

    def forward(self, t):
        return self.mlp(timestep_embedding(t).to(self.mlp[0].weight.dtype))


class ZImage(nn.Module):
    def __init__(self, in_channels=16, dim=3840, n_layers=30, n_noise_refiner=2, n_context_refiner=2, n_heads=30,
                 norm_eps=1e-5, cap_feat_dim=2560, axes_dims=(32, 48, 48), rope_theta=256.0, t_scale=1000.0,
                 t_mid=1024, ffn_hidden=None, patch=2):
        super().__init__()
        assert dim % n_heads == 0 and sum(axes_dims) == dim // n_heads
        self.patch = patch
        self.axes_dims = tuple(axes_dims)
        self.theta = rope_theta
        self.t_scale = t_scale
        ffn_hidden = ffn_hidden or int(dim / 3 * 8)
        adaln_dim = min(dim, ADALN_EMBED_DIM)
        key = "%d-1" % patch
        self.all_x_embedder = nn.ModuleDict({key: nn.Linear(patch * patch * in_channels, dim)})
        self.all_final_layer = nn.ModuleDict({key: FinalLayer(dim, patch * patch * in_channels, adaln_dim)})

        def blocks(n, modulation):
            return nn.ModuleList([Block(dim, n_heads, ffn_hidden, norm_eps, adaln_dim, modulation) for _ in range(n)])

        self.noise_refiner = blocks(n_noise_refiner, True)
        self.context_refiner = blocks(n_context_refiner, False)
        self.t_embedder = TimestepEmbedder(adaln_dim, t_mid)
        self.cap_embedder = nn.Sequential(RMSNorm(cap_feat_dim, norm_eps), nn.Linear(cap_feat_dim, dim))
        self.x_pad_token = nn.Parameter(torch.zeros(1, dim))
        self.cap_pad_token = nn.Parameter(torch.zeros(1, dim))
        self.layers = blocks(n_layers, True)

    def rope(self, ids):
        return rope_complex(ids, self.axes_dims, self.theta)

    def forward(self, x, t, captions):
        """x [B, C, H, W]; t [B] the model's time (1 - sigma); captions: B tensors [L_i, cap_dim]."""
        p = self.patch
        B, _, H, W = x.shape
        h, w = H // p, W // p
        n, n_pad = h * w, padded(h * w)
        key = "%d-1" % p
        blocks = {}
        t_emb = self.t_embedder(t * self.t_scale)

        # Captions: embedded, padded to a multiple of 32 with cap_pad_token, then to the batch's longest.
        lp = [padded(c.shape[0]) for c in captions]
        Tp = max(lp)
        cap = torch.zeros(B, Tp, self.cap_pad_token.shape[1], dtype=x.dtype)
        cap_ids = torch.zeros(B, Tp, 3, dtype=torch.int64)
        cap_valid = torch.zeros(B, Tp, dtype=x.dtype)
        for b, c in enumerate(captions):
            emb = self.cap_embedder(c)
            cap[b, :lp[b]] = torch.cat([emb, self.cap_pad_token.expand(lp[b] - c.shape[0], -1)])
            cap_ids[b, :lp[b], 0] = torch.arange(lp[b]) + 1
            cap_valid[b, :lp[b]] = 1
        cap_freqs = self.rope(cap_ids) * cap_valid[..., None]  # batch padding: zero rotations
        cap_mask = torch.where(cap_valid > 0, torch.zeros_like(cap_valid), torch.full_like(cap_valid, -math.inf))

        # Image tokens, padded to a multiple of 32 with x_pad_token at position (0, 0, 0).
        img = self.all_x_embedder[key](patchify(x, p))
        img = torch.cat([img, self.x_pad_token.expand(B, n_pad - n, -1)], dim=1)
        img_ids = torch.zeros(B, n_pad, 3, dtype=torch.int64)
        rows = torch.arange(h)[:, None].expand(h, w).reshape(-1)
        cols = torch.arange(w)[None, :].expand(h, w).reshape(-1)
        for b in range(B):
            img_ids[b, :n, 0] = lp[b] + 1
            img_ids[b, :n, 1] = rows
            img_ids[b, :n, 2] = cols
        img_freqs = self.rope(img_ids)

        for i, block in enumerate(self.noise_refiner):
            img = block(img, None, img_freqs, t_emb)
            blocks["noise_refiner.%d" % i] = img
        for i, block in enumerate(self.context_refiner):
            cap = block(cap, cap_mask, cap_freqs)
            blocks["context_refiner.%d" % i] = cap

        # Per item: image tokens, then its padded caption; batch padding (zeros) after.
        unified = torch.cat([img, cap * cap_valid[..., None]], dim=1)
        freqs = torch.cat([img_freqs, cap_freqs], dim=1)
        mask = torch.cat([torch.zeros(B, n_pad, dtype=x.dtype), cap_mask], dim=1)
        for i, block in enumerate(self.layers):
            unified = block(unified, mask, freqs, t_emb)
            blocks["layers.%d" % i] = unified
        out = self.all_final_layer[key](unified, t_emb)
        return unpatchify(out[:, :n], h, w, p), blocks, {"caption_valid": cap_valid, "rope": freqs, "mask": mask}


def velocity(model, x, sigma, captions):
    """The rectified-flow velocity (noise - x0) at sigma [B]: the model at t = 1 - sigma, negated.
    Returns (velocity, blocks, tables)."""
    out, blocks, tables = model(x, 1 - sigma, captions)
    return -out, blocks, tables


def comfy_names(state_dict):
    """The original / diffusers names -> the single-file (ComfyUI) names: to_q, to_k, to_v stacked
    into attention.qkv, to_out.0 -> out, norm_q / norm_k -> q_norm / k_norm, all_x_embedder.2-1 ->
    x_embedder, all_final_layer.2-1 -> final_layer."""
    out = {}
    for name, value in state_dict.items():
        if name.endswith(("attention.to_k.weight", "attention.to_v.weight")):
            continue
        if name.endswith("attention.to_q.weight"):
            stem = name[:-len("to_q.weight")]
            out[stem + "qkv.weight"] = torch.cat(
                [state_dict[stem + part + ".weight"] for part in ("to_q", "to_k", "to_v")]).contiguous()
            continue
        for old, new in (("attention.to_out.0.", "attention.out."), ("attention.norm_q.", "attention.q_norm."),
                         ("attention.norm_k.", "attention.k_norm."), ("all_x_embedder.2-1.", "x_embedder."),
                         ("all_final_layer.2-1.", "final_layer.")):
            name = name.replace(old, new)
        out[name] = value
    return out
