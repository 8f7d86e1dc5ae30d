#!/usr/bin/python3
"""SDXL's conditioning by the second, independent reference (training/reference/sgm_conditioner.py, a
transcription of Stability's sgm GeneralConditioner and its embedders) on kiln's tiny SDXL, against
kiln's existing goldens, and a new golden for a CFG job with a non-empty negative prompt.

Run with Debian's python3-torch (not a pyenv python), from anywhere:
    /usr/bin/python3 training/check_sgm_conditioning.py [--out DIR]

1. Checks against tests/golden/models/sdxl_tiny_io.safetensors (written by training/make_sdxl_fixtures.py
   with kiln's first references), on its own token rows: CLIP-L's hidden_states[layer_idx] and
   pooler_output, bigG's penultimate, pooled (@ text_projection) and ln_final(last), the UNet context and
   y (8-wide size embeddings) and the 2816-wide vector; the max |diff| of each is printed. sgm computes
   the size embeddings in float32 (timestep_embedding), kiln's references in float64: that part differs
   by float32 rounding, up to ~1e-4 for sizes near 1024.
2. Writes tests/golden/pipeline/sdxl_cfg_negative.safetensors (F32 unless noted; PyTorch shapes):
     cond.tokens_l, cond.tokens_g, uncond.tokens_l, uncond.tokens_g   I32 [1, 77]: sgm's token rows for
                         PROMPT / NEGATIVE (CLIP-L padded with EOS 319, bigG padded with 0)
     cond.context, uncond.context   [1, 77, 64]: GeneralConditioner's crossattn (CLIP-L 32 | bigG 32)
     cond.y, uncond.y               [1, 96]: its vector (bigG pooled 48 | 6 x 8 size embeddings) for a
                                    WIDTH x HEIGHT job as kiln conditions one (original = target = the
                                    image's size, crop 0, 0: sd-cli's rule; sgm's demo asks for them)
     cfg.x                          [1, 4, 8, 8]: a seeded latent (torch.Generator seed 4711, randn)
     cfg.sigma                      [1]: the float32 discrete sigma of timestep CFG_T
     cfg.eps                        [1, 4, 8, 8]: eps_u + 6 (eps_c - eps_u), the UNet (kiln's UNet
                                    reference, training/reference/unet.py) on x * c_in at t = CFG_T with
                                    (uncond.context, uncond.y) and (cond.context, cond.y)
     cfg.denoised                   [1, 4, 8, 8]: sgm's VanillaCFG over DiscreteDenoiser(EpsScaling):
                                    x - sigma * cfg.eps
   metadata: prompt, negative_prompt, width, height, cfg_scale, timestep.
   The sigma is exactly a table entry, so sgm's quantized timestep (an integer) and k-diffusion's
   fractional sigma_to_t (kiln) agree up to float32 rounding of the sigma.

The networks run in float64 on the stored F16 weights widened; everything is deterministic (one thread).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import safetensors_io  # noqa: E402
from reference import sgm_conditioner as sgm  # noqa: E402
from reference.unet import UNet  # noqa: E402  (the UNet is not under question here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "golden", "models", "sdxl_tiny.safetensors")
MODEL_IO = os.path.join(ROOT, "tests", "golden", "models", "sdxl_tiny_io.safetensors")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tiny_tokenizer")
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
FILE_NAME = "sdxl_cfg_negative.safetensors"

# The tiny SDXL of training/make_sdxl_fixtures.py: both encoders vocab 320, width 32, 3 layers, 2 heads,
# MLP 128; bigG's text_projection 32 -> 48; size embeddings 8 wide (y = 48 + 6 * 8 = 96). CLIP-L keeps
# openai/clip-vit-large-patch14's quick_gelu, bigG open_clip's nn.GELU (ViT-bigG-14 has no quick_gelu).
CLIP_L = sgm.CLIPTextConfig(vocab_size=320, hidden_size=32, intermediate_size=128, num_hidden_layers=3,
                            num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu",
                            eos_token_id=2)  # 2: the legacy config openai/clip-vit-large-patch14 ships
BIGG = dict(width=32, heads=2, layers=3, mlp_ratio=4.0, embed_dim=48)
SIZE_DIM = 8
UNET = dict(in_channels=4, out_channels=4, model_channels=32, channel_mult=(1, 1), num_res_blocks=1,
            attention_levels=(1,), num_head_channels=16, transformer_depth=(0, 2), transformer_depth_middle=1,
            output_depths=(2, 1, 0, 0), use_linear_in_transformer=True)

PROMPT = "a red circle"
NEGATIVE = "ugly"
WIDTH = HEIGHT = 256
CFG_SCALE = 6.0
CFG_T = 700
X_SEED = 4711


def log(msg):
    print(msg, flush=True)


def maxdiff(a, b):
    return float((a.double() - b.double()).abs().max())


def load_unet(state):
    unet = UNet(context_dim=64, adm_in_channels=48 + 6 * SIZE_DIM, **UNET)
    prefix = "model.diffusion_model."
    unet.load_state_dict({k[len(prefix):]: v.double() for k, v in state.items() if k.startswith(prefix)}, strict=True)
    return unet.double().eval()


def check_existing(cond, io):
    """sgm's modules on the fixture's token rows against kiln's stored reference outputs."""
    e0, e1 = cond.embedders[0], cond.embedders[1]
    worst = {}
    with torch.no_grad():
        tokens_l = io["clip_l.tokens"].long()
        out = e0.transformer(input_ids=tokens_l, output_hidden_states=True)
        hidden_l = out["hidden_states"][e0.layer_idx]
        worst["clip_l.penultimate"] = maxdiff(hidden_l, io["clip_l.penultimate"])
        worst["clip_l.pooled (HF pooler_output)"] = maxdiff(out["pooler_output"], io["clip_l.pooled"])
        tokens_g = io["clip_g.tokens"].long()
        z = e1.encode_with_transformer(tokens_g)
        worst["clip_g.penultimate"] = maxdiff(z["penultimate"], io["clip_g.penultimate"])
        worst["clip_g.pooled"] = maxdiff(z["pooled"], io["clip_g.pooled"])
        worst["clip_g.last_normed (ln_final(last))"] = maxdiff(e1.model.ln_final(z["last"]), io["clip_g.last_normed"])
        context = torch.cat([hidden_l, z["penultimate"]], dim=2)
        worst["unet.context"] = maxdiff(context, io["unet.context"])

        sizes = io["cond.sizes"].double()  # per row: original (h, w), crop (top, left), target (h, w)

        def vector(pooled, outdim):
            parts = [pooled.float()]
            for k in range(3):
                parts.append(sgm.ConcatTimestepEmbedderND(outdim)(sizes[:, 2 * k:2 * k + 2]))
            return torch.cat(parts, dim=1)

        worst["unet.y (sizes 8 wide, sgm float32 embedding)"] = maxdiff(vector(z["pooled"], SIZE_DIM), io["unet.y"])
        v2816 = vector(io["cond.pooled_1280"].double(), 256)
        worst["cond.vector_2816 (sgm float32 embedding)"] = maxdiff(v2816, io["cond.vector_2816"])
        # the same in float64 (how kiln computes it): isolates the float32 rounding
        args64 = []
        for k in range(3):
            for j in range(2):
                v = sizes[:, 2 * k + j:2 * k + j + 1]
                half = 128
                f = torch.exp(-np.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
                args64.append(torch.cat([torch.cos(v * f), torch.sin(v * f)], dim=1))
        v2816_64 = torch.cat([io["cond.pooled_1280"].double()] + args64, dim=1)
        worst["cond.vector_2816 (float64 embedding)"] = maxdiff(v2816_64, io["cond.vector_2816"])
    log("against %s (kiln's references):" % os.path.relpath(MODEL_IO, ROOT))
    for k, v in worst.items():
        log("  %-48s max |diff| %.3e" % (k, v))
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/pipeline)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    state, meta = safetensors_io.load_file(MODEL)
    io, _ = safetensors_io.load_file(MODEL_IO)
    tokenizer = sgm.SimpleTokenizer(TOKENIZER)
    cond = sgm.sdxl_conditioner(state, tokenizer, CLIP_L, BIGG, size_outdim=SIZE_DIM)
    log("CLIP-L layer_idx %d of %d layers (sd_xl_base: 11 of 12)" % (cond.embedders[0].layer_idx, 3))
    worst = check_existing(cond, io)

    value_dict = dict(prompt=PROMPT, negative_prompt=NEGATIVE, orig_width=WIDTH, orig_height=HEIGHT,
                      crop_coords_top=0, crop_coords_left=0, target_width=WIDTH, target_height=HEIGHT)
    batch, batch_uc = sgm.get_batch(value_dict)
    with torch.no_grad():
        c, uc = cond.get_unconditional_conditioning(batch, batch_uc=batch_uc, force_uc_zero_embeddings=[])
    fx = {}
    for name, texts in (("cond", [PROMPT]), ("uncond", [NEGATIVE])):
        fx[name + ".tokens_l"] = cond.embedders[0].tokenize(texts).to(torch.int32)
        fx[name + ".tokens_g"] = cond.embedders[1].tokenize(texts).to(torch.int32)
    fx["cond.context"] = c["crossattn"].float().contiguous()
    fx["cond.y"] = c["vector"].float().contiguous()
    fx["uncond.context"] = uc["crossattn"].float().contiguous()
    fx["uncond.y"] = uc["vector"].float().contiguous()
    assert fx["cond.context"].shape == (1, 77, 64) and fx["cond.y"].shape == (1, 96)
    log("prompt %r -> CLIP-L %s, bigG %s" % (PROMPT, fx["cond.tokens_l"][0, :8].tolist(),
                                              fx["cond.tokens_g"][0, :8].tolist()))
    log("negative %r -> CLIP-L %s, bigG %s" % (NEGATIVE, fx["uncond.tokens_l"][0, :8].tolist(),
                                                fx["uncond.tokens_g"][0, :8].tolist()))
    log("cond vs uncond context max |diff| %.3e (the negative prompt matters)" %
        maxdiff(fx["cond.context"], fx["uncond.context"]))

    # One CFG evaluation at a table sigma with kiln's UNet reference.
    unet = load_unet(state)
    denoiser = sgm.DiscreteEpsDenoiser()
    sigma = denoiser.sigmas[CFG_T:CFG_T + 1].clone()  # float32
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(X_SEED))
    assert int(denoiser.sigma_to_idx(sigma)) == CFG_T

    def network(xin, c_noise, cnd):
        out, _ = unet(xin, c_noise.double(), cnd["crossattn"], cnd["vector"])
        return out

    both = {"crossattn": torch.cat([uc["crossattn"], c["crossattn"]]).double(),
            "vector": torch.cat([uc["vector"], c["vector"]]).double()}
    with torch.no_grad():
        xx = torch.cat([x, x]).double()
        denoised, eps = denoiser(network, xx, torch.cat([sigma, sigma]), both)
    fx["cfg.x"] = x
    fx["cfg.sigma"] = sigma
    fx["cfg.eps"] = sgm.vanilla_cfg(eps, CFG_SCALE).float().contiguous()
    fx["cfg.denoised"] = sgm.vanilla_cfg(denoised, CFG_SCALE).float().contiguous()
    d_check = maxdiff(fx["cfg.denoised"], x.double() - float(sigma) * fx["cfg.eps"].double())
    log("cfg: sigma %.9g (t %d), eps range [%.4f, %.4f], denoised range [%.4f, %.4f], x - sigma eps vs "
        "denoised %.1e" % (float(sigma), CFG_T, float(fx["cfg.eps"].min()), float(fx["cfg.eps"].max()),
                           float(fx["cfg.denoised"].min()), float(fx["cfg.denoised"].max()), d_check))

    metadata = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "width": str(WIDTH), "height": str(HEIGHT),
                "cfg_scale": "%g" % CFG_SCALE, "timestep": str(CFG_T),
                "kiln.fixture.generator": "training/check_sgm_conditioning.py"}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, FILE_NAME)
    safetensors_io.save_file(fx, path, metadata)
    back, meta_back = safetensors_io.load_file(path)
    assert meta_back == metadata and all(torch.equal(back[k], fx[k]) for k in fx)
    log("wrote %s: %d tensors, %d bytes" % (os.path.relpath(path, ROOT), len(fx), os.path.getsize(path)))
    return worst


if __name__ == "__main__":
    main()
