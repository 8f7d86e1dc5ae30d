#!/usr/bin/python3
"""Writes a tiny random-weight Z-Image DiT and its golden inputs/outputs,
computed with training/reference/z_image.py, for
tests/unit/z_image_dit_test.cpp.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_z_image_fixtures.py [--out DIR]

Writes into tests/golden/models/:
  z_image_tiny.safetensors            the single-file (ComfyUI) names, as
                                      z_image_turbo_bf16.safetensors: x_embedder,
                                      attention.qkv / out / q_norm / k_norm,
                                      final_layer.*; no prefix
  z_image_tiny_diffusers.safetensors  the same weights in the original's and
                                      diffusers' transformer/ names (to_q, to_k,
                                      to_v, to_out.0, norm_q, norm_k,
                                      all_x_embedder.2-1, all_final_layer.2-1)
  z_image_tiny_io.safetensors         inputs, per-layer outputs and velocities (F32)

The model: dim 64, 2 heads of 32 (RoPE axes 8, 12, 12: metadata
"kiln.z_image.axes_dim"), FFN 170 (int(dim / 3 * 8)), 1 noise refiner, 1
context refiner and 2 main layers, caption width 48 (Qwen3-4B's 2560 in the
real model), 16 latent channels in 2x2 patches, t_embedder 256 -> 64 -> 64
(min(dim, 256)). Weights are BF16 as released; the reference runs in float64 on
exactly the stored values, so a C++ run with the weights widened to F32 agrees
to ~1e-5 relative.

Cases (prefix of the io names), each with x [B, 16, H, W], sigma [B], the
captions zero-padded to the batch's longest as context [B, T, 48] and their
lengths caption_lengths [B] (I32), the velocity out [B, 16, H, W]
(-model(x, 1 - sigma)), and for "batch." and "even." every block's output
block.<name> in kiln's token layout with caption_valid [B, Tp], and the
host tables: rope.cos / rope.sin [B, Np + Tp, head_dim / 2] and the key mask
mask [B, Np + Tp]:
  batch.   B 2, latent 6x10 (15 image tokens: 17 pad tokens), captions of 7
           and 37 tokens (padded to 32 and 64: batch padding masked)
  even.    B 2, latent 8x8 (16 image tokens), captions of 5 and 20 tokens
           (both padded to 32: no mask needed)
  exact.   B 1, latent 8x16 (32 image tokens), a caption of 32 tokens: no pads

Before writing, the script checks the reference against facts that do not
depend on it: patchify inverts and puts the channel fastest, RoPE is a
rotation of each pair (complex multiplication) whose scores depend only on
relative positions, and an item's velocity does not depend on the other items
of its batch (the masking of batch padding).

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import z_image as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 900
DTYPE = torch.bfloat16
TINY = dict(in_channels=16, dim=64, n_layers=2, n_noise_refiner=1, n_context_refiner=1, n_heads=2, norm_eps=1e-5,
            cap_feat_dim=48, axes_dims=(8, 12, 12), rope_theta=256.0, t_scale=1000.0, t_mid=64)
METADATA = {"kiln.z_image.axes_dim": "8,12,12"}
# name: (latent H, W, caption lengths, sigmas, per-block outputs)
CASES = {
    "batch.": (6, 10, [7, 37], [1.0, 0.35], True),
    "even.": (8, 8, [5, 20], [0.6, 0.1], True),
    "exact.": (8, 16, [32], [0.5], False),
}


def init_value(name, shape, gen):
    if name.endswith("pad_token"):
        return torch.randn(shape, generator=gen)
    if len(shape) >= 2:
        return torch.randn(shape, generator=gen) * shape[1] ** -0.5
    if "norm" in name:  # RMSNorm weights
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


def randomize(module, seed):
    """Seeded BF16 weights in state_dict order; loads the widened values into `module`."""
    gen = torch.Generator().manual_seed(seed)
    stored = {k: init_value(k, v.shape, gen).to(DTYPE).contiguous() for k, v in module.state_dict().items()}
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()})
    return stored


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def velocity(model, x, sigma, captions):
    with torch.no_grad():
        return ref.velocity(model, x.double(), sigma.double(), [c.double() for c in captions])


# ------------------------------------------------------------ self-checks


def check_reference(model, gen):
    # patchify / unpatchify are inverses; a token holds (ph, pw, c) with c fastest.
    lat = torch.randn(2, 3, 4, 6, generator=gen, dtype=torch.float64)
    tokens = ref.patchify(lat)
    assert torch.equal(ref.unpatchify(tokens, 2, 3), lat)
    assert torch.equal(tokens[1, 1 * 3 + 2], lat[1, :, 2:4, 4:6].permute(1, 2, 0).reshape(-1))  # row 1, col 2
    # RoPE rotates (x[2j], x[2j+1]) by its angle; scores depend on position differences only.
    ids = torch.tensor([[[3, 0, 0], [9, 2, 1], [0, 0, 0]]])
    x = torch.randn(1, 3, 2, 32, generator=gen, dtype=torch.float64)
    angles = ref.rope_angles(ids, model.axes_dims, model.theta)[:, :, None, :]
    rotated = ref.apply_rotary(x, model.rope(ids))
    expect_even = x[..., 0::2] * torch.cos(angles) - x[..., 1::2] * torch.sin(angles)
    expect_odd = x[..., 0::2] * torch.sin(angles) + x[..., 1::2] * torch.cos(angles)
    assert torch.allclose(rotated[..., 0::2], expect_even, atol=1e-12)
    assert torch.allclose(rotated[..., 1::2], expect_odd, atol=1e-12)
    k = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    shifted = ids + torch.tensor([4, 1, 2])
    scores = torch.einsum("blhd,bmhd->bhlm", rotated, ref.apply_rotary(k, model.rope(ids)))
    scores2 = torch.einsum("blhd,bmhd->bhlm", ref.apply_rotary(x, model.rope(shifted)),
                           ref.apply_rotary(k, model.rope(shifted)))
    assert torch.allclose(scores, scores2, atol=1e-4)  # angles are rounded to float32


def check_batch_independence(model, x, sigma, captions):
    """Each item's velocity alone equals its velocity in the batch (the mask works)."""
    batch, _, _ = velocity(model, x, sigma, captions)
    for b in range(x.shape[0]):
        alone, _, _ = velocity(model, x[b:b + 1], sigma[b:b + 1], captions[b:b + 1])
        assert torch.allclose(alone[0], batch[b], atol=1e-10), "item %d depends on its batch" % b


