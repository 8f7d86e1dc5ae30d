#!/usr/bin/python3
"""Writes a tiny random-weight Wan text-to-video DiT with the original tensor
names and its golden inputs and outputs, computed with
training/reference/wan_dit.py (transcribed from wan/modules/model.py of
Wan-Video/Wan2.1).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_wan_dit_fixtures.py [--out DIR]

Writes into tests/golden/models/ (shapes in PyTorch order):

  wan_dit_tiny.safetensors     WanModel's state dict (t2v), original names, no
                               prefix, F16 (to stay small; the reference
                               computes with exactly these values): dim 48 in
                               3 heads of 16 (real: heads of 128; metadata
                               "kiln.wan.heads" = 3), so RoPE splits a head
                               into 8 frame, 4 row and 4 column features
                               (real: 44, 42, 42); 2 blocks (real: 30 or 40),
                               FFN 128, 4 latent channels in and out (real:
                               16), patch (1, 2, 2), text_dim 32 (real:
                               4096), freq_dim 256 as the real models.
  wan_dit_tiny_io.safetensors  F32. A clip: x [2, 8, 4, 6] (the original's
                               [B, C=4, F=2, H=4, W=6] with C and F merged,
                               frame fastest: kiln's layout), timesteps [2] =
                               (0.875, 0.3125) (sigma; the model is run at t =
                               1000 sigma), context [2, 5, 32] whose item 1 has
                               3 prompt rows and 2 zero rows (the reference
                               gets its 3 rows: zero rows after the prompt are
                               the original's own padding), out [2, 8, 4, 6],
                               block.blocks.{0,1} [2, 12, 48] (the tokens after
                               each block, (f, h, w) order), rope.cos /
                               rope.sin [12, 8] (each pair's factor for the 2 x
                               2 x 3 patch grid).
                               One frame (text-to-image): image.x [1, 4, 6, 4]
                               (3 x 2 patches), image.timesteps [1] = (0.5),
                               image.context [1, 7, 32], image.out [1, 4, 6,
                               4], image.block.blocks.{0,1} [1, 6, 48].

The reference runs in float64 on exactly the stored weights and inputs, so a
C++ run in F32 should agree to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: the module tree's names and shapes are wan_dit_tensor_shapes'
and the released configurations come out at their published sizes (1.3B,
14B, 5B); RoPE's factors are rotations of adjacent pairs by the positions
listed here by hand (frame, row, column from 0) with the head split d - 4 (d
// 6), 2 (d // 6), 2 (d // 6); the patch embedding is a linear map of each
1 x 2 x 2 patch's (c, ph, pw) features in (f, h, w) token order, and
unpatchify reads a token's features as (pt, ph, pw, c); the time embedding is
[cos, sin] of t 10000^(-i / 128); zero rows after a prompt change nothing,
while masking the 512-row padding out of the cross-attention would (the
padding is attended). Everything is seeded and built twice: the second build
must equal the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import wan_dit as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 5200
TINY = dict(patch_size=(1, 2, 2), in_dim=4, dim=48, ffn_dim=128, freq_dim=256, text_dim=32, out_dim=4, num_heads=3,
            num_layers=2)
DIT_METADATA = {"kiln.wan.heads": str(TINY["num_heads"])}
BATCH, FRAMES, HW, TXT, ITEM1_TXT = 2, 2, (4, 6), 5, 3
IMAGE_HW, IMAGE_TXT = (6, 4), 7


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def init_value(name, shape, gen):
    if name.endswith("modulation"):  # the original's randn / sqrt(dim)
        return torch.randn(shape, generator=gen) * shape[-1] ** -0.5
    if len(shape) >= 2:  # linear and Conv3d weights
        return torch.randn(shape, generator=gen) * math.prod(shape[1:]) ** -0.5
    if "norm" in name and name.endswith(".weight"):  # RMSNorm and norm3 scales
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


# ------------------------------------------------------------ self-checks


def check_names():
    got = {k: tuple(v.shape) for k, v in ref.WanModel(**TINY).state_dict().items()}
    want = ref.wan_dit_tensor_shapes(TINY)
    assert got == want, "names/shapes differ from wan_dit_tensor_shapes: %s" % (set(got) ^ set(want))
    for name, cfg, low, high in (("Wan2.1-T2V-1.3B", ref.WAN21_1_3B, 1.3e9, 1.5e9),
                                 ("Wan2.1-T2V-14B", ref.WAN21_14B, 14.0e9, 14.5e9),
                                 ("Wan2.2-TI2V-5B", ref.WAN22_5B, 4.9e9, 5.2e9)):
        n = sum(math.prod(s) for s in ref.wan_dit_tensor_shapes(cfg).values())
        assert low < n < high, (name, n)
        assert cfg["dim"] // cfg["num_heads"] == 128  # every release: heads of 128
        mmf.log("real size from the name list: %s %.2fB parameters" % (name, n / 1e9))


def check_rope():
    d = 128
    assert (d - 4 * (d // 6), 2 * (d // 6)) == (44, 42)
    d = TINY["dim"] // TINY["num_heads"]
    axes = (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))
    assert axes == (8, 4, 4)
    f, h, w = FRAMES, HW[0] // 2, HW[1] // 2
    pos = torch.tensor([(a, b, c) for a in range(f) for b in range(h) for c in range(w)], dtype=torch.float64)
    cols = []
    for axis, n in enumerate(axes):
        cols += [pos[:, axis] * ref.THETA ** (-2.0 * j / n) for j in range(n // 2)]
    want = torch.polar(torch.ones(len(pos), d // 2, dtype=torch.float64), torch.stack(cols, dim=1))
    got = ref.grid_freqs(ref.rope_freqs(d), f, h, w)
    assert torch.allclose(got, want, atol=1e-12), "RoPE factors are not the listed positions' rotations"
    # adjacent features (2j, 2j + 1) turn as one complex number
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, len(pos), 2, d, generator=gen, dtype=torch.float64)
    y = ref.rope_apply(x, torch.tensor([[f, h, w]]), ref.rope_freqs(d))
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * want[None, :, None]
    assert torch.allclose(y, torch.stack([z.real, z.imag], dim=-1).reshape(x.shape), atol=1e-12)


def check_pieces():
    gen = torch.Generator().manual_seed(2)
    model = ref.WanModel(**TINY).double()
    x = torch.randn(TINY["in_dim"], 2, 4, 6, generator=gen, dtype=torch.float64)  # [C, F, H, W]
    with torch.no_grad():
        tokens = model.patch_embedding(x[None]).flatten(2).transpose(1, 2)[0]
        kernel = model.patch_embedding.weight.reshape(TINY["dim"], -1)  # features (c, pt, ph, pw)
        for f, i, j in ((0, 0, 0), (1, 1, 2), (0, 1, 1), (1, 0, 2)):
            patch = x[:, f, 2 * i:2 * i + 2, 2 * j:2 * j + 2].reshape(-1)
            want = kernel @ patch + model.patch_embedding.bias
            assert torch.allclose(tokens[f * 6 + i * 3 + j], want, atol=1e-12), "patch embedding"
        # unpatchify: token (f, i, j), feature (ph * 2 + pw) * C + c -> [c, f, 2i + ph, 2j + pw]
        feats = torch.randn(1, 12, 16, generator=gen, dtype=torch.float64)
        out = model.unpatchify(feats, torch.tensor([[2, 2, 3]]))[0]
        for c, f, i, j, ph, pw in ((0, 0, 0, 0, 0, 0), (3, 1, 1, 2, 1, 0), (2, 0, 1, 1, 0, 1), (1, 1, 0, 2, 1, 1)):
            assert out[c, f, 2 * i + ph, 2 * j + pw] == feats[0, f * 6 + i * 3 + j, (ph * 2 + pw) * 4 + c]
    e = ref.sinusoidal_embedding_1d(256, torch.tensor([500.0]))
    assert abs(e[0, 0] - math.cos(500.0)) < 1e-12 and abs(e[0, 128] - math.sin(500.0)) < 1e-12
    assert abs(e[0, 1] - math.cos(500.0 * 10000 ** (-1 / 128))) < 1e-12


def check_dit(model, io):
    x = io["x"].double().view(BATCH, TINY["in_dim"], FRAMES, *HW)
    context, sigma = io["context"].double(), io["timesteps"].double()
    with torch.no_grad():
        out = ref.predict(model, x, sigma, context, [TXT, ITEM1_TXT])
        # zero rows after a prompt are the original's own padding
        assert torch.equal(ref.predict(model, x, sigma, context), out), "zero rows after the prompt"
        assert torch.allclose(io["out"].double().view(out.shape), out, atol=1e-6)
        # the 512-row padding is attended: masking it out changes the prediction
        for block in model.blocks:
            block.cross_attn.forward = masked_cross_attention(block.cross_attn, [TXT, ITEM1_TXT])
        masked = ref.predict(model, x, sigma, context, [TXT, ITEM1_TXT])
        for block in model.blocks:
            del block.cross_attn.forward
        assert not torch.allclose(masked, out, atol=1e-4), "the padding rows are not attended"
        # one batch item alone gives its row of the batch
        alone = ref.predict(model, x[1:], sigma[1:], context[1:, :ITEM1_TXT])
        assert torch.allclose(alone, out[1:], atol=1e-12)


def masked_cross_attention(attn, lengths):
    plain = attn.forward

    def forward(x, context, context_lens):
        return plain(x, context, torch.tensor(lengths))
    return forward


# ------------------------------------------------------------ fixtures


def run(model, io, prefix, x, sigma, context, lengths):
    blocks = {}
    with torch.no_grad():
        out = ref.predict(model, x, sigma, context, lengths, blocks=blocks)
    io[prefix + "out"] = f32(out.flatten(1, 2))  # [B, C F, H, W]: kiln's layout
    for k, v in blocks.items():
        io[prefix + "block." + k] = f32(v)


def build(seed):
    model = ref.WanModel(**TINY)
    gen = torch.Generator().manual_seed(seed)
    ckpt = {}
    for k, v in model.state_dict().items():
        ckpt[k] = init_value(k, tuple(v.shape), gen).to(torch.float16).contiguous()
    model.load_state_dict({k: v.double() for k, v in ckpt.items()}, strict=True)
    model = model.double().eval()

    gen = torch.Generator().manual_seed(seed + 1000)
    C = TINY["in_dim"]
    context = torch.randn(BATCH, TXT, TINY["text_dim"], generator=gen)
    context[1, ITEM1_TXT:] = 0
    io = {"x": torch.randn(BATCH, C * FRAMES, *HW, generator=gen),
          "timesteps": torch.tensor([0.875, 0.3125]),
          "context": context,
          "image.x": torch.randn(1, C, *IMAGE_HW, generator=gen),
          "image.timesteps": torch.tensor([0.5]),
          "image.context": torch.randn(1, IMAGE_TXT, TINY["text_dim"], generator=gen)}
    # The reference sees exactly the stored (F32) inputs.
    run(model, io, "", io["x"].double().view(BATCH, C, FRAMES, *HW), io["timesteps"].double(),
        io["context"].double(), [TXT, ITEM1_TXT])
    run(model, io, "image.", io["image.x"].double().view(1, C, 1, *IMAGE_HW), io["image.timesteps"].double(),
        io["image.context"].double(), None)
    freqs = ref.grid_freqs(model.freqs, FRAMES, HW[0] // 2, HW[1] // 2)
    io["rope.cos"], io["rope.sin"] = f32(freqs.real), f32(freqs.imag)
    assert io["block.blocks.1"].shape == (BATCH, FRAMES * 6, TINY["dim"])
    assert io["image.block.blocks.1"].shape == (1, 6, TINY["dim"])
    check_dit(model, io)
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
    mmf.save_fixture_pair(args.out, "wan_dit_tiny", ckpt, io, "training/make_wan_dit_fixtures.py",
                          "[batch, channels x frames (frame fastest), H, W], [batch, tokens, width]", DIT_METADATA,
                          max_bytes=250 << 10)


if __name__ == "__main__":
    main()
