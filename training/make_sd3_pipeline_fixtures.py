#!/usr/bin/python3
"""Writes a tiny random-weight SD3.5 in Stability's release layout and the
golden result of whole text-to-image jobs on it, computed with the PyTorch
references in training/reference/ (no kiln code): the end-to-end truth for
kiln's SD3 pipeline (tests/unit/sd3_pipeline_test.cpp).

Run with Debian's python3-torch, after training/make_flux_pipeline_fixtures.py
(whose CLIP-L, T5 and autoencoder it reuses):
    /usr/bin/python3 training/make_sd3_pipeline_fixtures.py

Reads tests/golden/pipeline/flux_tiny/{clip_l,t5xxl,ae}.safetensors: CLIP-L
in HF names (width 32), T5 v1.1 in HF names (48) with its unigram tokenizer
in tokenizer_2/, and a 16-channel autoencoder without quant convs (SD3's VAE
has Flux's architecture; only the latent scale and shift differ). Writes:

  tests/golden/pipeline/sd3_tiny/sd3.5_tiny.safetensors
      the MMDiT under model.diffusion_model. and the autoencoder under
      first_stage_model. (as sd3.5_large.safetensors), F16: 2 joint blocks,
      hidden 64, 2 heads of 32 with QK norm (SD3.5 Large's), context 48
      (T5's width), pooled 44, pos_embed_max_size 10
  tests/golden/pipeline/sd3_tiny/clip_g.safetensors
      an OpenCLIP tower (GELU, text_projection) written in HF's
      CLIPTextModelWithProjection names, as Stability's clip_g.safetensors:
      width 12, 2 layers, metadata kiln.clip.heads "2"
  tests/golden/pipeline/sd3_tiny_txt2img.safetensors
      the job "a red cat on a blue square", negative "", 32x32, seed 11,
      4 steps euler, cfg 4.5, the flow schedule with shift 3 (sd-cli's
      discrete flow table: t = linspace(999, 0, 4), sigma = 3 s / (1 + 2 s),
      s = (t + 1) / 1000): clip_l.tokens, clip_g.tokens (0 after EOS),
      t5.tokens [1, 77]; context [1, 154, 48] (sd3_infer.get_cond's join),
      pooled [1, 44], uncond.context, uncond.pooled; sigmas, noise (webui's
      Philox, seed 11), latent, image [1, 3, 32, 32] in [-1, 1];
      no_t5.context and no_t5.image: the same job without T5 (77 zero rows)

Deliberate difference from Stability's sd3_infer.py, which kiln follows
sd-cli in: the schedule (sd3_infer samples dpmpp_2m on a linspace of its own
shifted table; kiln, like sd-cli, takes the discrete flow table above).

Every stage runs in float64 on the stored F16 weights; deterministic.
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_flux_pipeline_fixtures as flux  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from reference import mmdit  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.clip_text import ClipTextHF, ClipTextOpenClip  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402
from reference.t5 import T5EncoderV11  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "sd3_tiny")
SEED = 3600
DTYPE = torch.float16
PROMPT, NEGATIVE = flux.PROMPT, ""
WIDTH = HEIGHT = 32
NOISE_SEED, STEPS, CFG, SHIFT_K = 11, 4, 4.5, 3.0
SCALE, SHIFT = 1.5305, 0.0609
T5_LENGTH = 77
CLIP_G = dict(vocab=320, width=12, layers=2, heads=2, positions=77, intermediate=24)
DIT = dict(depth=2, hidden=64, heads=2, in_channels=16, patch=2, context_dim=48, adm_dim=32 + 12,
           pos_embed_max_size=10, qk_norm=True)


def load(module, path, drop=()):
    stored, _ = safetensors_io.load_file(path)
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items() if k not in drop})
    return module.double().eval()


def openclip_as_hf(stored, width):
    """An OpenCLIP text tower's state dict in HF's CLIPTextModelWithProjection names."""
    out = {"text_model.embeddings.token_embedding.weight": stored["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": stored["positional_embedding"],
           "text_model.final_layer_norm.weight": stored["ln_final.weight"],
           "text_model.final_layer_norm.bias": stored["ln_final.bias"],
           "text_projection.weight": stored["text_projection"].t().contiguous()}
    i = 0
    while "transformer.resblocks.%d.ln_1.weight" % i in stored:
        oc, hf = "transformer.resblocks.%d." % i, "text_model.encoder.layers.%d." % i
        for a, b in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("attn.out_proj", "self_attn.out_proj"),
                     ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
            for leaf in ("weight", "bias"):
                out[hf + b + "." + leaf] = stored[oc + a + "." + leaf]
        for k, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[hf + "self_attn.%s.weight" % name] = stored[oc + "attn.in_proj_weight"][k * width:(k + 1) * width]
            out[hf + "self_attn.%s.bias" % name] = stored[oc + "attn.in_proj_bias"][k * width:(k + 1) * width]
        i += 1
    return {k: v.contiguous() for k, v in out.items()}


def flow_sigmas():
    import numpy as np
    ts = np.linspace(999, 0, STEPS)
    s = [(t + 1) / 1000 for t in ts]
    return [float(np.float32(SHIFT_K * v / (1 + (SHIFT_K - 1) * v))) for v in s] + [0.0]


def main():
    os.makedirs(PARTS, exist_ok=True)
    flux_parts = flux.PARTS
    clip_l = load(ClipTextHF(**flux.CLIP), os.path.join(flux_parts, "clip_l.safetensors"),
                  drop=("text_model.embeddings.position_ids",))
    t5 = load(T5EncoderV11(**flux.T5), os.path.join(flux_parts, "t5xxl.safetensors"))
    ae = load(AutoencoderKL(**flux.AE), os.path.join(flux_parts, "ae.safetensors"))

    clip_g = ClipTextOpenClip(**CLIP_G, with_projection=True)
    stored_g = mmf.randomize(clip_g, SEED + 1, DTYPE)
    del stored_g["logit_scale"]
    safetensors_io.save_file(openclip_as_hf(stored_g, CLIP_G["width"]), os.path.join(PARTS, "clip_g.safetensors"),
                             metadata={"kiln.clip.heads": "2"})
    dit = mmdit.MMDiT(**DIT)
    stored_dit = mmf.randomize(dit, SEED + 2, DTYPE)
    gen = torch.Generator().manual_seed(SEED + 3)  # a position table of the real one's scale, not a matrix's
    stored_dit["pos_embed"] = (0.5 * torch.randn(stored_dit["pos_embed"].shape, generator=gen)).to(DTYPE)
    dit.load_state_dict({k: v.to(torch.float32) for k, v in stored_dit.items()})
    ae_stored, _ = safetensors_io.load_file(os.path.join(flux_parts, "ae.safetensors"))
    release = {"model.diffusion_model." + k: v for k, v in stored_dit.items()}
    release.update({"first_stage_model." + k: v for k, v in ae_stored.items()})
    safetensors_io.save_file(release, os.path.join(PARTS, "sd3.5_tiny.safetensors"))
    clip_g, dit = clip_g.double().eval(), dit.double().eval()

    tokenizer = flux.clip_tokenizer()
    io = {}

    def cond(prompt, key, with_t5=True):
        l_ids = tokenizer(prompt)
        first_eos = l_ids.index(max(l_ids))  # EOS, the vocabulary's last id, pads CLIP-L's row
        assert l_ids[-1] == l_ids[first_eos]
        g_ids = l_ids[:first_eos + 1] + [0] * (77 - first_eos - 1)  # SDXL's CLIP-G tokenizer pads with 0
        t5_ids = (flux.unigram_encode(prompt) if prompt else []) + [1]
        t5_ids += [0] * (T5_LENGTH - len(t5_ids))
        io[key + "clip_l.tokens"] = torch.tensor([l_ids], dtype=torch.int32)
        io[key + "clip_g.tokens"] = torch.tensor([g_ids], dtype=torch.int32)
        io[key + "t5.tokens"] = torch.tensor([t5_ids], dtype=torch.int32)
        l_hidden, l_pooled = clip_l.encode(torch.tensor([l_ids]), layer_from_end=2, final_norm=False, pooled=True)
        g_hidden, g_pooled = clip_g.encode(torch.tensor([g_ids]), layer_from_end=2, final_norm=False, pooled=True)
        t5_hidden = t5(torch.tensor([t5_ids])) if with_t5 else None
        if isinstance(t5_hidden, tuple):
            t5_hidden = t5_hidden[0]
        return (mmdit.sd3_context(l_hidden, g_hidden, t5_hidden, DIT["context_dim"]),
                mmdit.sd3_pooled(l_pooled, g_pooled))

    def job(with_t5):
        c, cp = cond(PROMPT, "", with_t5)
        u, up = cond(NEGATIVE, "uncond.", with_t5)
        sigmas = flow_sigmas()
        lw, lh = WIDTH // 2, HEIGHT // 2
        noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(16 * lh * lw), dtype=torch.float32)
        noise = noise.reshape(1, 16, lh, lw)
        x = noise.double() * sigmas[0]
        for i in range(STEPS):
            t = torch.tensor([sigmas[i]], dtype=torch.float64)
            vc, vu = dit(x, t, cp, c), dit(x, t, up, u)
            x = x + (sigmas[i + 1] - sigmas[i]) * (vu + CFG * (vc - vu))
        image, _ = ae.decode(x / SCALE + SHIFT)
        return c, cp, u, up, sigmas, noise, x, image

    with torch.no_grad():
        c, cp, u, up, sigmas, noise, latent, image = job(True)
        io.update({"context": mmf.f32(c), "pooled": mmf.f32(cp), "uncond.context": mmf.f32(u),
                   "uncond.pooled": mmf.f32(up), "sigmas": torch.tensor(sigmas, dtype=torch.float32),
                   "noise": noise, "latent": mmf.f32(latent), "image": mmf.f32(image)})
        tokens = {k: v for k, v in io.items() if k.endswith("tokens")}
        c, _, _, _, _, _, _, image = job(False)
        io.update(tokens)
        io["no_t5.context"] = mmf.f32(c)
        io["no_t5.image"] = mmf.f32(image)
    path = os.path.join(OUT, "sd3_tiny_txt2img.safetensors")
    safetensors_io.save_file(io, path, metadata={"prompt": PROMPT, "negative_prompt": NEGATIVE,
                                                 "seed": str(NOISE_SEED), "steps": str(STEPS), "cfg_scale": str(CFG)})
    for p in [os.path.join(PARTS, n) for n in sorted(os.listdir(PARTS))] + [path]:
        print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("clip_l tokens %s, t5 tokens %s" % (io["clip_l.tokens"][0, :10].tolist(), io["t5.tokens"][0, :10].tolist()))


if __name__ == "__main__":
    main()
