#!/usr/bin/python3
"""Trains kiln-tiny: VAE, then UNet + CLIP text encoder on eps-prediction.

    /usr/bin/python3 training/train_tiny.py [--out /tmp/kiln-train] [--seed 0] [--stage ...]

Stages (each resumes from what --out already holds; see training/README.md):
  1. VAE (ldm AutoencoderKL): MSE + KL_WEIGHT * KL on freshly drawn batches,
     mostly on 32x32 crops; vae_ckpt.pt, vae.pt, loss_vae.csv.
  2. latent pool: --pool images drawn and encoded (posterior mean); latent
     scale factor = 1 / std of those latents; pool.pt.
  3a. UNet + CLIP jointly: SD's scaled-linear DDPM schedule (beta
     0.00085..0.012, 1000 steps), uniform t, eps-prediction MSE, 10% of the
     captions replaced by "" (classifier-free guidance), AdamW with warm-up and
     cosine decay over --unet-steps, stopped after --stop-at; unet_ckpt.pt,
     loss_unet.csv.
  3b. continues 3a with offset noise (--offset-noise), fresh EMA (exported);
     unet2_ckpt.pt, loss_unet2.csv, final.pt.
  4. VAE decoder fine-tune at 64x64 on the frozen encoder (latent space
     unchanged); vae_decoder.pt, loss_vae_decoder.csv.

Every random draw comes from generators seeded by (seed, stage, step), so a
resumed run continues exactly as an uninterrupted one would (up to float
summation order). Progress lines: step, loss, it/s, ETA.
"""

import argparse
import copy
import csv
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shapes_dataset as ds  # noqa: E402
import tiny_model as tm  # noqa: E402
import tiny_tokenizer  # noqa: E402

KL_WEIGHT = 1e-5
CAPTION_DROPOUT = 0.10


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


def fmt_time(s):
    s = int(max(s, 0))
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


def lr_at(step, total, base, warmup):
    if step < warmup:
        return base * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))


def save_atomic(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


class CsvLog:
    def __init__(self, path, header, resume_step):
        rows = []
        if os.path.exists(path) and resume_step > 0:
            with open(path) as f:
                r = csv.reader(f)
                next(r, None)
                rows = [row for row in r if int(row[0]) < resume_step]
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(header)
        self.w.writerows(rows)
        self.f.flush()

    def add(self, row):
        self.w.writerow(row)

    def flush(self):
        self.f.flush()


def vae_loss(vae, x, gen):
    moments = vae.quant_conv(vae.encoder(x, {}))
    mean, logvar = moments.chunk(2, dim=1)
    logvar = logvar.clamp(-30.0, 20.0)
    z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, generator=gen)
    rec, _ = vae.decode(z)
    mse = F.mse_loss(rec, x)
    kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()
    return mse + KL_WEIGHT * kl, mse, kl


