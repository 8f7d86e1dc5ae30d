#!/usr/bin/python3
"""Samples kiln-tiny with a PyTorch reference sampler and plots the training.

    /usr/bin/python3 training/sample_grid.py [--run /tmp/kiln-train] [--cfg 2] [--steps 20]

Writes training/plots/:
  samples_grid.png         every colour (rows) x shape (columns) on a white
                           background, --seeds samples each (side by side)
  samples_backgrounds.png  the same on black and on gray
  loss_vae.png, loss_unet.png  from the run's loss CSVs

Sampling: k-diffusion's Euler ancestral (training/reference/sampling.py) over
SD's discrete sigma schedule (scaled-linear betas 0.00085..0.012, 1000 steps),
eps-prediction denoiser with classifier-free guidance against the empty
prompt, weights rounded to what the GGUF stores (F16 matrices). Also prints a
crude pixel-statistics accuracy (foreground hue, background, shape from the
fill ratio of the foreground's bounding box).
"""

import argparse
import csv
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf_reader  # noqa: E402
import shapes_dataset as ds  # noqa: E402
import tiny_model as tm  # noqa: E402
import tiny_tokenizer  # noqa: E402
from reference import sampling  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = os.path.join(ROOT, "training", "plots")


def f16_round(sd):
    return {k: (v.half().float() if v.dim() >= 2 else v.float()) for k, v in sd.items()}


class Model:
    """kiln-tiny's networks in PyTorch with a reference sampler."""

    def __init__(self, tokens, merges, config, clip_sd, unet_sd, vae_sd, scale_factor):
        self.tok = tiny_tokenizer.Tokenizer(tokens, merges)
        self.clip = tm.make_clip(len(tokens), config["clip"]).eval()
        self.unet = tm.make_unet(config["clip"]["width"], config["unet"]).eval()
        self.vae = tm.make_vae(config["vae"]).eval()
        self.clip.load_state_dict(clip_sd)
        self.unet.load_state_dict(unet_sd)
        self.vae.load_state_dict(vae_sd)
        self.scale = scale_factor
        self.schedule = sampling.DiscreteSchedule(sampling.scaled_linear_alphas_cumprod())

    @classmethod
    def from_run(cls, run):
        """A training run's final.pt (weights rounded to F16 as the GGUF stores them)."""
        ck = torch.load(os.path.join(run, "final.pt"))
        dec = os.path.join(run, "vae_decoder.pt")
        vae = torch.load(dec)["model"] if os.path.exists(dec) else ck["vae"]
        return cls(ck["tokens"], ck["merges"], ck["config"], f16_round(ck["clip"]), f16_round(ck["unet"]),
                   f16_round(vae), ck["scale_factor"])

    @classmethod
    def from_gguf(cls, path):
        """The exported file itself (models/kiln-tiny.gguf), read with gguf_reader."""
        meta, tensors = gguf_reader.load(path)
        return cls(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"], tm.CONFIG,
                   gguf_reader.split_prefix(tensors, tm.CLIP_PREFIX), gguf_reader.split_prefix(tensors, tm.UNET_PREFIX),
                   gguf_reader.split_prefix(tensors, tm.VAE_PREFIX), float(meta["kiln.vae.scale_factor"]))

    @torch.no_grad()
    def generate(self, prompts, seeds, cfg=5.0, steps=20, sampler="euler_a", scheduler="discrete"):
        n = len(prompts)
        cond = self.clip(torch.tensor([self.tok(p) for p in prompts]))
        uncond = self.clip(torch.tensor([self.tok("")])).expand(n, -1, -1)
        ctx = torch.cat([cond, uncond])
        gens = [torch.Generator().manual_seed(s) for s in seeds]

        def noise():
            return torch.stack([torch.randn(4, 16, 16, generator=g) for g in gens])

        def model(x, sigma):
            _, c_out, c_in = sampling.get_scalings("eps", sigma)
            t = torch.full((2 * n,), self.schedule.sigma_to_t(sigma))
            xin = torch.cat([x, x]).float() * c_in
            eps, _ = self.unet(xin, t, ctx)
            e_c, e_u = eps[:n], eps[n:]
            return x + c_out * (e_u + cfg * (e_c - e_u)).double()

        sigmas = sampling.get_sigmas(scheduler, steps, self.schedule)
        x = noise().double() * sigmas[0]
        x = sampling.SAMPLERS[sampler](model, x, sigmas, noise=lambda: noise().double())
        img, _ = self.vae.decode(x.float() / self.scale)
        return ds.to_uint8(img.numpy())


# ------------------------------------------------------------ crude classifier

