#!/usr/bin/python3
"""Writes a tiny random-weight Flux.1-dev in BFL's parts and the golden result
of a whole text-to-image job on it, computed with the PyTorch references in
training/reference/ (no kiln code): the end-to-end truth for kiln's Flux
pipeline (tests/unit/flux_pipeline_test.cpp).

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_flux_pipeline_fixtures.py

Writes, relative to the repository root:
  tests/golden/pipeline/flux_tiny/flux_dit.safetensors  BFL names, no prefix (as flux1-dev.safetensors),
                                                       F16, metadata kiln.flux.axes_dim "8,12,12"
  tests/golden/pipeline/flux_tiny/ae.safetensors       BFL's autoencoder: no quant convs, z 16, F16
  tests/golden/pipeline/flux_tiny/clip_l.safetensors   HF CLIPTextModel names (text_model.*), F16,
                                                       metadata kiln.clip.heads "2"
  tests/golden/pipeline/flux_tiny/t5xxl.safetensors    HF T5EncoderModel names (shared, encoder.*), F16
  tests/golden/pipeline/flux_tiny/diffusers_transformer.safetensors
                                                       the same DiT in diffusers' FluxTransformer2DModel names
                                                       (as in a diffusers folder's transformer/), converted
                                                       here the way diffusers' convert_flux_to_diffusers.py
                                                       does: qkv and linear1 split, norm_out's halves swapped
  tests/golden/pipeline/flux_tiny/tokenizer_2/tokenizer.json
                                                       a 48-piece SentencePiece unigram vocabulary in HF's
                                                       format (T5's layout: <pad> 0, </s> 1, <unk> 2)
  tests/golden/pipeline/flux_tiny/chroma_dit.safetensors  a Chroma DiT (distilled_guidance_layer, no
                                                       per-block modulation, no vector_in) of the same widths
  tests/golden/pipeline/chroma_tiny_txt2img.safetensors  a Chroma job: the same prompt and seed, negative
      prompt "", cfg 4, mu 1.0 (no resolution shift), T5 padding masked out of the DiT's attention but for
      one pad token after EOS (sd-cli's default): t5.tokens / t5.uncond_tokens, t5.hidden / t5.uncond_hidden,
      t5.valid / t5.uncond_valid [1, 512], noise, sigmas, latent, image
  tests/golden/pipeline/flux_tiny_txt2img.safetensors  the job's inputs, intermediates and result (F32):
      t5.tokens [1, 512] (I32), clip.tokens [1, 77] (I32), t5.hidden [1, 512, 48], clip.pooled [1, 32],
      noise [1, 16, 16, 16] (webui's Philox randn, seed 11, = --rng cuda), sigmas [5],
      velocity0 [1, 16, 16, 16] (the DiT's output at the first step), latent [1, 16, 16, 16] (final),
      image [1, 3, 32, 32] (decoded, in [-1, 1], not clamped); i2i.init_pixels [1, 3, 32, 32] (that image
      as 8-bit values) and i2i.image: image-to-image from it at strength 0.5 (see the code)

The job: prompt "a red cat on a blue square", 32x32, seed 11, 4 steps, euler, kiln's default
scheduler for Flux-dev (sd-cli's "discrete" on the flow table: t = linspace(999, 0, 4),
sigma = time_shift(mu, (t + 1) / 1000)) with BFL's resolution shift mu for 64 image tokens
(0.4675), guidance 3.5, cfg 1. The CLIP tokens come from tests/fixtures/tiny_tokenizer (CLIP BPE,
EOS padding); the T5 tokens from a unigram Viterbi written here from SentencePiece's definition.

Every stage runs in float64 on the stored F16 weights; deterministic (byte-identical files).
"""

import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import tiny_tokenizer  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.clip_text import ClipTextHF  # noqa: E402
from reference.flux import Flux  # noqa: E402
from reference.sampling import PhiloxGenerator, bfl_lin_function, bfl_time_shift  # noqa: E402
from reference.t5 import T5EncoderV11  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "flux_tiny")
SEED = 900
DTYPE = torch.float16

PROMPT = "a red cat on a blue square"
WIDTH = HEIGHT = 32
NOISE_SEED = 11
STEPS = 4
GUIDANCE = 3.5
T5_LENGTH = 512  # Flux-dev's max_length

CLIP = dict(vocab=320, width=32, layers=2, heads=2, positions=77, intermediate=64)
T5 = dict(vocab=64, d_model=48, d_kv=12, heads=4, d_ff=64, layers=2, num_buckets=32)
CHROMA_CFG = 4.0
CHROMA_MU = 1.0
DIT = dict(in_channels=64, out_channels=64, vec_in_dim=32, context_in_dim=48, hidden_size=64, mlp_hidden=128,
           num_heads=2, depth=2, depth_single_blocks=2, axes_dim=(8, 12, 12), guidance_embed=True)
