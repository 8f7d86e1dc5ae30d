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

Wan 2.1 I2V and FLF2V (image-to-video and first-last-frame-to-video, which also read their images with CLIP
ViT-H/14's vision tower: reference/clip_vision.py; --clip_vision clip_vision_h.safetensors):
  wan_tiny/clip_vision.safetensors  a tiny CLIPVisionModelWithProjection in the names of ComfyUI's
      clip_vision_h.safetensors, F16, metadata kiln.clip.heads "2": the real geometry (224 x 224 in patches
      of 14: 257 tokens), width 32, 3 layers, 2 heads, MLP 64, projection 16 (real: 1280, 32, 16, 5120, 1024)
  wan_tiny/wan_dit_i2v21.safetensors  a DiT of the same widths, model_type 'i2v' (in_dim 36): the blocks'
      cross-attention adds k_img, v_img, norm_k_img, and img_emb.proj.{0,1,3,4} maps CLIP tokens of width 32
      (real: 1280) to context rows put before the text's
  wan_tiny/wan_dit_flf2v.safetensors  the same, model_type 'flf2v': img_emb.emb_pos [1, 514, 32] besides
  wan_tiny_i2v21.safetensors  the job: image, clip_features [1, 257, 32], condition, noise, sigmas, latent,
      video as the I2V job's
  wan_tiny_flf2v.safetensors  the job: image (the first frame), end_image [48, 64, 3] (the last, another
      smooth picture), clip_features [2, 257, 32] (first, last), condition, noise, sigmas, latent, video
  - CLIP as Wan's CLIPModel.visual (wan/modules/clip.py): the [-1, 1] image stretched to 224 x 224 (bicubic,
    align_corners=False, no antialias, no crop), back to [0, 1], CLIP's mean and std; the tokens after all
    layers but the last (use_31_block), without post_layernorm. FLF2V encodes [first, last] as a batch of
    two, which img_emb reads as one item of 514 tokens (plus emb_pos);
  - the condition as WanI2V.generate / WanFLF2V.generate build it: the clip [image, zeros x 4] or [first,
    zeros x 3, last] encoded in one go (its normalised mean); the mask 1 per given pixel frame, the first
    frame's repeated 4 times, read 4 per latent frame: I2V 1 on latent frame 0; FLF2V also 1 on the last
    latent frame's mask plane 3 (its last pixel frame);
  - the I2V job's prompts, noise, schedule, cfg and Euler, the DiT seeing [x, condition] and the CLIP tokens
    in both passes (Wan's arg_c and arg_null both carry clip_fea). The CLIP tower runs on its F32-rounded
    pixels and the DiT on the stored clip_features.
  Before writing, the script checks that an image already 224 x 224 is only normalised (bicubic at scale 1
  is the identity, bit for bit), that the I2V DiT with CLIP tokens of zeros differs from its weights run as
  a t2v model (the image path is live), that flf2v's img_emb reads [2, 257, d] as [1, 514, d], and that
  the released models' name lists come out at their sizes (CLIP-vision-H 632M, Wan2.1-I2V-14B 16.4B).

Wan 2.2 TI2V-5B (text-to-video and its image-to-video mode, one 't2v' DiT on Wan 2.2's 48-channel latent; its VAE
16x smaller per side, 4x along time: tests/golden/models/wan22_vae_tiny.safetensors, make_wan22_vae_fixtures.py's,
read as it is, reference/wan22_vae.py):
  wan_tiny/wan_dit_ti2v.safetensors  a DiT of the same widths with in_dim = out_dim = 48 (TI2V-5B's)
  wan_tiny_ti2v_t2v.safetensors  the job: noise [1, 48, 2, 4, 4], sigmas [4], latent [1, 48, 2, 4, 4], video
      [1, 3, 5, 64, 64]; metadata width and height 64, vae "models/wan22_vae_tiny.safetensors"
  wan_tiny_ti2v_i2v.safetensors  the job: image [64, 64, 3] (8-bit values as F32), first_latent [1, 48, 1, 4, 4],
      noise, sigmas, latent, video as above; the same metadata
  - text-to-video (WanTI2V.t2v): 64x64 (a 4 x 4 latent, 2 x 2 patch tokens per latent frame), 5 frames (2 latent
    frames), the T2V job's prompts, schedule (3 steps, shift 3), cfg 6 and Euler; noise: Philox randn of the
    48 x 2 x 4 x 4 latent in (c, f, h, w) order, one draw, seed 11; decoded by Wan 2.2's VAE (normalised, not
    clamped). t2v's mask2 (masks_like(noise, zero=False)) is all ones: every token has the step's t, the DiT's
    one-per-item form.
  - image-to-video (WanTI2V.i2v), the same job but: the image's latent z = the VAE's encode of the one-frame clip
    [image] (v / 127.5 - 1; its normalised mean, [1, 48, 1, 4, 4]); mask2 = masks_like([noise], zero=True)'s
    second mask: ones like the latent, 0 on the first latent frame (every channel); the start x = (1 - mask2) z
    + mask2 (noise sigma_0); each step (both CFG passes) gives the DiT per-token timesteps, the original's
    temp_ts = (mask2[0][0][:, ::2, ::2] * t).flatten() (channel 0's mask at each 2 x 2 patch's top-left latent
    pixel, (f, h, w) order: 0 on the first latent frame's 4 tokens, t = 1000 sigma on the other 4; seq_len is the
    token count, so no padding entries); after each Euler step x = (1 - mask2) z + mask2 x, so the DiT sees z as
    the first frame at every step and the final latent's first frame is z exactly (the decode gets it as is).
    The DiT runs on the stored (F32) first_latent.
  What kiln's jobs do that the original does not: Euler on the flow sigmas in place of UniPC (the original's
  default, sample_solver='unipc'; the mask is re-imposed after each solver step either way), and the negative
  prompt "" as given (WanTI2V replaces "" by config.sample_neg_prompt). The original's i2v picks the output size
  from max_area and the image's aspect (best_output_size(iw, ih, 32, 32, max_area): multiples of patch x VAE
  stride = 32), resizes the image by max(ow / iw, oh / ih) (PIL LANCZOS) and centre-crops it; here the image is
  already the job's 64 x 64 (best_output_size(64, 64, 32, 32, 64 * 64) = (64, 64), scale 1, and PIL's resize to
  the same size is a copy), so kiln's job has no resize. The original reads pixels as to_tensor's v / 255 in
  float32, then (p - 0.5) / 0.5; here v / 127.5 - 1 in float64. Its decode clamps to [-1, 1]; these videos are not
  clamped.
  Before the jobs, the script checks that the DiT given per-token t all equal to sigma gives bit for bit its
  one-per-item result (output and blocks), and that the i2v timesteps (first frame at 0) change the output;
  the i2v job checks that the DiT's input has z as its first frame at every step and so does the final latent.

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
import make_wan22_vae_fixtures as mw22  # noqa: E402
import make_wan_dit_fixtures as mwd  # noqa: E402
import make_wan_vae_fixtures as mw  # noqa: E402
from reference import clip_vision as clipv  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan22_vae as wan22  # noqa: E402
from reference import wan_dit as ref  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402
from reference.umt5 import UMT5Encoder, hf_name  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "wan_tiny")
SPIECE_SOURCE = os.path.join(ROOT, "tests", "golden", "text", "umt5_like_spiece.model")
VAE_SOURCE = os.path.join(ROOT, "tests", "golden", "models", "wan_vae_tiny.safetensors")
VAE22_SOURCE = os.path.join(ROOT, "tests", "golden", "models", "wan22_vae_tiny.safetensors")
JOB = "wan_tiny_t2v.safetensors"
A14B_JOB = "wan_tiny_a14b.safetensors"
I2V_JOB = "wan_tiny_i2v.safetensors"
I2V21_JOB = "wan_tiny_i2v21.safetensors"
FLF2V_JOB = "wan_tiny_flf2v.safetensors"
TI2V_T2V_JOB = "wan_tiny_ti2v_t2v.safetensors"
TI2V_I2V_JOB = "wan_tiny_ti2v_i2v.safetensors"
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
COND_CHANNELS = LATENT_CHANNELS + 4 + LATENT_CHANNELS  # the image models' in_dim: noise, mask, image latent
# CLIP ViT-H/14's geometry (224 / 14: 16 x 16 patches and the class token, 257 tokens), tiny widths.
CLIP_TINY = dict(image_size=224, patch_size=14, width=32, layers=3, heads=2, intermediate=64, projection=16)
CLIP_METADATA = {"kiln.clip.heads": str(CLIP_TINY["heads"])}
CLIP_TOKENS = (CLIP_TINY["image_size"] // CLIP_TINY["patch_size"]) ** 2 + 1
# TI2V-5B (Wan 2.2's 48-channel VAE: 16x smaller per side, 4x in time; the DiT's patches 2 x 2 as ever)
TI2V_CHANNELS = wan22.WAN22_VAE["z_dim"]  # 48: TI2V-5B's in_dim and out_dim
TI2V_SIZE = 64  # width and height: a 4 x 4 latent, 2 x 2 patch tokens per latent frame
TI2V_STRIDE = 16
MAX_TOTAL_BYTES = 4 * 1000 * 1000


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


def dit_init_value(name, shape, gen):
    """mwd.init_value, but for the image models' img_emb: its LayerNorm scales near 1 (mwd's rule finds norms
    by name, "proj.0" and "proj.4" are LayerNorms too) and flf2v's emb_pos ~ N(0, 0.5) (not as a weight
    matrix: the original's are learnt positions of O(1) tokens). Names of a t2v model draw as before."""
    if name in ("img_emb.proj.0.weight", "img_emb.proj.4.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name == "img_emb.emb_pos":
        return 0.5 * torch.randn(shape, generator=gen)
    return mwd.init_value(name, shape, gen)


def write_dit(text_dim, name="wan_dit.safetensors", seed=SEED + 2, in_dim=LATENT_CHANNELS, out_dim=LATENT_CHANNELS,
              **image):
    """`image`: model_type ('i2v' or 'flf2v') and clip_dim of a Wan 2.1 image model."""
    cfg = dict(mwd.TINY, in_dim=in_dim, out_dim=out_dim, text_dim=text_dim, **image)
    return store(ref.WanModel(**cfg), dit_init_value, ref.wan_dit_tensor_shapes(cfg), seed, name,
                 mwd.DIT_METADATA)


def store(model, init_value, shapes, seed, name, metadata):
    """Draws the model's weights with init_value, writes them as F16 to wan_tiny/NAME and returns the model on
    the stored values in float64; `shapes` is the name list the reference's shape function gives."""
    gen = torch.Generator().manual_seed(seed)
    stored = {k: init_value(k, tuple(v.shape), gen).to(torch.float16).contiguous()
              for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in stored.items()} == shapes
    model.load_state_dict({k: v.double() for k, v in stored.items()}, strict=True)
    safetensors_io.save_file(stored, os.path.join(PARTS, name), dict(metadata))
    return model.double().eval()


def clip_init_value(name, shape, gen):
    """mmf.init_value (LayerNorm scales 1 + N(0, 0.1), biases N(0, 0.05), matrices N(0, 1 / fan_in), the position
    table N(0, 0.5)), and the class token like the positions: an O(1) token (mmf's rule would take the 1-D
    class_embedding for a bias)."""
    if name.endswith("class_embedding"):
        return 0.5 * torch.randn(shape, generator=gen)
    return mmf.init_value(name, shape, gen)


def write_clip_vision(seed=SEED + 7):
    """A tiny CLIPVisionModelWithProjection in clip_vision_h.safetensors' names, F16."""
    return store(clipv.ClipVisionModel(**CLIP_TINY), clip_init_value, clipv.clip_vision_tensor_shapes(CLIP_TINY),
                 seed, "clip_vision.safetensors", CLIP_METADATA)


def read_vae():
    weights, _ = safetensors_io.load_file(VAE_SOURCE)
    vae = wan.WanVAE_(**mw.TINY)
    vae.load_state_dict({k: v.to(torch.float64) for k, v in weights.items()}, strict=True)
    return vae.double().eval()


def read_vae22():
    """Wan 2.2's tiny VAE (make_wan22_vae_fixtures.py's, F32), read as it is stored."""
    weights, _ = safetensors_io.load_file(VAE22_SOURCE)
    vae = wan22.WanVAE22(**mw22.TINY)
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


def sample_on_t2v_prompts(t2v, sigmas, dit_of_step, condition=None, clip_fea=None, noise=None, first_latent=None,
                          seen=None):
    """Euler with CFG from the T2V job's noise (or `noise`) over `sigmas`, on its prompt and negative prompt:
    step i with the DiT and cfg dit_of_step(i) gives, seeing `condition` (when given) beside x along the
    channels and the CLIP tokens `clip_fea` (when given) in both passes (Wan's arg_c and arg_null both carry
    clip_fea). `first_latent` (TI2V's image-to-video, WanTI2V.i2v): the latent's first frame is that latent,
    at the start and after every step, and the DiT sees its tokens at t = 0 (ti2v_first_frame_mask). `seen`,
    when a list, gets each step's DiT input."""
    cond, uncond = t2v["t5.hidden"].double(), t2v["t5.uncond_hidden"].double()
    real = int((t2v["t5.tokens"] != PAD).sum())
    x = (t2v["noise"] if noise is None else noise).double() * sigmas[0]
    if first_latent is not None:
        mask2 = ti2v_first_frame_mask(x)
        token_mask = mask2[:, 0, :, ::2, ::2].flatten(1)  # [1, seq_len]: i2v's mask2[0][0][:, ::2, ::2]
        x = (1 - mask2) * first_latent + mask2 * x
    for i in range(len(sigmas) - 1):
        dit, cfg = dit_of_step(i)
        sigma = torch.tensor([sigmas[i]], dtype=torch.float64)
        t_tokens = None if first_latent is None else token_mask * sigmas[i]
        xy = x if condition is None else torch.cat([x, condition], dim=1)
        if seen is not None:
            seen.append(xy)
        c = ref.predict(dit, xy, sigma, cond, [real], clip_fea=clip_fea, t_tokens=t_tokens)
        u = ref.predict(dit, xy, sigma, uncond, [1], clip_fea=clip_fea, t_tokens=t_tokens)
        x = x + (sigmas[i + 1] - sigmas[i]) * (u + cfg * (c - u))
        if first_latent is not None:
            x = (1 - mask2) * first_latent + mask2 * x
    return x


def ti2v_first_frame_mask(latent):
    """WanTI2V.i2v's mask2 (masks_like([noise], zero=True), no generator): ones like the latent, the first
    latent frame 0 in every channel."""
    mask = torch.ones_like(latent)
    mask[:, :, 0] = 0
    return mask


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


def last_frame():
    """A second smooth 8-bit RGB picture (H, W, 3), other waves and ramps: the FLF2V job's end image."""
    ys = torch.arange(HEIGHT, dtype=torch.float64)[:, None]
    xs = torch.arange(WIDTH, dtype=torch.float64)[None, :]
    r = (210 - 2 * xs).expand(HEIGHT, WIDTH)
    g = 128 + 90 * torch.cos(xs / 7.0) * torch.sin(ys / 11.0 + 0.5)
    b = (30 + 4 * ys).expand(HEIGHT, WIDTH)
    return torch.stack([r, g, b], dim=-1).round().clamp(0, 255)


def image_pixels(image):
    """An 8-bit picture (H, W, 3) as Wan reads it: [1, 3, H, W] in [-1, 1] (kiln's v / 127.5 - 1)."""
    return (image / 127.5 - 1.0).permute(2, 0, 1)[None]


def image_condition(vae, first, last=None):
    """[1, 20, LATENT_FRAMES, h, w]: the mask's 4 planes, then the latent (the VAE's normalised mean) of the
    clip [first, zeros...] (WanI2V.generate) or [first, zeros..., last] (WanFLF2V.generate), encoded in one
    go. The mask as the originals build it: 1 per pixel frame given, the first frame's value repeated 4
    times (the first latent frame stands for one pixel frame), then read 4 frames per latent frame."""
    clip = torch.zeros(1, 3, FRAMES, HEIGHT, WIDTH, dtype=torch.float64)
    clip[0, :, 0] = image_pixels(first)[0]
    if last is not None:
        clip[0, :, -1] = image_pixels(last)[0]
    mu, _ = wan.encode_normalized(vae, clip)
    h, w = HEIGHT // 8, WIDTH // 8
    msk = torch.ones(1, FRAMES, h, w, dtype=torch.float64)
    msk[:, 1:] = 0
    if last is not None:
        msk[:, -1] = 1
    msk = torch.concat([torch.repeat_interleave(msk[:, 0:1], repeats=4, dim=1), msk[:, 1:]], dim=1)
    msk = msk.view(1, msk.shape[1] // 4, 4, h, w).transpose(1, 2)[0]  # [4, LATENT_FRAMES, h, w]
    # what that comes to: latent frame 0 all 1; the last latent frame 1 on mask plane 3 only when `last`
    want = torch.zeros(4, LATENT_FRAMES, h, w, dtype=torch.float64)
    want[:, 0] = 1
    if last is not None:
        want[3, -1] = 1
    assert torch.equal(msk, want)
    return torch.cat([msk[None], mu], dim=1)


def run_i2v_job(dit, t2v, vae):
    """Image-to-video on the T2V job's prompts, noise and schedule."""
    image = first_frame()
    io = {"image": image.to(torch.float32), "noise": t2v["noise"], "sigmas": t2v["sigmas"]}
    condition = image_condition(vae, image)
    io["condition"] = mmf.f32(condition)
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), condition)
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan.decode_normalized(vae, x))
    return io


