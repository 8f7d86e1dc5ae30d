"""PyTorch reference for FLUX.2 (Black Forest Labs, 2025/2026): the DiT of
FLUX.2 [klein] 4B / 9B (and [dev]) and the FLUX.2 autoencoder, written from
BFL's reference code, read through public copies of
github.com/black-forest-labs/flux2:

- ``src/flux2/model.py`` (Flux2, Flux2Params / Klein4BParams / Klein9BParams,
  DoubleStreamBlock, SingleStreamBlock, Modulation, LastLayer, SelfAttention,
  SiLUActivation, MLPEmbedder, EmbedND, rope, apply_rope, timestep_embedding,
  RMSNorm, QKNorm) - read in the forks TensorTemplar/flux2 and ZZfive/flux2,
  identical in the parts used here;
- ``src/flux2/autoencoder.py`` (AutoEncoder with its BatchNorm2d, Encoder with
  ``quant_conv``, Decoder with ``post_quant_conv``) - read in
  Ambitionlszz/FluxCompression and ZZfive/flux2;
- ``src/flux2/sampling.py`` (prc_txt, prc_img, encode_image_refs,
  get_schedule, compute_empirical_mu, generalized_time_snr_shift, denoise,
  denoise_cfg) and ``src/flux2/text_encoder.py`` (Qwen3Embedder,
  OUTPUT_LAYERS_QWEN3 = [9, 18, 27], MAX_LENGTH = 512) - read in
  black-forest-labs/flux2 itself;

and checked against diffusers' ``transformer_flux2.py`` (Flux2Transformer2DModel)
and ``autoencoder_kl_flux2.py`` (AutoencoderKLFlux2). docs/flux2_architecture_notes.md
is the prose version with every tensor name and shape.

Parameter names are BFL's, so ``Flux2(...).state_dict()`` has the names of
``flux-2-klein-4b.safetensors`` (no prefix, no biases anywhere) and
``AutoEncoder(...).state_dict()`` those of FLUX.2's ``ae.safetensors``
(sd.cpp's docs call it flux2_ae.safetensors): ``encoder.*`` (with
``encoder.quant_conv``), ``decoder.*`` (with ``decoder.post_quant_conv``),
``bn.running_mean``, ``bn.running_var``, ``bn.num_batches_tracked``.
``bfl_dit_tensor_shapes(cfg)`` / ``bfl_ae_tensor_shapes(...)`` list them from
the configuration alone (used to check the modules and to size the real files).

The DiT (everything in the dtype of the inputs; run it in float64):

- ``vec = time_in(emb(t))`` (+ ``guidance_in(emb(g))`` only with
  ``use_guidance_embed``: [dev]; klein has none), ``emb`` = BFL's
  ``timestep_embedding(t, 256)``: ``t * 1000``, ``cat([cos, sin])`` with
  ``f_i = exp(-ln(10000) i / 128)``. ``time_in`` is ``out_layer(silu(in_layer(.)))``.
- Modulation is shared by all blocks of a kind (computed once per forward):
  ``double_stream_modulation_img(vec)`` and ``double_stream_modulation_txt(vec)``
  give 6 chunks each (shift1, scale1, gate1, shift2, scale2, gate2),
  ``single_stream_modulation(vec)`` gives 3 (shift, scale, gate); each
  ``lin(silu(vec))``, chunked along features in that order.
- ``img = img_in(x)``, ``txt = txt_in(ctx)`` (x: [B, N, 128] tokens of the
  normalised latent, image then reference tokens; ctx: [B, T, context_in_dim]).
- Double block (per stream, LayerNorm without affine, eps 1e-6):
  ``m = (1 + scale1) * LN(x) + shift1``; ``qkv(m)`` in the "B L (K H D)"
  layout; QKNorm (RMSNorm over head_dim, eps 1e-6, ``.scale``) on q and k;
  joint attention over ``cat(txt, img)`` with RoPE; ``x += gate1 * proj(attn)``;
  ``x += gate2 * mlp((1 + scale2) * LN(x) + shift2)`` with
  ``mlp = mlp.2(SwiGLU(mlp.0(.)))``, SwiGLU(u) = silu(u[:M]) * u[M:].
- Single block over ``cat(txt, img)``: ``m = (1 + scale) * LN(x) + shift``;
  ``linear1(m)`` split [3H | 2M]: q, k, v ("B L (K H D)"), QKNorm, attention
  with RoPE; ``x += gate * linear2(cat(attn, SwiGLU(mlp)))``.
- Final layer on the image(+reference) tokens: ``adaLN_modulation.1(silu(vec))``
  -> (shift, scale); ``linear((1 + scale) * LN(x) + shift)`` -> 128 channels.
- RoPE over 4 axes (t, h, w, l) with ``axes_dim`` (32 each in the real
  models, theta 2000): axis a rotates its own consecutive block of head
  dimensions, pairs (x[2j], x[2j+1]) by ``pos_a * theta ** (-2j / axes_dim[a])``.
  Positions (BFL's prc_txt / prc_img / encode_image_refs): text token l:
  (0, 0, 0, l); image token (row, col) of the 128-channel latent grid:
  (0, row, col, 0); reference image i (0-based): (10 + 10 i, row, col, 0)
  (no spatial offset: references are told apart by t alone).
- No attention mask anywhere in the DiT (BFL feeds all 512 text tokens,
  padding included, unmasked).

The autoencoder: the Flux.1/ldm Encoder/Decoder (ch 128, ch_mult 1 2 4 4, 2
res blocks, GroupNorm(32) eps 1e-6, mid attention) with 32 latent channels,
``encoder.quant_conv`` (1x1, 64 -> 64) after conv_out and
``decoder.post_quant_conv`` (1x1, 32 -> 32) before conv_in. ``encode(image in
[-1, 1])``: mean = first 32 channels of quant_conv's output (no sampling),
patchify "c (i 2) (j 2) -> (c 2 2) i j" (channel c * 4 + pi * 2 + pj), then
BatchNorm2d(128, eps 1e-4, affine False) in eval mode:
``z = (p - running_mean) / sqrt(running_var + 1e-4)``. ``decode`` inverts
that exactly (``p = z * sqrt(running_var + 1e-4) + running_mean``),
unpatchifies and runs post_quant_conv and the decoder. There is no other
scale or shift (Flux.1's 0.3611 / 0.1159 are gone). The DiT's tokens are the
normalised latent "c h w -> (h w) c" (patch size 1 at the DiT).
FLUX.2-small-decoder's ``full_encoder_small_decoder.safetensors`` is the same
encoder with a decoder of ch 96 (channels 96, 192, 384, 384):
``AutoEncoder(decoder_ch=96)``.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference import vae as ldm_vae
# BFL's flux2 takes these from flux1 too (model.py imports flux1's
# timestep_embedding, its rope module the same EmbedND and apply_rope).
from reference.flux import QKNorm, apply_rope, attention, embed_nd, timestep_embedding  # noqa: F401

# ------------------------------------------------------------ configurations

# BFL src/flux2/model.py: Klein4BParams, Klein9BParams, Flux2Params ([dev]).
KLEIN_4B = dict(in_channels=128, context_in_dim=7680, hidden_size=3072, num_heads=24, depth=5,
                depth_single_blocks=20, axes_dim=(32, 32, 32, 32), theta=2000, mlp_ratio=3.0,
                use_guidance_embed=False)
KLEIN_9B = dict(in_channels=128, context_in_dim=12288, hidden_size=4096, num_heads=32, depth=8,
                depth_single_blocks=24, axes_dim=(32, 32, 32, 32), theta=2000, mlp_ratio=3.0,
                use_guidance_embed=False)
DEV = dict(in_channels=128, context_in_dim=15360, hidden_size=6144, num_heads=48, depth=8,
           depth_single_blocks=48, axes_dim=(32, 32, 32, 32), theta=2000, mlp_ratio=3.0,
           use_guidance_embed=True)

# BFL src/flux2/autoencoder.py: AutoEncoderParams.
AE = dict(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, z_channels=32)
SMALL_DECODER_CH = 96  # FLUX.2-small-decoder: decoder block_out_channels (96, 192, 384, 384)

BN_EPS = 1e-4
PATCH = 2

# BFL src/flux2/text_encoder.py (Qwen3Embedder) and src/flux2/sampling.py.
QWEN3_OUTPUT_LAYERS = (9, 18, 27)  # indices into HF's output_hidden_states (0 = embeddings)
MAX_LENGTH = 512
QWEN3_PAD_ID = 151643  # <|endoftext|>, the Qwen tokenizer's pad token
# Qwen3's chat template for [{"role": "user", "content": prompt}] with
# add_generation_prompt=True, enable_thinking=False (ComfyUI's KleinTokenizer
# writes the same string out: comfy/text_encoders/flux.py).
KLEIN_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
REF_T_SCALE = 10  # encode_image_refs: t = scale + scale * i


def mlp_hidden(cfg):
    return int(cfg["hidden_size"] * cfg["mlp_ratio"])


def bfl_dit_tensor_shapes(cfg):
    """{name: shape} of a BFL FLUX.2 DiT file (PyTorch [out, in] order), from the config alone."""
    H, C, M = cfg["hidden_size"], cfg["in_channels"], mlp_hidden(cfg)
    D = H // cfg["num_heads"]
    s = {
        "img_in.weight": (H, C),
        "txt_in.weight": (H, cfg["context_in_dim"]),
        "time_in.in_layer.weight": (H, 256),
        "time_in.out_layer.weight": (H, H),
        "double_stream_modulation_img.lin.weight": (6 * H, H),
        "double_stream_modulation_txt.lin.weight": (6 * H, H),
        "single_stream_modulation.lin.weight": (3 * H, H),
        "final_layer.linear.weight": (C, H),
        "final_layer.adaLN_modulation.1.weight": (2 * H, H),
    }
    if cfg["use_guidance_embed"]:
        s["guidance_in.in_layer.weight"] = (H, 256)
        s["guidance_in.out_layer.weight"] = (H, H)
    for i in range(cfg["depth"]):
        for st in ("img", "txt"):
            p = "double_blocks.%d.%s_" % (i, st)
            s[p + "attn.qkv.weight"] = (3 * H, H)
            s[p + "attn.norm.query_norm.scale"] = (D,)
            s[p + "attn.norm.key_norm.scale"] = (D,)
            s[p + "attn.proj.weight"] = (H, H)
            s[p + "mlp.0.weight"] = (2 * M, H)
            s[p + "mlp.2.weight"] = (H, M)
    for i in range(cfg["depth_single_blocks"]):
        p = "single_blocks.%d." % i
        s[p + "linear1.weight"] = (3 * H + 2 * M, H)
        s[p + "linear2.weight"] = (H, H + M)
        s[p + "norm.query_norm.scale"] = (D,)
        s[p + "norm.key_norm.scale"] = (D,)
    return s


# ------------------------------------------------------------ DiT pieces


def layer_norm(x):
    """nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)."""
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def modulate(x, shift, scale):
    return (1 + scale) * x + shift


def swiglu(x):
    """BFL's SiLUActivation: x1, x2 = x.chunk(2, -1); silu(x1) * x2 (the gate is the first half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return F.silu(x1) * x2


