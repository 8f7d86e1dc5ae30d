#!/usr/bin/python3
"""Writes a tiny random-weight Wan 2.1 text-to-video model in its released parts and the golden results
of a whole text-to-video job on it, computed with the PyTorch references in training/reference/ (no kiln
code): the end-to-end truth for kiln's Wan pipeline (tests/unit/wan_pipeline_test.cpp).

Run with Debian's python3-torch and python3-sentencepiece:
    /usr/bin/python3 training/make_wan_pipeline_fixtures.py

Reads tests/golden/text/umt5_like_spiece.model (the tokenizer: a unigram model with byte fallback, trained
by make_umt5_tokenizer_fixture.py; pad 0 and EOS 1 as umT5's) and tests/golden/models/wan_vae_tiny.safetensors
(Wan 2.1's VAE in the original names, make_wan_vae_fixtures.py's; 8x smaller along each side, 4x along time),
which the test passes as they are. Writes, relative to the repository root (in tests/golden/pipeline/):
  wan_tiny/umt5.safetensors  a tiny umT5 (reference/umt5.py, Wan's T5Encoder with a table per block) in
      HF's UMT5EncoderModel names (as ComfyUI's umt5_xxl_fp16.safetensors), F16: make_umt5_fixtures.py's
      widths with the vocabulary of the SentencePiece model below (500)
  wan_tiny/wan_dit.safetensors  the DiT (reference/wan_dit.py) in the original names, no prefix, F16,
      metadata kiln.wan.heads "3": make_wan_dit_fixtures.py's widths (48 in 3 heads of 16, 2 blocks,
      patch 1x2x2) with 16 latent channels in and out (the VAE's) and the tiny umT5's width as text_dim
  wan_tiny_t2v.safetensors  the job (F32 but the I32 tokens): t5.tokens [1, 512], t5.hidden [1, 512, 32]
      (the prompt's rows, then zeros), t5.uncond_tokens, t5.uncond_hidden (the negative prompt ""),
      noise [1, 16, 2, 6, 8], sigmas [4], velocity0 [1, 16, 2, 6, 8] (the guided velocity of the first
      step), latent [1, 16, 2, 6, 8] (final), video [1, 3, 5, 48, 64] (decoded, in [-1, 1], not clamped)

The job (sd-cli's Wan command line): -M vid_gen, prompt "a red cat on a blue square", negative prompt "",
64x48 (W x H: the latent is 8 wide and 6 high), --video-frames 5 (two latent frames: the first alone, then
four), seed 11, --rng cuda, 3 steps, euler, cfg 6, --flow-shift 3.
  - text (Wan's T5EncoderModel): the SentencePiece ids of the prompt, then EOS (1), padded with 0 to 512;
    umT5 with the padding masked (its keys at the dtype's lowest value); the context is the prompt's rows
    (EOS included: Wan's seq_lens counts the mask), which WanModel pads with zero rows to its text_len
    of 512 before its text embedding; the negative prompt the same way;
  - noise: webui's Philox randn (kiln's --rng cuda) of the 16 x 2 x 6 x 8 latent in that order (channel,
    frame, row, column: the original's [C, F, H, W]), one draw, seed 11;
  - schedule ("discrete" on the flow table, shift 3): t = linspace(999, 0, 3), s = (t + 1) / 1000,
    sigma = 3 s / (1 + 2 s), rounded to float32, then 0;
  - the DiT at t = 1000 sigma gives the velocity v; v = u + 6 (c - u) (sd-cli's classifier-free
    guidance); Euler: x <- x + (sigma_next - sigma) v, from x = noise * sigma_0;
  - decode (reference/wan_vae.py's WanVAE_.decode: the latent frames one at a time through the causal
    cache) with the VAE's own normalisation: 5 frames.

Wan 2.2 A14B's two experts, the same job but for the schedule and the guidance:
  wan_tiny/wan_dit_high_noise.safetensors  a second DiT of the same widths and other weights, the high-noise
      expert (--high-noise-diffusion-model; wan_dit.safetensors is then the low-noise one)
  wan_tiny_a14b.safetensors  the job: noise, sigmas [5], latent, video as above
  - sd-cli's command line: --steps 2 --high-noise-steps 2 (the schedule has 4 steps, the expert samples the
    first 2, as sd.cpp's generate_video splits its sigmas), --high-noise-cfg-scale 4, cfg 6, euler for both;
    --steps 4 with --moe-boundary 0.8 splits the same schedule at the same step (sigma 0.6 is the first
    below 0.8);
  - steps 0 and 1 with the expert and cfg 4, steps 2 and 3 with the low-noise DiT and cfg 6, Euler
    throughout on the one latent.

Wan 2.2 I2V (image-to-video, the A14B experts' input without CLIP): -i is the clip's first frame.
  wan_tiny/wan_dit_i2v.safetensors  a DiT of the same widths taking 36 planes: the noise latent's 16, a mask's 4
      and the first frame's latent's 16 (Wan 2.2 I2V-A14B's in_dim)
  wan_tiny_i2v.safetensors  the job: image [48, 64, 3] (the -i image's 8-bit values, as F32), condition
      [1, 20, 2, 6, 8] (mask then latent), noise, sigmas, latent, video as above
  - the condition as Wan's WanI2V.generate builds it: the clip [image, zeros x 4] (the image's 8-bit values
    v / 127.5 - 1, kiln's reading of an image file) encoded by the VAE (its normalised mean), and the mask 1
    on the first latent frame's 4 planes, 0 on the second's;
  - the T2V job's prompts, noise, schedule (3 steps, shift 3), cfg 6 and Euler, the DiT seeing
    [x, condition] along the channels in both passes.

Every stage runs in float64 on the stored weights; deterministic (byte-identical files).
"""

