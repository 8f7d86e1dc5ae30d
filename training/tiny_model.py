"""kiln-tiny's three networks, built from the reference modules in
training/reference/ (the ones kiln's C++ models are verified against), and the
SD noise schedule.

Sizes (every channel count a multiple of 32 for GroupNorm(32)):
  CLIP text (HF naming, quick_gelu): vocab = tokenizer size (577), width 128,
      2 layers, 4 heads, MLP 512, 77 positions.
  UNet (ldm, SD1 conv proj_in/out): in/out 4, model_channels 32,
      channel_mult (1, 2, 2), 1 res block per level, attention at levels 1, 2
      (8x8 and 4x4 latents) and the middle, 4 heads, depth 1, context 128.
  VAE (ldm AutoencoderKL): ch 32, ch_mult (1, 2, 2), 1 res block, z 4:
      64x64x3 <-> 16x16x4.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference.clip_text import ClipTextHF  # noqa: E402
from reference.unet import UNet  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

CONFIG = {
    "clip": dict(width=128, layers=2, heads=4, intermediate=512, positions=77),
    "unet": dict(in_channels=4, out_channels=4, model_channels=32, channel_mult=(1, 2, 2), num_res_blocks=1,
                 attention_levels=(1, 2), num_heads=4, transformer_depth=1, use_linear_in_transformer=False),
    "vae": dict(ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, image_channels=3, z_channels=4, embed_dim=4),
}

CLIP_PREFIX = "cond_stage_model.transformer."
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."


def make_clip(vocab, cfg=CONFIG["clip"]):
    return ClipTextHF(vocab=vocab, width=cfg["width"], layers=cfg["layers"], heads=cfg["heads"],
                      positions=cfg["positions"], intermediate=cfg["intermediate"])


def make_unet(context_dim, cfg=CONFIG["unet"]):
    return UNet(context_dim=context_dim, **cfg)


def make_vae(cfg=CONFIG["vae"]):
    return AutoencoderKL(**cfg)


def alphas_cumprod(beta_start=0.00085, beta_end=0.012, steps=1000):
    """ldm's scaled-linear schedule in float64 (stored float32 in SD
    checkpoints; kiln's DiscreteSchedule::scaled_linear)."""
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, steps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0).to(torch.float32)


def count(module):
    return sum(p.numel() for p in module.parameters())
