#!/usr/bin/python3
"""Writes the golden fixture of a whole inpainting job with a plain (4-channel) UNet, A1111's method, on
the tiny random-weight SD1 model (tests/golden/models/sd1_tiny.safetensors).

Run with Debian's python3-torch and python3-pil (not a pyenv python), from anywhere:
    /usr/bin/python3 training/make_sd1_inpaint_fixture.py [--out DIR]

The job (what `kiln -m sd1_tiny.safetensors --tokenizer tests/fixtures/tiny_tokenizer -i init.png
--mask mask.png ...` runs): 32x32 image (latent [1, 4, 16, 16]: the tiny VAE's stride is 2), prompt
PROMPT, negative prompt NEGATIVE, cfg 6, 4 steps of euler on the discrete schedule, strength 0.8,
seed 7, --rng cuda (webui's Philox emulation of torch's CUDA randn), clip_skip 1.

  init image  a fixed synthetic RGB image: red a horizontal ramp, green a vertical ramp, blue a checker
              of 8x8 squares (no randomness);
  mask        white (repaint) on the square x in [16, 32), y in [8, 24), black elsewhere: aligned to 8 px;
  encoding    the VAE's moments of the init image (v / 255 * 2 - 1), then a SAMPLE of them,
              mean + exp(0.5 clamp(logvar, -30, 20)) * noise, scaled by 0.18215: both the start latent and
              the latent the unmasked region keeps (A1111's init_latent);
  rng order   as kiln and sd-cli: the sample's noise is the first randn(1024) of Philox(seed), drawn before
              the sampling noise; then the generator is seeded again with the image's seed (sd-cli's
              generate_image calls rng->manual_seed(seed + b) for each image) and the sampling noise is
              again the first randn(1024) of Philox(seed): for the first image of a job the two noises
              are the same numbers;
  schedule    sigmas = discrete(4) as float32; A1111's setup_img2img_steps: t_enc = int(0.8 * 4) = 3, the
              sampler runs sigmas[4 - 3 - 1:], all four steps; x = init_latent + noise * sigmas[0];
  denoiser    D(x, sigma) = x - sigma * eps, eps = UNet(x * c_in, t) (c_in, t and sigma as float32, t
              k-diffusion's fractional sigma_to_t), CFG as A1111's combine_denoised:
              D_u + 6 (D_c - D_u);
  masking     A1111 (training/reference/a1111_inpaint.py): the mask resized to the latent's size
              (PIL's default BICUBIC), /255, np.around -> nmask (1 repaint), mask = 1 - nmask; after each
              denoiser call denoised = denoised * nmask + init_latent * mask; after sampling
              samples = samples * nmask + init_latent * mask;
  output      the VAE decode of that latent / 0.18215 (kiln: no paste-back of the init pixels; A1111
              composites the init image over its unmasked area after decoding, apply_overlay: not in
              the stored image, reported only).

Writes tests/golden/pipeline/sd1_tiny_inpaint.safetensors (F32 unless noted; PyTorch shapes):
  init_pixels     [32, 32, 3]  the init image's 8-bit values (HWC, as the PNG)
  mask_pixels     [32, 32]     the mask's 8-bit values
  init            [1, 3, 32, 32] the VAE's input, v / 255 * 2 - 1
  init_moments    [1, 8, 16, 16] the VAE's encoder + quant_conv output (mean, logvar)
  encode_noise    [1, 4, 16, 16] the sample's noise (first randn(1024) of Philox(7))
  init_latent     [1, 4, 16, 16] the scaled sample (start and kept latent)
  latent_mask     [1, 1, 16, 16] A1111's nmask plane (1 = repaint); equal to kiln's rule here
  cond_tokens, uncond_tokens  I32 [1, 77]   BOS 318, ids, EOS 319, EOS padding
  cond, uncond    [1, 77, 64]  the CLIP context (last layer + final LayerNorm)
  sigmas          [5]          float32 discrete sigmas
  noise           [1, 4, 16, 16] the sampling noise (unscaled)
  x_start         [1, 4, 16, 16] init_latent + noise * sigmas[0]
  final           [1, 4, 16, 16] the final latent after the last blend
  image           [1, 3, 32, 32] its decode, in [-1, 1]
  a1111.overlay_image [32, 32, 3] A1111's saved image (truncated to 8 bits, init pasted over the
                  unmasked area): for comparison only
  metadata        prompt, negative_prompt, seed, steps, cfg_scale, strength, sampler, scheduler, rng

The networks run in float64 on the stored F16 weights widened (training/reference/ clip_text, unet,
vae through make_model_fixtures), the sampler state in float64 from float32 inputs. Deterministic (one
thread): running twice gives byte-identical files.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_model_fixtures import CLIP_PREFIX_HF, PRESETS, UNET_PREFIX, VAE_PREFIX, make_clip, make_unet, make_vae  # noqa
from reference import a1111_inpaint as a1111  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import sampling as ref  # noqa: E402
from reference.sgm_conditioner import SimpleTokenizer, hf_clip_tokenize  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny.safetensors")
MODEL_IO = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny_io.safetensors")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tiny_tokenizer")
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
FILE_NAME = "sd1_tiny_inpaint.safetensors"

PROMPT = "a red circle"
NEGATIVE = "ugly blurry"
SEED = 7
STEPS = 4
CFG_SCALE = 6.0
STRENGTH = 0.8
SIZE = 32
LATENT = 16
SCALE_FACTOR = 0.18215
MASK_BOX = (16, 8, 32, 24)  # x0, y0, x1, y1 (exclusive)

METADATA = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "seed": str(SEED), "steps": str(STEPS),
            "cfg_scale": "%g" % CFG_SCALE, "strength": "%g" % STRENGTH, "sampler": "euler",
            "scheduler": "discrete", "rng": "cuda",
            "kiln.fixture.generator": "training/make_sd1_inpaint_fixture.py"}


def log(msg):
    print(msg, flush=True)


def load_models():
    """(clip, unet, vae) in float64, from sd1_tiny.safetensors (stored F16, widened)."""
    weights, _ = safetensors_io.load_file(MODEL)
    spec = PRESETS["compact"]["sd1"]

    def sub(prefix, skip=()):
        return {k[len(prefix):]: v.double() for k, v in weights.items()
                if k.startswith(prefix) and k[len(prefix):] not in skip}

    clip = make_clip("hf", spec["clip"]).double()
    clip.load_state_dict(sub(CLIP_PREFIX_HF, skip=("text_model.embeddings.position_ids",)), strict=True)
    unet = make_unet(spec["unet"], 4, spec["clip"]["width"], linear=False).double()
    unet.load_state_dict(sub(UNET_PREFIX), strict=True)
    vae = make_vae(spec["vae"]).double()
    vae.load_state_dict(sub(VAE_PREFIX), strict=True)
    io, _ = safetensors_io.load_file(MODEL_IO)
    with torch.no_grad():
        d = [float((clip(io["clip.tokens"], clip_skip=1).float() - io["clip.out.skip1"]).abs().max()),
             float((unet(io["unet.x"].double(), io["unet.t"].double(), io["unet.context"].double())[0].float()
                    - io["unet.out"]).abs().max()),
             float((vae.encode(io["vae.image"].double())[0].float() - io["vae.encoded_mean"]).abs().max()),
             float((vae.decode(io["vae.z"].double())[0].float() - io["vae.decoded"]).abs().max())]
    log("model check vs %s: clip %.1e, unet %.1e, vae encode %.1e, decode %.1e" % (
        os.path.relpath(MODEL_IO, ROOT), *d))
    assert max(d) < 1e-5
    return clip.eval(), unet.eval(), vae.eval()


def init_image():
    px = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
    for y in range(SIZE):
        for x in range(SIZE):
            px[y, x, 0] = round(255 * x / (SIZE - 1))
            px[y, x, 1] = round(255 * y / (SIZE - 1))
            px[y, x, 2] = 200 if ((x // 8) + (y // 8)) % 2 else 40
    return px


def mask_image(box=MASK_BOX):
    m = np.zeros((SIZE, SIZE), dtype=np.uint8)
    x0, y0, x1, y1 = box
    m[y0:y1, x0:x1] = 255
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/pipeline)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    clip, unet, vae = load_models()
    schedule = ref.DiscreteSchedule(ref.scaled_linear_alphas_cumprod())
    n = 4 * LATENT * LATENT
    shape = (1, 4, LATENT, LATENT)
    fx = {}

    # Prompts: CLIP BPE of the tiny vocabulary, SD1's EOS padding, clip_skip 1.
    tok = SimpleTokenizer(TOKENIZER)
    fx["cond_tokens"] = hf_clip_tokenize(tok, [PROMPT]).to(torch.int32)
    fx["uncond_tokens"] = hf_clip_tokenize(tok, [NEGATIVE]).to(torch.int32)
    with torch.no_grad():
        cond = clip(fx["cond_tokens"], clip_skip=1)
        uncond = clip(fx["uncond_tokens"], clip_skip=1)
    fx["cond"] = cond.float().contiguous()
    fx["uncond"] = uncond.float().contiguous()

    # A1111's Img2Img init with a mask.
    px, mpx = init_image(), mask_image()
    fx["init_pixels"] = torch.from_numpy(px.astype(np.float32))
    fx["mask_pixels"] = torch.from_numpy(mpx.astype(np.float32))
    masking = a1111.Img2ImgMasking(Image.fromarray(mpx, "L"), SIZE, SIZE)
    image01 = masking.prepare_image(Image.fromarray(px, "RGB"))
    image = torch.from_numpy(image01)[None].double() * 2 - 1  # images_tensor_to_samples
    fx["init"] = image.float()
    with torch.no_grad():
        moments = vae.quant_conv(vae.encoder(image, {}))
    fx["init_moments"] = moments.float().contiguous()
    encode_rng = ref.PhiloxGenerator(SEED)
    encode_noise = torch.from_numpy(encode_rng.randn(n)).reshape(shape)
    fx["encode_noise"] = encode_noise
    init_latent = a1111.diagonal_gaussian_sample(moments, encode_noise.double()) * SCALE_FACTOR
    fx["init_latent"] = init_latent.float().contiguous()
    masking.set_init_latent(init_latent)
    fx["latent_mask"] = masking.nmask[:1][None].float().contiguous()
    kiln_mask = a1111.kiln_latent_mask(mpx, LATENT, LATENT)
    log("latent mask: A1111 (bicubic, around) vs kiln (round, block max) differ at %d of %d latent pixels; "
        "%d repainted" % (int((masking.nmask[0].numpy() != kiln_mask).sum()), LATENT * LATENT, int(kiln_mask.sum())))
    assert np.array_equal(masking.nmask[0].numpy(), kiln_mask)

    # Sampling: sd-cli's generator seeded again for the image.
    sigmas_all = [float(s) for s in np.asarray(ref.get_sigmas("discrete", STEPS, schedule), dtype=np.float32)]
    steps, t_enc = a1111.setup_img2img_steps(STEPS, STRENGTH)
    sigma_sched = a1111.img2img_sigma_sched(sigmas_all, steps, t_enc)
    fx["sigmas"] = torch.tensor(sigma_sched, dtype=torch.float32)
    rng = ref.PhiloxGenerator(SEED)
    noise = torch.from_numpy(rng.randn(n)).reshape(shape)
    assert torch.equal(noise, encode_noise)  # the same first draw of Philox(7)
    fx["noise"] = noise
    x = a1111.img2img_start(init_latent, noise.double(), sigma_sched)
    fx["x_start"] = x.float().contiguous()
    context = torch.cat([cond, uncond]).double()

    def inner_model(x_in, sigma):
        s = float(np.float32(sigma))
        c_in = float(np.float32(1.0 / math.sqrt(s * s + 1.0)))
        t = float(np.float32(schedule.sigma_to_t(s)))
        with torch.no_grad():
            eps, _ = unet(x_in * c_in, torch.tensor([t, t], dtype=torch.float64), context)
        return x_in - s * eps

    cfg = a1111.CFGDenoiserBlend(masking, CFG_SCALE)
    calls = [0]

    def model(xt, sigma):
        calls[0] += 1
        return cfg(inner_model, xt, sigma)

    samples = ref.sample_euler(model, x, sigma_sched)
    final = masking.sample_final_blend(samples)
    fx["final"] = final.float().contiguous()
    with torch.no_grad():
        decoded, _ = vae.decode(final / SCALE_FACTOR)
    fx["image"] = decoded.float().contiguous()
    kept = masking.mask.bool()
    log("sampling: %d steps (t_enc %d), %d denoiser calls; final latent kept region == init_latent: %s; "
        "repainted max |final - init| %.3f" % (len(sigma_sched) - 1, t_enc, calls[0],
                                                bool(torch.equal(final[0][kept], init_latent[0][kept])),
                                                float((final - init_latent).abs().max())))

    # A1111's saved image, for comparison: truncation to 8 bits and the overlay of the init image.
    x_sample = torch.clamp((decoded[0] + 1.0) / 2.0, min=0.0, max=1.0)
    x_sample = (255.0 * np.moveaxis(x_sample.numpy(), 0, 2)).astype(np.uint8)
    saved = a1111.apply_overlay(Image.fromarray(x_sample), None, 0, masking.overlay_images)
    saved = np.array(saved)
    fx["a1111.overlay_image"] = torch.from_numpy(saved.astype(np.float32))
    rounded = np.rint(np.clip((decoded[0].numpy() + 1) / 2, 0, 1) * 255).astype(np.int32).transpose(1, 2, 0)
    outside = mpx < 128
    log("A1111's saved image vs the decoded image rounded (kiln's PNG): max %d levels inside the mask, max %d "
        "outside (the init pixels pasted back; A1111 also truncates where kiln rounds)" % (
            int(np.abs(saved.astype(np.int32) - rounded)[~outside].max()),
            int(np.abs(saved.astype(np.int32) - rounded)[outside].max())))

    # A stroke thinner than a latent pixel: the two latent-mask rules part.
    thin = np.zeros((SIZE, SIZE), dtype=np.uint8)
    thin[:, 5] = 255
    m2 = a1111.Img2ImgMasking(Image.fromarray(thin, "L"), SIZE, SIZE)
    m2.set_init_latent(init_latent)
    log("1-px stroke: A1111 repaints %d latent pixels, kiln %d" % (
        int(m2.nmask[0].sum()), int(a1111.kiln_latent_mask(thin, LATENT, LATENT).sum())))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, FILE_NAME)
    safetensors_io.save_file(fx, path, METADATA)
    back, meta = safetensors_io.load_file(path)
    assert meta == METADATA and all(torch.equal(back[k], fx[k]) for k in fx)
    log("wrote %s: %d tensors, %d bytes" % (os.path.relpath(path, ROOT), len(fx), os.path.getsize(path)))
    for k in sorted(fx):
        v = fx[k]
        if v.is_floating_point():
            log("  %-20s %-16s min %+9.4f max %+9.4f" % (k, list(v.shape), float(v.min()), float(v.max())))
        else:
            log("  %-20s %-16s %s" % (k, list(v.shape), v[0, :8].tolist()))


if __name__ == "__main__":
    main()
