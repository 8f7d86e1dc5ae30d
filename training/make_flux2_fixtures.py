#!/usr/bin/python3
"""Writes a tiny random-weight FLUX.2 [klein]-style DiT and a tiny FLUX.2
autoencoder with BFL's tensor names, and their golden inputs/outputs, computed
with training/reference/flux2.py (written from BFL's flux2 repository; see
docs/flux2_architecture_notes.md).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_flux2_fixtures.py [--out DIR]

Writes into tests/golden/models/ (all F32; shapes in PyTorch order):

  flux2_tiny.safetensors        the DiT, BFL names, no prefix, no biases (as
                                flux-2-klein-4b.safetensors): hidden 64, 2 heads
                                of 32, RoPE axes_dim 4, 10, 10, 8 (metadata
                                "kiln.flux2.axes_dim"; the real models use
                                32, 32, 32, 32) over (t, h, w, l), theta 2000
                                ("kiln.flux2.theta"), mlp_ratio 3 (SwiGLU of
                                192), 2 double + 2 single blocks, in/out 128,
                                context 48 (klein 4B: 7680 = 3 x 2560), no
                                guidance_in (klein).
  flux2_tiny_io.safetensors     x [2, 128, 3, 5] (15 image tokens: the
                                normalised, patchified latent), context
                                [2, 7, 48], timesteps [2] = (1, 0.35) (sigma;
                                the model multiplies by 1000); out [2, 128, 3, 5];
                                vec [2, 64] (time_in's output); ids [22, 4]
                                (text then image positions); rope.cos /
                                rope.sin [22, 16] (each pair's angle);
                                block.double_blocks.{0,1} = cat(txt, img) and
                                block.single_blocks.{0,1} [2, 22, 64].
                                ref1.*: one reference latent ref1.ref0
                                [2, 128, 2, 4] (t = 10): ref1.out (image tokens
                                only), ref1.ids [30, 4], ref1.block.* [2, 30, 64]
                                (txt, img, ref). ref2.*: a second reference
                                ref2.ref1 [2, 128, 3, 2] (t = 20): ref2.out,
                                ref2.ids [36, 4], ref2.rope.cos / .sin [36, 16].
                                schedule.steps<n>_seq<L> [n + 1]: BFL's
                                get_schedule (float32 as BFL computes it).
  flux2_ae_tiny.safetensors     the autoencoder, BFL names (ae.safetensors):
                                ch 32, ch_mult (1, 1), 1 res block, 32 latent
                                channels, encoder.quant_conv,
                                decoder.post_quant_conv, bn.running_mean /
                                running_var [128] (random, var 1.7..3.7 as the
                                real file's ~3.1) and bn.num_batches_tracked
                                (0-d I64), as the real file carries.
  flux2_ae_tiny_io.safetensors  image [1, 3, 16, 24] in [-1, 1]; encoded
                                [1, 128, 4, 6] (the normalised latent the DiT
                                takes), encoded.moments [1, 64, 8, 12],
                                encoded.mean [1, 32, 8, 12], encoded.patchified
                                [1, 128, 4, 6] (before the batch norm),
                                block.encoder.down.{0,1}, block.encoder.mid;
                                z [1, 128, 4, 6] (a given latent, N(0, 1)),
                                decoded [1, 3, 16, 24] (not clamped),
                                decoded.unnormalized, decoded.unpatchified
                                [1, 32, 8, 12], block.decoder.{mid,up.1,up.0};
                                roundtrip = decode(encoded) [1, 3, 16, 24].
  flux2_ae_small_decoder_tiny.safetensors (+ _io)
                                the same with the decoder narrower than the
                                encoder, as full_encoder_small_decoder.safetensors
                                (real: encoder ch 128, decoder ch 96): encoder
                                ch 64, decoder ch 32 (decoder.conv_in [32, 32,
                                3, 3]); the same io names.

The reference runs in float64 on exactly the stored F32 weights, so a C++ run
in F32 should agree to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: the modules' state dicts have exactly the names and shapes of
flux2.bfl_*_tensor_shapes (and the real klein 4B / 9B and autoencoder sizes
come out as expected), RoPE is a complex rotation of each pair whose scores
depend only on position differences, reference positions are (10 + 10 i, row,
col, 0), SwiGLU gates with the first half, the last single block's output
through the final layer is the output, references change the image tokens'
output, patchify is BFL's rearrange and unpatchify inverts it, the batch norm
is torch's BatchNorm2d in eval mode and decode's normalisation inverts
encode's. Everything is seeded and built twice: the second build must equal
the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import flux2 as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 2600
DTYPE = torch.float32
TINY = dict(in_channels=128, context_in_dim=48, hidden_size=64, num_heads=2, depth=2, depth_single_blocks=2,
            axes_dim=(4, 10, 10, 8), theta=2000, mlp_ratio=3.0, use_guidance_embed=False)
DIT_METADATA = {"kiln.flux2.axes_dim": ",".join(str(a) for a in TINY["axes_dim"]),
                "kiln.flux2.theta": str(TINY["theta"])}
BATCH, GRID, TXT = 2, (3, 5), 7
REF_GRIDS = [(2, 4), (3, 2)]
SCHEDULES = [(4, 4096), (50, 4096), (4, 256), (20, 6400)]  # (steps, image tokens): 1024^2 = 4096 tokens

AE_TINY = dict(ch=32, ch_mult=(1, 1), num_res_blocks=1, z_channels=32)
# As full_encoder_small_decoder.safetensors: the decoder narrower than the encoder (real: 128 vs 96).
AE_SMALL_DECODER = dict(ch=64, ch_mult=(1, 1), num_res_blocks=1, z_channels=32, decoder_ch=32)
IMAGE_HW = (16, 24)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def init_value(name, shape, gen):
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) >= 2:  # linear / conv
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        return torch.randn(shape, generator=gen) * fan_in ** -0.5
    if leaf == "scale" or (leaf == "weight" and len(shape) == 1):  # RMSNorm / GroupNorm scales
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if leaf == "running_mean":
        return 0.05 * torch.randn(shape, generator=gen)
    if leaf == "running_var":  # the real file's std is ~1.75 (var ~3.1)
        return 1.7 + 2.0 * torch.rand(shape, generator=gen)
    if leaf == "num_batches_tracked":
        return torch.tensor(0, dtype=torch.int64)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


def randomize(module, seed):
    """Seeded F32 weights in state_dict order; loads them into `module`; returns the stored dict."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for k, v in module.state_dict().items():
        t = init_value(k, tuple(v.shape), gen)
        stored[k] = (t.to(DTYPE) if t.is_floating_point() else t).contiguous()
    module.load_state_dict(stored, strict=True)
    return stored