AE = dict(ch=32, ch_mult=(1, 1), num_res_blocks=1, z_channels=16, embed_dim=16, quant_convs=False)
SCALE, SHIFT = 0.3611, 0.1159

META = "\u2581"
# (piece, log-probability): T5's specials first, then enough pieces that the
# prompt has several segmentations for Viterbi to choose from.
PIECES = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), (META, -3.0)]
PIECES += [(c, -4.0) for c in "abcdefghijklmnopqrstuvwxyz"]
PIECES += [(META + "a", -3.2), (META + "cat", -5.5), ("at", -4.1), (META + "red", -6.0), ("re", -4.2), ("ed", -4.4),
           (META + "on", -4.9), (META + "blue", -6.5), ("ue", -4.3), (META + "square", -7.0), ("are", -5.0),
           (META + "c", -4.6), ("qu", -4.5), (META + "b", -4.6), (META + "s", -4.6), ("lu", -4.8),
           (META + "r", -4.7), (META + "o", -4.7)]


def unigram_encode(text):
    """SentencePiece unigram: normalise whitespace, '▁' for spaces and in front, then the segmentation
    with the highest total log-probability (Viterbi over every piece matching at each position)."""
    text = META + META.join(text.split())
    scores = {p: s for p, s in PIECES[3:]}
    ids = {p: i for i, (p, _) in enumerate(PIECES)}
    n = len(text)
    best = [-math.inf] * (n + 1)
    back = [None] * (n + 1)
    best[0] = 0.0
    for end in range(1, n + 1):
        for start in range(end):
            piece = text[start:end]
            if piece in scores and best[start] + scores[piece] > best[end]:
                best[end] = best[start] + scores[piece]
                back[end] = start
    assert back[n] is not None, "the prompt needs a piece the vocabulary lacks"
    out = []
    end = n
    while end > 0:
        out.append(ids[text[back[end]:end]])
        end = back[end]
    return out[::-1]


def tokenizer_json():
    specials = [{"id": i, "content": PIECES[i][0], "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i in range(3)]
    meta = {"type": "Metaspace", "replacement": META, "prepend_scheme": "always", "split": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, meta]},
        "post_processor": None,
        "decoder": meta,
        "model": {"type": "Unigram", "unk_id": 2, "vocab": [[p, s] for p, s in PIECES], "byte_fallback": False},
    }


def clip_tokenizer():
    folder = os.path.join(ROOT, "tests", "fixtures", "tiny_tokenizer")
    vocab = json.load(open(os.path.join(folder, "vocab.json")))
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [line.rstrip("\n") for line in open(os.path.join(folder, "merges.txt")) if not line.startswith("#")]
    return tiny_tokenizer.Tokenizer(tokens, [m for m in merges if m])


def f64(module):
    return module.double().eval()


def t5_row(text):
    ids = unigram_encode(text) + [1] if text else [1]
    return ids + [0] * (T5_LENGTH - len(ids))


def kept(ids, extra_pad=1):
    """Chroma's DiT mask: real tokens and EOS, then `extra_pad` pad tokens."""
    n = sum(1 for i in ids if i != 0) + extra_pad
    return [1.0 if k < n else 0.0 for k in range(len(ids))]


def flow_sigmas(mu):
    ts = np.linspace(999, 0, STEPS)
    return [float(np.float32(bfl_time_shift(mu, 1.0, (t + 1) / 1000))) for t in ts] + [0.0]


def chroma_job(t5, ae):
    dit = Flux(**dict(DIT, vec_in_dim=0, guidance_embed=False, chroma=True, approximator_hidden=32,
                      approximator_layers=2))
    safetensors_io.save_file(mmf.randomize(dit, SEED + 5, DTYPE), os.path.join(PARTS, "chroma_dit.safetensors"),
                             metadata={"kiln.flux.axes_dim": "8,12,12"})
    dit = f64(dit)
    io = {}
    rows = {"": t5_row(PROMPT), "uncond_": t5_row("")}
    with torch.no_grad():
        hidden, valid = {}, {}
        for key, ids in rows.items():
            io["t5.%stokens" % key] = torch.tensor([ids], dtype=torch.int32)
            h = t5(torch.tensor([ids]))
            hidden[key] = h[0] if isinstance(h, tuple) else h
            valid[key] = torch.tensor([kept(ids)], dtype=torch.float64)
            io["t5.%shidden" % key] = mmf.f32(hidden[key])
            io["t5.%svalid" % key] = valid[key].to(torch.float32)
        sigmas = flow_sigmas(CHROMA_MU)
        io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
        lw, lh = WIDTH // 2, HEIGHT // 2
        noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(16 * lh * lw), dtype=torch.float32)
        io["noise"] = noise.reshape(1, 16, lh, lw)
        x = io["noise"].double() * sigmas[0]
        for i in range(STEPS):
            t = torch.tensor([sigmas[i]], dtype=torch.float64)
            vc, _ = dit(x, hidden[""], t, txt_mask=valid[""])
            vu, _ = dit(x, hidden["uncond_"], t, txt_mask=valid["uncond_"])
            x = x + (sigmas[i + 1] - sigmas[i]) * (vu + CHROMA_CFG * (vc - vu))
        io["latent"] = mmf.f32(x)
        io["image"] = mmf.f32(ae.decode(x / SCALE + SHIFT)[0])
    path = os.path.join(OUT, "chroma_tiny_txt2img.safetensors")
    safetensors_io.save_file(io, path, metadata={"prompt": PROMPT, "seed": str(NOISE_SEED), "steps": str(STEPS),
                                                 "cfg_scale": str(CHROMA_CFG), "mu": repr(CHROMA_MU)})
    print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), os.path.getsize(path)))