def split_heads(qkv, heads):
    """[B, L, 3 * H * D] in the "B L (K H D)" layout -> q, k, v [B, H, L, D]."""
    B, L, _ = qkv.shape
    qkv = qkv.reshape(B, L, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


class SiLUActivation(nn.Module):
    def forward(self, x):
        return swiglu(x)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim, hidden_dim):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim, bias=False)
        self.out_layer = nn.Linear(hidden_dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.out_layer(F.silu(self.in_layer(x)))


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.norm = QKNorm(dim // heads)
        self.proj = nn.Linear(dim, dim, bias=False)

    def qkv_heads(self, x):
        q, k, v = split_heads(self.qkv(x), self.heads)
        return self.norm.query_norm(q), self.norm.key_norm(k), v


class Modulation(nn.Module):
    """lin(silu(vec)) chunked into (shift, scale, gate) x (2 if double else 1), each [B, 1, dim]."""

    def __init__(self, dim, double):
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=False)

    def forward(self, vec):
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return [tuple(out[i:i + 3]) for i in range(0, self.multiplier, 3)]


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_hidden_dim):
        super().__init__()
        self.img_attn = SelfAttention(hidden, heads)
        self.img_mlp = nn.Sequential(nn.Linear(hidden, 2 * mlp_hidden_dim, bias=False), SiLUActivation(),
                                     nn.Linear(mlp_hidden_dim, hidden, bias=False))
        self.txt_attn = SelfAttention(hidden, heads)
        self.txt_mlp = nn.Sequential(nn.Linear(hidden, 2 * mlp_hidden_dim, bias=False), SiLUActivation(),
                                     nn.Linear(mlp_hidden_dim, hidden, bias=False))

    def forward(self, img, txt, pe, img_mods, txt_mods):
        """pe covers cat(txt, img); *_mods: [(shift1, scale1, gate1), (shift2, scale2, gate2)]."""
        (i_sh1, i_sc1, i_g1), (i_sh2, i_sc2, i_g2) = img_mods
        (t_sh1, t_sc1, t_g1), (t_sh2, t_sc2, t_g2) = txt_mods
        img_q, img_k, img_v = self.img_attn.qkv_heads(modulate(layer_norm(img), i_sh1, i_sc1))
        txt_q, txt_k, txt_v = self.txt_attn.qkv_heads(modulate(layer_norm(txt), t_sh1, t_sc1))
        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe)
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img = img + i_g1 * self.img_attn.proj(img_attn)
        img = img + i_g2 * self.img_mlp(modulate(layer_norm(img), i_sh2, i_sc2))
        txt = txt + t_g1 * self.txt_attn.proj(txt_attn)
        txt = txt + t_g2 * self.txt_mlp(modulate(layer_norm(txt), t_sh2, t_sc2))
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_hidden_dim):
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.mlp_hidden = mlp_hidden_dim
        self.linear1 = nn.Linear(hidden, 3 * hidden + 2 * mlp_hidden_dim, bias=False)
        self.linear2 = nn.Linear(hidden + mlp_hidden_dim, hidden, bias=False)
        self.norm = QKNorm(hidden // heads)

    def forward(self, x, pe, mod):
        shift, scale, gate = mod
        qkv, mlp = torch.split(self.linear1(modulate(layer_norm(x), shift, scale)),
                               [3 * self.hidden, 2 * self.mlp_hidden], dim=-1)
        q, k, v = split_heads(qkv, self.heads)
        q, k = self.norm.query_norm(q), self.norm.key_norm(k)
        out = self.linear2(torch.cat((attention(q, k, v, pe), swiglu(mlp)), dim=2))
        return x + gate * out


class LastLayer(nn.Module):
    def __init__(self, hidden, out_channels):
        super().__init__()
        self.linear = nn.Linear(hidden, out_channels, bias=False)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=False))

    def forward(self, x, vec):
        shift, scale = self.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)
        return self.linear(modulate(layer_norm(x), shift, scale))


