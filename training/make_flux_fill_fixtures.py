#!/usr/bin/python3
"""Writes a tiny random-weight Flux.1-Fill-dev DiT beside the tiny Flux parts of
training/make_flux_pipeline_fixtures.py (whose CLIP-L, T5 and autoencoder it reuses, so run that
first) and the golden result of an inpainting job on it, computed as BFL's flux/sampling.py
prepare_fill and denoise do, with the PyTorch references in training/reference/ (no kiln code):
the end-to-end truth for kiln's Fill pipeline (tests/unit/flux_fill_test.cpp).

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_flux_fill_fixtures.py

Writes, relative to the repository root:
  tests/golden/pipeline/flux_tiny/fill_dit.safetensors  the Fill DiT: dev's widths, img_in taking 144
      features (the latent's 64, the masked image's latent's 64, and the 2x2 mask's 16: the tiny
      autoencoder downscales 2x where BFL's does 8x, whose 8x8 mask gives Fill's 384), F16,
      metadata kiln.flux.axes_dim "8,12,12"
  tests/golden/pipeline/flux_tiny_fill.safetensors  the job: init_pixels [1, 3, 32, 32] and mask_pixels
      [1, 1, 32, 32] (8-bit values, as kiln reads them from PNGs), img_cond [1, 64, 80] (BFL's packed
      masked-image latent and mask), velocity0 [1, 16, 16, 16], latent [1, 16, 16, 16], image
      [1, 3, 32, 32] (decoded, in [-1, 1], not clamped)

The job: the Flux job's prompt, 32x32, seed 11, 4 steps, guidance 30 (BFL's and diffusers' for
Fill), BFL's resolution shift, from pure noise (kiln's --strength 1: the first sigma is 1). BFL's
prepare_fill: image / 127.5 - 1 times (1 - mask / 255) (the soft mask as it is), encoded by the
autoencoder, scaled as (z - shift) * scale and packed in 2x2 patches; the mask rearranged
"b (h ph) (w pw) -> b (ph pw) h w" (ph = pw = the downscale) and packed the same way; the two joined along the
features, and the DiT's image tokens are the packed latent and img_cond joined along the features.
BFL's encoder draws a posterior sample from torch's generator; this reference and kiln take its
mean (docs/flux.md says so).

Every stage runs in float64 on the stored F16 weights; deterministic (byte-identical files).
"""

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_flux_pipeline_fixtures as fp  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.clip_text import ClipTextHF  # noqa: E402
from reference.flux import Flux, patchify, token_ids, unpatchify  # noqa: E402
from reference.sampling import PhiloxGenerator, bfl_lin_function  # noqa: E402
from reference.t5 import T5EncoderV11  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

GUIDANCE = 30.0
D = 2  # the tiny autoencoder's downscale (one level); BFL's is 8, so 8 x 8 mask planes and 384 features
FILL_DIT = dict(fp.DIT, in_channels=4 * (16 + 16 + D * D))


def load(module, name):
    tensors, _ = safetensors_io.load_file(os.path.join(fp.PARTS, name))
    result = module.load_state_dict(
        {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in tensors.items()}, strict=False)
    assert not result.missing_keys, result.missing_keys  # CLIP's file adds position_ids, unused here
    return fp.f64(module)


def pack(x):
    """BFL's "b c (h ph) (w pw) -> b (h w) (c ph pw)" with ph = pw = 2."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def job_pixels():
    """An init image (colour gradients and a square) and a mask: the left half repainted, a soft
    column (values 64 and 192) through the middle, the rest kept."""
    ys, xs = np.mgrid[0:fp.HEIGHT, 0:fp.WIDTH]
    image = np.stack([xs * 8, ys * 8, 255 - xs * 4], axis=0).astype(np.float64)
    image[:, 10:22, 12:20] = [[[40.0]], [[200.0]], [[90.0]]]
    mask = np.zeros((1, fp.HEIGHT, fp.WIDTH))
    mask[0, :, :14] = 255.0
    mask[0, :, 14:16] = 192.0
    mask[0, 4:12, 16:18] = 64.0
    return torch.tensor(image[None]), torch.tensor(mask[None])


def main():
    clip = load(ClipTextHF(**fp.CLIP), "clip_l.safetensors")
    t5 = load(T5EncoderV11(**fp.T5), "t5xxl.safetensors")
    ae = load(AutoencoderKL(**fp.AE), "ae.safetensors")
    dit = Flux(**FILL_DIT)
    safetensors_io.save_file(mmf.randomize(dit, fp.SEED + 6, fp.DTYPE), os.path.join(fp.PARTS, "fill_dit.safetensors"),
                             metadata={"kiln.flux.axes_dim": "8,12,12"})
    dit = fp.f64(dit)

    io = {}
    with torch.no_grad():
        hidden = t5(torch.tensor([fp.t5_row(fp.PROMPT)]))
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        _, pooled = clip.encode(torch.tensor([fp.clip_tokenizer()(fp.PROMPT)]), pooled=True)

        image, mask = job_pixels()
        io["init_pixels"] = image.to(torch.float32)
        io["mask_pixels"] = mask.to(torch.float32)
        # BFL's prepare_fill.
        img_cond = (image / 127.5 - 1.0) * (1.0 - mask / 255.0)
        z, _ = ae.encode(img_cond)
        img_cond = pack((z - fp.SHIFT) * fp.SCALE)
        m = (mask / 255.0)[:, 0]
        b, h, w = m.shape
        m = m.reshape(b, h // D, D, w // D, D).permute(0, 2, 4, 1, 3).reshape(b, D * D, h // D, w // D)
        img_cond = torch.cat([img_cond, pack(m)], dim=-1)
        io["img_cond"] = mmf.f32(img_cond)

        lw, lh = fp.WIDTH // 2, fp.HEIGHT // 2
        grid = (lh // 2, lw // 2)
        mu = bfl_lin_function()(grid[0] * grid[1])
        sigmas = fp.flow_sigmas(mu)
        assert sigmas[0] == 1.0
        noise = torch.tensor(PhiloxGenerator(fp.NOISE_SEED).randn(16 * lh * lw), dtype=torch.float64)
        x = noise.reshape(1, 16, lh, lw)
        ids = token_ids(hidden.shape[1], grid)
        guidance = torch.tensor([GUIDANCE], dtype=torch.float64)
        for i in range(fp.STEPS):
            tokens = torch.cat([patchify(x), img_cond], dim=-1)
            t = torch.tensor([sigmas[i]], dtype=torch.float64)
            out, _ = dit.forward_tokens(tokens, ids, hidden, t, pooled, guidance, None)
            v = unpatchify(out, grid[0], grid[1])
            if i == 0:
                io["velocity0"] = mmf.f32(v)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
        io["latent"] = mmf.f32(x)
        io["image"] = mmf.f32(ae.decode(x / fp.SCALE + fp.SHIFT)[0])
    meta = {"prompt": fp.PROMPT, "seed": str(fp.NOISE_SEED), "steps": str(fp.STEPS), "guidance": str(GUIDANCE),
            "mu": repr(mu)}
    path = os.path.join(fp.OUT, "flux_tiny_fill.safetensors")
    safetensors_io.save_file(io, path, metadata=meta)
    for p in (os.path.join(fp.PARTS, "fill_dit.safetensors"), path):
        print("wrote %s (%d bytes)" % (os.path.relpath(p, fp.ROOT), os.path.getsize(p)))


if __name__ == "__main__":
    main()