def classify(img):
    """(colour, background, shape) guessed from pixel statistics of a uint8 HWC image."""
    x = img.astype(np.float64)
    border = np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]])
    bgc = np.median(border, axis=0)
    bg = min(ds.BACKGROUNDS, key=lambda k: np.sum((np.array(ds.BACKGROUNDS[k]) - bgc) ** 2))
    fgmask = np.sqrt(((x - np.array(ds.BACKGROUNDS[bg])) ** 2).sum(-1)) > 80
    if fgmask.sum() < 20:
        return None, bg, None
    fgc = np.median(x[fgmask], axis=0)
    colour = min(ds.COLOURS, key=lambda k: np.sum((np.array(ds.COLOURS[k]) - fgc) ** 2))
    ys, xs = np.nonzero(fgmask)
    box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
    fill = fgmask.sum() / box
    # fill ratios of the drawn shapes: square 1, circle pi/4, triangle 1/2, star ~0.35
    shape = min({"square": 0.97, "circle": 0.785, "triangle": 0.5, "star": 0.33}.items(),
                key=lambda kv: abs(kv[1] - fill))[0]
    return colour, bg, shape


def tile(images, cols):
    rows = [np.concatenate(images[i:i + cols], axis=1) for i in range(0, len(images), cols)]
    return np.concatenate(rows, axis=0)


def save_png(arr, path, scale=3):
    from PIL import Image

    Image.fromarray(arr).resize((arr.shape[1] * scale, arr.shape[0] * scale), Image.NEAREST).save(path)


def plot_losses(run):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, col, title in (("vae", "mse", "VAE reconstruction MSE (images in [-1, 1])"),
                             ("vae_decoder", "mse", "VAE decoder fine-tune MSE (64x64)"),
                             ("unet", "loss", "UNet + CLIP eps-prediction MSE")):
        path = os.path.join(run, "loss_%s.csv" % name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            rows = list(csv.DictReader(f))
        step = np.array([int(r["step"]) for r in rows])
        y = np.array([float(r[col]) for r in rows])
        path_b = os.path.join(run, "loss_unet2.csv")
        split = None
        if name == "unet" and os.path.exists(path_b):  # stage 3b continues stage 3a
            with open(path_b) as f:
                rows_b = list(csv.DictReader(f))
            split = len(step)
            step = np.concatenate([step, split + np.array([int(r["step"]) for r in rows_b])])
            y = np.concatenate([y, np.array([float(r[col]) for r in rows_b])])
        k = 25
        smooth = np.convolve(y, np.ones(k) / k, mode="valid")
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot(step, y, lw=0.5, alpha=0.4, label="per step")
        ax.plot(step[k - 1:], smooth, lw=1.5, label="mean of %d" % k)
        if split is not None:
            ax.axvline(split, color="gray", ls="--", lw=1)
            ax.text(split, ax.get_ylim()[1], " 3b: offset noise 0.3", va="top", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(PLOTS, "loss_%s.png" % name))
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="/tmp/kiln-train")
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sampler", default="euler_a")
    ap.add_argument("--scheduler", default="discrete")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--plots-only", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(PLOTS, exist_ok=True)
    if args.plots_only:
        plot_losses(args.run)
        return
    m = Model.from_run(args.run)

    total = ok = 0
    per = {"colour": 0, "background": 0, "shape": 0}
    for bgs, fname in ((["white"], "samples_grid.png"), (["black", "gray"], "samples_backgrounds.png")):
        prompts, seeds, labels = [], [], []
        for bg in bgs:
            for colour in ds.COLOUR_NAMES:
                for shape in ds.SHAPES:
                    for s in range(args.seeds):
                        prompts.append(ds.caption(shape, colour, bg))
                        seeds.append(1000 + s)
                        labels.append((colour, bg, shape))
        imgs = m.generate(prompts, seeds, cfg=args.cfg, steps=args.steps, sampler=args.sampler,
                          scheduler=args.scheduler)
        for img, lab in zip(imgs, labels):
            got = classify(img)
            total += 1
            ok += got == lab
            per["colour"] += got[0] == lab[0]
            per["background"] += got[1] == lab[1]
            per["shape"] += got[2] == lab[2]
        pad = np.full((64, 8, 3), 200, np.uint8)
        cells = []
        for i in range(0, len(imgs), args.seeds):
            cells.append(np.concatenate(list(imgs[i:i + args.seeds]) + [pad], axis=1))
        grid = tile(cells, len(ds.SHAPES))
        save_png(grid, os.path.join(PLOTS, fname))
        print("wrote %s (%d images: rows %s, columns %s)" % (fname, len(imgs), "x".join(
            [",".join(bgs), ",".join(ds.COLOUR_NAMES)]), ",".join(ds.SHAPES)))
    print("pixel classifier: all three right %d/%d (%.0f%%); colour %d, background %d, shape %d" % (
        ok, total, 100.0 * ok / total, per["colour"], per["background"], per["shape"]))
    if not args.no_plots:
        plot_losses(args.run)
        print("wrote loss plots to %s" % PLOTS)


if __name__ == "__main__":
    main()
