"""PyTorch reference for ControlNet (Zhang et al. 2023) as lllyasviel's
ControlNet repository builds it (cldm/cldm.py: ControlNet and
ControlledUnetModel), and sgm's SDXL variant (label_emb, per-level
transformer depths).

Parameter names follow cldm, so ``ControlNet(...).state_dict()`` prefixed
with ``control_model.`` is an original release (control_v11p_sd15_canny).
The encoder half reuses training/reference/unet.py's blocks; differences
from cldm that do not change the result: no dropout, no checkpointing, no
zero-init (callers set the weights; the zero convolutions are random here so
they matter in a test).

``ControlNet.forward(x, hint, t, context, y=None)`` returns the list of
residuals: one per input block (after its zero conv) and the middle block's
(after middle_block_out). ``controlled_unet(unet, x, t, context, control,
strength, y)`` is cldm's ControlledUnetModel.forward with ControlLDM's
control scales: every residual times ``strength``, the last added to the
middle block's output, the others to the skips the output blocks read.
"""

import torch
import torch.nn as nn

from reference.unet import Downsample, ResBlock, TimestepEmbedSequential, UNet, timestep_embedding

# cldm's input_hint_block widths: conv(hint, 16), conv(16, 16), conv(16, 32, s2),
# conv(32, 32), conv(32, 96, s2), conv(96, 96), conv(96, 256, s2), zero conv(256, C).
LDM_HINT_WIDTHS = (16, 16, 32, 32, 96, 96, 256)


class ControlNet(nn.Module):
    """cldm's ControlNet. The encoder half (time_embed, label_emb, input_blocks, middle_block) is
    built by training/reference/unet.py's UNet from the same arguments, as cldm's copy of
    UNetModel's constructor builds it; the decoder half is dropped."""

    def __init__(self, in_channels=4, hint_channels=3, model_channels=320, hint_widths=LDM_HINT_WIDTHS,
                 **unet_args):
        super().__init__()
        unet = UNet(in_channels=in_channels, out_channels=in_channels, model_channels=model_channels, **unet_args)
        self.model_channels = model_channels
        self.adm_in_channels = unet.adm_in_channels
        self.time_embed = unet.time_embed
        if unet.adm_in_channels:
            self.label_emb = unet.label_emb

        hint = []
        widths = list(hint_widths) + [model_channels]
        ch = hint_channels
        for k, w in enumerate(widths):
            hint.append(nn.Conv2d(ch, w, 3, padding=1, stride=2 if k in (2, 4, 6) else 1))
            if k + 1 < len(widths):
                hint.append(nn.SiLU())
            ch = w
        self.input_hint_block = TimestepEmbedSequential(*hint)

        def zero_conv(ch):
            return TimestepEmbedSequential(nn.Conv2d(ch, ch, 1))

        self.input_blocks = unet.input_blocks
        # Each input block's output channels: its last resnet's, or its
        # downsampler's, or input_blocks.0's convolution's.
        channels = []
        for block in self.input_blocks:
            layer = block[0]
            if isinstance(layer, ResBlock):
                channels.append(layer.out_layers[-1].out_channels)
            elif isinstance(layer, Downsample):
                channels.append(layer.op.out_channels)
            else:
                channels.append(layer.out_channels)
        self.zero_convs = nn.ModuleList([zero_conv(ch) for ch in channels])
        self.middle_block = unet.middle_block
        self.middle_block_out = zero_conv(channels[-1])

    def forward(self, x, hint, timesteps, context, y=None):
        if (y is None) != (not self.adm_in_channels):
            raise ValueError("y must be given exactly when the model has label_emb")
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        if y is not None:
            emb = emb + self.label_emb(y)
        guided_hint = self.input_hint_block(hint, emb, context)
        outs = []
        h = x
        for module, zero_conv in zip(self.input_blocks, self.zero_convs):
            if guided_hint is not None:
                h = module(h, emb, context)
                h = h + guided_hint
                guided_hint = None
            else:
                h = module(h, emb, context)
            outs.append(zero_conv(h, emb, context))
        h = self.middle_block(h, emb, context)
        outs.append(self.middle_block_out(h, emb, context))
        return outs


def controlled_unet(unet, x, timesteps, context, control, strength, y=None):
    """cldm's ControlledUnetModel.forward over training/reference/unet.py's UNet."""
    control = [c * strength for c in control]
    emb = unet.time_embed(timestep_embedding(timesteps, unet.model_channels).to(x.dtype))
    if y is not None:
        emb = emb + unet.label_emb(y)
    hs = []
    h = x
    for module in unet.input_blocks:
        h = module(h, emb, context)
        hs.append(h)
    h = unet.middle_block(h, emb, context)
    h = h + control.pop()
    for module in unet.output_blocks:
        h = torch.cat([h, hs.pop() + control.pop()], dim=1)
        h = module(h, emb, context)
    return unet.out(h)
