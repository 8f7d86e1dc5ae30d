#!/usr/bin/python3
"""Writes a seeded random LoRA in kohya's format (lora_unet_<ldm path>.lora_down/lora_up/alpha)
for every matrix of a single-file SD checkpoint's UNet transformers (attention q/k/v/out,
feed-forward, linear proj_in/out), read from the file's safetensors header alone. For benchmarks
(bench/README.md: a step with 1 and 4 run-time LoRAs) and memory tests on large models; the
values mean nothing.

    /usr/bin/python3 training/make_random_lora.py MODEL.safetensors OUT.safetensors [--rank 32] [--seed 1]
"""

import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import safetensors_io  # noqa: E402

UNET = "model.diffusion_model."
MATRICES = (".attn1.to_q.", ".attn1.to_k.", ".attn1.to_v.", ".attn1.to_out.0.", ".attn2.to_q.", ".attn2.to_k.",
            ".attn2.to_v.", ".attn2.to_out.0.", ".ff.net.0.proj.", ".ff.net.2.")


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for name, info in sorted(header(args.model).items()):
        if name == "__metadata__" or not name.startswith(UNET) or not name.endswith(".weight"):
            continue
        shape = info["shape"]
        if len(shape) != 2 or not (any(m in name for m in MATRICES) or ".proj_in." in name or ".proj_out." in name):
            continue
        key = "lora_unet_" + name[len(UNET):-len(".weight")].replace(".", "_")
        out_dim, in_dim = shape
        tensors[key + ".lora_down.weight"] = (torch.randn(args.rank, in_dim, generator=gen) * in_dim ** -0.5).half()
        tensors[key + ".lora_up.weight"] = (torch.randn(out_dim, args.rank, generator=gen) * 0.01).half()
        tensors[key + ".alpha"] = torch.tensor(float(args.rank))
    safetensors_io.save_file(tensors, args.out)
    print("wrote %s: %d layers, rank %d, %.1f MB" % (args.out, len(tensors) // 3, args.rank,
                                                   os.path.getsize(args.out) / 1e6))


if __name__ == "__main__":
    main()