DIFFUSERS_GLOBAL = {
    "img_in": "x_embedder", "txt_in": "context_embedder",
    "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
    "final_layer.linear": "proj_out", "final_layer.adaLN_modulation.1": "norm_out.linear",
}
DIFFUSERS_DOUBLE = {
    "img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
    "img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2",
    "txt_mlp.0": "ff_context.net.0.proj", "txt_mlp.2": "ff_context.net.2",
    "img_attn.norm.query_norm": "attn.norm_q", "img_attn.norm.key_norm": "attn.norm_k",
    "txt_attn.norm.query_norm": "attn.norm_added_q", "txt_attn.norm.key_norm": "attn.norm_added_k",
}
DIFFUSERS_SINGLE = {"linear2": "proj_out", "modulation.lin": "norm.linear", "norm.query_norm": "attn.norm_q",
                    "norm.key_norm": "attn.norm_k"}


def to_diffusers(bfl, hidden):
    """BFL's Flux state dict in diffusers' FluxTransformer2DModel names (the inverse of diffusers'
    scripts/convert_flux_to_diffusers.py): q/k/v split, linear1 split into q, k, v and proj_mlp, and
    norm_out's (scale, shift) where BFL's final adaLN has (shift, scale); RMSNorm .scale -> .weight."""
    out = {}
    for name, t in bfl.items():
        stem, leaf = name.rsplit(".", 1)
        leaf = "weight" if leaf == "scale" else leaf
        if stem in DIFFUSERS_GLOBAL:
            if stem == "final_layer.adaLN_modulation.1":
                shift, scale = t.chunk(2, dim=0)
                t = torch.cat([scale, shift], dim=0)
            out["%s.%s" % (DIFFUSERS_GLOBAL[stem], leaf)] = t
            continue
        kind, index, rest = stem.split(".", 2)
        if kind == "double_blocks":
            block = "transformer_blocks.%s." % index
            if rest in ("img_attn.qkv", "txt_attn.qkv"):
                parts = ("to_q", "to_k", "to_v") if rest.startswith("img") else ("add_q_proj", "add_k_proj",
                                                                                 "add_v_proj")
                for part, chunk in zip(parts, t.chunk(3, dim=0)):
                    out[block + "attn.%s.%s" % (part, leaf)] = chunk.contiguous()
            else:
                out[block + "%s.%s" % (DIFFUSERS_DOUBLE[rest], leaf)] = t
        else:
            block = "single_transformer_blocks.%s." % index
            if rest == "linear1":
                q, k, v, mlp = torch.split(t, [hidden, hidden, hidden, t.shape[0] - 3 * hidden], dim=0)
                for part, chunk in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), (q, k, v, mlp)):
                    out[block + "%s.%s" % (part, leaf)] = chunk.contiguous()
            else:
                out[block + "%s.%s" % (DIFFUSERS_SINGLE[rest], leaf)] = t
    return out