import math
import os
import sys

import sentencepiece as spm
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import make_umt5_fixtures as mu  # noqa: E402
import make_wan_dit_fixtures as mwd  # noqa: E402
import make_wan_vae_fixtures as mw  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan_dit as ref  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402
from reference.umt5 import UMT5Encoder, hf_name  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "wan_tiny")
SPIECE_SOURCE = os.path.join(ROOT, "tests", "golden", "text", "umt5_like_spiece.model")
VAE_SOURCE = os.path.join(ROOT, "tests", "golden", "models", "wan_vae_tiny.safetensors")
JOB = "wan_tiny_t2v.safetensors"
A14B_JOB = "wan_tiny_a14b.safetensors"
I2V_JOB = "wan_tiny_i2v.safetensors"
A14B_STEPS, A14B_HIGH_STEPS, A14B_HIGH_CFG = 4, 2, 4.0
SEED = 6100

PROMPT = "a red cat on a blue square"
NEGATIVE = ""
WIDTH, HEIGHT = 64, 48
FRAMES = 5  # 1 + 4 (LATENT_FRAMES - 1)
LATENT_FRAMES = 2
NOISE_SEED = 11
STEPS = 3
CFG = 6.0
SHIFT_FACTOR = 3.0
TEXT_LEN = 512  # Wan's text_len: umT5's padded length and the DiT's context rows
PAD, EOS = 0, 1
LATENT_CHANNELS = 16
MAX_TOTAL_BYTES = 2 * 1000 * 1000


def read_tokenizer():
    sp = spm.SentencePieceProcessor(model_file=SPIECE_SOURCE)
    assert (sp.pad_id(), sp.eos_id()) == (PAD, EOS), (sp.pad_id(), sp.eos_id())
    return sp


def write_umt5(vocab):
    cfg = dict(mu.UMT5, vocab=vocab)
    model = UMT5Encoder(**cfg)
    gen = torch.Generator().manual_seed(SEED + 1)
    stored = {k: mu.init_value(k, v.shape, gen).to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.double() for k, v in stored.items()})
    safetensors_io.save_file({hf_name(k): v for k, v in stored.items()}, os.path.join(PARTS, "umt5.safetensors"))
    return model.double().eval(), cfg["dim"]


def write_dit(text_dim, name="wan_dit.safetensors", seed=SEED + 2, in_dim=LATENT_CHANNELS):
    cfg = dict(mwd.TINY, in_dim=in_dim, out_dim=LATENT_CHANNELS, text_dim=text_dim)
    model = ref.WanModel(**cfg)
    gen = torch.Generator().manual_seed(seed)
    stored = {k: mwd.init_value(k, tuple(v.shape), gen).to(torch.float16).contiguous()
              for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in stored.items()} == ref.wan_dit_tensor_shapes(cfg)
    model.load_state_dict({k: v.double() for k, v in stored.items()}, strict=True)
    safetensors_io.save_file(stored, os.path.join(PARTS, name), dict(mwd.DIT_METADATA))
    return model.double().eval()