def run_i2v21_job(dit, clip, t2v, vae):
    """Wan 2.1 image-to-video: the I2V job with CLIP. The CLIP tower sees F32-rounded pixels and the DiT the
    stored (F32) features, so the job's golden is exactly its stages on the stored inputs."""
    image = first_frame()
    io = {"image": image.to(torch.float32)}
    pixels = clipv.wan_clip_pixels(image_pixels(image))
    io["clip_features"] = mmf.f32(clipv.wan_clip_features(clip, mmf.f32(pixels).double()))
    assert io["clip_features"].shape == (1, CLIP_TOKENS, CLIP_TINY["width"])
    condition = image_condition(vae, image)
    io.update({"condition": mmf.f32(condition), "noise": t2v["noise"], "sigmas": t2v["sigmas"]})
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), condition,
                              io["clip_features"].double())
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan.decode_normalized(vae, x))
    return io


def run_flf2v_job(dit, clip, t2v, vae):
    """Wan 2.1 first-last-frame-to-video (WanFLF2V.generate): the CLIP tokens of both frames, [2, 257, W]
    (clip.visual of the list [first, last]), which img_emb reads as one item of 514; the clip [first,
    zeros x 3, last] encoded; the same prompts, noise, schedule, cfg and Euler."""
    first, last = first_frame(), last_frame()
    io = {"image": first.to(torch.float32), "end_image": last.to(torch.float32)}
    pixels = clipv.wan_clip_pixels(torch.cat([image_pixels(first), image_pixels(last)]))
    io["clip_features"] = mmf.f32(clipv.wan_clip_features(clip, mmf.f32(pixels).double()))
    assert io["clip_features"].shape == (2, CLIP_TOKENS, CLIP_TINY["width"])
    condition = image_condition(vae, first, last)
    io.update({"condition": mmf.f32(condition), "noise": t2v["noise"], "sigmas": t2v["sigmas"]})
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), condition,
                              io["clip_features"].double())
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan.decode_normalized(vae, x))
    return io


