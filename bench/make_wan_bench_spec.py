#!/usr/bin/python3
"""Writes the spec of the all-in-one file kiln-bench times Wan 2.1 T2V 1.3B's step on at sd-cli's
size (832x480, 33 frames; docs/wan.md "Speed on the CPU"):

  - the whole 1.3B DiT (tests/fixtures/wan21_t2v_1_3b.spec: 30 blocks of width 1536, F16, under
    ComfyUI's model.diffusion_model.);
  - umT5-XXL at full width with 2 layers and a 512-token vocabulary (tests/fixtures/wan_medium.spec's
    text_encoders.umt5xxl.*): the encode is not what is timed;
  - the tiny Wan 2.1 VAE of the goldens (tests/golden/models/wan_vae_tiny.safetensors' names and
    shapes, under vae.): the same layout and 16 latent channels at a fraction of the width, so the
    clip's decode (19 minutes with the real VAE on 2 cores) does not swamp the run.

    /usr/bin/python3 bench/make_wan_bench_spec.py /tmp/wan_1_3b_bench.spec
    /usr/bin/python3 bench/write_spec_model.py /tmp/wan_1_3b_bench.spec /tmp/wan_1_3b_bench.safetensors
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16"}


def spec_lines(path, keep):
    return [line.rstrip("\n") for line in open(path) if not line.startswith("#") and line.strip() and keep(line)]


def safetensors_lines(path, prefix):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return ["%s%s %s %s" % (prefix, name, DTYPES[t["dtype"]], " ".join(str(d) for d in t["shape"]))
            for name, t in header.items() if name != "__metadata__"]


def main():
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    lines = spec_lines(os.path.join(fixtures, "wan21_t2v_1_3b.spec"), lambda line: True)
    lines += spec_lines(os.path.join(fixtures, "wan_medium.spec"),
                        lambda line: line.startswith("text_encoders.umt5xxl."))
    lines += safetensors_lines(os.path.join(ROOT, "tests", "golden", "models", "wan_vae_tiny.safetensors"), "vae.")
    with open(sys.argv[1], "w") as out:
        out.write("# name dtype shape (outermost first); written by bench/make_wan_bench_spec.py\n")
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