def read_vae():
    weights, _ = safetensors_io.load_file(VAE_SOURCE)
    vae = wan.WanVAE_(**mw.TINY)
    vae.load_state_dict({k: v.to(torch.float64) for k, v in weights.items()}, strict=True)
    return vae.double().eval()


def flow_sigmas(steps=STEPS):
    out = []
    for t in torch.linspace(999, 0, steps, dtype=torch.float64).tolist():
        s = (t + 1) / 1000
        out.append(float(torch.tensor(SHIFT_FACTOR * s / (1 + (SHIFT_FACTOR - 1) * s), dtype=torch.float32)))
    return out + [0.0]


def encode(umt5, sp, prompt):
    """Wan's T5EncoderModel: the ids, EOS, the padding to 512 masked; the padding's rows zero."""
    ids = sp.encode(prompt) + [EOS]
    real = len(ids)
    tokens = torch.tensor([ids + [PAD] * (TEXT_LEN - real)], dtype=torch.int32)
    mask = (torch.arange(TEXT_LEN) < real).to(torch.float64)[None]
    out, _ = umt5(tokens, mask)
    out[:, real:] = 0
    return tokens, out, real


def run_job(dit, umt5, vae, sp):
    io = {}
    tokens, hidden, real = encode(umt5, sp, PROMPT)
    uncond_tokens, uncond_hidden, uncond_real = encode(umt5, sp, NEGATIVE)
    assert uncond_real == 1  # EOS alone
    io["t5.tokens"] = tokens
    io["t5.hidden"] = mmf.f32(hidden)
    io["t5.uncond_tokens"] = uncond_tokens
    io["t5.uncond_hidden"] = mmf.f32(uncond_hidden)

    sigmas = flow_sigmas()
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
    lw, lh = WIDTH // 8, HEIGHT // 8
    shape = (1, LATENT_CHANNELS, LATENT_FRAMES, lh, lw)
    noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(math.prod(shape)), dtype=torch.float32)
    io["noise"] = noise.reshape(shape)
    # The reference sees the stored (F32) contexts, their prompt rows as Wan passes them.
    cond, uncond = io["t5.hidden"].double(), io["t5.uncond_hidden"].double()
    x = io["noise"].double() * sigmas[0]
    for i in range(STEPS):
        sigma = torch.tensor([sigmas[i]], dtype=torch.float64)
        c = ref.predict(dit, x, sigma, cond, [real])
        u = ref.predict(dit, x, sigma, uncond, [uncond_real])
        v = u + CFG * (c - u)
        if i == 0:
            io["velocity0"] = mmf.f32(v)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    io["latent"] = mmf.f32(x)
    video = wan.decode_normalized(vae, x)
    assert video.shape == (1, 3, FRAMES, HEIGHT, WIDTH), video.shape
    io["video"] = mmf.f32(video)
    return io


def sample_on_t2v_prompts(t2v, sigmas, dit_of_step, condition=None):
    """Euler with CFG from the T2V job's noise over `sigmas`, on its prompt and negative prompt: step i with
    the DiT and cfg dit_of_step(i) gives, seeing `condition` (when given) beside x along the channels."""
    cond, uncond = t2v["t5.hidden"].double(), t2v["t5.uncond_hidden"].double()
    real = int((t2v["t5.tokens"] != PAD).sum())
    x = t2v["noise"].double() * sigmas[0]
    for i in range(len(sigmas) - 1):
        dit, cfg = dit_of_step(i)
        sigma = torch.tensor([sigmas[i]], dtype=torch.float64)
        xy = x if condition is None else torch.cat([x, condition], dim=1)
        c = ref.predict(dit, xy, sigma, cond, [real])
        u = ref.predict(dit, xy, sigma, uncond, [1])
        x = x + (sigmas[i + 1] - sigmas[i]) * (u + cfg * (c - u))
    return x


def run_a14b_job(high_dit, low_dit, t2v, vae):
    """The A14B job on the T2V job's prompts and noise: the expert's steps, then the low-noise DiT's."""
    io = {"noise": t2v["noise"]}
    sigmas = flow_sigmas(A14B_STEPS)
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
    x = sample_on_t2v_prompts(
        t2v, sigmas, lambda i: (high_dit, A14B_HIGH_CFG) if i < A14B_HIGH_STEPS else (low_dit, CFG))
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan.decode_normalized(vae, x))
    return io


