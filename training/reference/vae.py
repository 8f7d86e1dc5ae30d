"""PyTorch reference for ldm's AutoencoderKL (the SD1.x / SD2.x VAE).

Parameter names follow CompVis ldm (``ldm/modules/diffusionmodules/model.py``
Encoder/Decoder, ``ldm/models/autoencoder.py`` AutoencoderKL), so
``AutoencoderKL(...).state_dict()`` prefixed with ``first_stage_model.`` is a
single-file checkpoint's VAE. No attention outside the middle block
(attn_resolutions = [] as in SD), no dropout.

``encode(image)`` returns ``(mean, blocks)``: the mean of the latent
distribution (first z channels of quant_conv's output, unscaled) and the
outputs of "encoder.down.I" (after each level, including its downsample).
``decode(z)`` takes the unscaled latent and returns ``(image, blocks)`` with
"decoder.mid" and "decoder.up.I" (after each level, including its upsample);
the image is not clamped.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def normalize(channels):
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels, out_channels=None):
        super().__init__()
        out_channels = out_channels or in_channels
        self.norm1 = normalize(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = normalize(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)
        else:
            self.nin_shortcut = None

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        if self.nin_shortcut is not None:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = normalize(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        b, c, hh, ww = q.shape
        q = q.reshape(b, c, hh * ww).permute(0, 2, 1)  # b, hw, c
        k = k.reshape(b, c, hh * ww)  # b, c, hw
        w = torch.softmax(torch.bmm(q, k) * (int(c) ** -0.5), dim=2)  # b, hw(q), hw(k)
        v = v.reshape(b, c, hh * ww)
        h = torch.bmm(v, w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + self.proj_out(h)


class Downsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class Upsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    pass


class _Mid(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.block_1 = ResnetBlock(channels)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels)

    def forward(self, x):
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, in_channels, z_channels, double_z=True):
        super().__init__()
        self.num_levels = len(ch_mult)
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)
        in_mult = (1,) + tuple(ch_mult)
        self.down = nn.ModuleList()
        block_in = ch
        for i, mult in enumerate(ch_mult):
            level = _Level()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_in = ch * in_mult[i]
            block_out = ch * mult
            for _ in range(num_res_blocks):
                level.block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
            if i != self.num_levels - 1:
                level.downsample = Downsample(block_in)
            self.down.append(level)
        self.mid = _Mid(block_in)
        self.norm_out = normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, 2 * z_channels if double_z else z_channels, 3, padding=1)

    def forward(self, x, blocks):
        h = self.conv_in(x)
        for i, level in enumerate(self.down):
            for block in level.block:
                h = block(h)
            if i != self.num_levels - 1:
                h = level.downsample(h)
            blocks["encoder.down.%d" % i] = h
        h = self.mid(h)
        blocks["encoder.mid"] = h
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, out_channels, z_channels):
        super().__init__()
        self.num_levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = _Mid(block_in)
        up = []
        for i in reversed(range(self.num_levels)):
            level = _Level()
            level.block = nn.ModuleList()
            level.attn = nn.ModuleList()
            block_out = ch * ch_mult[i]
            for _ in range(num_res_blocks + 1):
                level.block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
            if i != 0:
                level.upsample = Upsample(block_in)
            up.insert(0, level)
        self.up = nn.ModuleList(up)
        self.norm_out = normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, 3, padding=1)

    def forward(self, z, blocks):
        h = self.conv_in(z)
        h = self.mid(h)
        blocks["decoder.mid"] = h
        for i in reversed(range(self.num_levels)):
            level = self.up[i]
            for block in level.block:
                h = block(h)
            if i != 0:
                h = level.upsample(h)
            blocks["decoder.up.%d" % i] = h
        return self.conv_out(swish(self.norm_out(h)))


class AutoencoderKL(nn.Module):
    """SD1/SD2 VAE: ch 128, ch_mult (1, 2, 4, 4), 2 res blocks, z 4. With quant_convs=False, BFL's Flux
    autoencoder (flux/modules/autoencoder.py): the same encoder and decoder, z 16, no quant convolutions
    (its scale 0.3611 and shift 0.1159 are applied outside, as here)."""

    def __init__(self, ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, image_channels=3, z_channels=4,
                 embed_dim=4, quant_convs=True):
        super().__init__()
        self.embed_dim = embed_dim if quant_convs else z_channels
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, image_channels, z_channels)
        self.decoder = Decoder(ch, ch_mult, num_res_blocks, image_channels, z_channels)
        if quant_convs:
            self.quant_conv = nn.Conv2d(2 * z_channels, 2 * embed_dim, 1)
            self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        else:
            self.quant_conv = self.post_quant_conv = None

    def encode(self, image):
        blocks = {}
        moments = self.encoder(image, blocks)
        if self.quant_conv is not None:
            moments = self.quant_conv(moments)
        return moments[:, : self.embed_dim], blocks

    def decode(self, z):
        blocks = {}
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        image = self.decoder(z, blocks)
        return image, blocks
