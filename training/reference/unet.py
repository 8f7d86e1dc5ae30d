"""PyTorch reference for ldm's UNetModel as used by SD1.x / SD2.x, and sgm's
UNetModel as SDXL uses it (generative-models, diffusionmodules/openaimodel.py).

Parameter names follow CompVis ldm (``openaimodel.py`` / ``attention.py``), so
``UNet(...).state_dict()`` prefixed with ``model.diffusion_model.`` is a
single-file checkpoint's UNet. Differences from ldm that do not change the
result: no dropout, no checkpointing, no zero-init (callers set the weights),
GroupNorm computes in the input's dtype (ldm's GroupNorm32 upcasts to f32;
this module is meant to run in f32 or f64).

``forward(x, t, context, y=None)`` returns ``(out, blocks)`` where ``blocks``
maps "input_blocks.K", "middle_block", "output_blocks.K" to the output of that
block.

SDXL's additions, as sgm builds them: a transformer depth per level
(``transformer_depth=(0, 2, 10)``; the middle block takes the last level's
unless ``transformer_depth_middle`` says otherwise, 0 meaning sgm's
``disable_middle_transformer``, an Identity at middle_block.1), 64-wide heads
(``num_head_channels=64``), linear projections, and ``adm_in_channels``: a
``label_emb`` Sequential(Sequential(Linear(adm, 4C), SiLU, Linear(4C, 4C)))
whose output is added to the time embedding (num_classes="sequential").
``output_depths`` (one per output block) gives distilled variants (SSD-1B,
Vega) their per-block depths, which sgm's per-level list cannot express.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def timestep_embedding(timesteps, dim, max_period=10000):
    """ldm's sinusoidal embedding: cat([cos, sin]) (cos first)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = timesteps.to(torch.float64)[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def norm32(channels):
    return nn.GroupNorm(32, channels, eps=1e-5)


class TimestepEmbedSequential(nn.Sequential):
    def forward(self, x, emb, context):
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context)
            else:
                x = layer(x)
        return x


class ResBlock(nn.Module):
    def __init__(self, channels, emb_channels, out_channels=None):
        super().__init__()
        out_channels = out_channels or channels
        self.in_layers = nn.Sequential(norm32(channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(norm32(out_channels), nn.SiLU(), nn.Dropout(0.0),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1))
        if out_channels == channels:
            self.skip_connection = nn.Identity()
        else:
            self.skip_connection = nn.Conv2d(channels, out_channels, 1)

    def forward(self, x, emb):
        h = self.in_layers(x)
        h = h + self.emb_layers(emb)[:, :, None, None]
        h = self.out_layers(h)
        return self.skip_connection(x) + h


class Downsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim, heads, dim_head):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None):
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        b, n, inner = q.shape
        m = k.shape[1]
        d = inner // self.heads
        q = q.reshape(b, n, self.heads, d).transpose(1, 2)
        k = k.reshape(b, m, self.heads, d).transpose(1, 2)
        v = v.reshape(b, m, self.heads, d).transpose(1, 2)
        p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        o = torch.matmul(p, v).transpose(1, 2).reshape(b, n, inner)
        return self.to_out(o)


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        value, gate = self.proj(x).chunk(2, dim=-1)
        return value * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        inner = dim * mult
        self.net = nn.Sequential(GEGLU(dim, inner), nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x):
        return self.net(x)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, context_dim):
        super().__init__()
        self.attn1 = CrossAttention(dim, dim, heads, dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads, dim_head)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        x = self.ff(self.norm3(x)) + x
        return x


class SpatialTransformer(nn.Module):
    def __init__(self, in_channels, heads, dim_head, depth, context_dim, use_linear):
        super().__init__()
        inner = heads * dim_head
        self.use_linear = use_linear
        self.norm = nn.GroupNorm(32, in_channels, eps=1e-6)
        if use_linear:
            self.proj_in = nn.Linear(in_channels, inner)
        else:
            self.proj_in = nn.Conv2d(in_channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(inner, heads, dim_head, context_dim) for _ in range(depth)])
        if use_linear:
            self.proj_out = nn.Linear(inner, in_channels)
        else:
            self.proj_out = nn.Conv2d(inner, in_channels, 1)

    def forward(self, x, context):
        b, c, h, w = x.shape
        x_in = x
        x = self.norm(x)
        if not self.use_linear:
            x = self.proj_in(x)
        x = x.reshape(b, x.shape[1], h * w).transpose(1, 2)
        if self.use_linear:
            x = self.proj_in(x)
        for block in self.transformer_blocks:
            x = block(x, context)
        if self.use_linear:
            x = self.proj_out(x)
        x = x.transpose(1, 2).reshape(b, x.shape[2], h, w)
        if not self.use_linear:
            x = self.proj_out(x)
        return x + x_in