# ------------------------------------------------------------ token positions


def txt_ids(length):
    """BFL prc_txt: (t, h, w, l) = (0, 0, 0, l) for l in 0..length-1. [length, 4] float64."""
    ids = torch.zeros(length, 4, dtype=torch.float64)
    ids[:, 3] = torch.arange(length, dtype=torch.float64)
    return ids


def img_ids(h, w, t=0):
    """BFL prc_img: cartesian_prod(t, arange(h), arange(w), [0]) -> (t, row, col, 0), row-major. [h w, 4]."""
    ids = torch.zeros(h, w, 4, dtype=torch.float64)
    ids[..., 0] = t
    ids[..., 1] = torch.arange(h, dtype=torch.float64)[:, None]
    ids[..., 2] = torch.arange(w, dtype=torch.float64)[None, :]
    return ids.reshape(h * w, 4)


def ref_ids(grids):
    """BFL encode_image_refs: reference i (0-based) of grid (h, w) gets t = 10 + 10 i, rows and
    columns from 0 (no offsets). [sum h w, 4]."""
    parts = [img_ids(h, w, REF_T_SCALE + REF_T_SCALE * i) for i, (h, w) in enumerate(grids)]
    return torch.cat(parts) if parts else torch.zeros(0, 4, dtype=torch.float64)


