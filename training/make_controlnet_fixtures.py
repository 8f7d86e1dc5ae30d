#!/usr/bin/python3
"""Writes tiny random-weight ControlNets matching the UNets of
tests/golden/models/sd1_tiny.safetensors and sdxl_tiny.safetensors, with
golden residuals and the controlled UNet's output, computed with
training/reference/controlnet.py.

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_controlnet_fixtures.py [--out DIR]

Writes into tests/golden/models/:
  controlnet_sd1_tiny.safetensors     control_model.* (cldm names), F16 as real
                                      releases (references use them widened), with
                                      sd1_tiny's head metadata
  controlnet_sd1_tiny_io.safetensors  inputs (x, hint, t, context), the
                                      residuals control.residual.K and the
                                      UNet's output with them at strength 0.9
  controlnet_sdxl_tiny(_io).safetensors  the same for sdxl_tiny's UNet (sgm's
                                      SDXL layout: label_emb, per-level depths,
                                      linear projections, 16-wide heads); the
                                      inputs add y, its context and y are
                                      sdxl_tiny_io's

The ControlNet has sd1_tiny's UNet shape (model_channels 32, channel_mult
(1, 2), one resnet per level, attention at both levels, 2 heads, context 64)
and a narrow input_hint_block (widths 8, 8, 16, 16, 32, 32, 32; kiln reads
them from the weights). The UNet's weights are sd1_tiny's own (F16, widened).
References are computed in float64 and stored as F32. Seeded: running twice
gives byte-identical files.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_sdxl_fixtures  # noqa: E402
from make_model_fixtures import UNET_COMMON, UNET_PREFIX, f32, randomize, save_fixture_pair  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.controlnet import ControlNet, controlled_unet  # noqa: E402
from reference.unet import UNet  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")
SD1_TINY = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny.safetensors")
SDXL_TINY = os.path.join(ROOT, "tests", "golden", "models", "sdxl_tiny.safetensors")
SDXL_TINY_IO = os.path.join(ROOT, "tests", "golden", "models", "sdxl_tiny_io.safetensors")

CONTEXT = 64
SHAPE = dict(model_channels=32, channel_mult=(1, 2), num_res_blocks=1, attention_levels=(0, 1), num_heads=2,
             transformer_depth=1, context_dim=CONTEXT)
HINT_WIDTHS = (8, 8, 16, 16, 32, 32, 32)
STRENGTH = 0.9
SEED = 1400


def load_unet(path, **config):
    tensors, _ = safetensors_io.load_file(path)
    unet = UNet(**config)
    state = {k[len(UNET_PREFIX):]: v.to(torch.float32) for k, v in tensors.items() if k.startswith(UNET_PREFIX)}
    unet.load_state_dict(state)
    return unet


def write_fixture(out_dir, name, unet, net_config, metadata, seed, x, hint, t, context, y=None):
    """Random ControlNet weights for `net_config`, its residuals and `unet` controlled by them."""
    net = ControlNet(hint_channels=3, hint_widths=HINT_WIDTHS, **net_config)
    stored = randomize(net, seed, torch.float16)
    ckpt = {"control_model." + k: v for k, v in stored.items()}
    net, unet = net.double().eval(), unet.double().eval()
    yd = None if y is None else y.double()
    with torch.no_grad():
        residuals = net(x.double(), hint.double(), t.double(), context.double(), yd)
        out = controlled_unet(unet, x.double(), t.double(), context.double(), list(residuals), STRENGTH, yd)
        plain, _ = unet(x.double(), t.double(), context.double(), yd)
        zero = controlled_unet(unet, x.double(), t.double(), context.double(), list(residuals), 0.0, yd)
    assert torch.equal(zero, plain), "strength 0 must be the plain UNet"
    assert (out - plain).abs().max() > 1e-2 * plain.abs().max(), "the control must change the output"
    io = {"x": x, "hint": hint, "t": t, "context": context, "strength": torch.tensor([STRENGTH]),
          "unet.controlled": f32(out)}
    if y is not None:
        io["y"] = f32(y)
    for k, r in enumerate(residuals):
        io["control.residual.%d" % k] = f32(r)
    save_fixture_pair(out_dir, name, ckpt, io, "training/make_controlnet_fixtures.py",
                      "NCHW, [batch, tokens, width]; the UNet is %s.safetensors'" % name.replace("controlnet_", ""),
                      ckpt_metadata=metadata, max_bytes=3 << 19)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)

    unet = load_unet(SD1_TINY, in_channels=4, context_dim=CONTEXT, use_linear_in_transformer=False,
                     **dict(UNET_COMMON, channel_mult=(1, 2)))
    x = torch.randn(2, 4, 8, 8, generator=gen)
    hint = torch.rand(2, 3, 64, 64, generator=gen)  # RGB in [0, 1], 8x the latent
    t = torch.tensor([981.0, 1.0])
    context = torch.randn(2, 77, CONTEXT, generator=gen)
    write_fixture(args.out, "controlnet_sd1_tiny", unet, dict(in_channels=4, **SHAPE), {"kiln.unet.heads": "2"},
                  SEED + 2, x, hint, t, context)

    sdxl_io, _ = safetensors_io.load_file(SDXL_TINY_IO)
    context, y = sdxl_io["unet.context"], sdxl_io["unet.y"]
    config = dict(make_sdxl_fixtures.UNET, context_dim=context.shape[-1], adm_in_channels=y.shape[-1])
    unet = load_unet(SDXL_TINY, **config)
    net_config = {k: v for k, v in config.items() if k not in ("out_channels", "output_depths")}
    x = torch.randn(2, 4, 8, 8, generator=gen)
    hint = torch.rand(2, 3, 64, 64, generator=gen)
    write_fixture(args.out, "controlnet_sdxl_tiny", unet, net_config, {"kiln.unet.head_channels": "16"},
                  SEED + 3, x, hint, t, context, y)


if __name__ == "__main__":
    main()