def ti2v_noise():
    """Philox randn of the [1, 48, 2, 4, 4] latent in (c, f, h, w) order, one draw, seed 11 (as the T2V job's)."""
    shape = (1, TI2V_CHANNELS, LATENT_FRAMES, TI2V_SIZE // TI2V_STRIDE, TI2V_SIZE // TI2V_STRIDE)
    return torch.tensor(PhiloxGenerator(NOISE_SEED).randn(math.prod(shape)), dtype=torch.float32).reshape(shape)


def ti2v_image():
    """A smooth 8-bit RGB picture (64, 64, 3): the TI2V image-to-video job's -i file."""
    ys = torch.arange(TI2V_SIZE, dtype=torch.float64)[:, None]
    xs = torch.arange(TI2V_SIZE, dtype=torch.float64)[None, :]
    r = 128 + 100 * torch.sin(xs / 9.0) * torch.cos(ys / 13.0)
    g = (40 + 3 * xs).expand(TI2V_SIZE, TI2V_SIZE)
    b = (240 - 3 * ys).expand(TI2V_SIZE, TI2V_SIZE)
    return torch.stack([r, g, b], dim=-1).round().clamp(0, 255)


def run_ti2v_t2v_job(dit, t2v, vae22):
    """TI2V-5B text-to-video (WanTI2V.t2v: its mask2 is all ones, so every token has the step's t): the T2V
    job's prompts, schedule, cfg and Euler on a 48-channel latent, decoded by Wan 2.2's VAE."""
    io = {"noise": ti2v_noise(), "sigmas": t2v["sigmas"]}
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), noise=io["noise"])
    io["latent"] = mmf.f32(x)
    video = wan22.decode_normalized(vae22, x)
    assert video.shape == (1, 3, FRAMES, TI2V_SIZE, TI2V_SIZE), video.shape
    io["video"] = mmf.f32(video)
    return io


