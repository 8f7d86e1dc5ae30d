#!/usr/bin/python3
"""Writes a tiny random-weight Wan 2.2 VAE (the 48-channel one of
Wan2.2-TI2V-5B) with the original tensor names and its golden inputs and
outputs, computed with training/reference/wan22_vae.py (transcribed from
wan/modules/vae2_2.py of Wan-Video/Wan2.2).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_wan22_vae_fixtures.py [--out DIR]

Writes into tests/golden/models/ (all F32; shapes in PyTorch order):

  wan22_vae_tiny.safetensors     WanVAE_'s state dict as Wan2.2_VAE.pth and
                                 wan2.2_vae.safetensors name it (no prefix;
                                 CausalConv3d weights 5-D [out, in, kt, kh, kw],
                                 Conv2d weights 4-D, RMS_norm gammas
                                 [C, 1, 1, 1], [C, 1, 1] in the attention
                                 blocks). TINY below: dim 4, dec_dim 6,
                                 dim_mult (1, 1, 2, 2) (real: 160, 256,
                                 (1, 2, 4, 4)), z_dim 48, num_res_blocks 2 and
                                 temperal_downsample (False, True, True) as the
                                 real model. Encoder widths 4, 4, 4, 8, 8:
                                 level 0 downsample2d with AvgDown3D (4 -> 4,
                                 1, 2), level 1 downsample3d (4 -> 4, 2, 2:
                                 groups of 8), level 2 downsample3d widening
                                 (4 -> 8, 2, 2: groups of 4, as the real
                                 levels 1 and 2), level 3 no resample
                                 (identity shortcut). Decoder widths 12, 12,
                                 12, 6, 6: levels 0 and 1 upsample3d with
                                 DupUp3D (12 -> 12, 2, 2), level 2 upsample2d
                                 narrowing (12 -> 6, 1, 2: repeats 2, as the
                                 real level 2), level 3 no resample, no
                                 shortcut.
  wan22_vae_tiny_io.safetensors  One frame, a batch of 2, each item its own
                                 one-frame clip (the original run on each item
                                 alone): image [2, 3, 32, 48] in [-1, 1] ->
                                 encoded [2, 48, 2, 3] (the normalised mean
                                 (mu - mean) / std); z [2, 48, 2, 3] (a given
                                 normalised latent) -> decoded [2, 3, 32, 48]
                                 (not clamped).
                                 A clip, its frames along the first axis (the
                                 original's [1, C, T, H, W] as [T, C, H, W]):
                                 clip.z [3, 48, 2, 3] -> clip.decoded
                                 [9, 3, 32, 48] (WanVAE_.decode: one latent
                                 frame per chunk through the causal cache,
                                 first_chunk on the first, 1 + 4 + 4 frames);
                                 clip.video [9, 3, 32, 48] -> clip.encoded
                                 [3, 48, 2, 3] (WanVAE_.encode: chunks of 1, 4,
                                 4 frames; normalised mean).
                                 Intermediates, [T, C, h, w], each the output
                                 of the named module in the clip runs, its
                                 per-chunk outputs concatenated along time:
                                 block.decoder.conv1 [3, 12, 2, 3] (the
                                 decoder's first conv, after WanVAE_.conv2 of
                                 the de-normalised latent);
                                 block.decoder.upsamples.N (Up_ResidualBlock N:
                                 its residual blocks, its Resample and its
                                 DupUp3D shortcut; N = 0, 1, 2 upsample, 3 not):
                                 [5, 12, 4, 6], [9, 12, 8, 12], [9, 6, 16, 24],
                                 [9, 6, 16, 24] (before the head and
                                 unpatchify: h, w are half the image's);
                                 block.encoder.downsamples.N (Down_ResidualBlock
                                 N, AvgDown3D shortcut added; after patchify
                                 and the encoder's conv1): [9, 4, 8, 12],
                                 [5, 4, 4, 6], [3, 8, 2, 3], [3, 8, 2, 3].

The reference runs in float64 on exactly the stored F32 weights and inputs,
so a C++ run in F32 should agree to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: the module tree's names and shapes are
wan22_vae_tensor_shapes' for the tiny and the real configuration; the real
one has 704,688,668 parameters, which in F16 is the 1.41 GB of ComfyUI's
wan2.2_vae.safetensors; AvgDown3D (C -> 2C, factors 2, 2) makes channel
(c, a) the 2x2 average of channel c at frame 2t + a, zero frames padded in
front; DupUp3D (C -> C, factors 2, 2) is nearest 2x upsampling with each
frame twice, the first dropped on the first chunk; patchify puts pixel
(2h + q, 2w + r) of channel c in channel 4c + 2r + q and unpatchify undoes it;
a causal convolution of one frame is a 2-D convolution with the last temporal
kernel slice; the clip decode and encode are causal (a later latent frame or
chunk leaves the earlier frames as they were, and their first frame is the
one-frame result); the one-frame batches equal one batched run; the
normalisation is (mu - mean) / std. Everything is seeded and built twice:
the second build must equal the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import wan22_vae as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 2200
TINY = dict(ref.WAN22_VAE, dim=4, dec_dim=6, dim_mult=[1, 1, 2, 2])
BATCH, IMAGE_HW = 2, (32, 48)
CLIP_LATENT_FRAMES = 3  # -> 1 + 4 * 2 = 9 frames
Z = ref.WAN22_VAE["z_dim"]
# ComfyUI's wan2.2_vae.safetensors: 1.41 GB in F16 (rounded to 10 MB).
COMFY_WAN22_VAE_F16_BYTES = 1.41e9
REAL_PARAMS = 704688668


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def init_value(name, shape, gen):
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gamma":  # RMS_norm scales, [C, 1, 1, 1] or [C, 1, 1]
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if len(shape) >= 2:  # convolutions, 2-D and 3-D
        return torch.randn(shape, generator=gen) * math.prod(shape[1:]) ** -0.5
    return 0.05 * torch.randn(shape, generator=gen)  # biases


def randomize(model, seed):
    """Seeded F32 weights in state_dict order into `model` (float64); returns them as stored."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for k, v in model.state_dict().items():
        stored[k] = init_value(k, tuple(v.shape), gen).to(torch.float32).contiguous()
    model.load_state_dict({k: v.double() for k, v in stored.items()}, strict=True)
    return stored


