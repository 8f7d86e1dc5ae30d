#!/usr/bin/python3
"""Trains models/loras/circles-to-squares.safetensors: a kohya-format LoRA for
kiln's default model (models/kiln-tiny.gguf) that draws a square wherever the
prompt asks for a circle.

    flock /tmp/kiln-cpu.lock /usr/bin/python3 training/train_lora.py [--out /tmp/kiln-lora] [--seed 0]

1. The base model is read from the GGUF itself (training/gguf_reader.py; the
   weights as kiln sees them, F16 rounded) into the reference modules of
   training/tiny_model.py, and frozen.
2. Data: training/shapes_dataset.py's images and captions, except that every
   image captioned "circle" shows a square of that colour, size and place on
   that background (the other shapes unchanged); --pool of them encoded with
   the model's own VAE encoder (posterior mean x kiln.vae.scale_factor).
3. LoRA (training/kohya_lora.py, kohya's networks/lora.py): rank --rank,
   alpha --alpha, on every linear and 1x1 conv of the UNet's transformers
   (proj_in, proj_out, attn1/attn2 to_q/to_k/to_v/to_out.0, ff.net.0.proj,
   ff.net.2) and the text encoder's q/k/v/out_proj and mlp fc1/fc2.
4. Objective exactly as stage 3b of train_tiny.py: eps-prediction MSE, SD's
   scaled-linear DDPM schedule (1000 steps), uniform t, offset noise 0.3, 10%
   of the captions replaced by "", batches of 16 captions x 4 pool latents;
   --circle-share of the captions say "circle" (the data set has a quarter).
   AdamW, warm-up then cosine to 10%, grad-norm clip 1.
5. Writes the LoRA in kohya's safetensors layout (training/reference/
   safetensors_io.py), then reloads the file, merges it into a fresh copy of
   the base model and samples circle prompts with and without it and other
   shapes with it (the PyTorch reference sampler, euler_a 20 steps cfg 2 as
   kiln's defaults), judged by training/shape_classifier.py (the rule of
   tests/unit/shape_classifier.cpp); prints the verdicts and exits non-zero
   when the file does not do what it should. Plots: training/plots/
   loss_lora.png, lora_circles_to_squares.png.

Run folder: pool.pt, loss_lora.csv. Progress lines give step, loss, it/s, ETA.
"""

import argparse
import csv
import hashlib
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_gguf  # noqa: E402
import gguf_reader  # noqa: E402
import kohya_lora  # noqa: E402
import shape_classifier  # noqa: E402
import shapes_dataset as ds  # noqa: E402
import tiny_model as tm  # noqa: E402
from reference import safetensors_io  # noqa: E402
from sample_grid import Model, save_png, tile  # noqa: E402
from train_tiny import CAPTION_DROPOUT, fmt_time, log, lr_at, save_atomic  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = os.path.join(ROOT, "training", "plots")
DRAWN = {"circle": "square"}  # the altered data set: captioned shape -> drawn shape

# kiln's diffusers table (src/io/name_map.cpp build_unet_rules) for kiln-tiny's
# layout (3 levels, 1 res block, attention at levels 1 and 2), written out by
# hand; kohya_lora.diffusers_transformer_path (diffusers' conversion formula)
# must agree with it.
KILN_TABLE_TINY = {
    "input_blocks.3.1": "down_blocks.1.attentions.0",
    "input_blocks.5.1": "down_blocks.2.attentions.0",
    "middle_block.1": "mid_block.attentions.0",
    "output_blocks.0.1": "up_blocks.0.attentions.0",
    "output_blocks.1.1": "up_blocks.0.attentions.1",
    "output_blocks.2.1": "up_blocks.1.attentions.0",
    "output_blocks.3.1": "up_blocks.1.attentions.1",
}


def check_name_mapping(unet, layers_per_block):
    blocks = [n for n, m in unet.named_modules() if type(m).__name__ == "SpatialTransformer"]
    got = {b: kohya_lora.diffusers_transformer_path(b, layers_per_block) for b in blocks}
    if got != KILN_TABLE_TINY:
        raise SystemExit("diffusers paths disagree with kiln's table: %s vs %s" % (got, KILN_TABLE_TINY))


