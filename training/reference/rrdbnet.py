"""ESRGAN's RRDBNet, written from the definitions in xinntao/ESRGAN
(RRDBNet_arch.py, the "new arch") and XPixelGroup/BasicSR
(basicsr/archs/rrdbnet_arch.py, used by Real-ESRGAN), for kiln's golden
fixtures. Plain PyTorch, no package.

    feat = conv_first(pixel_unshuffle(x, r))      (r = 1: no unshuffle)
    feat = feat + conv_body(RRDB_1(...RRDB_nb(feat)))
    for each upsampler: feat = lrelu(conv_up_k(nearest_2x(feat)))
    out  = conv_last(lrelu(conv_hr(feat)))

An RRDB is three residual dense blocks, out = rdb3(rdb2(rdb1(x))) * 0.2 + x;
a residual dense block is five 3x3 convolutions over the concatenation of
its input and every earlier output (growth `gc` channels each, leaky ReLU
0.2 after the first four), out = conv5(...) * 0.2 + x.

BasicSR's RRDBNet always has two upsamplers and reaches x2 and x1 by pixel
unshuffle (r = 2, 4) of the input; ESRGAN's original networks have one
upsampler per factor 2 and no unshuffle. `upsamplers` and `unshuffle` cover
both.

Names: state_dict() gives BasicSR's names (conv_first, body.N.rdb1.conv1,
conv_body, conv_up1, conv_up2, conv_hr, conv_last); esrgan_names() maps them
to the original ESRGAN checkpoint names (model.0, model.1.sub.N.RDB1.conv1.0,
model.1.sub.<nb>, model.3, model.6, ..., model.<3u+2>, model.<3u+4>).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def pixel_unshuffle(x, r):
    b, c, h, w = x.shape
    x = x.view(b, c, h // r, r, w // r, r)
    return x.permute(0, 1, 3, 5, 2, 4).reshape(b, c * r * r, h // r, w // r)


class ResidualDenseBlock(nn.Module):
    def __init__(self, nf, gc):
        super().__init__()
        self.conv1 = nn.Conv2d(nf, gc, 3, 1, 1)
        self.conv2 = nn.Conv2d(nf + gc, gc, 3, 1, 1)
        self.conv3 = nn.Conv2d(nf + 2 * gc, gc, 3, 1, 1)
        self.conv4 = nn.Conv2d(nf + 3 * gc, gc, 3, 1, 1)
        self.conv5 = nn.Conv2d(nf + 4 * gc, nf, 3, 1, 1)

    def forward(self, x):
        lrelu = lambda t: F.leaky_relu(t, 0.2)  # noqa: E731
        x1 = lrelu(self.conv1(x))
        x2 = lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, nf, gc):
        super().__init__()
        self.rdb1 = ResidualDenseBlock(nf, gc)
        self.rdb2 = ResidualDenseBlock(nf, gc)
        self.rdb3 = ResidualDenseBlock(nf, gc)

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    def __init__(self, in_nc=3, out_nc=3, nf=64, nb=23, gc=32, upsamplers=2, unshuffle=1):
        super().__init__()
        self.unshuffle = unshuffle
        self.conv_first = nn.Conv2d(in_nc * unshuffle * unshuffle, nf, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(nf, gc) for _ in range(nb)])
        self.conv_body = nn.Conv2d(nf, nf, 3, 1, 1)
        self.upsamplers = upsamplers
        for k in range(upsamplers):
            setattr(self, "conv_up%d" % (k + 1), nn.Conv2d(nf, nf, 3, 1, 1))
        self.conv_hr = nn.Conv2d(nf, nf, 3, 1, 1)
        self.conv_last = nn.Conv2d(nf, out_nc, 3, 1, 1)

    def scale(self):
        return 2**self.upsamplers // self.unshuffle

    def forward(self, x):
        lrelu = lambda t: F.leaky_relu(t, 0.2)  # noqa: E731
        if self.unshuffle > 1:
            x = pixel_unshuffle(x, self.unshuffle)
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        for k in range(self.upsamplers):
            up = getattr(self, "conv_up%d" % (k + 1))
            feat = lrelu(up(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(lrelu(self.conv_hr(feat)))

    def esrgan_names(self):
        """BasicSR name -> original ESRGAN name, for every tensor."""
        nb = len(self.body)
        names = {}
        for name in self.state_dict():
            module, _, kind = name.rpartition(".")
            parts = module.split(".")
            if parts[0] == "conv_first":
                new = "model.0"
            elif parts[0] == "body":
                # body.N.rdbK.convJ -> model.1.sub.N.RDBK.convJ.0
                new = "model.1.sub.%s.RDB%s.%s.0" % (parts[1], parts[2][3:], parts[3])
            elif parts[0] == "conv_body":
                new = "model.1.sub.%d" % nb
            elif parts[0].startswith("conv_up"):
                new = "model.%d" % (3 * int(parts[0][7:]))
            elif parts[0] == "conv_hr":
                new = "model.%d" % (3 * self.upsamplers + 2)
            elif parts[0] == "conv_last":
                new = "model.%d" % (3 * self.upsamplers + 4)
            else:
                raise ValueError(name)
            names[name] = new + "." + kind
        return names