def main():
    os.makedirs(os.path.join(PARTS, "tokenizer_2"), exist_ok=True)
    with open(os.path.join(PARTS, "tokenizer_2", "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, indent=1, ensure_ascii=False)
        f.write("\n")
    io = {}

    t5_ids = t5_row(PROMPT)
    clip_ids = clip_tokenizer()(PROMPT)
    io["t5.tokens"] = torch.tensor([t5_ids], dtype=torch.int32)
    io["clip.tokens"] = torch.tensor([clip_ids], dtype=torch.int32)

    clip = ClipTextHF(**CLIP)
    stored = mmf.randomize(clip, SEED + 1, DTYPE)
    stored["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64).reshape(1, 77)
    safetensors_io.save_file(stored, os.path.join(PARTS, "clip_l.safetensors"), metadata={"kiln.clip.heads": "2"})
    t5 = T5EncoderV11(**T5)
    safetensors_io.save_file(mmf.randomize(t5, SEED + 2, DTYPE), os.path.join(PARTS, "t5xxl.safetensors"))
    dit = Flux(**DIT)
    dit_weights = mmf.randomize(dit, SEED + 3, DTYPE)
    safetensors_io.save_file(dit_weights, os.path.join(PARTS, "flux_dit.safetensors"),
                             metadata={"kiln.flux.axes_dim": "8,12,12"})
    safetensors_io.save_file(to_diffusers(dit_weights, DIT["hidden_size"]),
                             os.path.join(PARTS, "diffusers_transformer.safetensors"),
                             metadata={"kiln.flux.axes_dim": "8,12,12"})
    ae = AutoencoderKL(**AE)
    safetensors_io.save_file(mmf.randomize(ae, SEED + 4, DTYPE), os.path.join(PARTS, "ae.safetensors"))
    clip, t5, dit, ae = f64(clip), f64(t5), f64(dit), f64(ae)

    with torch.no_grad():
        hidden = t5(io["t5.tokens"].long())
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        _, pooled = clip.encode(io["clip.tokens"].long(), pooled=True)
        io["t5.hidden"] = mmf.f32(hidden)
        io["clip.pooled"] = mmf.f32(pooled)

        lw, lh = WIDTH // 2, HEIGHT // 2
        image_tokens = (lw // 2) * (lh // 2)
        mu = bfl_lin_function()(image_tokens)
        sigmas = flow_sigmas(mu)
        io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
        noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(16 * lh * lw), dtype=torch.float32)
        noise = noise.reshape(1, 16, lh, lw)
        io["noise"] = noise
        x = noise.double() * sigmas[0]
        guidance = torch.tensor([GUIDANCE], dtype=torch.float64)
        for i in range(STEPS):
            v, _ = dit(x, hidden, torch.tensor([sigmas[i]], dtype=torch.float64), y=pooled, guidance=guidance)
            if i == 0:
                io["velocity0"] = mmf.f32(v)
            x = x + (sigmas[i + 1] - sigmas[i]) * v  # BFL's Euler step on the velocity
        io["latent"] = mmf.f32(x)
        image, _ = ae.decode(x / SCALE + SHIFT)
        io["image"] = mmf.f32(image)
        # Image-to-image from that image (as 8-bit pixels): the init latent is a sample of the
        # autoencoder's posterior drawn from the job's generator at the seed (sd-cli's order), the
        # noise starts again from a generator at the seed, and with strength 0.5 sd-cli's
        # t_enc = int(4 * 0.5) = 2: the sigmas from index 4 - 2 - 1 = 1 on, so 3 steps run from
        # x = (1 - sigma) x0 + sigma noise.
        pixels = torch.round(torch.clamp((image + 1) / 2, 0, 1) * 255)
        io["i2i.init_pixels"] = pixels.to(torch.float32)
        moments = ae.encoder(pixels / 127.5 - 1, {})
        mean, logvar = moments.chunk(2, dim=1)
        std = torch.exp(0.5 * torch.clamp(logvar, -30, 20))
        draw = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(mean.numel()), dtype=torch.float64).reshape(mean.shape)
        x0 = (mean + std * draw - SHIFT) * SCALE
        t_enc = min(STEPS - 1, int(STEPS * 0.5))
        tail = sigmas[STEPS - t_enc - 1:]
        x = (1 - tail[0]) * x0 + tail[0] * noise.double()
        for i in range(len(tail) - 1):
            v, _ = dit(x, hidden, torch.tensor([tail[i]], dtype=torch.float64), y=pooled, guidance=guidance)
            x = x + (tail[i + 1] - tail[i]) * v
        io["i2i.image"] = mmf.f32(ae.decode(x / SCALE + SHIFT)[0])
    meta = {"prompt": PROMPT, "seed": str(NOISE_SEED), "steps": str(STEPS), "guidance": str(GUIDANCE),
            "mu": repr(mu)}
    path = os.path.join(OUT, "flux_tiny_txt2img.safetensors")
    safetensors_io.save_file(io, path, metadata=meta)
    chroma_job(t5, ae)
    for name in sorted(os.listdir(PARTS)):
        p = os.path.join(PARTS, name)
        if os.path.isfile(p):
            print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("wrote %s (%d bytes); t5 tokens %s; clip tokens %s" % (
        os.path.relpath(path, ROOT), os.path.getsize(path), t5_ids[:12], clip_ids[:10]))


if __name__ == "__main__":
    main()