def run_ti2v_i2v_job(dit, t2v, vae22):
    """TI2V-5B image-to-video (WanTI2V.i2v) with Euler: the image's latent z as the first latent frame, kept
    at every step, its tokens at t = 0. The DiT runs on exactly the stored (F32) first_latent."""
    image = ti2v_image()
    io = {"image": image.to(torch.float32)}
    z = wan22.encode_normalized(vae22, image_pixels(image)[:, :, None])  # the one-frame clip [image]
    assert z.shape == (1, TI2V_CHANNELS, 1, TI2V_SIZE // TI2V_STRIDE, TI2V_SIZE // TI2V_STRIDE), z.shape
    io.update({"first_latent": mmf.f32(z), "noise": ti2v_noise(), "sigmas": t2v["sigmas"]})
    z = io["first_latent"].double()
    seen = []
    x = sample_on_t2v_prompts(t2v, t2v["sigmas"].tolist(), lambda i: (dit, CFG), noise=io["noise"], first_latent=z,
                              seen=seen)
    # the DiT's input holds z as its first frame at every step, and so does the final latent
    assert len(seen) == STEPS and all(torch.equal(u[:, :, :1], z) for u in seen)
    assert torch.equal(x[:, :, :1], z)
    assert not torch.equal(seen[0][:, :, 1:], seen[1][:, :, 1:])  # the rest is sampled
    io["latent"] = mmf.f32(x)
    io["video"] = mmf.f32(wan22.decode_normalized(vae22, x))
    assert io["video"].shape == (1, 3, FRAMES, TI2V_SIZE, TI2V_SIZE)
    return io


# ------------------------------------------------------------ self-checks


def check_clip_pixels():
    """An image already 224 x 224 is not resampled: the bicubic kernel at a whole-pixel offset is (0, 1, 0, 0),
    so the ViT's input is the normalisation alone, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    image = torch.rand(2, 3, 224, 224, generator=gen, dtype=torch.float64) * 2 - 1
    mean = torch.tensor(clipv.MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(clipv.STD, dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.equal(clipv.wan_clip_pixels(image), (image.mul(0.5).add(0.5) - mean) / std)


def check_real_sizes():
    """The shape lists of the released models come out at their published sizes: CLIP ViT-H/14's vision
    tower with its projection (632M) and Wan2.1-I2V-14B (16.4B: T2V-14B's blocks with k_img, v_img,
    norm_k_img, and img_emb); FLF2V-14B is I2V-14B and emb_pos."""
    n = sum(math.prod(v) for v in clipv.clip_vision_tensor_shapes(clipv.CLIP_VISION_H).values())
    assert 630e6 < n < 635e6, n
    mmf.log("real size from the name list: CLIP-vision-H %.1fM parameters" % (n / 1e6))
    i2v = sum(math.prod(v) for v in ref.wan_dit_tensor_shapes(ref.WAN21_I2V_14B).values())
    assert 16.3e9 < i2v < 16.5e9, i2v
    flf2v = sum(math.prod(v) for v in ref.wan_dit_tensor_shapes(ref.WAN21_FLF2V_14B).values())
    assert flf2v - i2v == ref.FLF_CONTEXT_TOKENS * ref.CLIP_DIM
    mmf.log("real size from the name list: Wan2.1-I2V-14B %.3fB parameters" % (i2v / 1e9))


def check_image_models(i2v, flf2v, t2v_job):
    """The image path is live: the I2V model with CLIP tokens of zeros (img_emb then gives LayerNorm biases,
    not zeros) differs from the same weights run as a t2v model (text cross-attention only); flf2v's
    img_emb reads [2, 257, d] as one item of 514 tokens, the first frame's first, plus emb_pos; the masks
    """
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, COND_CHANNELS, LATENT_FRAMES, HEIGHT // 8, WIDTH // 8, generator=gen, dtype=torch.float64)
    sigma = torch.tensor([0.75], dtype=torch.float64)
    cond = t2v_job["t5.hidden"].double()
    real = int((t2v_job["t5.tokens"] != PAD).sum())
    t2v = ref.WanModel(**dict(mwd.TINY, in_dim=COND_CHANNELS, out_dim=LATENT_CHANNELS, text_dim=cond.shape[-1]))
    image_only = ("img_emb.", "cross_attn.k_img.", "cross_attn.v_img.", "cross_attn.norm_k_img.")
    t2v.load_state_dict({k: v for k, v in i2v.state_dict().items() if not any(p in k for p in image_only)},
                        strict=True)
    t2v = t2v.double().eval()
    zeros = torch.zeros(1, CLIP_TOKENS, CLIP_TINY["width"], dtype=torch.float64)
    plain = ref.predict(t2v, x, sigma, cond, [real])
    with_image = ref.predict(i2v, x, sigma, cond, [real], clip_fea=zeros)
    assert not torch.allclose(plain, with_image, atol=1e-3), "the image cross-attention changes nothing"
    pair = torch.randn(2, CLIP_TOKENS, CLIP_TINY["width"], generator=gen, dtype=torch.float64)
    want = flf2v.img_emb.proj(torch.cat([pair[0], pair[1]])[None] + flf2v.img_emb.emb_pos)
    assert torch.equal(flf2v.img_emb(pair), want)


def check_per_token_t(dit, t2v_job):
    """Wan 2.2's per-token t: every token at the item's sigma gives exactly the one-per-item result (block
    outputs too); TI2V's i2v timesteps (the first latent frame's tokens at 0) change every token's output
    (the attention mixes them), and the first frame's as a t = 0 evaluation of those tokens would."""
    gen = torch.Generator().manual_seed(5)
    lat = TI2V_SIZE // TI2V_STRIDE
    x = torch.randn(1, TI2V_CHANNELS, LATENT_FRAMES, lat, lat, generator=gen, dtype=torch.float64)
    cond = t2v_job["t5.hidden"].double()
    real = int((t2v_job["t5.tokens"] != PAD).sum())
    seq_len = LATENT_FRAMES * (lat // 2) ** 2
    sigma = torch.tensor([0.75], dtype=torch.float64)
    blocks_item, blocks_token = {}, {}
    per_item = ref.predict(dit, x, sigma, cond, [real], blocks=blocks_item)
    per_token = ref.predict(dit, x, sigma, cond, [real], blocks=blocks_token,
                            t_tokens=torch.full((1, seq_len), 0.75, dtype=torch.float64))
    assert torch.equal(per_item, per_token), (per_item - per_token).abs().max()
    assert all(torch.equal(blocks_item[k], blocks_token[k]) for k in blocks_item)
    mask = ti2v_first_frame_mask(x)[:, 0, :, ::2, ::2].flatten(1)
    assert mask.tolist() == [[0.0] * (seq_len // LATENT_FRAMES) + [1.0] * (seq_len // LATENT_FRAMES)]
    clean_first = ref.predict(dit, x, sigma, cond, [real], t_tokens=mask * 0.75)
    assert not torch.allclose(clean_first[:, :, 1:], per_item[:, :, 1:], atol=1e-6)
    assert not torch.allclose(clean_first[:, :, :1], per_item[:, :, :1], atol=1e-6)


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
    check_clip_pixels()
    check_real_sizes()
    sp = read_tokenizer()
    umt5, width = write_umt5(sp.get_piece_size())
    dit = write_dit(width)
    high_dit = write_dit(width, "wan_dit_high_noise.safetensors", SEED + 3)
    i2v_dit = write_dit(width, "wan_dit_i2v.safetensors", SEED + 4, in_dim=COND_CHANNELS)
    clip = write_clip_vision()
    i2v21_dit = write_dit(width, "wan_dit_i2v21.safetensors", SEED + 5, in_dim=COND_CHANNELS, model_type="i2v",
                          clip_dim=CLIP_TINY["width"])
    flf2v_dit = write_dit(width, "wan_dit_flf2v.safetensors", SEED + 6, in_dim=COND_CHANNELS, model_type="flf2v",
                          clip_dim=CLIP_TINY["width"])
    ti2v_dit = write_dit(width, "wan_dit_ti2v.safetensors", SEED + 8, in_dim=TI2V_CHANNELS, out_dim=TI2V_CHANNELS)
    vae = read_vae()
    vae22 = read_vae22()
    with torch.no_grad():
        t2v = run_job(dit, umt5, vae, sp)
        save_job(t2v)
        save_job(run_a14b_job(high_dit, dit, t2v, vae), A14B_JOB,
                 {"steps": str(A14B_STEPS - A14B_HIGH_STEPS), "high_noise_steps": str(A14B_HIGH_STEPS),
                  "high_noise_cfg_scale": repr(A14B_HIGH_CFG), "high_noise_sampler": "euler",
                  "high_noise_model": "wan_tiny/wan_dit_high_noise.safetensors"})
        save_job(run_i2v_job(i2v_dit, t2v, vae), I2V_JOB, {"model": "wan_tiny/wan_dit_i2v.safetensors"})
        check_image_models(i2v21_dit, flf2v_dit, t2v)
        save_job(run_i2v21_job(i2v21_dit, clip, t2v, vae), I2V21_JOB,
                 {"model": "wan_tiny/wan_dit_i2v21.safetensors", "clip_vision": "wan_tiny/clip_vision.safetensors"})
        save_job(run_flf2v_job(flf2v_dit, clip, t2v, vae), FLF2V_JOB,
                 {"model": "wan_tiny/wan_dit_flf2v.safetensors", "clip_vision": "wan_tiny/clip_vision.safetensors"})
        check_per_token_t(ti2v_dit, t2v)
        ti2v_meta = {"width": str(TI2V_SIZE), "height": str(TI2V_SIZE), "model": "wan_tiny/wan_dit_ti2v.safetensors",
                     "vae": "models/wan22_vae_tiny.safetensors"}
        save_job(run_ti2v_t2v_job(ti2v_dit, t2v, vae22), TI2V_T2V_JOB, ti2v_meta)
        save_job(run_ti2v_i2v_job(ti2v_dit, t2v, vae22), TI2V_I2V_JOB, ti2v_meta)
    jobs = (JOB, A14B_JOB, I2V_JOB, I2V21_JOB, FLF2V_JOB, TI2V_T2V_JOB, TI2V_I2V_JOB)
    total = sum(os.path.getsize(os.path.join(OUT, job)) for job in jobs)
    for name in sorted(os.listdir(PARTS)):
        p = os.path.join(PARTS, name)
        total += os.path.getsize(p)
        print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("total %d bytes; prompt ids %s" % (total, sp.encode(PROMPT)))
    assert total < MAX_TOTAL_BYTES, total


if __name__ == "__main__":
    main()
