#!/usr/bin/python3
"""Writes tiny random-weight Flux.1 and Chroma DiTs with BFL's tensor names and
their golden inputs/outputs, computed with training/reference/flux.py, for
tests/unit/flux_dit_test.cpp.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_flux_fixtures.py [--out DIR]

Writes into tests/golden/models/ (training/README.md lists the contents):
  flux_tiny.safetensors           like flux1-dev (guidance_in), no prefix
  flux_schnell_tiny.safetensors   like flux1-schnell (no guidance_in), under
                                  model.diffusion_model. (ComfyUI all-in-one)
  chroma_tiny.safetensors         Chroma (distilled_guidance_layer, no
                                  modulation layers, no vector_in), no prefix
  <model>_io.safetensors          inputs, per-block outputs and outputs (F32)

Every model: hidden 64, 2 heads of 32 (axes_dim 8, 12, 12: metadata
"kiln.flux.axes_dim"), MLP 128, 2 double and 2 single blocks, 16 latent
channels (in/out 64 after 2x2 patches), context 32 (T5's width in Flux: 4096),
vector 24 (CLIP-L pooled: 768). Inputs: an 8x8 latent (16 image tokens), 7
text tokens, batch 2. Weights are F16; the reference runs in float64 on
exactly the stored values, so a C++ run with the weights widened to F32
agrees to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: RoPE is a rotation of each pair by its angle (complex
multiplication), attention scores depend only on relative positions, patchify
inverts, schnell ignores guidance while dev does not, and Chroma's image
output ignores what padded text tokens hold.

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import flux as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 700
DTYPE = torch.float16
TINY = dict(in_channels=64, out_channels=64, vec_in_dim=24, context_in_dim=32, hidden_size=64, mlp_hidden=128,
            num_heads=2, depth=2, depth_single_blocks=2, axes_dim=(8, 12, 12), theta=10000, qkv_bias=True)
CHROMA = dict(approximator_hidden=48, approximator_layers=2)
METADATA = {"kiln.flux.axes_dim": "8,12,12"}
BATCH, LATENT, SIZE, TXT = 2, 16, 8, 7
# Kontext: one reference latent of another size (4x6: 2x3 patches), and a
# second case with two (the second, 6x2 (3x1 patches), placed to the right of
# the first: below it, the pair would be taller than wide).
REF_SIZES = [(4, 6), (6, 2)]
# Chroma: per prompt, how many of the 7 T5 tokens are real (the rest padding).
VALID = [5, 3]


def init_value(name, shape, gen):
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) >= 2:
        return torch.randn(shape, generator=gen) * shape[1] ** -0.5
    if leaf == "scale":  # RMSNorm
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return 0.05 * torch.randn(shape, generator=gen)  # biases


def randomize(module, seed):
    """Seeded F16 weights in state_dict order; loads the widened values into `module`."""
    gen = torch.Generator().manual_seed(seed)
    stored = {k: init_value(k, v.shape, gen).to(DTYPE).contiguous() for k, v in module.state_dict().items()}
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()})
    return stored


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def rope_planes(ids, axes_dim, theta):
    """[L, head_dim/2] cos and sin of every pair's angle, from the reference's pe."""
    pe = ref.embed_nd(ids[None], axes_dim, theta)[0, 0]  # [L, D/2, 2, 2]
    return pe[..., 0, 0], pe[..., 1, 0]


# ------------------------------------------------------------ self-checks


def check_reference(model):
    gen = torch.Generator().manual_seed(1)
    # RoPE rotates each pair (x[2j], x[2j+1]) as the complex number x[2j] + i x[2j+1]
    # times exp(i angle).
    ids = ref.token_ids(3, (2, 3), [(1, 2)])
    pe = ref.embed_nd(ids[None], model.axes_dim, model.theta)
    x = torch.randn(1, 2, ids.shape[0], sum(model.axes_dim), generator=gen, dtype=torch.float64)
    cos, sin = rope_planes(ids, model.axes_dim, model.theta)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.complex(cos, sin)
    assert torch.allclose(ref.apply_rope(x, pe), torch.stack([z.real, z.imag], dim=-1).reshape(x.shape), atol=1e-12)
    # Scores after RoPE depend on positions only through their differences.
    q, k = x, torch.randn(x.shape, generator=gen, dtype=torch.float64)
    shifted = ref.embed_nd((ids + torch.tensor([2.0, -3.0, 5.0], dtype=torch.float64))[None], model.axes_dim,
                           model.theta)
    scores = ref.apply_rope(q, pe) @ ref.apply_rope(k, pe).transpose(-1, -2)
    scores_shifted = ref.apply_rope(q, shifted) @ ref.apply_rope(k, shifted).transpose(-1, -2)
    assert torch.allclose(scores, scores_shifted, atol=1e-9)
    # patchify / unpatchify are inverses, and patchify is BFL's rearrange.
    lat = torch.randn(2, 3, 4, 6, generator=gen, dtype=torch.float64)
    tokens = ref.patchify(lat)
    assert torch.equal(ref.unpatchify(tokens, 2, 3), lat)
    assert torch.equal(tokens[1, 1 * 3 + 2], lat[1, :, 2:4, 4:6].reshape(-1))  # token (row 1, col 2)


def check_guidance(model, inputs, needs_guidance):
    with torch.no_grad():
        a, _ = model(**inputs)
        b, _ = model(**dict(inputs, guidance=inputs["guidance"] + 1.0))
    assert torch.equal(a, b) != needs_guidance, "guidance_in must be used iff the model has it"


def check_padding_ignored(model, inputs):
    context = inputs["context"].clone()
    context[0, VALID[0]:] += 10.0
    context[1, VALID[1]:] -= 7.0
    with torch.no_grad():
        a, _ = model(**inputs)
        b, _ = model(**dict(inputs, context=context))
    assert torch.allclose(a, b, atol=1e-12), "masked text tokens changed the image"


# ------------------------------------------------------------ fixtures


def run(model, io, prefix, inputs, blocks=True):
    with torch.no_grad():
        out, block_outputs = model(**inputs)
    io[prefix + "out"] = f32(out)
    if blocks:
        for k, v in block_outputs.items():
            io[prefix + "block." + k] = f32(v)
    return out


def build(kind, seed):
    """Returns (checkpoint tensors, io tensors)."""
    chroma = kind == "chroma"
    cfg = dict(TINY, guidance_embed=kind == "dev", chroma=chroma, **(CHROMA if chroma else {}))
    model = ref.Flux(**cfg)
    ckpt = randomize(model, seed)
    model = model.double().eval()
    check_reference(model)

    gen = torch.Generator().manual_seed(seed + 1000)
    io = {}
    x = torch.randn(BATCH, LATENT, SIZE, SIZE, generator=gen)
    context = torch.randn(BATCH, TXT, TINY["context_in_dim"], generator=gen)
    timesteps = torch.tensor([1.0, 0.35])
    io.update({"x": x, "context": context, "timesteps": timesteps})
    inputs = dict(x=x.double(), context=context.double(), timesteps=timesteps.double())
    if not chroma:
        y = torch.randn(BATCH, TINY["vec_in_dim"], generator=gen)
        guidance = torch.tensor([3.5, 1.0])
        io.update({"y": y})
        inputs["y"] = y.double()
        if kind == "dev":
            io["guidance"] = guidance
            inputs["guidance"] = guidance.double()
        check_guidance(model, dict(inputs, guidance=guidance.double()), kind == "dev")
    run(model, io, "", inputs)

    cos, sin = rope_planes(ref.token_ids(TXT, (SIZE // 2, SIZE // 2)), model.axes_dim, model.theta)
    io["rope.cos"], io["rope.sin"] = f32(cos), f32(sin)

    if kind == "dev":
        # Kontext: reference latents appended as extra image tokens.
        refs = [torch.randn(BATCH, LATENT, h, w, generator=gen) for h, w in REF_SIZES]
        for i, r in enumerate(refs):
            io["kontext.ref%d" % i] = r
        run(model, io, "kontext.", dict(inputs, refs=[refs[0].double()]))
        run(model, io, "kontext2.", dict(inputs, refs=[r.double() for r in refs]), blocks=False)
        grids = [(h // 2, w // 2) for h, w in REF_SIZES]
        cos, sin = rope_planes(ref.token_ids(TXT, (SIZE // 2, SIZE // 2), grids), model.axes_dim, model.theta)
        io["kontext2.rope.cos"], io["kontext2.rope.sin"] = f32(cos), f32(sin)
        # Skip-layer guidance's pass: double block 1 and single block 1 left out.
        run(model, io, "skip.", dict(inputs, skip=(1, 3)), blocks=False)
    if chroma:
        txt_mask = torch.tensor([[1.0] * v + [0.0] * (TXT - v) for v in VALID])
        io["masked.txt_mask"] = txt_mask
        masked = dict(inputs, txt_mask=txt_mask.double())
        check_padding_ignored(model, masked)
        run(model, io, "masked.", masked)
        M = ref.chroma_modulation_count(TINY["depth"], TINY["depth_single_blocks"])
        io["chroma.index"] = f32(ref.timestep_embedding(torch.arange(M, dtype=torch.float64), 32))
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    for offset, (name, kind, prefix) in enumerate([("flux_tiny", "dev", ""),
                                                   ("flux_schnell_tiny", "schnell", "model.diffusion_model."),
                                                   ("chroma_tiny", "chroma", "")]):
        ckpt, io = build(kind, SEED + 10 * offset)
        mmf.save_fixture_pair(args.out, name, {prefix + k: v for k, v in ckpt.items()}, io,
                              "training/make_flux_fixtures.py", "NCHW, [batch, tokens, width]", METADATA,
                              max_bytes=1 << 20)

if __name__ == "__main__":
    main()