def rand64(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


# ------------------------------------------------------------ self-checks


def check_names():
    model = ref.WanVAE22(**TINY)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = ref.wan22_vae_tensor_shapes(TINY)
    assert got == want, "names/shapes differ from wan22_vae_tensor_shapes: %s" % (set(got) ^ set(want))
    real = ref.WanVAE22(**ref.WAN22_VAE)
    got = {k: tuple(v.shape) for k, v in real.state_dict().items()}
    del real
    assert got == ref.wan22_vae_tensor_shapes(ref.WAN22_VAE), "the real configuration's names differ"
    n = sum(math.prod(s) for s in got.values())
    assert n == REAL_PARAMS, n
    # F16 tensors plus a JSON header of some tens of KB, against "1.41 GB" rounded to 10 MB.
    assert abs(2 * n - COMFY_WAN22_VAE_F16_BYTES) < 5e6, (n, 2 * n)
    # Published facts of the real checkpoint's layout.
    assert got["encoder.conv1.weight"] == (160, 12, 3, 3, 3)
    assert got["encoder.head.2.weight"] == (96, 640, 3, 3, 3) and got["conv1.weight"] == (96, 96, 1, 1, 1)
    assert got["conv2.weight"] == (48, 48, 1, 1, 1) and got["decoder.conv1.weight"] == (1024, 48, 3, 3, 3)
    assert got["decoder.upsamples.0.upsamples.3.time_conv.weight"] == (2048, 1024, 3, 1, 1)
    assert got["decoder.upsamples.2.upsamples.3.resample.1.weight"] == (512, 512, 3, 3)
    assert "decoder.upsamples.2.upsamples.3.time_conv.weight" not in got
    assert "encoder.downsamples.0.downsamples.2.time_conv.weight" not in got
    assert got["encoder.downsamples.1.downsamples.2.time_conv.weight"] == (320, 320, 3, 1, 1)
    assert got["decoder.head.2.weight"] == (12, 256, 3, 3, 3)
    mmf.log("real Wan 2.2 VAE from the name list: %d parameters, %d tensors, %.3f GB F16"
            % (n, len(got), 2 * n / 1e9))


def check_causal_conv():
    """A CausalConv3d on one frame with no cache is a 2-D convolution with its last temporal slice."""
    gen = torch.Generator().manual_seed(1)
    conv = ref.CausalConv3d(3, 5, 3, padding=1).double()
    with torch.no_grad():
        conv.weight.copy_(rand64(gen, *conv.weight.shape))
        x = rand64(gen, 2, 3, 1, 6, 7)
        want = F.conv2d(x[:, :, 0], conv.weight[:, :, 2], conv.bias, padding=1)
        assert torch.allclose(conv(x)[:, :, 0], want, atol=1e-12)
        past = rand64(gen, 2, 3, 2, 6, 7)
        want = F.conv3d(torch.cat([past, x], 2), conv.weight, conv.bias, padding=(0, 1, 1))
        assert torch.allclose(conv(x, past), want, atol=1e-12)


def check_resamplers():
    gen = torch.Generator().manual_seed(2)
    C, T, H, W = 3, 2, 4, 5
    # AvgDown3D(C -> 2C, factor_t 2, factor_s 2): channel 2c + a is the 2x2 mean of channel c at 2t + a.
    x = rand64(gen, 1, C, 2 * T, 2 * H, 2 * W)
    y = ref.AvgDown3D(C, 2 * C, 2, 2)(x)
    assert y.shape == (1, 2 * C, T, H, W)
    for c in range(C):
        for a in range(2):
            want = F.avg_pool2d(x[0, c, a::2], 2)
            assert torch.allclose(y[0, 2 * c + a], want, atol=1e-12)
    # An odd frame count: one zero frame in FRONT (so (c, 0) of the first output frame is 0).
    y1 = ref.AvgDown3D(C, 2 * C, 2, 2)(x[:, :, :1])
    assert torch.equal(y1[0, 0::2, 0], torch.zeros(C, H, W, dtype=x.dtype))
    assert torch.allclose(y1[0, 1::2, 0], F.avg_pool2d(x[0, :, 0], 2), atol=1e-12)
    # Equal widths, factor_s 2 only (encoder level 0): a 2x2 average pool of each channel.
    y2 = ref.AvgDown3D(C, C, 1, 2)(x)
    assert torch.allclose(y2, F.avg_pool3d(x, (1, 2, 2)), atol=1e-12)
    # DupUp3D(C -> C, factor_t 2, factor_s 2): nearest 2x in space, each frame twice.
    z = rand64(gen, 1, C, T, H, W)
    up = ref.DupUp3D(C, C, 2, 2)
    want = z.repeat_interleave(2, 2).repeat_interleave(2, 3).repeat_interleave(2, 4)
    assert torch.equal(up(z), want)
    assert torch.equal(up(z, first_chunk=True), want[:, :, 1:])
    # DupUp3D(2C -> C, factor_s 2) (decoder level 2 of the real model): output channel o at
    # offset (p, q) is input channel (4 o + 2 p + q) // 2.
    z2 = rand64(gen, 1, 2 * C, T, H, W)
    y3 = ref.DupUp3D(2 * C, C, 1, 2)(z2)
    for o in range(C):
        for p in range(2):
            for q in range(2):
                assert torch.equal(y3[0, o, :, p::2, q::2], z2[0, (4 * o + 2 * p + q) // 2])
    # patchify: channel 4c + 2r + q holds pixel (2h + q, 2w + r) of channel c (column offset first).
    v = rand64(gen, 2, 3, T, 2 * H, 2 * W)
    pv = ref.patchify(v, 2)
    for c in range(3):
        for r in range(2):
            for q in range(2):
                assert torch.equal(pv[:, 4 * c + 2 * r + q], v[:, c, :, q::2, r::2])
    assert torch.equal(ref.unpatchify(pv, 2), v)
    assert torch.equal(ref.patchify(v[:, :, 0], 2), pv[:, :, 0])
    assert torch.equal(ref.unpatchify(pv[:, :, 0], 2), v[:, :, 0])


def check_model(model, io):
    with torch.no_grad():
        # Causality: the first latent frame alone decodes to the clip's first frame; a change
        # to the last latent frame leaves the first 1 + 4 frames as they were.
        z = io["clip.z"].double().permute(1, 0, 2, 3)[None]
        clip = ref.decode_normalized(model, z)
        first = ref.decode_normalized(model, z[:, :, :1])
        assert torch.allclose(clip[:, :, :1], first, atol=1e-12)
        two = ref.decode_normalized(model, z[:, :, :2])
        assert torch.allclose(clip[:, :, :5], two, atol=1e-12)
        bumped = z.clone()
        bumped[:, :, -1] += 1.0
        other = ref.decode_normalized(model, bumped)
        assert torch.allclose(clip[:, :, :5], other[:, :, :5], atol=1e-12)
        assert not torch.allclose(clip[:, :, 5:], other[:, :, 5:], atol=1e-6)
        # The same for the encoder: frame 0 alone, then the first chunk of 4.
        video = io["clip.video"].double().permute(1, 0, 2, 3)[None]
        mu = ref.encode_normalized(model, video)
        mu0 = ref.encode_normalized(model, video[:, :, :1])
        assert torch.allclose(mu[:, :, :1], mu0, atol=1e-12)
        mu1 = ref.encode_normalized(model, video[:, :, :5])
        assert torch.allclose(mu[:, :, :2], mu1, atol=1e-12)
        bumped = video.clone()
        bumped[:, :, 5:] += 0.5
        mu2 = ref.encode_normalized(model, bumped)
        assert torch.allclose(mu[:, :, :2], mu2[:, :, :2], atol=1e-12)
        assert not torch.allclose(mu[:, :, 2:], mu2[:, :, 2:], atol=1e-6)
        # The normalisation: (mu - mean) / std of the raw mean (scale [0, 1]: forward's default).
        raw = model.encode(video, [0, 1])
        mean = torch.tensor(ref.LATENTS_MEAN, dtype=torch.float64).view(1, -1, 1, 1, 1)
        std = torch.tensor(ref.LATENTS_STD, dtype=torch.float64).view(1, -1, 1, 1, 1)
        assert torch.allclose(mu, (raw - mean) / std, atol=1e-12)
        # The one-frame batches item by item equal one batched run of the original.
        batched = ref.encode_normalized(model, io["image"].double()[:, :, None])[:, :, 0]
        assert torch.allclose(batched, io["encoded"].double(), atol=1e-6)
        batched = ref.decode_normalized(model, io["z"].double()[:, :, None])[:, :, 0]
        assert torch.allclose(batched, io["decoded"].double(), atol=1e-6)
    h, w = IMAGE_HW
    assert clip.shape == (1, 3, 9, h, w) and mu.shape == (1, Z, 3, h // 16, w // 16)


# ------------------------------------------------------------ fixtures


def block_hooks(model, blocks, which):
    """Forward hooks appending each chunk's output of the named modules to blocks[name]."""
    handles = []

    def keep(name):
        def hook(module, inputs, output):
            blocks.setdefault(name, []).append(output)

        return hook

    if which == "decoder":
        mods = [("decoder.conv1", model.decoder.conv1)]
        mods += [("decoder.upsamples.%d" % i, m) for i, m in enumerate(model.decoder.upsamples)]
    else:
        mods = [("encoder.downsamples.%d" % i, m) for i, m in enumerate(model.encoder.downsamples)]
    for name, m in mods:
        handles.append(m.register_forward_hook(keep(name)))
    return handles


def clip_tensor(x):
    """[1, C, T, H, W] -> [T, C, H, W] (F32)"""
    assert x.shape[0] == 1
    return f32(x[0].permute(1, 0, 2, 3))


def build(seed):
    model = ref.WanVAE22(**TINY).double().eval()
    ckpt = randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    h, w = IMAGE_HW
    io = {
        "image": torch.rand(BATCH, 3, h, w, generator=gen) * 2 - 1,
        "z": torch.randn(BATCH, Z, h // 16, w // 16, generator=gen),
        "clip.z": torch.randn(CLIP_LATENT_FRAMES, Z, h // 16, w // 16, generator=gen),
        "clip.video": torch.rand(1 + 4 * (CLIP_LATENT_FRAMES - 1), 3, h, w, generator=gen) * 2 - 1,
    }
    with torch.no_grad():
        io["encoded"] = f32(ref.encode_one_frame_batch(model, io["image"].double()))
        io["decoded"] = f32(ref.decode_one_frame_batch(model, io["z"].double()))
        for part, key, fn, out in (("decoder", "clip.z", ref.decode_normalized, "clip.decoded"),
                                   ("encoder", "clip.video", ref.encode_normalized, "clip.encoded")):
            blocks = {}
            handles = block_hooks(model, blocks, part)
            io[out] = clip_tensor(fn(model, io[key].double().permute(1, 0, 2, 3)[None]))
            for handle in handles:
                handle.remove()
            for k, v in blocks.items():
                io["block." + k] = clip_tensor(torch.cat(v, 2))
    check_model(model, io)
    return ckpt, {k: f32(v) for k, v in io.items()}


def same(a, b):
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    check_names()
    check_causal_conv()
    check_resamplers()
    ckpt, io = build(SEED)
    ckpt2, io2 = build(SEED)
    assert same(ckpt, ckpt2) and same(io, io2), "a second build differs"
    mmf.log("tiny: %d tensors, %d parameters" % (len(ckpt), sum(v.numel() for v in ckpt.values())))
    mmf.save_fixture_pair(args.out, "wan22_vae_tiny", ckpt, io, "training/make_wan22_vae_fixtures.py",
                          "NCHW; clips [T, C, H, W]", None, max_bytes=1 << 20)


if __name__ == "__main__":
    main()