def train_vae(args, out):
    final = os.path.join(out, "vae.pt")
    if os.path.exists(final):
        log("stage 1: %s exists, skipping" % final)
        return
    torch.manual_seed(args.seed)
    vae = tm.make_vae()
    opt = torch.optim.Adam(vae.parameters(), lr=args.vae_lr)
    start = 0
    ckpt_path = os.path.join(out, "vae_ckpt.pt")
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        vae.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
        log("stage 1: resuming at step %d" % start)
    log("stage 1: VAE %d params, %d steps, batch %d" % (tm.count(vae), args.vae_steps, args.vae_batch))
    csvlog = CsvLog(os.path.join(out, "loss_vae.csv"), ["step", "loss", "mse", "kl", "lr", "seconds"], start)
    t0 = time.time()
    for step in range(start, args.vae_steps):
        lr = lr_at(step, args.vae_steps, args.vae_lr, 50)
        for g in opt.param_groups:
            g["lr"] = lr
        x, _, _ = ds.batch([args.seed, 1, step], args.vae_batch)
        if step < int(args.vae_steps * args.vae_crop_share):
            # fully convolutional: most steps see random 32x32 crops (4x cheaper)
            rng = np.random.default_rng([args.seed, 11, step])
            oy, ox = rng.integers(0, 33, size=2)
            x = np.ascontiguousarray(x[:, :, oy:oy + 32, ox:ox + 32])
        gen = torch.Generator().manual_seed(args.seed * 7919 + 1_000_000 + step)
        loss, mse, kl = vae_loss(vae, torch.from_numpy(x), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        el = time.time() - t0
        csvlog.add([step, "%.6f" % loss.item(), "%.6f" % mse.item(), "%.5f" % kl.item(), "%.3g" % lr, "%.1f" % el])
        done = step + 1 - start
        if step % 20 == 0 or step == args.vae_steps - 1:
            ips = done / el
            log("vae  step %5d/%d  loss %.5f  mse %.5f  kl %.3f  %.2f it/s  ETA %s" % (
                step + 1, args.vae_steps, loss.item(), mse.item(), kl.item(), ips,
                fmt_time((args.vae_steps - step - 1) / ips)))
            csvlog.flush()
        if (step + 1) % args.ckpt_every == 0:
            save_atomic({"model": vae.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt_path)
    csvlog.flush()
    save_atomic({"model": vae.state_dict(), "config": tm.CONFIG["vae"]}, final)
    log("stage 1 done in %s" % fmt_time(time.time() - t0))


def train_decoder(args, out):
    """Stage 4: fine-tunes the VAE decoder (and post_quant_conv) at 64x64 on
    the frozen encoder's posterior means, so the latent space the UNet learnt
    is unchanged; needs only vae.pt, so it may run alongside stage 3."""
    final = os.path.join(out, "vae_decoder.pt")
    if os.path.exists(final):
        log("stage 4: %s exists, skipping" % final)
        return
    vae = tm.make_vae()
    vae.load_state_dict(torch.load(os.path.join(out, "vae.pt"))["model"])
    for p in list(vae.encoder.parameters()) + list(vae.quant_conv.parameters()):
        p.requires_grad_(False)
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    opt = torch.optim.Adam(params, lr=args.dec_lr)
    start = 0
    ckpt_path = os.path.join(out, "vae_decoder_ckpt.pt")
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        vae.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
        log("stage 4: resuming at step %d" % start)
    log("stage 4: VAE decoder fine-tune, %d steps, batch %d" % (args.dec_steps, args.dec_batch))
    csvlog = CsvLog(os.path.join(out, "loss_vae_decoder.csv"), ["step", "mse", "lr", "seconds"], start)
    t0 = time.time()
    for step in range(start, args.dec_steps):
        lr = lr_at(step, args.dec_steps, args.dec_lr, 20)
        for g in opt.param_groups:
            g["lr"] = lr
        x, _, _ = ds.batch([args.seed, 4, step], args.dec_batch)
        x = torch.from_numpy(x)
        with torch.no_grad():
            mean, _ = vae.encode(x)
        rec, _ = vae.decode(mean)
        mse = F.mse_loss(rec, x)
        opt.zero_grad(set_to_none=True)
        mse.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        el = time.time() - t0
        csvlog.add([step, "%.6f" % mse.item(), "%.3g" % lr, "%.1f" % el])
        done = step + 1 - start
        if step % 20 == 0 or step == args.dec_steps - 1:
            ips = done / el
            log("dec  step %5d/%d  mse %.5f  %.2f it/s  ETA %s" % (
                step + 1, args.dec_steps, mse.item(), ips, fmt_time((args.dec_steps - step - 1) / ips)))
            csvlog.flush()
        if (step + 1) % 100 == 0:
            save_atomic({"model": vae.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt_path)
    csvlog.flush()
    save_atomic({"model": vae.state_dict(), "config": tm.CONFIG["vae"]}, final)
    log("stage 4 done in %s" % fmt_time(time.time() - t0))


@torch.no_grad()
def make_pool(args, out):
    path = os.path.join(out, "pool.pt")
    if os.path.exists(path):
        log("stage 2: %s exists, skipping" % path)
        return
    vae = tm.make_vae()
    vae.load_state_dict(torch.load(os.path.join(out, "vae.pt"))["model"])
    vae.eval()
    t0 = time.time()
    lat, caps, mses = [], [], []
    chunk = 250
    for i in range(0, args.pool, chunk):
        x, c, _ = ds.batch([args.seed, 2, i], min(chunk, args.pool - i))
        x = torch.from_numpy(x)
        mean, _ = vae.encode(x)
        if i < 1000:
            rec, _ = vae.decode(mean)
            mses.append(F.mse_loss(rec, x).item())
        lat.append(mean)
        caps.extend(c)
    lat = torch.cat(lat)
    std = lat.std().item()
    scale = 1.0 / std
    log("stage 2: pool %d latents in %.0f s; latent mean %.4f std %.4f -> scale factor %.5f; "
        "recon mse (first 1000) %.5f" % (len(caps), time.time() - t0, lat.mean().item(), std, scale,
                                        float(np.mean(mses))))
    save_atomic({"latents": lat * scale, "captions": caps, "scale_factor": scale}, path)


def train_unet(args, out, phase):
    """Stage 3 (phase "a", from scratch, stopped after --stop-at steps) and
    stage 3b (phase "b": continues from phase a's last checkpoint with offset
    noise, fresh EMA; writes final.pt)."""
    b = phase == "b"
    final = os.path.join(out, "final.pt")
    if os.path.exists(final):
        log("stage 3%s: %s exists, skipping" % (phase, final))
        return
    total = args.unet2_steps if b else args.unet_steps
    stop = total if b else min(args.stop_at or total, total)
    lr_base = args.lr2 if b else args.lr
    warmup = 50 if b else 200
    ema_decay = args.ema2 if b else args.ema
    offset = args.offset_noise if b else 0.0
    ckpt_path = os.path.join(out, "unet2_ckpt.pt" if b else "unet_ckpt.pt")
    a_ckpt = os.path.join(out, "unet_ckpt.pt")
    if not b and os.path.exists(a_ckpt) and torch.load(a_ckpt)["step"] >= stop:
        log("stage 3a: checkpoint at step %d already, skipping" % stop)
        return
    tok = tiny_tokenizer.default()
    pool = torch.load(os.path.join(out, "pool.pt"))
    lat = pool["latents"]
    cap_ids = {}
    for c in set(pool["captions"]) | {""}:
        cap_ids[c] = torch.tensor(tok(c), dtype=torch.long)
    uniq = sorted(set(pool["captions"]))
    uniq_tokens = torch.stack([cap_ids[c] for c in uniq])
    members = [[] for _ in uniq]
    pos = {c: i for i, c in enumerate(uniq)}
    for i, c in enumerate(pool["captions"]):
        members[pos[c]].append(i)
    members = [torch.tensor(m) for m in members]
    empty = cap_ids[""]
    n_groups = args.batch // args.group

    torch.manual_seed(args.seed + 1)
    clip = tm.make_clip(len(tok.tokens))
    unet = tm.make_unet(tm.CONFIG["clip"]["width"])
    params = list(clip.parameters()) + list(unet.parameters())
    opt = torch.optim.AdamW(params, lr=lr_base, weight_decay=0.0, betas=(0.9, 0.99))
    if b:  # start from phase a's raw weights and optimizer state
        ck = torch.load(a_ckpt)
        clip.load_state_dict(ck["clip"])
        unet.load_state_dict(ck["unet"])
        opt.load_state_dict(ck["opt"])
        log("stage 3b: starting from phase a's step-%d weights" % ck["step"])
    ema_clip, ema_unet = copy.deepcopy(clip), copy.deepcopy(unet)
    for p in list(ema_clip.parameters()) + list(ema_unet.parameters()):
        p.requires_grad_(False)
    start = 0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        clip.load_state_dict(ck["clip"])
        unet.load_state_dict(ck["unet"])
        ema_clip.load_state_dict(ck["ema_clip"])
        ema_unet.load_state_dict(ck["ema_unet"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
        log("stage 3%s: resuming at step %d" % (phase, start))
    acp = tm.alphas_cumprod()
    log("stage 3%s: CLIP %d params, UNet %d params, %d of %d steps, batch %d, pool %d, offset noise %g" % (
        phase, tm.count(clip), tm.count(unet), stop, total, args.batch, len(lat), offset))
    csvlog = CsvLog(os.path.join(out, "loss_unet2.csv" if b else "loss_unet.csv"), ["step", "loss", "lr", "seconds"],
                    start)
    t0 = time.time()
    ema_params = list(ema_clip.parameters()) + list(ema_unet.parameters())
    smooth = None
    for step in range(start, stop):
        lr = lr_at(step, total, lr_base, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(args.seed * 7919 + (5_000_000 if b else 3_000_000) + step)
        # n_groups captions, args.group pool images of each: the text encoder
        # runs once per caption.
        caps = torch.randint(0, len(uniq), (n_groups,), generator=gen)
        idx = torch.cat([members[c][torch.randint(0, len(members[c]), (args.group,), generator=gen)]
                         for c in caps.tolist()])
        x0 = lat[idx]
        tokens = uniq_tokens[caps].clone()
        drop = torch.rand(n_groups, generator=gen) < CAPTION_DROPOUT
        tokens[drop] = empty
        t = torch.randint(0, 1000, (len(idx),), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        if offset:
            # offset noise: a random per-channel constant, so the model does not
            # read the image's mean colour from the noisy input at high t (a
            # 16x16 latent keeps its mean visible even at t = 999)
            noise = noise + offset * torch.randn(x0.shape[0], x0.shape[1], 1, 1, generator=gen)
        a = acp[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        ctx = clip(tokens).repeat_interleave(args.group, dim=0)
        pred, _ = unet(xt, t.float(), ctx)
        loss = F.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_mul_(ema_params, decay)
            torch._foreach_add_(ema_params, params, alpha=1 - decay)
        el = time.time() - t0
        smooth = loss.item() if smooth is None else 0.98 * smooth + 0.02 * loss.item()
        csvlog.add([step, "%.6f" % loss.item(), "%.3g" % lr, "%.1f" % el])
        done = step + 1 - start
        if step % 25 == 0 or step == args.unet_steps - 1:
            ips = done / el
            log("unet%s step %5d/%d  loss %.4f (avg %.4f)  lr %.2e  %.2f it/s  ETA %s" % (
                phase, step + 1, stop, loss.item(), smooth, lr, ips, fmt_time((stop - step - 1) / ips)))
            csvlog.flush()
        if (step + 1) % args.ckpt_every == 0 or step == stop - 1:
            save_atomic({"clip": clip.state_dict(), "unet": unet.state_dict(), "ema_clip": ema_clip.state_dict(),
                         "ema_unet": ema_unet.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt_path)
    csvlog.flush()
    if not b:
        log("stage 3a done in %s" % fmt_time(time.time() - t0))
        return
    vae = torch.load(os.path.join(out, "vae.pt"))["model"]
    save_atomic({"clip": ema_clip.state_dict(), "unet": ema_unet.state_dict(), "vae": vae,
                 "scale_factor": pool["scale_factor"], "tokens": tok.tokens, "merges": tok.merges,
                 "config": tm.CONFIG, "steps": (stop, total), "seed": args.seed}, final)
    log("stage 3b done in %s; wrote %s" % (fmt_time(time.time() - t0), final))


def finalize_early(args, out):
    """Stage "finalize": writes final.pt from the last UNet checkpoint's EMA
    weights, for a run stopped before --unet-steps (a time budget ran out)."""
    final = os.path.join(out, "final.pt")
    if os.path.exists(final):
        log("finalize: %s exists, nothing to do" % final)
        return
    path = os.path.join(out, "unet2_ckpt.pt")
    if not os.path.exists(path):
        path = os.path.join(out, "unet_ckpt.pt")
    ck = torch.load(path)
    pool = torch.load(os.path.join(out, "pool.pt"))
    tok = tiny_tokenizer.default()
    vae = torch.load(os.path.join(out, "vae.pt"))["model"]
    save_atomic({"clip": ck["ema_clip"], "unet": ck["ema_unet"], "vae": vae,
                 "scale_factor": pool["scale_factor"], "tokens": tok.tokens, "merges": tok.merges,
                 "config": tm.CONFIG, "steps": ck["step"], "seed": args.seed}, final)
    log("finalize: wrote %s from the step-%d checkpoint's EMA weights" % (final, ck["step"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/kiln-train", help="run folder (checkpoints, CSVs, results)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine 2 threads ran ~10x slower)")
    ap.add_argument("--vae-steps", type=int, default=500)
    ap.add_argument("--vae-batch", type=int, default=32)
    ap.add_argument("--vae-lr", type=float, default=2e-3)
    ap.add_argument("--vae-crop-share", type=float, default=0.88,
                    help="share of the VAE steps trained on random 32x32 crops (the rest at 64x64)")
    ap.add_argument("--group", type=int, default=4, help="images per caption in a UNet batch")
    ap.add_argument("--pool", type=int, default=8000, help="images encoded for the UNet stage")
    ap.add_argument("--unet-steps", type=int, default=1800)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--stop-at", type=int, default=800,
                    help="stage 3a stops after this many of its --unet-steps (cosine schedule over --unet-steps)")
    ap.add_argument("--unet2-steps", type=int, default=900, help="stage 3b steps (offset noise)")
    ap.add_argument("--lr2", type=float, default=4e-4)
    ap.add_argument("--ema2", type=float, default=0.995)
    ap.add_argument("--offset-noise", type=float, default=0.3)
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--dec-steps", type=int, default=300)
    ap.add_argument("--dec-batch", type=int, default=16)
    ap.add_argument("--dec-lr", type=float, default=5e-4)
    ap.add_argument("--stage", choices=["all", "vae", "pool", "unet", "unet2", "decoder", "finalize"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    log("args: " + " ".join("%s=%s" % kv for kv in sorted(vars(args).items())))
    if args.stage in ("all", "vae"):
        train_vae(args, args.out)
    if args.stage in ("all", "pool"):
        make_pool(args, args.out)
    if args.stage in ("all", "unet"):
        train_unet(args, args.out, "a")
    if args.stage in ("all", "unet2"):
        train_unet(args, args.out, "b")
    if args.stage in ("all", "decoder"):
        train_decoder(args, args.out)
    if args.stage == "finalize":
        finalize_early(args, args.out)


if __name__ == "__main__":
    main()
