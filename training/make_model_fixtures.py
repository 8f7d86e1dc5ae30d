#!/usr/bin/python3
"""Writes tiny random-weight SD1/SD2 checkpoints and golden fixtures for the
C++ model tests (CLIP text encoder, UNet, VAE), computed with the PyTorch
reference modules in training/reference/.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_model_fixtures.py [--preset compact|brief] [--out DIR]
    /usr/bin/python3 training/make_model_fixtures.py --full-sd15 PATH [--dry-run]

Writes into tests/golden/models/ (see training/README.md for the contents):
  sd1_tiny.safetensors          cond_stage_model.transformer.* (HF CLIP) +
                                model.diffusion_model.* (UNet, 1x1-conv proj) +
                                first_stage_model.* (VAE)
  sd2_tiny.safetensors          cond_stage_model.model.* (OpenCLIP) + UNet
                                (linear proj) + VAE
  sd1_inpaint_tiny.safetensors  model.diffusion_model.* only, in_channels 9
  <model>_io.safetensors        inputs, outputs and per-block outputs (F32)

Reference outputs are computed in float64 from the exact stored weights (the
stored dtype, widened) and stored as F32, so a C++ run with F32 weights should
match to ~1e-5 relative; with the stored F16 weights used natively, expect
ggml's f16 matmul/conv rounding (~1e-3).

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import contextlib
import os
import sys
import time
import zlib

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import safetensors_io  # noqa: E402
from reference.clip_text import ClipTextHF, ClipTextOpenClip  # noqa: E402
from reference.unet import UNet  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

CLIP_PREFIX_HF = "cond_stage_model.transformer."
CLIP_PREFIX_OPENCLIP = "cond_stage_model.model."
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."

# Tiny model shapes. Channel counts stay multiples of 32 (GroupNorm(32)), so
# model_channels / ch 32 is the floor; sizes are set by the 64-channel level.
# Every preset: CLIP vocab 320, width 64, 2 layers, 2 heads, MLP 256, 77
# positions; UNet model_channels 32, 1 res block, attention at both levels,
# 2 heads, depth 1, context 64; VAE ch 32, 1 res block, z 4.
#   "brief":   UNet and VAE channel_mult (1, 2) everywhere, F32 weights
#              (about 21.6 MB of files).
#   "compact": (default, about 8.3 MB) F16 weights (as real SD checkpoints);
#              sd1_tiny keeps channel_mult (1, 2) in UNet and VAE, so channel
#              changes (input-block skip_connection, VAE nin_shortcut, levels
#              of different widths) are covered there; the SD2 and inpainting
#              UNets and the SD2 VAE use channel_mult (1, 1).
#   "tight":   F16, channel_mult (1, 1) everywhere (about 6 MB): no level
#              changes width, the VAE has no nin_shortcut.
PRESETS = {
    "brief": {
        "weight_dtype": torch.float32,
        "sd1": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 2)), "vae": dict(ch_mult=(1, 2))},
        "sd2": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 2)), "vae": dict(ch_mult=(1, 2))},
        "sd1_inpaint": {"unet": dict(channel_mult=(1, 2))},
    },
    "compact": {
        "weight_dtype": torch.float16,
        "sd1": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 2)), "vae": dict(ch_mult=(1, 2))},
        "sd2": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 1)), "vae": dict(ch_mult=(1, 1))},
        "sd1_inpaint": {"unet": dict(channel_mult=(1, 1))},
    },
    "tight": {
        "weight_dtype": torch.float16,
        "sd1": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 1)), "vae": dict(ch_mult=(1, 1))},
        "sd2": {"clip": dict(vocab=320, width=64, layers=2, heads=2, intermediate=256),
                "unet": dict(channel_mult=(1, 1)), "vae": dict(ch_mult=(1, 1))},
        "sd1_inpaint": {"unet": dict(channel_mult=(1, 1))},
    },
}

UNET_COMMON = dict(out_channels=4, model_channels=32, num_res_blocks=1, attention_levels=(0, 1),
                   num_heads=2, transformer_depth=1)
VAE_COMMON = dict(ch=32, num_res_blocks=1, image_channels=3, z_channels=4, embed_dim=4)

CONTEXT_FALLBACK = 64  # context width of a model without a text encoder (the inpainting UNet)
HEADS_METADATA = {"kiln.unet.heads": "2", "kiln.clip.heads": "2"}


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------ weight init


def init_value(name, shape, gen):
    """A random tensor (f32) for parameter `name` that keeps activations O(1)."""
    shape = tuple(shape)
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("position_ids"):
        return torch.arange(shape[-1], dtype=torch.int64).reshape(shape)
    if leaf == "logit_scale":
        return torch.full(shape, 2.6592600345611572)  # log(1 / 0.07)
    if name.endswith("token_embedding.weight"):
        return torch.randn(shape, generator=gen)
    if name.endswith("position_embedding.weight") or leaf == "positional_embedding":
        return 0.5 * torch.randn(shape, generator=gen)
    if len(shape) >= 2:  # linear / conv / fused in_proj / text_projection
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        return torch.randn(shape, generator=gen) * fan_in ** -0.5
    if len(shape) == 1 and (leaf == "weight"):  # GroupNorm / LayerNorm scale
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    # biases (1-D "bias", in_proj_bias)
    return 0.05 * torch.randn(shape, generator=gen)


def randomize(module, seed, dtype):
    """Seeded weights in state_dict order, rounded to `dtype`; returns the
    state dict as stored (dtype) and loads the widened values into `module`."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for name, param in module.state_dict().items():
        v = init_value(name, param.shape, gen)
        if v.is_floating_point():
            v = v.to(dtype)
        stored[name] = v.contiguous()
    module.load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v for k, v in stored.items()})
    return stored


