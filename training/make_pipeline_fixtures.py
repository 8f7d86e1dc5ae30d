#!/usr/bin/python3
"""Writes the golden fixture for a complete txt2img sampling run of the tiny
random-weight SD1 model (tests/golden/models/sd1_tiny.safetensors), for every
sampler, computed with the PyTorch reference modules in training/reference/.

Run with Debian's python3-torch (not a pyenv python), from anywhere:
    /usr/bin/python3 training/make_pipeline_fixtures.py [--out DIR] [--no-check]

Writes tests/golden/pipeline/sd1_tiny_txt2img.safetensors (F32 except the I32
token ids; PyTorch shapes, NCHW):
  cond_tokens, uncond_tokens   I32 [1, 77]: BOS 318, ids, EOS 319, padded with 319
  cond, uncond                 [1, 77, 64]: reference CLIP (clip_skip 1: last layer + final LayerNorm)
  noise                        [1, 4, 16, 16]: the first randn(1024) of Philox(seed 7), unscaled
  sigmas.<scheduler>           [5]: the float32 sigmas of "discrete" / "karras" at 4 steps (ending in 0)
  denoised0.discrete           [1, 4, 16, 16]: the CFG denoiser of the first step, D(x, sigmas[0]) with
                               x = float32(noise * sigmas[0]) (discrete; karras's sigmas[0] is 1 ulp lower)
  final.<sampler>.<scheduler>  [1, 4, 16, 16]: the latent every sampler ends with (discrete, 4 steps);
                               euler_a and dpm++2m also with karras
  __metadata__                 {"seed": "7", "steps": "4", "cfg_scale": "5", "rng": "cuda"}

The run (what kiln's src/pipeline/generate.cpp does for a 32x32 image, eps
prediction, cfg 5, --rng cuda, seed 7):
  sigmas  = get_sigmas(scheduler, 4), each rounded to float32 (kiln keeps sigmas as float);
  rng     = PhiloxGenerator(7) (webui's emulation of torch's CUDA randn);
  x       = float32(rng.randn(1024) * sigmas[0]), NCHW order;
  the sampler then draws its ancestral noise from the same stream, one rng.randn(1024) per draw, in the order
  training/reference/sampling.py's samplers call noise();
  D(x, sigma): sigma is rounded to float32 (kiln's denoiser takes a float), c_in = float32(1 / sqrt(sigma^2 + 1)),
  t = float32(sigma_to_t(sigma)) (k-diffusion's fractional, unrounded-to-integer timestep, computed in float64 on
  the float32 log-sigma table, then stored as the float the UNet's timestep input is), the UNet is run on
  x * c_in at t with context cond and with context uncond, out = uncond_out + 5 * (cond_out - uncond_out), and
  D = x - sigma * out (eps: c_skip 1, c_out -sigma).
  Default etas: 1 for euler_a and dpm++2s_a, 0 for ddim_trailing and tcd (others take none).

Precision: the CLIP and UNet run in float64 on the stored F16 weights widened; the sampler state (x, denoised, the
sampler's history) is kept in float64, as in sampling.py's references and tests/golden/sampling/samplers.txt, from
float32 inputs (initial x, sigmas, noise draws). kiln keeps the state in float32; unless --no-check is given the
script reruns every case with a float32 state (UNet still float64) and with a float32 state and a float32 UNet
and prints the largest difference from the stored finals, a measure of the tolerance the C++ test needs.

Everything is deterministic (one thread): running twice gives byte-identical files.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_model_fixtures import CLIP_PREFIX_HF, PRESETS, UNET_PREFIX, make_clip, make_unet  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import sampling as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny.safetensors")
MODEL_IO = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny_io.safetensors")
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
FILE_NAME = "sd1_tiny_txt2img.safetensors"

SEED = 7
STEPS = 4
CFG_SCALE = 5.0
LATENT_SHAPE = (1, 4, 16, 16)  # image 32x32 with sd1_tiny's VAE (ch_mult (1, 2): stride 2)
BOS, EOS = 318, 319
COND_IDS = [10, 20, 30]
UNCOND_IDS = []

SAMPLER_NAMES = ["euler", "euler_a", "heun", "dpm2", "dpm++2s_a", "dpm++2m", "dpm++2mv2", "ipndm", "lcm",
                 "ddim_trailing", "tcd"]
DEFAULT_ETA = {"euler_a": 1.0, "dpm++2s_a": 1.0, "ddim_trailing": 0.0, "tcd": 0.0}
CASES = [(s, "discrete") for s in SAMPLER_NAMES] + [("euler_a", "karras"), ("dpm++2m", "karras")]

METADATA = {"seed": str(SEED), "steps": str(STEPS), "cfg_scale": "%g" % CFG_SCALE, "rng": "cuda"}


def log(msg):
    print(msg, flush=True)


def tokens(ids):
    row = [BOS] + list(ids) + [EOS]
    row += [EOS] * (77 - len(row))
    return torch.tensor([row], dtype=torch.int32)


def load_models():
    """(clip, unet) in float64, weights from sd1_tiny.safetensors (stored F16, widened)."""
    weights, _ = safetensors_io.load_file(MODEL)
    spec = PRESETS["compact"]["sd1"]

    def sub(prefix, skip=()):
        return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix) and k[len(prefix):] not in skip}

    clip = make_clip("hf", spec["clip"])
    clip_sd = sub(CLIP_PREFIX_HF, skip=("text_model.embeddings.position_ids",))
    clip.double().load_state_dict({k: v.double() for k, v in clip_sd.items()}, strict=True)
    unet = make_unet(spec["unet"], 4, spec["clip"]["width"], linear=False)
    unet.double().load_state_dict({k: v.double() for k, v in sub(UNET_PREFIX).items()}, strict=True)
    return clip.eval(), unet.eval()


def check_against_model_io(clip, unet):
    """The loaded models reproduce make_model_fixtures.py's stored outputs."""
    io, _ = safetensors_io.load_file(MODEL_IO)
    with torch.no_grad():
        c = clip(io["clip.tokens"], clip_skip=1)
        u, _ = unet(io["unet.x"].double(), io["unet.t"].double(), io["unet.context"].double())
    dc = float((c.float() - io["clip.out.skip1"]).abs().max())
    du = float((u.float() - io["unet.out"]).abs().max())
    log("model check vs %s: clip max |diff| %.2e, unet max |diff| %.2e" % (os.path.relpath(MODEL_IO, ROOT), dc, du))
    assert dc < 1e-5 and du < 1e-5, "the loaded models do not reproduce sd1_tiny_io.safetensors"


