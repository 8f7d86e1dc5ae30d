"""The decoder of madebyollin's Tiny AutoEncoder (TAESD, TAESDXL, TAEF1),
written from taesd.py in https://github.com/madebyollin/taesd: an
nn.Sequential of Clamp, 3x3 convolutions, ReLUs, Blocks and 2x nearest
upsamples, whose state-dict keys are the Sequential's indices ("1.weight",
"3.conv.0.weight", ...). The original is fixed at 64 channels and the
(3, 3, 3, 1) block layout; `channels` and `blocks` are parameters here so
tests can use a small random one of the same structure.

diffusers' AutoencoderTiny (DecoderTiny) holds the same layers under
"decoder.layers.", one index lower (its Clamp is in forward(), not a layer),
and returns x * 2 - 1 instead of x; `diffusers_names` maps a state dict.
"""

import torch
import torch.nn as nn


def conv(n_in, n_out, **kwargs):
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class Block(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.conv = nn.Sequential(conv(n_in, n_out), nn.ReLU(), conv(n_out, n_out), nn.ReLU(), conv(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.fuse = nn.ReLU()

    def forward(self, x):
        return self.fuse(self.conv(x) + self.skip(x))


def Decoder(latent_channels=4, channels=64, blocks=(3, 3, 3, 1)):
    """madebyollin's Decoder(latent_channels) for channels=64, blocks=(3, 3, 3, 1)."""
    layers = [Clamp(), conv(latent_channels, channels), nn.ReLU()]
    for i, n in enumerate(blocks):
        layers += [Block(channels, channels) for _ in range(n)]
        if i + 1 < len(blocks):
            layers += [nn.Upsample(scale_factor=2), conv(channels, channels, bias=False)]
    layers.append(conv(channels, 3))
    return nn.Sequential(*layers)


def diffusers_names(state_dict):
    """madebyollin's keys ("3.conv.0.weight") as AutoencoderTiny's ("decoder.layers.2.conv.0.weight")."""
    out = {}
    for key, value in state_dict.items():
        index, rest = key.split(".", 1)
        out["decoder.layers.%d.%s" % (int(index) - 1, rest)] = value
    return out