# ------------------------------------------------------------ models


def make_clip(kind, cfg):
    if kind == "hf":
        return ClipTextHF(vocab=cfg["vocab"], width=cfg["width"], layers=cfg["layers"], heads=cfg["heads"],
                          positions=77, intermediate=cfg["intermediate"])
    return ClipTextOpenClip(vocab=cfg["vocab"], width=cfg["width"], layers=cfg["layers"], heads=cfg["heads"],
                            positions=77, intermediate=cfg["intermediate"], with_projection=True)


def make_unet(cfg, in_channels, context_dim, linear):
    return UNet(in_channels=in_channels, context_dim=context_dim, use_linear_in_transformer=linear,
                **UNET_COMMON, **cfg)


def make_vae(cfg):
    return AutoencoderKL(**VAE_COMMON, **cfg)


def make_tokens(gen, vocab, pad_id):
    """Two prompts of different lengths: BOS, ids, EOS, then padding."""
    bos, eos = vocab - 2, vocab - 1
    rows = []
    for n in (7, 20):
        ids = torch.randint(1, vocab - 2, (n,), generator=gen).tolist()
        row = [bos] + ids + [eos]
        row += [pad_id] * (77 - len(row))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32)


def save_fixture_pair(out_dir, name, ckpt, io, generator, shapes_note, ckpt_metadata=None, max_bytes=None):
    """Writes NAME.safetensors (the weights, with `ckpt_metadata`) and NAME_io.safetensors (the golden
    inputs and outputs, naming the model and `generator`), logs their sizes and the goldens' statistics,
    and checks the weights read back unchanged."""
    ckpt_path = os.path.join(out_dir, name + ".safetensors")
    io_path = os.path.join(out_dir, name + "_io.safetensors")
    safetensors_io.save_file(ckpt, ckpt_path, dict(ckpt_metadata or {}))
    safetensors_io.save_file(io, io_path, {
        "kiln.fixture.model": name + ".safetensors",
        "kiln.fixture.generator": generator,
        "kiln.fixture.note": "reference computed in float64 from the stored weights; "
                             "shapes in PyTorch order (%s)" % shapes_note,
    })
    for path, tensors in ((ckpt_path, ckpt), (io_path, io)):
        size = os.path.getsize(path)
        assert max_bytes is None or size < max_bytes, path + " is too large"
        log("wrote %s: %d tensors, %.1f KB" % (os.path.relpath(path, ROOT), len(tensors), size / 1e3))
    for k, v in io.items():
        if v.is_floating_point():
            log("  %-34s %-16s mean %+.4f std %.4f" % (k, shape_str(v), v.double().mean(), v.double().std()))
        else:
            log("  %-34s %-16s %s" % (k, shape_str(v), str(v.dtype).replace("torch.", "")))
    back, _ = safetensors_io.load_file(ckpt_path)
    assert sorted(back) == sorted(ckpt) and all(torch.equal(back[k], ckpt[k]) for k in ckpt)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def shape_str(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def build_model(name, spec, dtype, seed):
    """Returns (checkpoint tensors, io tensors), name -> tensor."""
    ckpt = {}
    io = {}
    gen = torch.Generator().manual_seed(seed + 1000)
    clip_cfg = spec.get("clip")
    is_sd2 = name.startswith("sd2")
    context_dim = clip_cfg["width"] if clip_cfg else CONTEXT_FALLBACK

    if clip_cfg:
        clip = make_clip("openclip" if is_sd2 else "hf", clip_cfg)
        prefix = CLIP_PREFIX_OPENCLIP if is_sd2 else CLIP_PREFIX_HF
        stored = randomize(clip, seed + 1, dtype)
        if not is_sd2:
            # SD1 checkpoints carry HF's position_ids buffer (I64 [1, 77]).
            stored["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64).reshape(1, 77)
        for k, v in stored.items():
            ckpt[prefix + k] = v
        tokens = make_tokens(gen, clip_cfg["vocab"], pad_id=0 if is_sd2 else clip_cfg["vocab"] - 1)
        clip = clip.double().eval()
        with torch.no_grad():
            io["clip.tokens"] = tokens
            io["clip.out.skip1"] = f32(clip(tokens, clip_skip=1))
            io["clip.out.skip2"] = f32(clip(tokens, clip_skip=2))
        log("  clip (%s): %d tensors, %d params" % (
            "open_clip" if is_sd2 else "HF", len(stored), sum(v.numel() for v in stored.values())))

    in_channels = 9 if "inpaint" in name else 4
    unet = make_unet(spec["unet"], in_channels, context_dim, linear=is_sd2)
    stored = randomize(unet, seed + 2, dtype)
    for k, v in stored.items():
        ckpt[UNET_PREFIX + k] = v
    x = torch.randn(2, in_channels, 16, 16, generator=gen)
    t = torch.tensor([981.0, 1.0])
    context = torch.randn(2, 77, context_dim, generator=gen)
    unet = unet.double().eval()
    with torch.no_grad():
        out, blocks = unet(x.double(), t.double(), context.double())
    io["unet.x"] = x
    io["unet.t"] = t
    io["unet.context"] = context
    io["unet.out"] = f32(out)
    for k, v in blocks.items():
        io["unet.block." + k] = f32(v)
    log("  unet: %d tensors, %d params, in %d, channel_mult %s, %s proj" % (
        len(stored), sum(v.numel() for v in stored.values()), in_channels, spec["unet"]["channel_mult"],
        "linear" if is_sd2 else "conv"))

    if "vae" in spec:
        vae = make_vae(spec["vae"])
        stored = randomize(vae, seed + 3, dtype)
        for k, v in stored.items():
            ckpt[VAE_PREFIX + k] = v
        vae = vae.double().eval()
        z = torch.randn(1, 4, 8, 8, generator=gen)
        image = torch.rand(1, 3, 16, 16, generator=gen) * 2 - 1
        with torch.no_grad():
            decoded, dblocks = vae.decode(z.double())
            mean, eblocks = vae.encode(image.double())
        io["vae.z"] = z
        io["vae.decoded"] = f32(decoded)
        for k, v in dblocks.items():
            io["vae.block." + k] = f32(v)
        io["vae.image"] = image
        io["vae.encoded_mean"] = f32(mean)
        for k, v in eblocks.items():
            io["vae.block." + k] = f32(v)
        log("  vae: %d tensors, %d params, ch_mult %s" % (
            len(stored), sum(v.numel() for v in stored.values()), spec["vae"]["ch_mult"]))
    return ckpt, io


def file_size(path):
    return os.path.getsize(path)


def write_tiny(out_dir, preset_name):
    preset = PRESETS[preset_name]
    dtype = preset["weight_dtype"]
    os.makedirs(out_dir, exist_ok=True)
    total = 0
    seeds = {"sd1_tiny": 100, "sd2_tiny": 200, "sd1_inpaint_tiny": 300}
    specs = {"sd1_tiny": preset["sd1"], "sd2_tiny": preset["sd2"], "sd1_inpaint_tiny": preset["sd1_inpaint"]}
    for name, spec in specs.items():
        log("%s (preset %s, weights %s):" % (name, preset_name, safetensors_io.DTYPES[dtype]))
        torch.manual_seed(seeds[name])
        ckpt, io = build_model(name, spec, dtype, seeds[name])
        meta = dict(HEADS_METADATA)
        ckpt_path = os.path.join(out_dir, name + ".safetensors")
        io_path = os.path.join(out_dir, name + "_io.safetensors")
        safetensors_io.save_file(ckpt, ckpt_path, meta)
        io_meta = {
            "kiln.fixture.model": name + ".safetensors",
            "kiln.fixture.generator": "training/make_model_fixtures.py --preset " + preset_name,
            "kiln.fixture.note": "reference computed in float64 from the stored weights; "
                                 "shapes in PyTorch order (NCHW, [batch, tokens, width])",
        }
        safetensors_io.save_file(io, io_path, io_meta)
        for path, tensors in ((ckpt_path, ckpt), (io_path, io)):
            size = file_size(path)
            total += size
            log("  wrote %s: %d tensors, %.2f MB" % (os.path.relpath(path, ROOT), len(tensors), size / 1e6))
        for k, v in io.items():
            if v.is_floating_point():
                log("    %-34s %-18s mean %+.4f std %.4f" % (k, shape_str(v), v.double().mean(), v.double().std()))
            else:
                log("    %-34s %-18s %s" % (k, shape_str(v), str(v.dtype).replace("torch.", "")))
        # Round trip through the reader.
        back, back_meta = safetensors_io.load_file(ckpt_path)
        assert back_meta == meta and sorted(back) == sorted(ckpt)
        assert all(torch.equal(back[k], ckpt[k]) for k in ckpt)
    log("total %.2f MB in %s" % (total / 1e6, os.path.relpath(out_dir, ROOT)))


# ------------------------------------------------------------ full-size SD1.5


@contextlib.contextmanager
def meta_parameters():
    """Modules built inside get parameters on the meta device (no memory)."""
    orig = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None:
            param = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                 requires_grad=param.requires_grad)
        orig(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = orig


def sd15_specs():
    """(name, dtype, shape) of the v1.5 single-file checkpoint's three modules
    (no model_ema.*, no DDPM schedule buffers), F16 as released, plus the I64
    position_ids buffer the release carries."""
    with meta_parameters():
        clip = ClipTextHF(vocab=49408, width=768, layers=12, heads=12, positions=77, intermediate=3072)
        unet = UNet(in_channels=4, out_channels=4, model_channels=320, channel_mult=(1, 2, 4, 4), num_res_blocks=2,
                    attention_levels=(0, 1, 2), num_heads=8, transformer_depth=1, context_dim=768)
        vae = AutoencoderKL(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2)
    specs = []
    for prefix, module in ((CLIP_PREFIX_HF, clip), (UNET_PREFIX, unet), (VAE_PREFIX, vae)):
        for name, p in module.state_dict().items():
            specs.append((prefix + name, torch.float16, tuple(p.shape)))
    specs.append((CLIP_PREFIX_HF + "text_model.embeddings.position_ids", torch.int64, (1, 77)))
    return safetensors_io.layout_order(specs)


def write_full_sd15(path, dry_run):
    specs = sd15_specs()
    groups = {}
    for name, dtype, shape in specs:
        top = name.split(".")[0]
        n = 1
        for s in shape:
            n *= s
        c, p = groups.get(top, (0, 0))
        groups[top] = (c + 1, p + n)
    for top, (c, p) in sorted(groups.items()):
        log("  %-20s %5d tensors %12d values" % (top, c, p))
    size = safetensors_io.file_bytes(specs)
    log("full SD1.5: %d tensors, %.3f GB (%d bytes)" % (len(specs), size / 1e9, size))
    if dry_run:
        return
    start = time.time()
    done = 0
    with safetensors_io.StreamWriter(path, specs) as w:
        for i, (name, dtype, shape) in enumerate(specs):
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode("utf-8")))
            value = init_value(name, shape, gen)
            if value.is_floating_point():
                value = value.to(dtype)
            w.write(name, value)
            done += value.numel() * value.element_size()
            if i % 50 == 0 or i == len(specs) - 1:
                el = time.time() - start
                log("  [%4d/%d] %.2f GB, %.0f MB/s" % (i + 1, len(specs), done / 1e9, done / 1e6 / max(el, 1e-9)))
    log("wrote %s (%.3f GB)" % (path, file_size(path) / 1e9))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    ap.add_argument("--preset", default="compact", choices=sorted(PRESETS))
    ap.add_argument("--full-sd15", metavar="PATH",
                    help="instead: write a full-size random-weight SD1.5 checkpoint (F16, ~2.1 GB)")
    ap.add_argument("--dry-run", action="store_true", help="with --full-sd15: list tensor count and bytes only")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    if args.full_sd15:
        write_full_sd15(args.full_sd15, args.dry_run)
    else:
        write_tiny(args.out, args.preset)


if __name__ == "__main__":
    main()
