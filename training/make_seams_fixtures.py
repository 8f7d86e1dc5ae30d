#!/usr/bin/python3
"""Writes the golden fixture for seamless images (sd-cli's --circular, --circularx): the tiny random-weight
SD1 model's UNet and VAE (tests/golden/models/sd1_tiny.safetensors) with their convolutions padding
circularly, computed with the PyTorch reference modules in training/reference/.

Run with Debian's python3-torch, from anywhere:
    /usr/bin/python3 training/make_seams_fixtures.py [--out DIR]

The inputs are sd1_tiny_io.safetensors' (unet.x, unet.t, unet.context, vae.z, vae.image). Writes
tests/golden/pipeline/sd1_tiny_seams.safetensors (F32, PyTorch shapes, NCHW):
  unet.out.<seams>      [2, 4, 16, 16]: the UNet on those inputs
  vae.decoded.<seams>   [1, 3, 16, 16]: the VAE's decoder on vae.z
  vae.encoded.<seams>   [1, 4, 8, 8]:   the mean of the VAE's encoder on vae.image
for <seams> "xy" (both pairs of edges meet: --circular) and "x" (left and right only: --circularx).

How the edges wrap: every padded nn.Conv2d reads across a seam what PyTorch's padding_mode="circular" reads
(F.pad(mode="circular") on that axis), zeros across the other axis, as A1111's "Tiling" and ComfyUI's seamless
nodes patch every Conv2d. One deliberate choice beyond that, sd-cli's: the VAE encoder's downsampler, which
pads one column and one row with zeros before its stride-2 convolution (F.pad outside the Conv2d, which
A1111's patch leaves alone), pads across a seam with the first column or row too, as sd-cli's
--circular does.

Everything runs in float64 on the stored F16 weights widened; deterministic.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_model_fixtures import PRESETS, UNET_PREFIX, VAE_PREFIX, make_unet, make_vae  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import vae as vae_module  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny.safetensors")
MODEL_IO = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny_io.safetensors")
FILE_NAME = "sd1_tiny_seams.safetensors"


def pad_across_seams(x, left, right, top, bottom, seam_x, seam_y):
    """x padded by the given amounts: circularly on a seam's axis, with zeros on the other."""
    x = F.pad(x, (left, right, 0, 0), mode="circular" if seam_x else "constant")
    return F.pad(x, (0, 0, top, bottom), mode="circular" if seam_y else "constant")


def wrap_convolutions(module, seam_x, seam_y):
    """Every padded Conv2d of `module` pads across the seams (and with zeros elsewhere) itself."""
    for m in module.modules():
        if isinstance(m, torch.nn.Conv2d) and m.padding != (0, 0):
            ph, pw = m.padding

            def forward(x, m=m, ph=ph, pw=pw):
                return F.conv2d(pad_across_seams(x, pw, pw, ph, ph, seam_x, seam_y), m.weight, m.bias, m.stride, 0)

            m.forward = forward
        if isinstance(m, vae_module.Downsample):
            def downsample(x, m=m):
                return m.conv(pad_across_seams(x, 0, 1, 0, 1, seam_x, seam_y))

            m.forward = downsample


def load(seam_x, seam_y):
    weights, _ = safetensors_io.load_file(MODEL)
    spec = PRESETS["compact"]["sd1"]

    def sub(prefix):
        return {k[len(prefix):]: v.double() for k, v in weights.items() if k.startswith(prefix)}

    unet = make_unet(spec["unet"], 4, spec["clip"]["width"], linear=False).double()
    unet.load_state_dict(sub(UNET_PREFIX), strict=True)
    vae = make_vae(spec["vae"]).double()
    vae.load_state_dict(sub(VAE_PREFIX), strict=True)
    for m in (unet, vae):
        wrap_convolutions(m, seam_x, seam_y)
    return unet.eval(), vae.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "pipeline"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    io, _ = safetensors_io.load_file(MODEL_IO)
    out = {}
    with torch.no_grad():
        # Without seams the wrapped modules are the plain ones: they reproduce sd1_tiny_io.
        unet, vae = load(False, False)
        plain, _ = unet(io["unet.x"].double(), io["unet.t"].double(), io["unet.context"].double())
        assert float((plain.float() - io["unet.out"]).abs().max()) < 1e-5
        for name, seam_x, seam_y in (("xy", True, True), ("x", True, False)):
            unet, vae = load(seam_x, seam_y)
            u, _ = unet(io["unet.x"].double(), io["unet.t"].double(), io["unet.context"].double())
            decoded, _ = vae.decode(io["vae.z"].double())
            mean, _ = vae.encode(io["vae.image"].double())
            out["unet.out." + name] = u.float().contiguous()
            out["vae.decoded." + name] = decoded.float().contiguous()
            out["vae.encoded." + name] = mean.float().contiguous()
            print("%s: unet differs from the plain one by up to %.3f" % (name, float((u.float() - plain.float()).abs().max())))
    path = os.path.join(args.out, FILE_NAME)
    safetensors_io.save_file(out, path, {"source": "training/make_seams_fixtures.py"})
    print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