def first_frame():
    """A smooth 8-bit RGB picture (H, W, 3): what the test writes as the -i file."""
    ys = torch.arange(HEIGHT, dtype=torch.float64)[:, None]
    xs = torch.arange(WIDTH, dtype=torch.float64)[None, :]
    r = 128 + 100 * torch.sin(xs / 9.0) * torch.cos(ys / 13.0)
    g = (60 + 3 * xs).expand(HEIGHT, WIDTH)
    b = (250 - 4 * ys).expand(HEIGHT, WIDTH)
    return torch.stack([r, g, b], dim=-1).round().clamp(0, 255)


def run_i2v_job(dit, t2v, vae):
    """Image-to-video on the T2V job's prompts, noise and schedule."""
    image = first_frame()
    io = {"image": image.to(torch.float32), "noise": t2v["noise"], "sigmas": t2v["sigmas"]}
    clip = torch.zeros(1, 3, FRAMES, HEIGHT, WIDTH, dtype=torch.float64)
    clip[0, :, 0] = (image / 127.5 - 1.0).permute(2, 0, 1)
    mu, _ = wan.encode_normalized(vae, clip)
    mask = torch.zeros(1, 4, LATENT_FRAMES, HEIGHT // 8, WIDTH // 8, dtype=torch.float64)
    mask[:, :, 0] = 1.0
    condition = torch.cat([mask, mu], dim=1)
    io["condition"] = mmf.f32(condition)
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), condition)
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan.decode_normalized(vae, x))
    return io


def save_job(io, name=JOB, extra=None):
    meta = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "seed": str(NOISE_SEED), "steps": str(STEPS),
            "width": str(WIDTH), "height": str(HEIGHT), "video_frames": str(FRAMES), "cfg_scale": repr(CFG),
            "sampler": "euler", "scheduler": "discrete", "flow_shift": repr(SHIFT_FACTOR), "rng": "cuda",
            "model": "wan_tiny/wan_dit.safetensors", "generator": "training/make_wan_pipeline_fixtures.py"}
    meta.update(extra or {})
    path = os.path.join(OUT, name)
    safetensors_io.save_file(io, path, metadata=meta)
    print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), os.path.getsize(path)))
    for k, v in io.items():
        if v.is_floating_point():
            print("  %-20s %-22s mean %+.4f std %.4f min %+.4f max %+.4f" % (
                k, mmf.shape_str(v), v.double().mean(), v.double().std(), v.min(), v.max()))


def main():
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(PARTS, exist_ok=True)
    sp = read_tokenizer()
    umt5, width = write_umt5(sp.get_piece_size())
    dit = write_dit(width)
    high_dit = write_dit(width, "wan_dit_high_noise.safetensors", SEED + 3)
    i2v_dit = write_dit(width, "wan_dit_i2v.safetensors", SEED + 4, in_dim=LATENT_CHANNELS + 4 + LATENT_CHANNELS)
    vae = read_vae()
    with torch.no_grad():
        t2v = run_job(dit, umt5, vae, sp)
        save_job(t2v)
        save_job(run_a14b_job(high_dit, dit, t2v, vae), A14B_JOB,
                 {"steps": str(A14B_STEPS - A14B_HIGH_STEPS), "high_noise_steps": str(A14B_HIGH_STEPS),
                  "high_noise_cfg_scale": repr(A14B_HIGH_CFG), "high_noise_sampler": "euler",
                  "high_noise_model": "wan_tiny/wan_dit_high_noise.safetensors"})
        save_job(run_i2v_job(i2v_dit, t2v, vae), I2V_JOB, {"model": "wan_tiny/wan_dit_i2v.safetensors"})
    total = sum(os.path.getsize(os.path.join(OUT, job)) for job in (JOB, A14B_JOB, I2V_JOB))
    for name in sorted(os.listdir(PARTS)):
        p = os.path.join(PARTS, name)
        total += os.path.getsize(p)
        print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("total %d bytes; prompt ids %s" % (total, sp.encode(PROMPT)))
    assert total < MAX_TOTAL_BYTES, total


if __name__ == "__main__":
    main()
