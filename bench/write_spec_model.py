#!/usr/bin/python3
"""Writes the checkpoint a tensor spec describes (tests/fixtures/*.spec: "name dtype dim...",
outermost first) with seeded random weights, for kiln-bench runs on the full-width random models
the docs measure:

    /usr/bin/python3 bench/write_spec_model.py tests/fixtures/sd35_large_medium.spec /tmp/sd3.5_large_medium.safetensors

Matrices and convolutions ~N(0, 1/fan_in), 1-D tensors (norm scales) ~1, integers 0..n-1 along
the last axis (position ids). The tests write the same specs through tests/unit/random_model.h;
speed does not depend on the values as long as they are finite and of the same scale.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))

from reference import safetensors_io  # noqa: E402


def main():
    spec, out = sys.argv[1], sys.argv[2]
    entries = []
    for line in open(spec):
        if line.startswith("#") or not line.strip():
            continue
        name, dtype, *dims = line.split()
        entries.append((name, safetensors_io.TORCH_DTYPES[dtype], tuple(int(d) for d in dims)))
    gen = torch.Generator().manual_seed(0)
    shapes = {name: (dtype, shape) for name, dtype, shape in entries}
    with safetensors_io.StreamWriter(out, entries, {"kiln.bench.spec": os.path.basename(spec)}) as w:
        for name in w.order:
            dtype, shape = shapes[name]
            if not dtype.is_floating_point:
                t = torch.arange(shape[-1]).expand(shape).to(dtype) if shape else torch.zeros((), dtype=dtype)
            elif len(shape) >= 2:
                fan_in = 1
                for d in shape[1:]:
                    fan_in *= d
                t = (torch.randn(shape, generator=gen) * fan_in ** -0.5).to(dtype)
            else:
                t = (1.0 + 0.02 * torch.randn(shape, generator=gen)).to(dtype)
            w.write(name, t.contiguous())
    print("wrote %s (%.1f GB)" % (out, os.path.getsize(out) / 1e9))


if __name__ == "__main__":
    main()
