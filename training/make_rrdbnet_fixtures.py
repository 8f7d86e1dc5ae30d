#!/usr/bin/python3
"""Writes small random RRDBNets (ESRGAN / Real-ESRGAN upscalers) and their
golden outputs for tests/unit/rrdbnet_test.cpp, computed with the PyTorch
reference in training/reference/rrdbnet.py.

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_rrdbnet_fixtures.py [--out DIR]

Writes into tests/golden/models/:
  rrdbnet_x4.safetensors        x4: two upsamplers, original ESRGAN names (model.N)
  rrdbnet_x2.safetensors        x2: Real-ESRGAN x2plus's form (pixel unshuffle 2,
                                two upsamplers), original ESRGAN names
  rrdbnet_x4_basicsr.pth        the x4 network again in BasicSR's names under
                                "params_ema", saved by torch.save as Real-ESRGAN's
                                .pth files are
  rrdbnet_io.safetensors        "input" [1, 3, 10, 12] in [0, 1], "x4_output"
                                [1, 3, 40, 48], "x2_output" [1, 3, 20, 24]

Networks: 8 features, growth 4, 2 RRDBs, F32 weights. The reference runs in
float64 from the stored F32 weights and is stored as F32. Seeded: running
twice gives the same tensors.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import safetensors_io  # noqa: E402
from reference.rrdbnet import RRDBNet  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

NF, GC, NB = 8, 4, 2
H, W = 10, 12


def make(seed, unshuffle, x):
    torch.manual_seed(seed)
    net = RRDBNet(in_nc=3, out_nc=3, nf=NF, nb=NB, gc=GC, upsamplers=2, unshuffle=unshuffle)
    with torch.no_grad():
        # Default init, but biases nonzero enough to matter.
        for name, p in net.named_parameters():
            if name.endswith(".bias"):
                p.uniform_(-0.1, 0.1)
        # Then conv_last rescaled per channel so the output on `x` has mean
        # 0.5 and deviation 0.2: an image in [0, 1] whose 8-bit form is not
        # flat, for tests that compare pictures.
        out = net.eval()(x)
        mean, std = out.mean(dim=(0, 2, 3)), out.std(dim=(0, 2, 3))
        gain = 0.2 / std
        net.conv_last.bias.copy_(0.5 - gain * (mean - net.conv_last.bias))
        net.conv_last.weight.mul_(gain.view(-1, 1, 1, 1))
    return net.eval()


def esrgan_state(net):
    names = net.esrgan_names()
    return {names[k]: v.detach().float().contiguous() for k, v in net.state_dict().items()}


def run(net, x):
    ref = make_copy(net).double()
    with torch.no_grad():
        return ref(x.double()).float()


def make_copy(net):
    copy = RRDBNet(3, 3, NF, NB, GC, net.upsamplers, net.unshuffle)
    copy.load_state_dict(net.state_dict())
    return copy.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(1403)
    x = torch.rand(1, 3, H, W)
    x4 = make(1401, 1, x)
    x2 = make(1402, 2, x)
    assert x4.scale() == 4 and x2.scale() == 2

    safetensors_io.save_file(esrgan_state(x4), os.path.join(args.out, "rrdbnet_x4.safetensors"))
    safetensors_io.save_file(esrgan_state(x2), os.path.join(args.out, "rrdbnet_x2.safetensors"))
    basicsr = {k: v.detach().float().contiguous() for k, v in x4.state_dict().items()}
    torch.save({"params_ema": basicsr}, os.path.join(args.out, "rrdbnet_x4_basicsr.pth"))

    io = {"input": x, "x4_output": run(x4, x), "x2_output": run(x2, x)}
    safetensors_io.save_file(io, os.path.join(args.out, "rrdbnet_io.safetensors"))
    for name, t in io.items():
        print("%-10s %s  min %.4f max %.4f" % (name, list(t.shape), t.min().item(), t.max().item()))


if __name__ == "__main__":
    main()