def rope_planes(ids, axes_dim, theta):
    """[L, head_dim/2] cos and sin of every pair's angle, from the reference's pe."""
    pe = ref.embed_nd(ids[None], axes_dim, theta)[0, 0]  # [L, D/2, 2, 2]
    return pe[..., 0, 0], pe[..., 1, 0]


# ------------------------------------------------------------ self-checks


def check_names():
    model = ref.Flux2(**TINY)
    want = ref.bfl_dit_tensor_shapes(TINY)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == want, "DiT names/shapes differ from bfl_dit_tensor_shapes: %s" % (set(got) ^ set(want))
    assert not any(k.endswith(".bias") for k in got), "FLUX.2's DiT has no biases"
    ae = ref.AutoEncoder(**AE_TINY)
    got = {k: tuple(v.shape) for k, v in ae.state_dict().items()}
    assert got == ref.bfl_ae_tensor_shapes(**AE_TINY), "AE names/shapes differ"
    small = ref.AutoEncoder(**AE_SMALL_DECODER)
    got = {k: tuple(v.shape) for k, v in small.state_dict().items()}
    assert got == ref.bfl_ae_tensor_shapes(**AE_SMALL_DECODER), "small-decoder names/shapes differ"
    assert got["decoder.conv_in.weight"][0] == 32 and got["encoder.conv_out.weight"][1] == 64

    def count(shapes):
        return sum(math.prod(s) for s in shapes.values())

    n4, n9, ndev = (count(ref.bfl_dit_tensor_shapes(c)) for c in (ref.KLEIN_4B, ref.KLEIN_9B, ref.DEV))
    assert 3.8e9 < n4 < 4.0e9 and 9.0e9 < n9 < 9.2e9 and 3.1e10 < ndev < 3.3e10, (n4, n9, ndev)
    nae = count(ref.bfl_ae_tensor_shapes(**ref.AE))
    nsmall = count(ref.bfl_ae_tensor_shapes(**dict(ref.AE, decoder_ch=ref.SMALL_DECODER_CH)))
    mmf.log("real sizes from the name lists: klein 4B %.3fB, klein 9B %.3fB, dev %.2fB parameters; "
            "AE %.1fM (%.0f MB F32), small-decoder AE %.1fM (%.0f MB F32)"
            % (n4 / 1e9, n9 / 1e9, ndev / 1e9, nae / 1e6, nae * 4 / 1e6, nsmall / 1e6, nsmall * 4 / 1e6))


