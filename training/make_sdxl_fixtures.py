#!/usr/bin/python3
"""Writes a tiny random-weight SDXL checkpoint and its golden fixtures for the
C++ model tests, computed with the PyTorch references in training/reference/.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_sdxl_fixtures.py [--out DIR]

Writes into tests/golden/models/ (see training/README.md for the contents):
  sdxl_tiny.safetensors      conditioner.embedders.0.transformer.* (HF CLIP-L),
                             conditioner.embedders.1.model.* (open_clip bigG
                             with text_projection), model.diffusion_model.*
                             (sgm UNet with label_emb), F16
  sdxl_tiny_io.safetensors   inputs, outputs and per-block outputs (F32), and
                             a full-width (2816) conditioning vector, and the
                             UNet's output without its middle transformer
                             (SSD-1B's and Vega's middle block)

Every stage takes the previous one's output, as SDXL does: the UNet's context
is the two encoders' penultimate hidden states (no final norm) concatenated,
its y the pooled bigG output followed by the size embeddings.

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference.clip_text import ClipTextHF, ClipTextOpenClip  # noqa: E402
from reference.sdxl_conditioning import sdxl_vector  # noqa: E402
from reference.unet import UNet  # noqa: E402

CLIP_L_PREFIX = "conditioner.embedders.0.transformer."
CLIP_G_PREFIX = "conditioner.embedders.1.model."
UNET_PREFIX = "model.diffusion_model."

SEED = 400
DTYPE = torch.float16
# Both encoders: vocab 320 (BOS 318, EOS 319: tests/fixtures/tiny_tokenizer), width 32, 3 layers (so the
# penultimate layer is an inner one), 2 heads, MLP 128. bigG's projection is
# 32 -> 48, not square, so x @ P and P x differ.
CLIP = dict(vocab=320, width=32, layers=3, heads=2, intermediate=128)
PROJECTION = 48
# The size embeddings are 8 wide here (256 in SDXL): y = 48 + 6 * 8 = 96.
SIZE_DIM = 8
# sgm-style UNet: two levels of 32 channels, one resnet each, no attention at
# level 0 (as SDXL's first level), depth 2 in input_blocks.3, 1 in the middle
# (not the last level's: read on its own), output blocks 2, 1, 0, 0 (per-block
# depths as SSD-1B has), linear projections, 16-wide heads (2 per
# transformer; SDXL: 64-wide), context 32 + 32 = 64.
UNET = dict(in_channels=4, out_channels=4, model_channels=32, channel_mult=(1, 1), num_res_blocks=1,
            attention_levels=(1,), num_head_channels=16, transformer_depth=(0, 2), transformer_depth_middle=1,
            output_depths=(2, 1, 0, 0), use_linear_in_transformer=True)
METADATA = {"kiln.clip.heads": "2", "kiln.unet.head_channels": "16"}
# original size (h, w), crop top-left (top, left), target size (h, w), per prompt
SIZES = [((896, 1152), (16, 32), (1024, 1024)), ((512, 640), (0, 8), (768, 1344))]


def build():
    ckpt, io = {}, {}
    gen = torch.Generator().manual_seed(SEED + 1000)
    ids = mmf.make_tokens(gen, CLIP["vocab"], pad_id=0)
    eos = CLIP["vocab"] - 1
    # SDXL pads CLIP-L with EOS (so the pooled position is the first EOS of
    # many) and bigG with 0.
    tokens_l = torch.where(ids == 0, torch.full_like(ids, eos), ids)
    tokens_g = ids
    io["clip_l.tokens"] = tokens_l
    io["clip_g.tokens"] = tokens_g

    clip_l = ClipTextHF(positions=77, **CLIP)
    stored = mmf.randomize(clip_l, SEED + 1, DTYPE)
    stored["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64).reshape(1, 77)
    for k, v in stored.items():
        ckpt[CLIP_L_PREFIX + k] = v
    clip_g = ClipTextOpenClip(positions=77, with_projection=True, **CLIP)
    clip_g.text_projection = torch.nn.Parameter(torch.empty(CLIP["width"], PROJECTION))
    stored = mmf.randomize(clip_g, SEED + 2, DTYPE)
    for k, v in stored.items():
        ckpt[CLIP_G_PREFIX + k] = v
    clip_l, clip_g = clip_l.double().eval(), clip_g.double().eval()

    with torch.no_grad():
        hidden_l, pooled_l = clip_l.encode(tokens_l, layer_from_end=2, final_norm=False, pooled=True)
        hidden_g, pooled_g = clip_g.encode(tokens_g, layer_from_end=2, final_norm=False, pooled=True)
        io["clip_l.penultimate"] = mmf.f32(hidden_l)
        io["clip_l.pooled"] = mmf.f32(pooled_l)  # HF CLIPTextModel's pooler_output (no projection)
        io["clip_g.penultimate"] = mmf.f32(hidden_g)
        io["clip_g.pooled"] = mmf.f32(pooled_g)  # @ text_projection
        io["clip_g.last_normed"] = mmf.f32(clip_g.encode(tokens_g)[0])  # SD2-style, for contrast

    context = torch.cat([hidden_l, hidden_g], dim=-1)
    y = torch.cat([sdxl_vector(pooled_g[i:i + 1], *SIZES[i], outdim=SIZE_DIM) for i in range(2)])
    io["cond.sizes"] = torch.tensor([[v for pair in s for v in pair] for s in SIZES], dtype=torch.float32)
    io["unet.context"] = mmf.f32(context)
    io["unet.y"] = mmf.f32(y)

    unet = UNet(context_dim=context.shape[-1], adm_in_channels=y.shape[-1], **UNET)
    stored = mmf.randomize(unet, SEED + 3, DTYPE)
    for k, v in stored.items():
        ckpt[UNET_PREFIX + k] = v
    x = torch.randn(2, UNET["in_channels"], 8, 8, generator=gen)
    t = torch.tensor([981.0, 1.0])
    unet = unet.double().eval()
    with torch.no_grad():
        out, blocks = unet(x.double(), t.double(), context, y)
    io["unet.x"] = x
    io["unet.t"] = t
    io["unet.out"] = mmf.f32(out)
    for k, v in blocks.items():
        io["unet.block." + k] = mmf.f32(v)

    # The conditioning vector at SDXL's real widths: a pooled 1280 and 256-wide
    # size embeddings (2816), for the C++ pure function.
    pooled = torch.randn(2, 1280, generator=gen)
    io["cond.pooled_1280"] = pooled
    io["cond.vector_2816"] = mmf.f32(
        torch.cat([sdxl_vector(pooled[i:i + 1].double(), *SIZES[i], outdim=256) for i in range(2)]))

    # SSD-1B and Vega have no middle transformer (sgm's Identity at
    # middle_block.1): the same weights without it.
    lean = UNet(context_dim=context.shape[-1], adm_in_channels=y.shape[-1], **dict(UNET, transformer_depth_middle=0))
    lean.load_state_dict({k: v for k, v in unet.state_dict().items() if not k.startswith("middle_block.1.")})
    lean = lean.double().eval()
    with torch.no_grad():
        io["unet.out_no_middle_transformer"] = mmf.f32(lean(x.double(), t.double(), context, y)[0])
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=mmf.DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.manual_seed(SEED)
    ckpt, io = build()
    os.makedirs(args.out, exist_ok=True)
    mmf.save_fixture_pair(args.out, "sdxl_tiny", ckpt, io, "training/make_sdxl_fixtures.py",
                          "NCHW, [batch, tokens, width]", METADATA)

if __name__ == "__main__":
    main()
