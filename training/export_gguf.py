#!/usr/bin/python3
"""Writes models/kiln-tiny.gguf from a training run (final.pt; the VAE from
vae_decoder.pt when stage 4 ran).

    /usr/bin/python3 training/export_gguf.py [--run /tmp/kiln-train] [--out models/kiln-tiny.gguf]

GGUF v3, written by hand (no gguf package here): "GGUF", version 3, tensor
count, key/value count, the key/value pairs, the tensor infos (name, n_dims,
ne innermost first, ggml type, offset), padding to general.alignment (32), the
tensor data (each tensor padded to 32 bytes).

Tensor names are SD1 single-file names: cond_stage_model.transformer.*,
model.diffusion_model.*, first_stage_model.*. Matrices, embeddings and conv
kernels are F16; 1-D tensors (biases, norm weights) F32.
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_model as tm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALIGN = 32
GGML_F32, GGML_F16 = 0, 1
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9

# Generation defaults carried in the file (kiln reads kiln.default.*).
DEFAULTS = {
    "kiln.default.width": 64,
    "kiln.default.height": 64,
    "kiln.default.steps": 20,
    "kiln.default.cfg_scale": 2.0,
    "kiln.default.sampler": "euler_a",
    "kiln.default.scheduler": "discrete",
}


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(v):
    """(type, bytes) for a Python value: str, bool, int (i32/u32), float (f32), list of str."""
    if isinstance(v, bool):
        return T_BOOL, struct.pack("<B", 1 if v else 0)
    if isinstance(v, str):
        return T_STRING, gguf_string(v)
    if isinstance(v, int):
        if v < 0:
            return T_INT32, struct.pack("<i", v)
        return T_UINT32, struct.pack("<I", v)
    if isinstance(v, float):
        return T_FLOAT32, struct.pack("<f", v)
    if isinstance(v, (list, tuple)):
        assert all(isinstance(x, str) for x in v), "only arrays of strings are written"
        return T_ARRAY, struct.pack("<IQ", T_STRING, len(v)) + b"".join(gguf_string(x) for x in v)
    raise TypeError("unsupported metadata value %r" % (v,))


def pad(n):
    return (ALIGN - n % ALIGN) % ALIGN


def write_gguf(path, metadata, tensors):
    """metadata: dict key -> value; tensors: list of (name, numpy array f16/f32)."""
    out = bytearray()
    out += b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        t, b = gguf_value(v)
        out += gguf_string(k) + struct.pack("<I", t) + b
    offset = 0
    blobs = []
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        gtype = {np.dtype(np.float16): GGML_F16, np.dtype(np.float32): GGML_F32}[arr.dtype]
        ne = list(reversed(arr.shape)) or [1]
        out += gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", gtype, offset)
        data = arr.tobytes()
        blobs.append(data + b"\0" * pad(len(data)))
        offset += len(blobs[-1])
    out += b"\0" * pad(len(out))
    with open(path + ".tmp", "wb") as f:
        f.write(out)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def to_numpy(name, t):
    t = t.detach().to(torch.float32)
    if t.dim() >= 2:
        return t.numpy().astype(np.float16)
    return t.numpy().astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="/tmp/kiln-train", help="training run folder holding final.pt")
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "kiln-tiny.gguf"))
    ap.add_argument("--cfg-scale", type=float, default=DEFAULTS["kiln.default.cfg_scale"])
    ap.add_argument("--steps", type=int, default=DEFAULTS["kiln.default.steps"])
    ap.add_argument("--sampler", default=DEFAULTS["kiln.default.sampler"])
    ap.add_argument("--scheduler", default=DEFAULTS["kiln.default.scheduler"])
    args = ap.parse_args()

    ck = torch.load(os.path.join(args.run, "final.pt"))
    cfg = ck["config"]
    dec = os.path.join(args.run, "vae_decoder.pt")
    if os.path.exists(dec):  # stage 4's fine-tuned decoder (same encoder, same latent space)
        ck["vae"] = torch.load(dec)["model"]
        print("VAE from %s" % dec)
    tensors = []
    for prefix, sd in ((tm.CLIP_PREFIX, ck["clip"]), (tm.UNET_PREFIX, ck["unet"]), (tm.VAE_PREFIX, ck["vae"])):
        for k, v in sd.items():
            tensors.append((prefix + k, to_numpy(k, v)))
    tensors.sort(key=lambda nt: nt[0])
    meta = {
        "general.architecture": "kiln-sd1",
        "general.name": "kiln-tiny",
        "general.description": "kiln's default model: a tiny SD1-architecture text-to-image model of coloured "
                               "shapes, trained by training/train_tiny.py",
        "general.alignment": ALIGN,
        "kiln.unet.heads": int(cfg["unet"]["num_heads"]),
        "kiln.clip.heads": int(cfg["clip"]["heads"]),
        "kiln.vae.scale_factor": float(ck["scale_factor"]),
        "kiln.prediction": "eps",
        "kiln.default.width": DEFAULTS["kiln.default.width"],
        "kiln.default.height": DEFAULTS["kiln.default.height"],
        "kiln.default.steps": int(args.steps),
        "kiln.default.cfg_scale": float(args.cfg_scale),
        "kiln.default.sampler": args.sampler,
        "kiln.default.scheduler": args.scheduler,
        "tokenizer.ggml.model": "clip",
        "tokenizer.ggml.tokens": list(ck["tokens"]),
        "tokenizer.ggml.merges": list(ck["merges"]),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_gguf(args.out, meta, tensors)
    n = sum(a.size for _, a in tensors)
    print("wrote %s: %d tensors, %d parameters, %d bytes (%.2f MiB); scale factor %.5f" % (
        args.out, len(tensors), n, os.path.getsize(args.out), os.path.getsize(args.out) / 2 ** 20,
        ck["scale_factor"]))


if __name__ == "__main__":
    main()
