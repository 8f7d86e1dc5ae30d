#!/usr/bin/python3
"""Writes two tiny random TAESD decoders and their outputs, computed with the
PyTorch reference (training/reference/taesd.py, madebyollin's Decoder), for
tests/unit/taesd_test.cpp.

    /usr/bin/python3 training/make_taesd_fixtures.py

Writes into tests/golden/models/:
  taesd_tiny.safetensors        4 latent channels, 8 channels, blocks (3, 3, 3, 1): TAESD's layout in
                                madebyollin's names ("1.weight", "3.conv.0.weight", ...)
  taef1_tiny.safetensors        16 latent channels (TAEF1's), 8 channels, blocks (2, 1, 1, 1), in
                                diffusers' AutoencoderTiny names ("decoder.layers.0.weight", ...)
  taesd_x4_tiny.safetensors     4 latent channels, 8 channels, blocks (1, 1, 1): 4x upscaling, for the
                                default model's 4x VAE (models/kiln-tiny.gguf), diffusers' names;
                                end-to-end tests only (no golden output)
  taesd_tiny_io.safetensors     for each (prefix taesd. and taef1.): latent [1, C, 5, 4] (values past
                                +-3, so the Clamp matters) and decoded [1, 3, 40, 32], the Decoder's
                                output (madebyollin's convention, about [0, 1], not clamped)

The weights are scaled up from PyTorch's default initialisation so that the
image is not all ReLU-zeroed and each layer changes the output.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import safetensors_io  # noqa: E402
from reference.taesd import Decoder, diffusers_names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "models")


def make(seed, latent_channels, blocks):
    torch.manual_seed(seed)
    decoder = Decoder(latent_channels, channels=8, blocks=blocks).double()
    with torch.no_grad():
        for p in decoder.parameters():
            p.mul_(1.5)
            if p.dim() == 1:
                p.add_(0.05)  # biases a little positive: fewer dead ReLUs
    latent = torch.randn(1, latent_channels, 5, 4, dtype=torch.float64) * 2.5
    with torch.no_grad():
        decoded = decoder(latent)
    weights = {k: v.float().contiguous() for k, v in decoder.state_dict().items()}
    return weights, latent.float(), decoded.float()


def main():
    taesd, taesd_latent, taesd_out = make(1, 4, (3, 3, 3, 1))
    taef1, taef1_latent, taef1_out = make(2, 16, (2, 1, 1, 1))
    taesd_x4, _, _ = make(3, 4, (1, 1, 1))
    safetensors_io.save_file(diffusers_names(taesd_x4), os.path.join(OUT, "taesd_x4_tiny.safetensors"))
    safetensors_io.save_file(taesd, os.path.join(OUT, "taesd_tiny.safetensors"))
    safetensors_io.save_file(diffusers_names(taef1), os.path.join(OUT, "taef1_tiny.safetensors"))
    safetensors_io.save_file(
        {
            "taesd.latent": taesd_latent.contiguous(),
            "taesd.decoded": taesd_out.contiguous(),
            "taef1.latent": taef1_latent.contiguous(),
            "taef1.decoded": taef1_out.contiguous(),
        },
        os.path.join(OUT, "taesd_tiny_io.safetensors"),
    )
    print("taesd: output range [%.3f, %.3f], taef1: [%.3f, %.3f]" %
          (taesd_out.min(), taesd_out.max(), taef1_out.min(), taef1_out.max()))


if __name__ == "__main__":
    main()