def latent_to_tokens(z):
    """[B, C, h, w] -> [B, h w, C] ("c h w -> (h w) c": patch size 1 at the DiT)."""
    B, C, h, w = z.shape
    return z.reshape(B, C, h * w).transpose(1, 2)


def tokens_to_latent(x, h, w):
    B, N, C = x.shape
    return x.transpose(1, 2).reshape(B, C, h, w)


# ------------------------------------------------------------ the DiT


class Flux2(nn.Module):
    def __init__(self, in_channels=128, context_in_dim=7680, hidden_size=3072, num_heads=24, depth=5,
                 depth_single_blocks=20, axes_dim=(32, 32, 32, 32), theta=2000, mlp_ratio=3.0,
                 use_guidance_embed=False):
        super().__init__()
        assert hidden_size % num_heads == 0 and sum(axes_dim) == hidden_size // num_heads
        self.hidden = hidden_size
        self.heads = num_heads
        self.axes_dim = tuple(axes_dim)
        self.theta = theta
        self.use_guidance_embed = use_guidance_embed
        m = int(hidden_size * mlp_ratio)
        self.img_in = nn.Linear(in_channels, hidden_size, bias=False)
        self.time_in = MLPEmbedder(256, hidden_size)
        self.txt_in = nn.Linear(context_in_dim, hidden_size, bias=False)
        if use_guidance_embed:
            self.guidance_in = MLPEmbedder(256, hidden_size)
        self.double_blocks = nn.ModuleList([DoubleStreamBlock(hidden_size, num_heads, m) for _ in range(depth)])
        self.single_blocks = nn.ModuleList(
            [SingleStreamBlock(hidden_size, num_heads, m) for _ in range(depth_single_blocks)])
        self.double_stream_modulation_img = Modulation(hidden_size, double=True)
        self.double_stream_modulation_txt = Modulation(hidden_size, double=True)
        self.single_stream_modulation = Modulation(hidden_size, double=False)
        self.final_layer = LastLayer(hidden_size, in_channels)

    def time_vec(self, timesteps, guidance=None):
        vec = self.time_in(timestep_embedding(timesteps, 256).to(self.img_in.weight.dtype))
        if self.use_guidance_embed:
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256).to(vec.dtype))
        return vec

    def forward_tokens(self, x, x_ids, ctx, ctx_ids, timesteps, guidance=None):
        """BFL's Flux2.forward: x [B, N, in] (image then reference tokens), x_ids [N, 4],
        ctx [B, T, context_in_dim], ctx_ids [T, 4], timesteps [B] (sigma in [0, 1]).
        Returns (out [B, N, in] for every x token, blocks) with blocks["vec"] [B, H],
        blocks["double_blocks.i"] = cat(txt, img) and blocks["single_blocks.i"] [B, T + N, H]."""
        blocks = {}
        T = ctx.shape[1]
        vec = self.time_vec(timesteps, guidance)
        blocks["vec"] = vec
        img_mods = self.double_stream_modulation_img(vec)
        txt_mods = self.double_stream_modulation_txt(vec)
        single_mod = self.single_stream_modulation(vec)[0]
        img = self.img_in(x)
        txt = self.txt_in(ctx)
        pe = embed_nd(torch.cat([ctx_ids, x_ids])[None], self.axes_dim, self.theta).to(img.dtype)
        for i, block in enumerate(self.double_blocks):
            img, txt = block(img, txt, pe, img_mods, txt_mods)
            blocks["double_blocks.%d" % i] = torch.cat((txt, img), dim=1)
        h = torch.cat((txt, img), dim=1)
        for i, block in enumerate(self.single_blocks):
            h = block(h, pe, single_mod)
            blocks["single_blocks.%d" % i] = h
        return self.final_layer(h[:, T:], vec), blocks

    def forward(self, x, context, timesteps, refs=(), guidance=None):
        """x [B, 128, h, w] (the normalised latent), context [B, T, context_in_dim], timesteps [B],
        refs: reference latents [B, 128, h_i, w_i] (BFL's img_cond_seq). Returns
        (velocity [B, 128, h, w], blocks); BFL keeps only the first h w outputs (pred[:, :N])."""
        B, _, h, w = x.shape
        tokens = torch.cat([latent_to_tokens(x)] + [latent_to_tokens(r) for r in refs], dim=1)
        ids = torch.cat([img_ids(h, w), ref_ids([(r.shape[2], r.shape[3]) for r in refs])])
        out, blocks = self.forward_tokens(tokens, ids, context, txt_ids(context.shape[1]), timesteps, guidance)
        return tokens_to_latent(out[:, :h * w], h, w), blocks

    def token_ids(self, txt_len, grid, ref_grids=()):
        """[T + h w + refs, 4]: the joint sequence's positions, text first."""
        return torch.cat([txt_ids(txt_len), img_ids(*grid), ref_ids(ref_grids)])


