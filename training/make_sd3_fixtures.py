#!/usr/bin/python3
"""Writes tiny random-weight SD3-style MMDiTs with Stability's tensor names and
their golden inputs and outputs, computed with training/reference/mmdit.py
(written from Stability's sd3.5 mmditx.py and sd3_infer.py).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_sd3_fixtures.py [--out DIR]

Writes into tests/golden/models/ (all F32; shapes in PyTorch order):

  sd35_tiny.safetensors     an SD3.5 Large-style DiT (QK RMSNorm): 3 joint
                            blocks (the last one's context stream pre-only),
                            hidden 32, 2 heads of 16 (ln_q [16]), MLP 128,
                            16 latent channels, patch 2, context 48 (real:
                            4096), pooled vector 40 (real: 2048),
                            pos_embed_max_size 8 (real: 192).
  sd35x_tiny.safetensors    the same as MMDiT-X (SD3.5 Medium): x_block.attn2
                            in blocks 0 and 1 (real: 0-12), nine modulation
                            chunks there.
  sd3_tiny.safetensors      SD3 Medium-style: no QK norm, so one head of
                            Stability's fixed width 64 (hidden 64); 2 blocks,
                            MLP 64 (real: 4 x hidden).
  *_io.safetensors          x [2, 16, 6, 8] (3 x 4 patches, the position
                            embedding cropped at top 2, left 2), sigma [2] =
                            (1, 0.35), y [2, 40], context [2, 7, 48]; out
                            [2, 16, 6, 8]; block.joint_blocks.N = cat(context,
                            x) [2, 7 + 12, hidden], x alone [2, 12, hidden] after the
                            last; slg.out: blocks [1] dropped (skip-layer
                            guidance); tall.x [1, 16, 10, 4] (5 x 2 patches,
                            cropped at top 1, left 3) and tall.out.
  sd3_join_io.safetensors   the conditioning join of sd3_infer.get_cond at
                            small widths (CLIP-L 8, CLIP-G 12, T5 32 for 768,
                            1280, 4096): l [1, 6, 8], g [1, 6, 12], t5 [1, 5,
                            32] -> context [1, 11, 32]; context_no_t5 [1, 83,
                            32] (77 zero rows for a missing T5); l_pooled
                            [1, 8], g_pooled [1, 12] -> pooled [1, 20].

The reference runs in float64 on exactly the stored F32 weights, so a C++ run
in F32 should agree to ~1e-5 relative. Before writing, the script checks the
modules' names and shapes against mmdit.sd3_tensor_shapes (and that the real
SD3.5 Large, Medium and SD3 Medium come out at their published sizes), and
builds everything twice: the second build must equal the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import mmdit as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 3500
BASE = dict(depth=3, hidden=32, heads=2, in_channels=16, patch=2, context_dim=48, adm_dim=40, pos_embed_max_size=8,
            qk_norm=True, x_block_self_attn_layers=())
TINY = {
    "sd35_tiny": BASE,
    "sd35x_tiny": dict(BASE, x_block_self_attn_layers=(0, 1)),
    "sd3_tiny": dict(BASE, depth=2, hidden=64, heads=1, qk_norm=False, mlp_ratio=1.0),
}
BATCH, HW, TXT = 2, (6, 8), 7
TALL_HW = (10, 4)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def init_value(name, shape, gen):
    if len(shape) >= 2 and name != "pos_embed":
        fan_in = math.prod(shape[1:])
        return torch.randn(shape, generator=gen) * fan_in ** -0.5
    if name.endswith("ln_q.weight") or name.endswith("ln_k.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name == "pos_embed":
        return 0.5 * torch.randn(shape, generator=gen)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


def check_names():
    for name, cfg in TINY.items():
        model = ref.MMDiT(**cfg)
        got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        want = ref.sd3_tensor_shapes(cfg)
        assert got == want, name + ": names/shapes differ from sd3_tensor_shapes: %s" % (set(got) ^ set(want))
    sizes = {k: sum(math.prod(s) for s in ref.sd3_tensor_shapes(ref.real_config(m)).values())
             for k, m in (("SD3 Medium", ref.SD3_MEDIUM), ("SD3.5 Medium", ref.SD35_MEDIUM),
                          ("SD3.5 Large", ref.SD35_LARGE))}
    # Published: SD3 Medium 2B, SD3.5 Medium 2.5B, SD3.5 Large 8.1B parameters.
    assert 2.0e9 < sizes["SD3 Medium"] < 2.1e9, sizes
    assert 2.4e9 < sizes["SD3.5 Medium"] < 2.6e9, sizes
    assert 8.0e9 < sizes["SD3.5 Large"] < 8.3e9, sizes
    mmf.log("real sizes from the name lists: " + ", ".join("%s %.2fB" % (k, v / 1e9) for k, v in sizes.items()))


def check_pieces():
    # The crop is centred: for a grid the size of the table it is the whole table.
    model = ref.MMDiT(**BASE)
    with torch.no_grad():
        model.pos_embed.copy_(torch.arange(64 * 32, dtype=torch.float32).view(1, 64, 32))
    assert torch.equal(model.cropped_pos_embed(8, 8), model.pos_embed)
    crop = model.cropped_pos_embed(3, 4)  # rows 2..4, columns 2..5 of the 8 x 8 grid
    assert crop[0, :, 0].tolist() == [32 * (r * 8 + c) for r in (2, 3, 4) for c in (2, 3, 4, 5)]
    # The embedding is [cos, sin] of t * f_i (forward passes sigma * 1000), f_0 = 1.
    e = ref.timestep_embedding(torch.tensor([500.0], dtype=torch.float64))
    assert abs(e[0, 0] - math.cos(500.0)) < 1e-12 and abs(e[0, 128] - math.sin(500.0)) < 1e-12


def build(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    model = ref.MMDiT(**cfg).to(torch.float64)
    ckpt = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_value(name, tuple(p.shape), gen).to(torch.float64))
            ckpt[name] = f32(p)
    x = torch.randn(BATCH, cfg["in_channels"], *HW, generator=gen, dtype=torch.float64)
    sigma = torch.tensor([1.0, 0.35], dtype=torch.float64)
    y = torch.randn(BATCH, cfg["adm_dim"], generator=gen, dtype=torch.float64)
    context = torch.randn(BATCH, TXT, cfg["context_dim"], generator=gen, dtype=torch.float64)
    tall = torch.randn(1, cfg["in_channels"], *TALL_HW, generator=gen, dtype=torch.float64)
    io = {"x": f32(x), "sigma": f32(sigma), "y": f32(y), "context": f32(context), "tall.x": f32(tall)}
    # The reference sees exactly the stored (F32-rounded) inputs.
    x, sigma, y, context, tall = (io[k].double() for k in ("x", "sigma", "y", "context", "tall.x"))
    blocks = {}
    with torch.no_grad():
        io["out"] = f32(model(x, sigma, y, context, blocks=blocks))
        io["slg.out"] = f32(model(x, sigma, y, context, layer_drops=(1,)))
        io["tall.out"] = f32(model(tall, sigma[1:], y[1:], context[1:]))
    for k, v in blocks.items():
        io["block." + k] = f32(v)
    assert io["block.joint_blocks.%d" % (cfg["depth"] - 1)].shape[1] == 12, "x alone after the last block"
    return ckpt, io


def build_join(seed):
    gen = torch.Generator().manual_seed(seed)
    # Small widths (CLIP-L 8, CLIP-G 12, T5 32) for the real 768, 1280, 4096: the join is the same.
    l, g = torch.randn(1, 6, 8, generator=gen), torch.randn(1, 6, 12, generator=gen)
    t5 = torch.randn(1, 5, 32, generator=gen)
    lp, gp = torch.randn(1, 8, generator=gen), torch.randn(1, 12, generator=gen)
    io = {"l": f32(l), "g": f32(g), "t5": f32(t5), "l_pooled": f32(lp), "g_pooled": f32(gp),
          "context": f32(ref.sd3_context(l, g, t5, 32)), "context_no_t5": f32(ref.sd3_context(l, g, None, 32)),
          "pooled": f32(ref.sd3_pooled(lp, gp))}
    assert io["context"].shape == (1, 11, 32) and io["context_no_t5"][0, 6:].abs().sum() == 0
    return io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    check_names()
    check_pieces()
    for i, (name, cfg) in enumerate(TINY.items()):
        ckpt, io = build(cfg, SEED + 10 * i)
        ckpt2, io2 = build(cfg, SEED + 10 * i)
        assert all(torch.equal(ckpt[k], ckpt2[k]) for k in ckpt) and all(torch.equal(io[k], io2[k]) for k in io)
        mmf.save_fixture_pair(args.out, name, ckpt, io, "training/make_sd3_fixtures.py",
                              "NCHW, [batch, tokens, width]", None, max_bytes=1 << 20)
    join = build_join(SEED + 100)
    path = os.path.join(args.out, "sd3_join_io.safetensors")
    mmf.safetensors_io.save_file(join, path, {"kiln.fixture.generator": "training/make_sd3_fixtures.py"})
    mmf.log("wrote %s: %.1f KB" % (os.path.relpath(path, ROOT), os.path.getsize(path) / 1e3))


if __name__ == "__main__":
    main()