@torch.no_grad()
def make_pool(args, base):
    path = os.path.join(args.out, "pool.pt")
    if os.path.exists(path):
        pool = torch.load(path)
        if pool["n"] == args.pool and pool["seed"] == args.seed:
            log("pool: %s exists (%d latents)" % (path, args.pool))
            return pool
    t0 = time.time()
    lat, caps = [], []
    for i in range(0, args.pool, 250):
        x, c, _ = ds.batch([args.seed, 21, i], min(250, args.pool - i), drawn=DRAWN)
        mean, _ = base.vae.encode(torch.from_numpy(x))
        lat.append(mean * base.scale)
        caps.extend(c)
    pool = {"latents": torch.cat(lat), "captions": caps, "n": args.pool, "seed": args.seed}
    save_atomic(pool, path)
    log("pool: %d images (circles drawn as squares) encoded in %.0f s; latent std %.3f" % (
        args.pool, time.time() - t0, pool["latents"].std().item()))
    return pool


def train(args, base, pool):
    tok = base.tok
    uniq = sorted(set(pool["captions"]))
    members = {c: [] for c in uniq}
    for i, c in enumerate(pool["captions"]):
        members[c].append(i)
    circle = [c for c in uniq if " circle" in c]
    other = [c for c in uniq if " circle" not in c]
    tokens = {c: torch.tensor(tok(c), dtype=torch.long) for c in uniq + [""]}
    lat = pool["latents"]
    n_groups = args.batch // args.group

    torch.manual_seed(args.seed)  # the LoRA's initial lora_down
    targets = kohya_lora.target_modules(base.unet, base.clip, tm.CONFIG["unet"]["num_res_blocks"],
                                        text_encoder=not args.no_text_encoder)
    wrapped = kohya_lora.inject(targets, args.rank, args.alpha)
    for p in list(base.unet.parameters()) + list(base.clip.parameters()):
        p.requires_grad_(False)
    params = [p for w in wrapped.values() for p in (w.lora_down.weight, w.lora_up.weight)]
    for p in params:
        p.requires_grad_(True)
    base.unet.train()
    base.clip.train()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    acp = tm.alphas_cumprod()
    log("LoRA: %d modules, rank %d, alpha %g, %d parameters; %d steps, batch %d (%d captions x %d), "
        "circle captions %.0f%%, pool %d" % (len(wrapped), args.rank, args.alpha, sum(p.numel() for p in params),
                                             args.steps, args.batch, n_groups, args.group,
                                             100 * args.circle_share, len(lat)))
    csv_path = os.path.join(args.out, "loss_lora.csv")
    f = open(csv_path, "w", newline="")
    w = csv.writer(f)
    w.writerow(["step", "loss", "circle_loss", "lr", "seconds"])
    t0 = time.time()
    smooth = None
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(args.seed * 7919 + 7_000_000 + step)
        is_circle = torch.rand(n_groups, generator=gen) < args.circle_share
        caps = []
        for c in is_circle.tolist():
            pool_of = circle if c else other
            caps.append(pool_of[int(torch.randint(0, len(pool_of), (1,), generator=gen))])
        idx = torch.cat([torch.tensor(members[c])[torch.randint(0, len(members[c]), (args.group,), generator=gen)]
                         for c in caps])
        x0 = lat[idx]
        tok_batch = torch.stack([tokens[c] for c in caps])
        drop = torch.rand(n_groups, generator=gen) < CAPTION_DROPOUT
        tok_batch[drop] = tokens[""]
        t = torch.randint(0, 1000, (len(idx),), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        noise = noise + args.offset_noise * torch.randn(x0.shape[0], x0.shape[1], 1, 1, generator=gen)
        a = acp[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        ctx = base.clip(tok_batch).repeat_interleave(args.group, dim=0)
        pred, _ = base.unet(xt, t.float(), ctx)
        per_item = (pred - noise).pow(2).mean(dim=(1, 2, 3))
        loss = per_item.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        circle_items = (is_circle & ~drop).repeat_interleave(args.group)
        circle_loss = per_item[circle_items].mean().item() if circle_items.any() else float("nan")
        el = time.time() - t0
        smooth = loss.item() if smooth is None else 0.98 * smooth + 0.02 * loss.item()
        w.writerow([step, "%.6f" % loss.item(), "%.6f" % circle_loss, "%.3g" % lr, "%.1f" % el])
        if step % 25 == 0 or step == args.steps - 1:
            ips = (step + 1) / el
            log("lora step %4d/%d  loss %.4f (avg %.4f)  lr %.2e  %.2f it/s  ETA %s" % (
                step + 1, args.steps, loss.item(), smooth, lr, ips, fmt_time((args.steps - step - 1) / ips)))
            f.flush()
    f.close()
    log("trained in %s; loss CSV %s" % (fmt_time(time.time() - t0), csv_path))
    return wrapped


def write_lora(args, wrapped):
    tensors = kohya_lora.state_dict(wrapped)
    # kohya's training metadata keys (sd-scripts writes many more)
    meta = {"ss_network_module": "networks.lora", "ss_network_dim": str(args.rank),
            "ss_network_alpha": "%g" % args.alpha, "ss_base_model_version": "sd_v1",
            "ss_output_name": os.path.splitext(os.path.basename(args.lora_out))[0],
            "kiln_trained_by": "training/train_lora.py", "kiln_base_model": "models/kiln-tiny.gguf"}
    os.makedirs(os.path.dirname(os.path.abspath(args.lora_out)), exist_ok=True)
    tmp = args.lora_out + ".tmp"
    safetensors_io.save_file(tensors, tmp, meta)
    os.replace(tmp, args.lora_out)
    with open(args.lora_out, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    log("wrote %s: %d tensors, %d bytes, sha256 %s" % (args.lora_out, len(tensors), os.path.getsize(args.lora_out),
                                                      digest))


def with_lora(gguf, lora_path, multiplier, text_encoder=True):
    """The base model read from `gguf` with the LoRA file merged in."""
    m = Model.from_gguf(gguf)
    tensors, _ = safetensors_io.load_file(lora_path)
    targets = kohya_lora.target_modules(m.unet, m.clip, tm.CONFIG["unet"]["num_res_blocks"], text_encoder)
    kohya_lora.merge(tensors, targets, multiplier)
    return m


def judge(model, prompts, seeds, args):
    imgs = model.generate(prompts, seeds, cfg=args.cfg, steps=args.sample_steps)
    return imgs, [shape_classifier.classify(img) for img in imgs]


def check_file(args):
    """Samples with and without the LoRA from the file as written; returns True
    when it turns circles into squares and leaves the rest alone."""
    base = Model.from_gguf(args.model)
    lora = with_lora(args.model, args.lora_out, 1.0, not args.no_text_encoder)
    circles = [(c, b) for c in ds.COLOUR_NAMES for b in ds.BACKGROUND_NAMES]
    prompts = [ds.caption("circle", c, b) for c, b in circles for _ in range(args.check_seeds)]
    seeds = [2000 + s for _ in circles for s in range(args.check_seeds)]
    # every other shape in every colour, the backgrounds taken in turn
    others = [(s, c, ds.BACKGROUND_NAMES[(i + j) % 3]) for i, s in enumerate(("square", "triangle", "star"))
              for j, c in enumerate(ds.COLOUR_NAMES)]
    o_prompts = [ds.caption(s, c, b) for s, c, b in others for _ in range(args.check_seeds)]
    o_seeds = [3000 + s for _ in others for s in range(args.check_seeds)]
    o_want = [(s, c, b) for s, c, b in others for _ in range(args.check_seeds)]
    want = [(c, b) for c, b in circles for _ in range(args.check_seeds)]

    _, without = judge(base, prompts, seeds, args)
    _, withl = judge(lora, prompts, seeds, args)
    _, o_without = judge(base, o_prompts, o_seeds, args)
    _, o_with = judge(lora, o_prompts, o_seeds, args)

    def rate(guesses, shape):
        ok = sum(g[0] == shape and (g[1], g[2]) == w for g, w in zip(guesses, want))
        return ok, len(guesses)

    n_circle, n = rate(without, "circle")
    n_square, _ = rate(withl, "square")
    n_other_base = sum(g == w for g, w in zip(o_without, o_want))
    n_other = sum(g == w for g, w in zip(o_with, o_want))
    for p, s, a, b in zip(prompts, seeds, without, withl):
        print("  %-40s seed %d  without: %-8s %-6s on %-5s  with: %-8s %-6s on %-5s" % (p, s, *a, *b))
    for p, s, a, b in zip(o_prompts, o_seeds, o_without, o_with):
        print("  %-40s seed %d  without: %-8s %-6s on %-5s  with: %-8s %-6s on %-5s" % (p, s, *a, *b))
    print("PyTorch check (%s judged by training/shape_classifier.py):" % os.path.basename(args.lora_out))
    print("  circle prompts without the LoRA: %d/%d circles of the right colour and background" % (n_circle, n))
    print("  circle prompts with the LoRA:    %d/%d squares of the right colour and background" % (n_square, n))
    print("  other shapes without the LoRA:   %d/%d as prompted" % (n_other_base, len(o_prompts)))
    print("  other shapes with the LoRA:      %d/%d as prompted" % (n_other, len(o_prompts)))
    good = n_circle >= 0.7 * n and n_square >= 0.7 * n and n_other >= 0.7 * len(o_prompts)
    print("  verdict: %s" % ("the file turns circles into squares" if good else "NOT GOOD"))
    return good


def grid(args):
    """Rows: prompts; columns: --grid-seeds samples without the LoRA, a gap,
    the same seeds with it."""
    base = Model.from_gguf(args.model)
    lora = with_lora(args.model, args.lora_out, 1.0, not args.no_text_encoder)
    rows = [("circle", "red", "white"), ("circle", "blue", "black"), ("circle", "yellow", "gray"),
            ("circle", "green", "white"), ("circle", "purple", "black"), ("circle", "orange", "gray"),
            ("square", "red", "white"), ("triangle", "blue", "black"), ("star", "green", "gray")]
    n = args.grid_seeds
    prompts = [ds.caption(*r) for r in rows for _ in range(n)]
    seeds = [4000 + s for _ in rows for s in range(n)]
    a = base.generate(prompts, seeds, cfg=args.cfg, steps=args.sample_steps)
    b = lora.generate(prompts, seeds, cfg=args.cfg, steps=args.sample_steps)
    gap = np.full((64, 12, 3), 200, np.uint8)
    cells = [np.concatenate(list(a[i:i + n]) + [gap] + list(b[i:i + n]), axis=1) for i in range(0, len(a), n)]
    path = os.path.join(PLOTS, "lora_circles_to_squares.png")
    save_png(tile(cells, 1), path)
    log("wrote %s (rows: %s; left %d seeds without the LoRA, right the same seeds with it)" % (
        path, "; ".join(" ".join(r) for r in rows), n))


def write_merged(args):
    """The base GGUF with the LoRA merged in at weight 1 (F16 as export_gguf.py
    writes): what kiln should draw with <lora:circles-to-squares:1>, runnable
    by a kiln without a LoRA loader."""
    m = with_lora(args.model, args.lora_out, 1.0, not args.no_text_encoder)
    meta, _ = gguf_reader.load(args.model)
    tensors = []
    for prefix, module in ((tm.CLIP_PREFIX, m.clip), (tm.UNET_PREFIX, m.unet), (tm.VAE_PREFIX, m.vae)):
        tensors += [(prefix + k, export_gguf.to_numpy(k, v)) for k, v in module.state_dict().items()]
    tensors.sort(key=lambda nt: nt[0])
    meta["general.name"] = "kiln-tiny+circles-to-squares"
    export_gguf.write_gguf(args.merged_gguf, meta, tensors)
    log("wrote %s (the LoRA merged at weight 1)" % args.merged_gguf)


def plot_loss(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(args.out, "loss_lora.csv")) as fh:
        rows = list(csv.DictReader(fh))
    step = np.array([int(r["step"]) for r in rows])
    k = 25
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for col, label in (("loss", "all captions"), ("circle_loss", "'circle' captions (drawn as squares)")):
        y = np.array([float(r[col]) for r in rows])
        keep = ~np.isnan(y)
        smooth = np.convolve(y[keep], np.ones(k) / k, mode="valid")
        ax.plot(step[keep][k - 1:], smooth, lw=1.5, label="%s, mean of %d" % (label, k))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("LoRA circles-to-squares: eps-prediction MSE (offset noise 0.3)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "loss_lora.png"))
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kiln-tiny.gguf"))
    ap.add_argument("--lora-out", default=os.path.join(ROOT, "models", "loras", "circles-to-squares.safetensors"))
    ap.add_argument("--out", default="/tmp/kiln-lora", help="run folder (latent pool, loss CSV)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine 2 threads ran ~10x slower)")
    ap.add_argument("--pool", type=int, default=4000, help="images encoded for training")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=4.0)
    ap.add_argument("--no-text-encoder", action="store_true", help="LoRA on the UNet only")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--group", type=int, default=4, help="images per caption in a batch")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--circle-share", type=float, default=0.5, help="share of the captions that say circle")
    ap.add_argument("--offset-noise", type=float, default=0.3)
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--sample-steps", type=int, default=20)
    ap.add_argument("--check-seeds", type=int, default=2)
    ap.add_argument("--grid-seeds", type=int, default=3)
    ap.add_argument("--check-only", action="store_true", help="only check and plot an existing --lora-out")
    ap.add_argument("--merged-gguf", help="also write the base model with the LoRA merged in to this GGUF")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(PLOTS, exist_ok=True)
    log("args: " + " ".join("%s=%s" % kv for kv in sorted(vars(args).items())))
    if not args.check_only:
        base = Model.from_gguf(args.model)
        check_name_mapping(base.unet, tm.CONFIG["unet"]["num_res_blocks"])
        pool = make_pool(args, base)
        wrapped = train(args, base, pool)
        write_lora(args, wrapped)
    if os.path.exists(os.path.join(args.out, "loss_lora.csv")):
        plot_loss(args)
    grid(args)
    if args.merged_gguf:
        write_merged(args)
    if not check_file(args):
        sys.exit(1)


if __name__ == "__main__":
    main()