# ------------------------------------------------------------ the autoencoder


def patchify(z, p=PATCH):
    """BFL AutoEncoder.encode: "... c (i pi) (j pj) -> ... (c pi pj) i j" (channel c * p * p + pi * p + pj)."""
    B, C, H, W = z.shape
    z = z.reshape(B, C, H // p, p, W // p, p).permute(0, 1, 3, 5, 2, 4)
    return z.reshape(B, C * p * p, H // p, W // p)


def unpatchify(z, p=PATCH):
    """The inverse: "... (c pi pj) i j -> ... c (i pi) (j pj)"."""
    B, Cp, h, w = z.shape
    C = Cp // (p * p)
    z = z.reshape(B, C, p, p, h, w).permute(0, 1, 4, 2, 5, 3)
    return z.reshape(B, C, h * p, w * p)


class Encoder(ldm_vae.Encoder):
    """BFL's Encoder: ldm's, plus ``quant_conv`` (2z -> 2z, 1x1) applied to conv_out's output."""

    def __init__(self, ch, ch_mult, num_res_blocks, in_channels, z_channels):
        super().__init__(ch, ch_mult, num_res_blocks, in_channels, z_channels)
        self.quant_conv = nn.Conv2d(2 * z_channels, 2 * z_channels, 1)

    def forward(self, x, blocks):
        return self.quant_conv(super().forward(x, blocks))


class Decoder(ldm_vae.Decoder):
    """BFL's Decoder: ``post_quant_conv`` (z -> z, 1x1) first, then ldm's decoder."""

    def __init__(self, ch, ch_mult, num_res_blocks, out_channels, z_channels):
        super().__init__(ch, ch_mult, num_res_blocks, out_channels, z_channels)
        self.post_quant_conv = nn.Conv2d(z_channels, z_channels, 1)

    def forward(self, z, blocks):
        return super().forward(self.post_quant_conv(z), blocks)


class AutoEncoder(nn.Module):
    """BFL's FLUX.2 AutoEncoder. ``decoder_ch`` (default ``ch``) is the decoder's base width:
    FLUX.2-small-decoder's full_encoder_small_decoder.safetensors has decoder_ch 96 with ch 128."""

    def __init__(self, ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, z_channels=32, decoder_ch=None,
                 image_channels=3):
        super().__init__()
        self.z_channels = z_channels
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, image_channels, z_channels)
        self.decoder = Decoder(decoder_ch or ch, ch_mult, num_res_blocks, image_channels, z_channels)
        self.bn = nn.BatchNorm2d(PATCH * PATCH * z_channels, eps=BN_EPS, momentum=0.1, affine=False,
                                 track_running_stats=True)

    def bn_std(self):
        return torch.sqrt(self.bn.running_var.view(1, -1, 1, 1) + BN_EPS)

    def normalize(self, p):
        """BatchNorm2d in eval mode: (p - running_mean) / sqrt(running_var + eps)."""
        return (p - self.bn.running_mean.view(1, -1, 1, 1)) / self.bn_std()

    def inv_normalize(self, z):
        """BFL's inv_normalize: z * sqrt(running_var + eps) + running_mean."""
        return z * self.bn_std() + self.bn.running_mean.view(1, -1, 1, 1)

    def encode(self, image):
        """image [B, 3, H, W] in [-1, 1], H and W multiples of 2 * 2^(levels-1). Returns
        (z [B, 128, H/16, W/16] normalised, extras: moments, mean, patchified, blocks)."""
        blocks = {}
        moments = self.encoder(image, blocks)
        mean = moments[:, :self.z_channels]
        p = patchify(mean)
        z = self.normalize(p)
        return z, dict(moments=moments, mean=mean, patchified=p, blocks=blocks)

    def decode(self, z):
        """z [B, 128, h, w] normalised -> (image [B, 3, 16 h, 16 w], not clamped; extras)."""
        blocks = {}
        p = self.inv_normalize(z)
        u = unpatchify(p)
        image = self.decoder(u, blocks)
        return image, dict(unnormalized=p, unpatchified=u, blocks=blocks)


def bfl_ae_tensor_shapes(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, z_channels=32, decoder_ch=None):
    """{name: shape} of a FLUX.2 autoencoder file in BFL's names (ae.safetensors; with decoder_ch 96
    full_encoder_small_decoder.safetensors). bn.num_batches_tracked is a 0-d int64."""
    s = {}

    def conv(name, cout, cin, k):
        s[name + ".weight"] = (cout, cin, k, k)
        s[name + ".bias"] = (cout,)

    def norm(name, c):
        s[name + ".weight"] = (c,)
        s[name + ".bias"] = (c,)

    def resnet(name, cin, cout):
        norm(name + ".norm1", cin)
        conv(name + ".conv1", cout, cin, 3)
        norm(name + ".norm2", cout)
        conv(name + ".conv2", cout, cout, 3)
        if cin != cout:
            conv(name + ".nin_shortcut", cout, cin, 1)

    def mid(name, c):
        resnet(name + ".block_1", c, c)
        norm(name + ".attn_1.norm", c)
        for leaf in ("q", "k", "v", "proj_out"):
            conv(name + ".attn_1." + leaf, c, c, 1)
        resnet(name + ".block_2", c, c)

    n = len(ch_mult)
    conv("encoder.conv_in", ch, 3, 3)
    block_in = ch
    for i, mult in enumerate(ch_mult):
        block_in = ch * ((1,) + tuple(ch_mult))[i]
        for j in range(num_res_blocks):
            resnet("encoder.down.%d.block.%d" % (i, j), block_in, ch * mult)
            block_in = ch * mult
        if i != n - 1:
            conv("encoder.down.%d.downsample.conv" % i, block_in, block_in, 3)
    mid("encoder.mid", block_in)
    norm("encoder.norm_out", block_in)
    conv("encoder.conv_out", 2 * z_channels, block_in, 3)
    conv("encoder.quant_conv", 2 * z_channels, 2 * z_channels, 1)
    dch = decoder_ch or ch
    conv("decoder.post_quant_conv", z_channels, z_channels, 1)
    block_in = dch * ch_mult[-1]
    conv("decoder.conv_in", block_in, z_channels, 3)
    mid("decoder.mid", block_in)
    for i in reversed(range(n)):
        for j in range(num_res_blocks + 1):
            resnet("decoder.up.%d.block.%d" % (i, j), block_in, dch * ch_mult[i])
            block_in = dch * ch_mult[i]
        if i != 0:
            conv("decoder.up.%d.upsample.conv" % i, block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", 3, block_in, 3)
    s["bn.running_mean"] = (4 * z_channels,)
    s["bn.running_var"] = (4 * z_channels,)
    s["bn.num_batches_tracked"] = ()
    return s


# ------------------------------------------------------------ text conditioning (klein)


def klein_context(hidden_states, layers=QWEN3_OUTPUT_LAYERS):
    """BFL Qwen3Embedder: torch.stack([hidden_states[k] for k in layers], dim=1) then
    "b c l d -> b l (c d)": feature c * D + d, layer-major ([h9 | h18 | h27]).
    hidden_states: HF output_hidden_states (index 0 = embeddings, k = output of layer k - 1)."""
    out = torch.stack([hidden_states[k] for k in layers], dim=1)
    B, C, L, D = out.shape
    return out.permute(0, 2, 1, 3).reshape(B, L, C * D)


def qwen3_hidden_states_masked(qwen3, tokens, attention_mask):
    """HF Qwen3Model's output_hidden_states for right-padded input with attention_mask (BFL passes
    it): causal attention where padded keys are masked out; positions stay 0..n-1. Uses the
    weights of a training/reference/qwen3.py Qwen3Model. Returns the list (embeddings first; the
    last entry final-normed, as HF)."""
    from reference import qwen3 as q3

    m = qwen3.model
    x = m.embed_tokens(tokens.long())
    n = tokens.shape[1]
    cos, sin = q3.rotary_cos_sin(n, qwen3.head_dim, qwen3.rope_theta, x.dtype)
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    masked = causal[None, None] | (attention_mask[:, None, None, :] == 0)
    hs = [x]
    for layer in m.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        b = h.shape[0]
        q = a.q_norm(a.q_proj(h).view(b, n, -1, a.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(h).view(b, n, -1, a.head_dim)).transpose(1, 2)
        v = a.v_proj(h).view(b, n, -1, a.head_dim).transpose(1, 2)
        q = q * cos + q3.rotate_half(q) * sin
        k = k * cos + q3.rotate_half(k) * sin
        g = a.heads // a.kv_heads
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = (q @ k.transpose(-1, -2) * a.head_dim ** -0.5).masked_fill(masked, float("-inf"))
        o = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, n, -1)
        x = x + a.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        hs.append(x)
    hs[-1] = m.norm(x)
    return hs


# ------------------------------------------------------------ sampling (BFL src/flux2/sampling.py)


def compute_empirical_mu(image_seq_len, num_steps):
    """BFL compute_empirical_mu (Python floats)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    b = m_200 - 200.0 * a
    return float(a * num_steps + b)


def generalized_time_snr_shift(t, mu, sigma):
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


def get_schedule(num_steps, image_seq_len):
    """BFL get_schedule: float32 linspace(1, 0, n + 1) shifted by exp(mu) / (exp(mu) + (1/t - 1)),
    mu = compute_empirical_mu(image tokens, steps). Returns the float32 tensor (BFL returns .tolist())."""
    mu = compute_empirical_mu(image_seq_len, num_steps)
    timesteps = torch.linspace(1, 0, num_steps + 1)
    return generalized_time_snr_shift(timesteps, mu, 1.0)


def denoise(model_fn, img, timesteps):
    """BFL denoise (distilled klein, no CFG): img += (t_prev - t_curr) * model(img, t_curr)."""
    for t_curr, t_prev in zip(timesteps[:-1], timesteps[1:]):
        img = img + (t_prev - t_curr) * model_fn(img, t_curr)
    return img


def denoise_cfg(model_fn_uncond, model_fn_cond, img, timesteps, guidance):
    """BFL denoise_cfg (klein base): pred = uncond + guidance * (cond - uncond), the empty prompt "" as
    the unconditional text."""
    for t_curr, t_prev in zip(timesteps[:-1], timesteps[1:]):
        u, c = model_fn_uncond(img, t_curr), model_fn_cond(img, t_curr)
        img = img + (t_prev - t_curr) * (u + guidance * (c - u))
    return img