class UNet(nn.Module):
    """ldm UNetModel. ``attention_levels``: indices of levels with transformers
    (SD1/SD2: (0, 1, 2) of four). Heads: ``num_heads`` fixed per level, or,
    when ``num_head_channels`` > 0, channels // num_head_channels (SD2)."""

    def __init__(self, in_channels=4, out_channels=4, model_channels=320, channel_mult=(1, 2, 4, 4),
                 num_res_blocks=2, attention_levels=(0, 1, 2), num_heads=8, num_head_channels=-1,
                 transformer_depth=1, context_dim=768, use_linear_in_transformer=False,
                 transformer_depth_middle=None, adm_in_channels=None, output_depths=None):
        super().__init__()
        self.model_channels = model_channels
        ted = model_channels * 4
        self.time_embed = nn.Sequential(nn.Linear(model_channels, ted), nn.SiLU(), nn.Linear(ted, ted))
        self.adm_in_channels = adm_in_channels
        if adm_in_channels:
            self.label_emb = nn.Sequential(
                nn.Sequential(nn.Linear(adm_in_channels, ted), nn.SiLU(), nn.Linear(ted, ted)))
        if isinstance(transformer_depth, int):
            transformer_depth = [transformer_depth] * len(channel_mult)
        if transformer_depth_middle is None:
            transformer_depth_middle = transformer_depth[-1]
        output_depths = list(output_depths) if output_depths is not None else None

        def transformer(ch, depth):
            if num_head_channels > 0:
                heads, dim_head = ch // num_head_channels, num_head_channels
            else:
                heads, dim_head = num_heads, ch // num_heads
            return SpatialTransformer(ch, heads, dim_head, depth, context_dim, use_linear_in_transformer)

        self.input_blocks = nn.ModuleList(
            [TimestepEmbedSequential(nn.Conv2d(in_channels, model_channels, 3, padding=1))])
        skip_channels = [model_channels]
        ch = model_channels
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers = [ResBlock(ch, ted, mult * model_channels)]
                ch = mult * model_channels
                if level in attention_levels:
                    layers.append(transformer(ch, transformer_depth[level]))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                skip_channels.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch)))
                skip_channels.append(ch)

        middle = transformer(ch, transformer_depth_middle) if transformer_depth_middle else nn.Identity()
        self.middle_block = TimestepEmbedSequential(ResBlock(ch, ted), middle, ResBlock(ch, ted))

        self.output_blocks = nn.ModuleList()
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                layers = [ResBlock(ch + skip_channels.pop(), ted, model_channels * mult)]
                ch = model_channels * mult
                depth = output_depths[len(self.output_blocks)] if output_depths else transformer_depth[level]
                if level in attention_levels and depth:
                    layers.append(transformer(ch, depth))
                if level and i == num_res_blocks:
                    layers.append(Upsample(ch))
                self.output_blocks.append(TimestepEmbedSequential(*layers))

        self.out = nn.Sequential(norm32(ch), nn.SiLU(), nn.Conv2d(model_channels, out_channels, 3, padding=1))

    def forward(self, x, timesteps, context, y=None):
        if (y is None) != (not self.adm_in_channels):
            raise ValueError("y must be given exactly when the model has label_emb")
        blocks = {}
        emb = timestep_embedding(timesteps, self.model_channels).to(x.dtype)
        emb = self.time_embed(emb)
        if y is not None:
            emb = emb + self.label_emb(y)
        hs = []
        h = x
        for k, module in enumerate(self.input_blocks):
            h = module(h, emb, context)
            hs.append(h)
            blocks["input_blocks.%d" % k] = h
        h = self.middle_block(h, emb, context)
        blocks["middle_block"] = h
        for k, module in enumerate(self.output_blocks):
            h = torch.cat([h, hs.pop()], dim=1)
            h = module(h, emb, context)
            blocks["output_blocks.%d" % k] = h
        return self.out(h), blocks