# ------------------------------------------------------------ fixtures


def build(seed):
    """Returns (checkpoint tensors (original names), io tensors)."""
    model = ref.ZImage(**TINY)
    ckpt = randomize(model, seed)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    check_reference(model, gen)

    io = {}
    for prefix, (H, W, lengths, sigmas, with_blocks) in CASES.items():
        B, T = len(lengths), max(lengths)
        x = torch.randn(B, TINY["in_channels"], H, W, generator=gen)
        captions = [torch.randn(n, TINY["cap_feat_dim"], generator=gen) for n in lengths]
        sigma = torch.tensor(sigmas)
        context = torch.zeros(B, T, TINY["cap_feat_dim"])
        for b, c in enumerate(captions):
            context[b, :c.shape[0]] = c
        if B > 1:
            check_batch_independence(model, x, sigma, captions)
        v, blocks, tables = velocity(model, x, sigma, captions)
        io.update({prefix + "x": x, prefix + "sigma": sigma, prefix + "context": context,
                   prefix + "caption_lengths": torch.tensor(lengths, dtype=torch.int32), prefix + "out": f32(v)})
        if with_blocks:
            io[prefix + "caption_valid"] = f32(tables["caption_valid"])
            io[prefix + "rope.cos"] = f32(tables["rope"].real)
            io[prefix + "rope.sin"] = f32(tables["rope"].imag)
            io[prefix + "mask"] = f32(tables["mask"])
            for name, value in blocks.items():
                io[prefix + "block." + name] = f32(value)
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    ckpt, io = build(SEED)
    mmf.save_fixture_pair(args.out, "z_image_tiny", ref.comfy_names(ckpt), io, "training/make_z_image_fixtures.py",
                          "NCHW, [batch, tokens, width]", METADATA, max_bytes=1 << 20)
    path = os.path.join(args.out, "z_image_tiny_diffusers.safetensors")
    safetensors_io.save_file(ckpt, path, dict(METADATA))
    mmf.log("wrote %s: %d tensors" % (os.path.relpath(path, ROOT), len(ckpt)))


if __name__ == "__main__":
    main()
