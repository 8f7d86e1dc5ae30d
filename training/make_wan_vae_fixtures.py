#!/usr/bin/python3
"""Writes a tiny random-weight Wan 2.1 VAE with the original tensor names and
its golden inputs and outputs, computed with training/reference/wan_vae.py
(transcribed from wan/modules/vae.py of Wan-Video/Wan2.1).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_wan_vae_fixtures.py [--out DIR]

Writes into tests/golden/models/ (all F32; shapes in PyTorch order):

  wan_vae_tiny.safetensors     WanVAE_'s state dict as Wan2.1_VAE.pth and
                               wan_2.1_vae.safetensors / qwen_image_vae.safetensors
                               name it (no prefix; CausalConv3d weights 5-D
                               [out, in, kt, kh, kw], RMS_norm gammas [C, 1, 1, 1]
                               and [C, 1, 1] in the attention blocks): dim 4,
                               dim_mult (1, 2, 3, 4) (real: 96, (1, 2, 4, 4)),
                               num_res_blocks 2, temperal_downsample
                               (False, True, True) and z_dim 16 as the real
                               model, no attention outside the middle blocks.
  wan_vae_tiny_io.safetensors  One frame, a batch of 2: image [2, 3, 16, 24] in
                               [-1, 1]; encoded [2, 16, 2, 3] (the normalised
                               mean (mu - mean) / std), encoded.log_var
                               [2, 16, 2, 3] (the log variance less log std^2);
                               z [2, 16, 2, 3] (a given normalised latent),
                               decoded [2, 3, 16, 24] (not clamped).
                               block.encoder.downsamples.{2,5,8,10},
                               block.encoder.middle, block.decoder.middle,
                               block.decoder.upsamples.{3,7,11,14}: the outputs
                               of those modules ([2, C, h, w]) in the two runs.
                               A clip, its frames along the first axis (the
                               original's [1, C, T, H, W] as [T, C, H, W]):
                               clip.z [3, 16, 2, 3] -> clip.decoded
                               [9, 3, 16, 24] (WanVAE_.decode: one latent frame
                               per chunk through the causal cache, 1 + 4 + 4
                               frames); clip.video [9, 3, 16, 24] ->
                               clip.encoded [3, 16, 2, 3] (WanVAE_.encode:
                               chunks of 1, 4, 4 frames; normalised mean).

The reference runs in float64 on exactly the stored F32 weights and inputs,
so a C++ run in F32 should agree to ~1e-5 relative.

Before writing, the script checks the reference against facts that do not
depend on it: the module tree's names and shapes are wan_vae_tensor_shapes'
for the tiny and the real configuration, and the real one in BF16 is the
size of the published qwen_image_vae.safetensors (253,806,246 bytes, less its
header); a causal convolution of one frame is a 2-D convolution with the last
temporal kernel slice; the clip decode and encode are causal (a later latent
frame or chunk leaves the earlier frames as they were, and their first frame
is the single-frame result); the normalisation is (mu - mean) / std. Everything
is seeded and built twice: the second build must equal the first bit for bit.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference import wan_vae as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")

SEED = 2100
TINY = dict(ref.WAN21, dim=4, dim_mult=[1, 2, 3, 4])
BATCH, IMAGE_HW = 2, (16, 24)
CLIP_LATENT_FRAMES = 3  # -> 1 + 4 * 2 = 9 frames
QWEN_IMAGE_VAE_BYTES = 253806246  # qwen_image_vae.safetensors, BF16


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


# ------------------------------------------------------------ self-checks


def check_names():
    model = ref.WanVAE_(**TINY)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = ref.wan_vae_tensor_shapes(**TINY)
    assert got == want, "names/shapes differ from wan_vae_tensor_shapes: %s" % (set(got) ^ set(want))
    real = ref.WanVAE_(**ref.WAN21)
    got = {k: tuple(v.shape) for k, v in real.state_dict().items()}
    assert got == ref.wan_vae_tensor_shapes(**ref.WAN21), "the real configuration's names differ"
    n = sum(math.prod(s) for s in got.values())
    # The file is the BF16 tensors and a JSON header of a few tens of KB.
    assert 0 < QWEN_IMAGE_VAE_BYTES - 2 * n < 64 << 10, (n, QWEN_IMAGE_VAE_BYTES)
    assert got["encoder.conv1.weight"] == (96, 3, 3, 3, 3) and got["conv1.weight"] == (32, 32, 1, 1, 1)
    # The decoder's upsamplers halve the channels; the next level's first block takes the half.
    assert got["decoder.upsamples.3.time_conv.weight"] == (768, 384, 3, 1, 1)
    assert got["decoder.upsamples.3.resample.1.weight"] == (192, 384, 3, 3)
    assert got["decoder.upsamples.4.residual.2.weight"] == (384, 192, 3, 3, 3)
    mmf.log("real Wan 2.1 VAE from the name list: %.2fM parameters, %d tensors, %.1f MB BF16 "
            "(qwen_image_vae.safetensors: %d bytes)" % (n / 1e6, len(got), 2 * n / 1e6, QWEN_IMAGE_VAE_BYTES))


def check_causal_conv():
    """A CausalConv3d on one frame with no cache is a 2-D convolution with its last temporal slice."""
    gen = torch.Generator().manual_seed(1)
    conv = ref.CausalConv3d(3, 5, 3, padding=1).double()
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, dtype=torch.float64))
        x = torch.randn(2, 3, 1, 6, 7, generator=gen, dtype=torch.float64)
        want = F.conv2d(x[:, :, 0], conv.weight[:, :, 2], conv.bias, padding=1)
        assert torch.allclose(conv(x)[:, :, 0], want, atol=1e-12)
        # With two frames of history, it is the plain 3-D convolution over them.
        past = torch.randn(2, 3, 2, 6, 7, generator=gen, dtype=torch.float64)
        want = F.conv3d(torch.cat([past, x], 2), conv.weight, conv.bias, padding=(0, 1, 1))
        assert torch.allclose(conv(x, past), want, atol=1e-12)


def check_model(model, io):
    with torch.no_grad():
        # Causality: the first latent frame alone decodes to the clip's first frame; a change
        # to the last latent frame leaves the first 1 + 4 frames as they were.
        z = io["clip.z"].double().permute(1, 0, 2, 3)[None]
        clip = ref.decode_normalized(model, z)
        first = ref.decode_normalized(model, z[:, :, :1])
        assert torch.allclose(clip[:, :, :1], first, atol=1e-12)
        bumped = z.clone()
        bumped[:, :, -1] += 1.0
        other = ref.decode_normalized(model, bumped)
        assert torch.allclose(clip[:, :, :5], other[:, :, :5], atol=1e-12)
        assert not torch.allclose(clip[:, :, 5:], other[:, :, 5:], atol=1e-6)
        # The same for the encoder: frame 0 alone, then the first chunk of 4.
        video = io["clip.video"].double().permute(1, 0, 2, 3)[None]
        mu, _ = ref.encode_normalized(model, video)
        mu0, _ = ref.encode_normalized(model, video[:, :, :1])
        assert torch.allclose(mu[:, :, :1], mu0, atol=1e-12)
        mu1, _ = ref.encode_normalized(model, video[:, :, :5])
        assert torch.allclose(mu[:, :, :2], mu1, atol=1e-12)
        # The normalisation: (mu - mean) / std of the raw mean.
        raw, log_var = model.encode(video)
        mean = torch.tensor(ref.LATENTS_MEAN, dtype=torch.float64).view(1, -1, 1, 1, 1)
        std = torch.tensor(ref.LATENTS_STD, dtype=torch.float64).view(1, -1, 1, 1, 1)
        assert torch.allclose(mu, (raw - mean) / std, atol=1e-12)
    assert clip.shape == (1, 3, 9) + IMAGE_HW and mu.shape == (1, 16, 3, IMAGE_HW[0] // 8, IMAGE_HW[1] // 8)


# ------------------------------------------------------------ fixtures


def block_hooks(model, blocks):
    """Hooks keeping the output of each level's last module and of the middle blocks, under
    their module names (Encoder3d and Decoder3d run their Sequentials layer by layer, so the
    hooks sit on the layers)."""
    handles = []

    def keep(name):
        def hook(module, inputs, output):
            blocks[name] = output

        return hook

    for part, seq in (("encoder.downsamples", model.encoder.downsamples),
                      ("decoder.upsamples", model.decoder.upsamples)):
        for i, layer in enumerate(seq):
            if isinstance(layer, ref.Resample) or i == len(seq) - 1:
                handles.append(layer.register_forward_hook(keep("%s.%d" % (part, i))))
    handles.append(model.encoder.middle[2].register_forward_hook(keep("encoder.middle")))
    handles.append(model.decoder.middle[2].register_forward_hook(keep("decoder.middle")))
    return handles


def build(seed):
    model = ref.WanVAE_(**TINY).double().eval()
    ckpt = randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    h, w = IMAGE_HW
    io = {
        "image": torch.rand(BATCH, 3, h, w, generator=gen) * 2 - 1,
        "z": torch.randn(BATCH, 16, h // 8, w // 8, generator=gen),
        "clip.z": torch.randn(CLIP_LATENT_FRAMES, 16, h // 8, w // 8, generator=gen),
        "clip.video": torch.rand(1 + 4 * (CLIP_LATENT_FRAMES - 1), 3, h, w, generator=gen) * 2 - 1,
    }
    blocks = {}
    handles = block_hooks(model, blocks)
    with torch.no_grad():
        mu, log_var = ref.encode_normalized(model, io["image"].double()[:, :, None])
        io["encoded"], io["encoded.log_var"] = f32(mu[:, :, 0]), f32(log_var[:, :, 0])
        image = ref.decode_normalized(model, io["z"].double()[:, :, None])
        io["decoded"] = f32(image[:, :, 0])
    for k, v in blocks.items():
        assert v.shape[2] == 1, k
        io["block." + k] = f32(v[:, :, 0])
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        clip = ref.decode_normalized(model, io["clip.z"].double().permute(1, 0, 2, 3)[None])
        io["clip.decoded"] = f32(clip[0].permute(1, 0, 2, 3))
        mu, _ = ref.encode_normalized(model, io["clip.video"].double().permute(1, 0, 2, 3)[None])
        io["clip.encoded"] = f32(mu[0].permute(1, 0, 2, 3))
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
    ckpt, io = build(SEED)
    ckpt2, io2 = build(SEED)
    assert same(ckpt, ckpt2) and same(io, io2), "a second build differs"
    mmf.save_fixture_pair(args.out, "wan_vae_tiny", ckpt, io, "training/make_wan_vae_fixtures.py",
                          "NCHW; clips [T, C, H, W]", None, max_bytes=(3 << 20) // 2)


if __name__ == "__main__":
    main()
