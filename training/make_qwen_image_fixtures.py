#!/usr/bin/python3
"""Writes a tiny random-weight Qwen-Image DiT with diffusers' tensor names and
its golden inputs and outputs, computed with training/reference/qwen_image.py
(transcribed from diffusers' transformer_qwenimage.py and the Qwen-Image
pipelines).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_qwen_image_fixtures.py [--out DIR]

Writes into tests/golden/models/ (all F32; shapes in PyTorch order):

  qwen_image_tiny.safetensors     the DiT, diffusers names, no prefix (as a
                                  transformer/ folder): width 64, 2 heads of
                                  32 (real: 24 of 128), 2 blocks (real: 60),
                                  MLP 256 (4 x width), 16 latent channels in
                                  patches of 2 x 2 (img_in from 64), context
                                  48 (real: 3584), RoPE axes_dim 4, 14, 14
                                  (real: 16, 56, 56; metadata
                                  "kiln.qwen_image.axes_dim"), theta 10000.
  qwen_image_tiny_io.safetensors  x [2, 16, 6, 8] (3 x 4 patches: an odd
                                  side, centred as diffusers centres it),
                                  context [2, 7, 48], timesteps [2] = (1, 0.35)
                                  (sigma; the model multiplies by 1000); out
                                  [2, 16, 6, 8]; temb [2, 64];
                                  block.transformer_blocks.{0,1} = cat(txt,
                                  img) [2, 19, 64]; rope.cos / rope.sin
                                  [19, 16] (each pair's angle, text then
                                  image tokens).
                                  ref1.*: one reference latent ref1.ref0
                                  [2, 16, 12, 4] (6 x 2 patches at frame 1,
                                  taller than the image, so the text starts
                                  after its half-extent): ref1.out (the
                                  image's tokens only), ref1.block.* [2, 31,
                                  64] (txt, img, ref). ref2.*: a second
                                  reference ref2.ref1 [2, 16, 2, 6] (1 x 3
                                  patches at frame 2): ref2.out,
                                  ref2.rope.cos / .sin [34, 16].
                                  zero_cond.*: the same weights as
                                  Qwen-Image-Edit-2511 (zero_cond_t: the
                                  references' tokens modulated at t = 0)
                                  with both references: zero_cond.out,
                                  zero_cond.block.* [2, 34, 64].

The reference runs in float64 on exactly the stored F32 weights and inputs,
so a C++ run in F32 should agree to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: the module's state dict has exactly the names and shapes of
qwen_image.qwen_image_tensor_shapes (and the real Qwen-Image comes out at its
published 20B parameters), the RoPE factors are the rotations of positions
listed here by hand (odd sides centred from -(n - n // 2), references at
frames 1, 2, ..., text from the largest half-extent over all images), a
rotation whose scores depend only on position differences, packing is
(c, ph, pw) and unpacking inverts it, the timestep embedding is [cos, sin]
of 1000 t, the output is proj_out(norm_out(...)) of the last block's image
tokens, references change the image's prediction, and zero_cond_t changes
nothing without references but changes it with them. Everything is seeded
and built twice: the second build must equal the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import qwen_image as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 4100
TINY = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
            num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(4, 14, 14), zero_cond_t=False)
DIT_METADATA = {"kiln.qwen_image.axes_dim": ",".join(str(a) for a in TINY["axes_dims_rope"])}
BATCH, HW, TXT = 2, (6, 8), 7
REF_HW = [(12, 4), (2, 6)]


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def init_value(name, shape, gen):
    if len(shape) >= 2:  # linear
        return torch.randn(shape, generator=gen) * shape[1] ** -0.5
    if "norm" in name and name.endswith(".weight"):  # RMSNorm weights: txt_norm, norm_q ...
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


# ------------------------------------------------------------ self-checks


def check_names():
    model = ref.QwenImageTransformer2DModel(**TINY)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = ref.qwen_image_tensor_shapes(TINY)
    assert got == want, "names/shapes differ from qwen_image_tensor_shapes: %s" % (set(got) ^ set(want))
    n = sum(math.prod(s) for s in ref.qwen_image_tensor_shapes(ref.QWEN_IMAGE).values())
    assert 20.0e9 < n < 20.6e9, n  # published: a 20B MMDiT
    mmf.log("real size from the name list: Qwen-Image %.2fB parameters" % (n / 1e9))


def positions_by_hand(shapes, txt):
    """(frame, row, column) of every token, text first, as the RoPE docs describe them."""
    start = max(max(h // 2, w // 2) for _, h, w in shapes)
    pos = [(start + i, start + i, start + i) for i in range(txt)]
    for frame, (_, h, w) in enumerate(shapes):
        pos += [(frame, r - (h - h // 2), c - (w - w // 2)) for r in range(h) for c in range(w)]
    return torch.tensor(pos, dtype=torch.float64)


def angles(pos, axes_dim):
    cols = []
    for a, dim in enumerate(axes_dim):
        for j in range(dim // 2):
            cols.append(pos[:, a] * ref.THETA ** (-2.0 * j / dim))
    return torch.stack(cols, dim=1)


def check_rope():
    axes = TINY["axes_dims_rope"]
    model = ref.QwenImageTransformer2DModel(**TINY)
    gen = torch.Generator().manual_seed(1)
    x = torch.zeros(1, 16, 6, 8)
    refs = [torch.zeros(1, 16, 12, 4), torch.zeros(1, 16, 2, 6)]
    freqs = ref.rope_freqs(model, x, refs, 5)
    pos = positions_by_hand(ref.image_shapes(x, refs), 5)
    # spot checks of the layout: 3 rows from -2, text from the tall reference's half-extent 3
    assert pos[5, 1:].tolist() == [-2, -2] and pos[5 + 11, 1:].tolist() == [0, 1] and pos[0].tolist() == [3, 3, 3]
    assert pos[5 + 12, 0] == 1 and pos[5 + 12, 1] == -3 and pos[-1].tolist() == [2, -1, 0]
    want = torch.polar(torch.ones_like(pos[:, :1]).expand(-1, sum(axes) // 2), angles(pos, axes))
    assert torch.allclose(freqs, want, atol=1e-12), "RoPE factors are not the listed positions' rotations"
    # pairs rotate as complex numbers; scores depend on position differences only
    L, D = pos.shape[0], sum(axes)
    q = torch.randn(1, L, 2, D, generator=gen, dtype=torch.float64)
    k = torch.randn(1, L, 2, D, generator=gen, dtype=torch.float64)
    z = torch.complex(q[..., 0::2], q[..., 1::2]) * freqs[None, :, None]
    rq = ref.apply_rotary_emb_qwen(q, freqs)
    assert torch.allclose(rq, torch.stack([z.real, z.imag], dim=-1).reshape(q.shape), atol=1e-12)
    moved = torch.polar(torch.ones_like(freqs.real), angles(pos + torch.tensor([2.0, -3.0, 5.0]), axes))
    s0 = torch.einsum("bihd,bjhd->bhij", rq, ref.apply_rotary_emb_qwen(k, freqs))
    s1 = torch.einsum("bihd,bjhd->bhij", ref.apply_rotary_emb_qwen(q, moved), ref.apply_rotary_emb_qwen(k, moved))
    assert torch.allclose(s0, s1, atol=1e-9)


def check_pieces():
    gen = torch.Generator().manual_seed(2)
    lat = torch.randn(2, 3, 4, 6, generator=gen, dtype=torch.float64)
    p = ref.pack_latents(lat)
    assert torch.equal(ref.unpack_latents(p, 4, 6), lat)
    # token i * 3 + j, feature c * 4 + ph * 2 + pw
    for c, ph, pw, i, j in ((0, 0, 0, 0, 0), (2, 1, 0, 1, 2), (1, 0, 1, 0, 1), (2, 1, 1, 1, 0)):
        assert p[1, i * 3 + j, c * 4 + ph * 2 + pw] == lat[1, c, 2 * i + ph, 2 * j + pw]
    e = ref.Timesteps(256, True, 0, 1000)(torch.tensor([0.5], dtype=torch.float64))
    assert abs(e[0, 0] - math.cos(500.0)) < 1e-12 and abs(e[0, 128] - math.sin(500.0)) < 1e-12
    assert abs(e[0, 1] - math.cos(500.0 * math.exp(-math.log(10000) / 128))) < 1e-12


def check_dit(model, zero_cond, io):
    x, context, t = io["x"].double(), io["context"].double(), io["timesteps"].double()
    refs = [io["ref1.ref0"].double(), io["ref2.ref1"].double()]
    with torch.no_grad():
        blocks = {}
        out = ref.predict(model, x, context, t, blocks=blocks)
        last = blocks["transformer_blocks.%d" % (TINY["num_layers"] - 1)][:, TXT:]
        again = ref.unpack_latents(model.proj_out(model.norm_out(last, blocks["temb"])), *HW)
        assert torch.allclose(out, again, atol=1e-12)
        with_ref = ref.predict(model, x, context, t, refs[:1])
        assert out.shape == with_ref.shape and not torch.allclose(out, with_ref, atol=1e-6)
        assert torch.allclose(ref.predict(zero_cond, x, context, t), out, atol=1e-12), "zero_cond_t without refs"
        assert not torch.allclose(ref.predict(zero_cond, x, context, t, refs), ref.predict(model, x, context, t, refs),
                                  atol=1e-6), "zero_cond_t changes nothing with refs"


# ------------------------------------------------------------ fixtures


def run(model, io, prefix, inputs, blocks=True):
    block_outputs = {}
    with torch.no_grad():
        io[prefix + "out"] = f32(ref.predict(model, **inputs, blocks=block_outputs))
    if blocks:
        for k, v in block_outputs.items():
            if k != "temb":
                io[prefix + "block." + k] = f32(v)
    return block_outputs


def rope_planes(model, x, refs):
    freqs = ref.rope_freqs(model, x, refs, TXT)
    return f32(freqs.real), f32(freqs.imag)


def build(seed):
    model = ref.QwenImageTransformer2DModel(**TINY)
    gen = torch.Generator().manual_seed(seed)
    ckpt = {}
    for k, v in model.state_dict().items():
        ckpt[k] = init_value(k, tuple(v.shape), gen).to(torch.float32).contiguous()
    model.load_state_dict(ckpt, strict=True)
    model = model.double().eval()
    zero_cond = ref.QwenImageTransformer2DModel(**dict(TINY, zero_cond_t=True))
    zero_cond.load_state_dict(ckpt, strict=True)
    zero_cond = zero_cond.double().eval()

    gen = torch.Generator().manual_seed(seed + 1000)
    io = {"x": torch.randn(BATCH, 16, *HW, generator=gen),
          "context": torch.randn(BATCH, TXT, TINY["joint_attention_dim"], generator=gen),
          "timesteps": torch.tensor([1.0, 0.35]),
          "ref1.ref0": torch.randn(BATCH, 16, *REF_HW[0], generator=gen),
          "ref2.ref1": torch.randn(BATCH, 16, *REF_HW[1], generator=gen)}
    # The reference sees exactly the stored (F32) inputs.
    x, context, t = io["x"].double(), io["context"].double(), io["timesteps"].double()
    refs = [io["ref1.ref0"].double(), io["ref2.ref1"].double()]
    base = dict(x=x, context=context, sigma=t)

    blocks = run(model, io, "", base)
    io["temb"] = f32(blocks["temb"])
    io["rope.cos"], io["rope.sin"] = rope_planes(model, x, [])
    run(model, io, "ref1.", dict(base, refs=refs[:1]))
    run(model, io, "ref2.", dict(base, refs=refs), blocks=False)
    io["ref2.rope.cos"], io["ref2.rope.sin"] = rope_planes(model, x, refs)
    run(zero_cond, io, "zero_cond.", dict(base, refs=refs))
    assert io["block.transformer_blocks.1"].shape == (BATCH, TXT + 12, 64)
    assert io["ref1.block.transformer_blocks.1"].shape == (BATCH, TXT + 12 + 12, 64)
    check_dit(model, zero_cond, io)
    return ckpt, io


def same(a, b):
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    check_names()
    check_rope()
    check_pieces()
    ckpt, io = build(SEED)
    ckpt2, io2 = build(SEED)
    assert same(ckpt, ckpt2) and same(io, io2), "a second build differs"
    mmf.save_fixture_pair(args.out, "qwen_image_tiny", ckpt, io, "training/make_qwen_image_fixtures.py",
                          "NCHW, [batch, tokens, width]", DIT_METADATA, max_bytes=(3 << 20) // 2)


if __name__ == "__main__":
    main()