def make_denoiser(unet, schedule, cond, uncond, dtype, counter):
    """D(x, sigma) with classifier-free guidance; the UNet and the returned tensor are in `dtype`."""
    context = torch.cat([cond, uncond], dim=0).to(dtype)
    net = unet.to(dtype)

    def model(x, sigma):
        counter[0] += 1
        s = float(np.float32(sigma))
        c_in = float(np.float32(1.0 / math.sqrt(s * s + 1.0)))
        t = float(np.float32(schedule.sigma_to_t(s)))
        xin = (x * c_in).to(dtype)
        with torch.no_grad():
            out, _ = net(torch.cat([xin, xin], dim=0), torch.tensor([t, t], dtype=torch.float64), context)
        c_out, u_out = out[:1], out[1:]
        guided = u_out + CFG_SCALE * (c_out - u_out)
        return (x.to(dtype) + (-s) * guided).to(x.dtype)

    return model


def run_case(sampler, scheduler, unet, schedule, cond, uncond, state_dtype=torch.float64, unet_dtype=torch.float64):
    """Returns (final latent, denoiser calls, noise draws)."""
    sigmas = [float(s) for s in np.asarray(ref.get_sigmas(scheduler, STEPS, schedule), dtype=np.float32)]
    rng = ref.PhiloxGenerator(SEED)
    n = int(np.prod(LATENT_SHAPE))
    noise0 = rng.randn(n)
    x = torch.from_numpy(noise0 * np.float32(sigmas[0])).reshape(LATENT_SHAPE).to(state_dtype)  # float32 product
    draws = [0]
    calls = [0]

    def noise():
        draws[0] += 1
        return torch.from_numpy(rng.randn(n)).reshape(LATENT_SHAPE).to(state_dtype)

    model = make_denoiser(unet, schedule, cond, uncond, unet_dtype, calls)
    kwargs = dict(noise=noise, alphas_cumprod=schedule.alphas_cumprod)
    if sampler in DEFAULT_ETA:
        kwargs["eta"] = DEFAULT_ETA[sampler]
    out = ref.SAMPLERS[sampler](model, x, sigmas, **kwargs)
    return out, calls[0], draws[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/pipeline)")
    ap.add_argument("--no-check", action="store_true", help="skip the float32 sensitivity reruns")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.set_default_dtype(torch.float32)

    schedule = ref.DiscreteSchedule(ref.scaled_linear_alphas_cumprod())
    clip, unet = load_models()
    check_against_model_io(clip, unet)

    fx = {}
    fx["cond_tokens"] = tokens(COND_IDS)
    fx["uncond_tokens"] = tokens(UNCOND_IDS)
    with torch.no_grad():
        cond = clip(fx["cond_tokens"], clip_skip=1)
        uncond = clip(fx["uncond_tokens"], clip_skip=1)
    fx["cond"] = cond.float().contiguous()
    fx["uncond"] = uncond.float().contiguous()
    n = int(np.prod(LATENT_SHAPE))
    noise0 = ref.PhiloxGenerator(SEED).randn(n)
    fx["noise"] = torch.from_numpy(noise0).reshape(LATENT_SHAPE).contiguous()
    for scheduler in sorted({c[1] for c in CASES}):
        fx["sigmas." + scheduler] = torch.tensor(ref.get_sigmas(scheduler, STEPS, schedule), dtype=torch.float32)

    sigma0 = float(fx["sigmas.discrete"][0])
    x0 = torch.from_numpy(noise0 * np.float32(sigma0)).reshape(LATENT_SHAPE).double()
    first = make_denoiser(unet, schedule, cond, uncond, torch.float64, [0])
    fx["denoised0.discrete"] = first(x0, sigma0).float().contiguous()

    stats = {}
    for sampler, scheduler in CASES:
        out, calls, draws = run_case(sampler, scheduler, unet, schedule, cond, uncond)
        key = "final.%s.%s" % (sampler, scheduler)
        fx[key] = out.float().contiguous()
        stats[key] = (calls, draws)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, FILE_NAME)
    safetensors_io.save_file(fx, path, METADATA)
    back, meta = safetensors_io.load_file(path)
    assert meta == METADATA and sorted(back) == sorted(fx) and all(torch.equal(back[k], fx[k]) for k in fx)
    log("wrote %s: %d tensors, %d bytes" % (os.path.relpath(path, ROOT), len(fx), os.path.getsize(path)))
    for k in sorted(fx):
        v = fx[k]
        extra = ""
        if k in stats:
            extra = "  nfe %d, draws %d" % stats[k]
        if v.is_floating_point():
            log("  %-30s %-6s %-16s min %+9.4f max %+9.4f mean %+8.4f std %7.4f%s" % (
                k, safetensors_io.DTYPES[v.dtype], list(v.shape), float(v.min()), float(v.max()),
                float(v.double().mean()), float(v.double().std()), extra))
        else:
            log("  %-30s %-6s %-16s %s" % (k, safetensors_io.DTYPES[v.dtype], list(v.shape), v[0, :6].tolist()))
    log("  sigmas: discrete %s, karras %s" % (fx["sigmas.discrete"].tolist(), fx["sigmas.karras"].tolist()))
    log("  sigma_to_t(sigmas.discrete) = %s" % [float(np.float32(schedule.sigma_to_t(float(s))))
                                                 for s in fx["sigmas.discrete"][:-1]])

    if not args.no_check:
        log("sensitivity (max |diff| from the stored final; relative to the final's max |value|):")
        for sampler, scheduler in CASES:
            key = "final.%s.%s" % (sampler, scheduler)
            ref_out = fx[key].double()
            scale = float(ref_out.abs().max())
            row = []
            for label, sd, ud in (("f32 state", torch.float32, torch.float64),
                                  ("f32 state+unet", torch.float32, torch.float32)):
                out, _, _ = run_case(sampler, scheduler, unet, schedule, cond, uncond, sd, ud)
                d = float((out.double() - ref_out).abs().max())
                row.append("%s %.2e (%.1e)" % (label, d, d / scale))
            unet.double()
            log("  %-30s %s" % (key, ", ".join(row)))


if __name__ == "__main__":
    main()