def check_rope():
    gen = torch.Generator().manual_seed(1)
    ids = torch.cat([ref.txt_ids(3), ref.img_ids(2, 3), ref.ref_ids([(1, 2), (2, 1)])])
    # reference positions: t = 10 + 10 i, rows and columns from 0, l = 0
    assert ids[3 + 6:3 + 8, 0].tolist() == [10, 10] and ids[-2:, 0].tolist() == [20, 20]
    assert ids[-2:, 1].tolist() == [0, 1] and ids[-2:, 2].tolist() == [0, 0]
    assert ids[3 + 6:3 + 8, 1:3].tolist() == [[0, 0], [0, 1]] and ids[3:, 3].abs().sum() == 0
    assert ids[:3, 3].tolist() == [0, 1, 2] and ids[:3, :3].abs().sum() == 0
    D = sum(TINY["axes_dim"])
    pe = ref.embed_nd(ids[None], TINY["axes_dim"], TINY["theta"])
    x = torch.randn(1, 2, ids.shape[0], D, generator=gen, dtype=torch.float64)
    cos, sin = rope_planes(ids, TINY["axes_dim"], TINY["theta"])
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.complex(cos, sin)
    assert torch.allclose(ref.apply_rope(x, pe), torch.stack([z.real, z.imag], dim=-1).reshape(x.shape), atol=1e-12)
    # each axis owns its consecutive block of pairs: axis a's angle for pair j is pos_a * theta^(-2j/dim_a)
    j0 = 0
    for a, dim in enumerate(TINY["axes_dim"]):
        for j in range(dim // 2):
            want = ids[:, a] * TINY["theta"] ** (-2.0 * j / dim)
            assert torch.allclose(torch.atan2(sin[:, j0 + j], cos[:, j0 + j]),
                                  torch.atan2(torch.sin(want), torch.cos(want)), atol=1e-9)
        j0 += dim // 2
    q, k = x, torch.randn(x.shape, generator=gen, dtype=torch.float64)
    moved = ref.embed_nd((ids + torch.tensor([3.0, -2.0, 5.0, 7.0], dtype=torch.float64))[None],
                         TINY["axes_dim"], TINY["theta"])
    s0 = ref.apply_rope(q, pe) @ ref.apply_rope(k, pe).transpose(-1, -2)
    s1 = ref.apply_rope(q, moved) @ ref.apply_rope(k, moved).transpose(-1, -2)
    assert torch.allclose(s0, s1, atol=1e-9)


def check_pieces():
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(3, 10, generator=gen, dtype=torch.float64)
    assert torch.equal(ref.swiglu(u), F.silu(u[:, :5]) * u[:, 5:])
    lat = torch.randn(2, 3, 4, 6, generator=gen, dtype=torch.float64)
    p = ref.patchify(lat)
    assert torch.equal(ref.unpatchify(p), lat)
    # BFL's "c (i pi) (j pj) -> (c pi pj) i j": channel c * 4 + pi * 2 + pj at (i, j)
    for c, pi, pj, i, j in ((0, 0, 0, 0, 0), (2, 1, 0, 1, 2), (1, 0, 1, 0, 1), (2, 1, 1, 1, 0)):
        assert p[1, c * 4 + pi * 2 + pj, i, j] == lat[1, c, 2 * i + pi, 2 * j + pj]
    t = ref.latent_to_tokens(p)
    assert torch.equal(t[1, 1 * 3 + 2], p[1, :, 1, 2]) and torch.equal(ref.tokens_to_latent(t, 2, 3), p)


def check_dit(model, io):
    """The output is the final layer on the last single block's image tokens; refs matter."""
    x = io["x"].double()
    with torch.no_grad():
        out, blocks = model(x, io["context"].double(), io["timesteps"].double())
        last = blocks["single_blocks.%d" % (TINY["depth_single_blocks"] - 1)][:, TXT:]
        again = ref.tokens_to_latent(model.final_layer(last, blocks["vec"]), *GRID)
        assert torch.allclose(out, again, atol=1e-12)
        with_ref, _ = model(x, io["context"].double(), io["timesteps"].double(), refs=[io["ref1.ref0"].double()])
    assert out.shape == with_ref.shape and not torch.allclose(out, with_ref, atol=1e-6)


def check_ae(ae, cfg, image):
    with torch.no_grad():
        z, enc = ae.encode(image)
        bn = F.batch_norm(enc["patchified"], ae.bn.running_mean, ae.bn.running_var, training=False, eps=ref.BN_EPS)
        assert torch.allclose(z, bn, atol=1e-12), "normalize is BatchNorm2d in eval mode"
        assert torch.allclose(ae.inv_normalize(z), enc["patchified"], atol=1e-12)
        img, dec = ae.decode(z)
    assert torch.allclose(dec["unpatchified"], enc["mean"], atol=1e-12)
    down = 2 ** (len(cfg["ch_mult"]) - 1) * ref.PATCH
    assert z.shape == (1, 4 * cfg["z_channels"], IMAGE_HW[0] // down, IMAGE_HW[1] // down)
    assert img.shape == image.shape


# ------------------------------------------------------------ fixtures


def run_dit(model, io, prefix, inputs, blocks=True):
    with torch.no_grad():
        out, block_outputs = model(**inputs)
    io[prefix + "out"] = f32(out)
    if blocks:
        for k, v in block_outputs.items():
            if k != "vec":
                io[prefix + "block." + k] = f32(v)
    return block_outputs


def build_dit(seed):
    model = ref.Flux2(**TINY)
    ckpt = randomize(model, seed)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    io = {}
    x = torch.randn(BATCH, 128, *GRID, generator=gen)
    context = torch.randn(BATCH, TXT, TINY["context_in_dim"], generator=gen)
    timesteps = torch.tensor([1.0, 0.35])
    refs = [torch.randn(BATCH, 128, h, w, generator=gen) for h, w in REF_GRIDS]
    io.update({"x": x, "context": context, "timesteps": timesteps, "ref1.ref0": refs[0], "ref2.ref1": refs[1]})
    base = dict(x=x.double(), context=context.double(), timesteps=timesteps.double())

    blocks = run_dit(model, io, "", base)
    io["vec"] = f32(blocks["vec"])
    ids = model.token_ids(TXT, GRID)
    io["ids"] = f32(ids)
    io["rope.cos"], io["rope.sin"] = (f32(t) for t in rope_planes(ids, model.axes_dim, model.theta))

    run_dit(model, io, "ref1.", dict(base, refs=[refs[0].double()]))
    io["ref1.ids"] = f32(model.token_ids(TXT, GRID, REF_GRIDS[:1]))
    run_dit(model, io, "ref2.", dict(base, refs=[r.double() for r in refs]), blocks=False)
    ids2 = model.token_ids(TXT, GRID, REF_GRIDS)
    io["ref2.ids"] = f32(ids2)
    io["ref2.rope.cos"], io["ref2.rope.sin"] = (f32(t) for t in rope_planes(ids2, model.axes_dim, model.theta))

    for steps, seq in SCHEDULES:
        io["schedule.steps%d_seq%d" % (steps, seq)] = ref.get_schedule(steps, seq).to(torch.float32).contiguous()
    check_dit(model, io)
    return ckpt, io


def build_ae(seed, cfg):
    ae = ref.AutoEncoder(**cfg)
    ckpt = randomize(ae, seed)
    ae = ae.double().eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    io = {}
    image = (torch.rand(1, 3, *IMAGE_HW, generator=gen) * 2 - 1).to(DTYPE)
    io["image"] = image
    with torch.no_grad():
        z, enc = ae.encode(image.double())
        io["encoded"] = f32(z)
        for k in ("moments", "mean", "patchified"):
            io["encoded." + k] = f32(enc[k])
        for k, v in enc["blocks"].items():
            io["block." + k] = f32(v)
        given = torch.randn(z.shape, generator=gen).to(DTYPE)
        io["z"] = given
        img, dec = ae.decode(given.double())
        io["decoded"] = f32(img)
        io["decoded.unnormalized"] = f32(dec["unnormalized"])
        io["decoded.unpatchified"] = f32(dec["unpatchified"])
        for k, v in dec["blocks"].items():
            io["block." + k] = f32(v)
        io["roundtrip"] = f32(ae.decode(z)[0])
    check_ae(ae, cfg, image.double())
    return ckpt, io


def same(a, b):
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


# klein's conditioning on a tiny Qwen3 (width 16: 3 x 16 = the tiny DiT's
# context 48) with more layers than hidden_states 27 needs: right-padded ids
# with the padding masked inside Qwen3, hidden_states 9, 18, 27 side by side.
KLEIN_QWEN3 = dict(vocab=300, hidden=16, layers=28, heads=4, kv_heads=2, head_dim=8, ffn=24)
KLEIN_REAL_TOKENS = 23
KLEIN_PAD_ID = 283  # the tiny tokenizer's <|endoftext|> (tests/golden/pipeline/z_image_tiny/tokenizer)


def build_klein_text(seed):
    from reference import qwen3 as q3

    gen = torch.Generator().manual_seed(seed)
    model = q3.Qwen3Model(**KLEIN_QWEN3).to(torch.float64)
    ckpt = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_value(name, tuple(p.shape), gen).to(torch.float64))
            ckpt[name] = f32(p)
    ids = torch.full((1, ref.MAX_LENGTH), KLEIN_PAD_ID, dtype=torch.int64)
    ids[0, :KLEIN_REAL_TOKENS] = torch.randint(0, 286, (KLEIN_REAL_TOKENS,), generator=gen)
    mask = torch.zeros(1, ref.MAX_LENGTH, dtype=torch.int64)
    mask[0, :KLEIN_REAL_TOKENS] = 1
    with torch.no_grad():
        hs = ref.qwen3_hidden_states_masked(model, ids, mask)
        context = ref.klein_context(hs)
    io = {"ids": f32(ids.to(torch.float64)), "mask": f32(mask.to(torch.float64)), "context": f32(context)}
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    check_names()
    check_rope()
    check_pieces()
    for name, build, seed, metadata in (
            ("flux2_tiny", build_dit, SEED, DIT_METADATA),
            ("flux2_ae_tiny", lambda s: build_ae(s, AE_TINY), SEED + 10, None),
            ("flux2_ae_small_decoder_tiny", lambda s: build_ae(s, AE_SMALL_DECODER), SEED + 20, None),
            ("flux2_klein_qwen3_tiny", build_klein_text, SEED + 30, None)):
        ckpt, io = build(seed)
        ckpt2, io2 = build(seed)
        assert same(ckpt, ckpt2) and same(io, io2), name + ": a second build differs"
        mmf.save_fixture_pair(args.out, name, ckpt, io, "training/make_flux2_fixtures.py",
                              "NCHW, [batch, tokens, width]", metadata, max_bytes=(5 << 20) // 2)


if __name__ == "__main__":
    main()
