"""PyTorch reference for Wan 2.2's 48-channel causal 3D VAE (Alibaba's Wan
team), the autoencoder of Wan2.2-TI2V-5B (``Wan2.2_VAE.pth``, ComfyUI's
``wan2.2_vae.safetensors``): 16x spatial and 4x temporal compression to 48
latent channels. Transcribed module by module from the original code,
``wan/modules/vae2_2.py`` of github.com/Wan-Video/Wan2.2 (CausalConv3d,
RMS_norm, Upsample, Resample, ResidualBlock, AttentionBlock, patchify,
unpatchify, AvgDown3D, DupUp3D, Down_ResidualBlock, Up_ResidualBlock,
Encoder3d, Decoder3d, count_conv3d, WanVAE_, and Wan2_2_VAE's configuration
and latent statistics). Modelled on ``wan_vae.py`` (Wan 2.1's VAE, from which
this one is derived).

Parameter names are the original module tree's, so
``WanVAE22(**WAN22_VAE).state_dict()`` has the names and shapes of
``Wan2.2_VAE.pth`` / ``wan2.2_vae.safetensors``: ``encoder.conv1``,
``encoder.downsamples.N.downsamples.M.{residual.{0,3}.gamma,
residual.{2,6}.*, shortcut.*, resample.1.*, time_conv.*}``,
``encoder.middle.{0,1,2}.*``, ``encoder.head.{0,2}.*``, ``conv1``, ``conv2``,
``decoder.conv1``, ``decoder.middle.*``,
``decoder.upsamples.N.upsamples.M.*``, ``decoder.head.{0,2}.*``.
``wan22_vae_tensor_shapes(cfg)`` lists them from the configuration alone.

What Wan 2.2 changes against Wan 2.1 (wan_vae.py):

- ``patchify`` / ``unpatchify`` with patch 2 around the whole network: the
  encoder's ``conv1`` takes 12 channels, the decoder's head gives 12. The
  channel order is einops' ``(c r q)``: channel c * 4 + r * 2 + q holds pixel
  (2 h + q, 2 w + r), i.e. the COLUMN offset r before the row offset q.
- The encoder's levels are ``Down_ResidualBlock``s (num_res_blocks
  ResidualBlocks, then a Resample on all but the last level) with a
  parameter-free shortcut ``avg_shortcut = AvgDown3D`` on EVERY level (the
  last level's has factors 1, 1 and equal widths: the identity). AvgDown3D
  pads the time axis at the FRONT with zero frames to a multiple of
  factor_t, folds the (t, h, w) offsets into channels (in the order
  c, t-offset, h-offset, w-offset) and averages groups of
  in * factor / out consecutive channels.
- The decoder's levels are ``Up_ResidualBlock``s (num_res_blocks + 1
  ResidualBlocks, then a Resample on all but the last level) with a
  ``DupUp3D`` shortcut on the levels that upsample (none on the last):
  repeat_interleave of the channels, unfolded into (t, h, w) offsets; with
  ``first_chunk`` it drops the first factor_t - 1 frames (the first latent
  frame gives one frame, as the main path's "Rep" upsample3d does).
  ``first_chunk`` goes only to the shortcut: the main path's causal state
  comes from the feature cache, as in 2.1.
- The decoder has its own width ``dec_dim`` (256 against the encoder's 160).
- Resample's upsample convolutions keep the width (``Conv2d(dim, dim)``; 2.1
  halves it), so the next level's first block takes the full width.
- ``WanVAE_.encode`` returns mu only (normalised by ``scale``); the log
  variance is computed and dropped.

What differs from the original, none of it in the numbers:

- torch 1.13 has neither ``F.scaled_dot_product_attention`` nor einops here:
  ``scaled_dot_product_attention`` below is torch 2's without mask or dropout,
  and each ``rearrange`` is the permute and reshape it stands for.
- ``Upsample`` casts to float32 around the interpolation (the original's fix
  for bfloat16); a float64 input is left float64 here, so the reference runs
  in float64 (nearest-neighbour interpolation only copies values).
- No tiling, no autocast: the copy of vae2_2.py read for this transcription
  carries spatial tiling helpers (``_tile_spans``, ``_feather_1d``,
  ``_decode_tiled``) that are not Wan's and are left out, and
  ``Wan2_2_VAE._autocast``'s amp context is left out (Wan2_2_VAE runs in
  float32 by default; here everything runs in whatever dtype the module and
  input have: float64 for the goldens). Encode and decode concatenate the
  per-chunk outputs as the original does (that copy collects them in a
  list first; the result is the same).
- Resample's unused ``init_weight``/``init_weight2``, ``reparameterize``,
  ``sample`` and the meta-device loading of ``_video_vae`` are left out.

The causal cache, as the original runs it: encode patchifies the clip of
1 + 4k frames and runs chunks of 1, 4, 4, ... frames through the encoder;
decode runs one latent frame per chunk, ``first_chunk=(i == 0)``, and
unpatchifies. Each CausalConv3d with a temporal kernel of 3 keeps the last
CACHE_T = 2 frames of its input (zeros before the clip); ``downsample3d``
skips ``time_conv`` on the first chunk (its one frame passes alone) and then
prepends the kept last frame to a stride-2 ``time_conv``; ``upsample3d``
stores "Rep" and skips ``time_conv`` on the first chunk (one frame out), then
reads "Rep" as zero history and makes two frames (channels [0, C), then
[C, 2C)) of each.

The latent the DiT sees is normalised per channel by Wan2_2_VAE's
statistics (LATENTS_MEAN, LATENTS_STD, 48 each: constants of the original
code, not in the weights): ``scale = [mean, 1 / std]``, encode gives
``(mu - mean) / std``, decode takes ``z * std + mean`` (written
``z / (1 / std) + mean``). Wan2_2_VAE.decode then clamps to [-1, 1];
``decode_normalized`` here does not.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Wan 2.2's vae2_2.py repeats these of Wan 2.1's vae.py unchanged.
from reference.wan_vae import (AttentionBlock, CausalConv3d, ResidualBlock, RMS_norm, Upsample,  # noqa: F401
                               batch_to_frames, count_conv3d, frames_to_batch, scaled_dot_product_attention)

CACHE_T = 2

# Wan2_2_VAE.__init__'s mean and std (wan/modules/vae2_2.py), 48 latent channels.
LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]
LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]
assert len(LATENTS_MEAN) == len(LATENTS_STD) == 48

# Wan2_2_VAE's configuration (z_dim 48, c_dim 160, dim_mult, temperal_downsample)
# over _video_vae's defaults and WanVAE_'s dec_dim default of 256.
WAN22_VAE = dict(dim=160, dec_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                 attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0)

PATCH = 2  # patchify / unpatchify's patch_size in encode and decode


class Resample(nn.Module):

    def __init__(self, dim, mode):
        assert mode in (
            "none",
            "upsample2d",
            "upsample3d",
            "downsample2d",
            "downsample3d",
        )
        super().__init__()
        self.dim = dim
        self.mode = mode

        # layers
        if mode == "upsample2d":
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                nn.Conv2d(dim, dim, 3, padding=1),
            )
        elif mode == "upsample3d":
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                nn.Conv2d(dim, dim, 3, padding=1),
                # nn.Conv2d(dim, dim//2, 3, padding=1)
            )
            self.time_conv = CausalConv3d(
                dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample2d":
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        elif mode == "downsample3d":
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
            self.time_conv = CausalConv3d(
                dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))
        else:
            self.resample = nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        b, c, t, h, w = x.size()
        if self.mode == "upsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = "Rep"
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -CACHE_T:, :, :].clone()
                    if (cache_x.shape[2] < 2 and feat_cache[idx] is not None and
                            feat_cache[idx] != "Rep"):
                        # cache last frame of last two chunk
                        cache_x = torch.cat(
                            [
                                feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                    cache_x.device),
                                cache_x,
                            ],
                            dim=2,
                        )
                    if (cache_x.shape[2] < 2 and feat_cache[idx] is not None and
                            feat_cache[idx] == "Rep"):
                        cache_x = torch.cat(
                            [
                                torch.zeros_like(cache_x).to(cache_x.device),
                                cache_x
                            ],
                            dim=2,
                        )
                    if feat_cache[idx] == "Rep":
                        x = self.time_conv(x)
                    else:
                        x = self.time_conv(x, feat_cache[idx])
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
                    x = x.reshape(b, 2, c, t, h, w)
                    x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]),
                                    3)
                    x = x.reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = frames_to_batch(x)
        x = self.resample(x)
        x = batch_to_frames(x, t)

        if self.mode == "downsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = x.clone()
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -1:, :, :].clone()
                    x = self.time_conv(
                        torch.cat([feat_cache[idx][:, :, -1:, :, :], x], 2))
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
        return x


def patchify(x, patch_size):
    """rearrange(x, 'b c (h q) (w r) -> b (c r q) h w') (4-D) or
    rearrange(x, 'b c f (h q) (w r) -> b (c r q) f h w') (5-D), q = r = patch_size."""
    if patch_size == 1:
        return x
    p = patch_size
    if x.dim() == 4:
        b, c, hq, wr = x.shape
        x = x.reshape(b, c, hq // p, p, wr // p, p)  # b c h q w r
        x = x.permute(0, 1, 5, 3, 2, 4).reshape(b, c * p * p, hq // p, wr // p)
    elif x.dim() == 5:
        b, c, f, hq, wr = x.shape
        x = x.reshape(b, c, f, hq // p, p, wr // p, p)  # b c f h q w r
        x = x.permute(0, 1, 6, 4, 2, 3, 5).reshape(b, c * p * p, f, hq // p, wr // p)
    else:
        raise ValueError(f"Invalid input shape: {x.shape}")

    return x


def unpatchify(x, patch_size):
    """rearrange(x, 'b (c r q) h w -> b c (h q) (w r)') (4-D) or
    rearrange(x, 'b (c r q) f h w -> b c f (h q) (w r)') (5-D), q = r = patch_size."""
    if patch_size == 1:
        return x
    p = patch_size
    if x.dim() == 4:
        b, crq, h, w = x.shape
        x = x.reshape(b, crq // (p * p), p, p, h, w)  # b c r q h w
        x = x.permute(0, 1, 4, 3, 5, 2).reshape(b, crq // (p * p), h * p, w * p)
    elif x.dim() == 5:
        b, crq, f, h, w = x.shape
        x = x.reshape(b, crq // (p * p), p, p, f, h, w)  # b c r q f h w
        x = x.permute(0, 1, 4, 5, 3, 6, 2).reshape(b, crq // (p * p), f, h * p, w * p)
    return x


class AvgDown3D(nn.Module):

    def __init__(
        self,
        in_channels,
        out_channels,
        factor_t,
        factor_s=1,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert in_channels * self.factor % out_channels == 0
        self.group_size = in_channels * self.factor // out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad_t = (self.factor_t - x.shape[2] % self.factor_t) % self.factor_t
        pad = (0, 0, 0, 0, pad_t, 0)
        x = F.pad(x, pad)
        B, C, T, H, W = x.shape
        x = x.view(
            B,
            C,
            T // self.factor_t,
            self.factor_t,
            H // self.factor_s,
            self.factor_s,
            W // self.factor_s,
            self.factor_s,
        )
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
        x = x.view(
            B,
            C * self.factor,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.view(
            B,
            self.out_channels,
            self.group_size,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.mean(dim=2)
        return x


class DupUp3D(nn.Module):

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        factor_t,
        factor_s=1,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels

        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert out_channels * self.factor % in_channels == 0
        self.repeats = out_channels * self.factor // in_channels

    def forward(self, x: torch.Tensor, first_chunk=False) -> torch.Tensor:
        x = x.repeat_interleave(self.repeats, dim=1)
        x = x.view(
            x.size(0),
            self.out_channels,
            self.factor_t,
            self.factor_s,
            self.factor_s,
            x.size(2),
            x.size(3),
            x.size(4),
        )
        x = x.permute(0, 1, 5, 2, 6, 3, 7, 4).contiguous()
        x = x.view(
            x.size(0),
            self.out_channels,
            x.size(2) * self.factor_t,
            x.size(4) * self.factor_s,
            x.size(6) * self.factor_s,
        )
        if first_chunk:
            x = x[:, :, self.factor_t - 1:, :, :]
        return x


class Down_ResidualBlock(nn.Module):

    def __init__(self,
                 in_dim,
                 out_dim,
                 dropout,
                 mult,
                 temperal_downsample=False,
                 down_flag=False):
        super().__init__()

        # Shortcut path with downsample
        self.avg_shortcut = AvgDown3D(
            in_dim,
            out_dim,
            factor_t=2 if temperal_downsample else 1,
            factor_s=2 if down_flag else 1,
        )

        # Main path with residual blocks and downsample
        downsamples = []
        for _ in range(mult):
            downsamples.append(ResidualBlock(in_dim, out_dim, dropout))
            in_dim = out_dim

        # Add the final downsample block
        if down_flag:
            mode = "downsample3d" if temperal_downsample else "downsample2d"
            downsamples.append(Resample(out_dim, mode=mode))

        self.downsamples = nn.Sequential(*downsamples)

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        x_copy = x.clone()
        for module in self.downsamples:
            x = module(x, feat_cache, feat_idx)

        return x + self.avg_shortcut(x_copy)


class Up_ResidualBlock(nn.Module):

    def __init__(self,
                 in_dim,
                 out_dim,
                 dropout,
                 mult,
                 temperal_upsample=False,
                 up_flag=False):
        super().__init__()
        # Shortcut path with upsample
        if up_flag:
            self.avg_shortcut = DupUp3D(
                in_dim,
                out_dim,
                factor_t=2 if temperal_upsample else 1,
                factor_s=2 if up_flag else 1,
            )
        else:
            self.avg_shortcut = None

        # Main path with residual blocks and upsample
        upsamples = []
        for _ in range(mult):
            upsamples.append(ResidualBlock(in_dim, out_dim, dropout))
            in_dim = out_dim

        # Add the final upsample block
        if up_flag:
            mode = "upsample3d" if temperal_upsample else "upsample2d"
            upsamples.append(Resample(out_dim, mode=mode))

        self.upsamples = nn.Sequential(*upsamples)

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        x_main = x.clone()
        for module in self.upsamples:
            x_main = module(x_main, feat_cache, feat_idx)
        if self.avg_shortcut is not None:
            x_shortcut = self.avg_shortcut(x, first_chunk)
            return x_main + x_shortcut
        else:
            return x_main


class Encoder3d(nn.Module):

    def __init__(
        self,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[True, True, False],
        dropout=0.0,
    ):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample

        # dimensions
        dims = [dim * u for u in [1] + dim_mult]
        scale = 1.0

        # init block
        self.conv1 = CausalConv3d(12, dims[0], 3, padding=1)

        # downsample blocks
        downsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            t_down_flag = (
                temperal_downsample[i]
                if i < len(temperal_downsample) else False)
            downsamples.append(
                Down_ResidualBlock(
                    in_dim=in_dim,
                    out_dim=out_dim,
                    dropout=dropout,
                    mult=num_res_blocks,
                    temperal_downsample=t_down_flag,
                    down_flag=i != len(dim_mult) - 1,
                ))
            scale /= 2.0
        self.downsamples = nn.Sequential(*downsamples)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(out_dim, out_dim, dropout),
            AttentionBlock(out_dim),
            ResidualBlock(out_dim, out_dim, dropout),
        )

        # # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            CausalConv3d(out_dim, z_dim, 3, padding=1),
        )

    def forward(self, x, feat_cache=None, feat_idx=[0]):

        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = torch.cat(
                    [
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device),
                        cache_x,
                    ],
                    dim=2,
                )
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        ## downsamples
        for layer in self.downsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## middle
        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    cache_x = torch.cat(
                        [
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device),
                            cache_x,
                        ],
                        dim=2,
                    )
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)

        return x


class Decoder3d(nn.Module):

    def __init__(
        self,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_upsample=[False, True, True],
        dropout=0.0,
    ):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_upsample = temperal_upsample

        # dimensions
        dims = [dim * u for u in [dim_mult[-1]] + dim_mult[::-1]]
        scale = 1.0 / 2**(len(dim_mult) - 2)
        # init block
        self.conv1 = CausalConv3d(z_dim, dims[0], 3, padding=1)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(dims[0], dims[0], dropout),
            AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], dropout),
        )

        # upsample blocks
        upsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            t_up_flag = temperal_upsample[i] if i < len(
                temperal_upsample) else False
            upsamples.append(
                Up_ResidualBlock(
                    in_dim=in_dim,
                    out_dim=out_dim,
                    dropout=dropout,
                    mult=num_res_blocks + 1,
                    temperal_upsample=t_up_flag,
                    up_flag=i != len(dim_mult) - 1,
                ))
        self.upsamples = nn.Sequential(*upsamples)

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            CausalConv3d(out_dim, 12, 3, padding=1),
        )

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = torch.cat(
                    [
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device),
                        cache_x,
                    ],
                    dim=2,
                )
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## upsamples
        for layer in self.upsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx, first_chunk)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    cache_x = torch.cat(
                        [
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device),
                            cache_x,
                        ],
                        dim=2,
                    )
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x


class WanVAE_(nn.Module):

    def __init__(
        self,
        dim=160,
        dec_dim=256,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[True, True, False],
        dropout=0.0,
    ):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample
        self.temperal_upsample = temperal_downsample[::-1]

        # modules
        self.encoder = Encoder3d(
            dim,
            z_dim * 2,
            dim_mult,
            num_res_blocks,
            attn_scales,
            self.temperal_downsample,
            dropout,
        )
        self.conv1 = CausalConv3d(z_dim * 2, z_dim * 2, 1)
        self.conv2 = CausalConv3d(z_dim, z_dim, 1)
        self.decoder = Decoder3d(
            dec_dim,
            z_dim,
            dim_mult,
            num_res_blocks,
            attn_scales,
            self.temperal_upsample,
            dropout,
        )

    def forward(self, x, scale=[0, 1]):
        mu = self.encode(x, scale)
        x_recon = self.decode(mu, scale)
        return x_recon, mu

    def encode(self, x, scale):
        self.clear_cache()
        x = patchify(x, patch_size=2)
        t = x.shape[2]
        iter_ = 1 + (t - 1) // 4
        ## The clip in time chunks of 1, 4, 4, 4, ... frames
        for i in range(iter_):
            self._enc_conv_idx = [0]
            if i == 0:
                out = self.encoder(
                    x[:, :, :1, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx,
                )
            else:
                out_ = self.encoder(
                    x[:, :, 1 + 4 * (i - 1):1 + 4 * i, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx,
                )
                out = torch.cat([out, out_], 2)
        mu, log_var = self.conv1(out).chunk(2, dim=1)
        if isinstance(scale[0], torch.Tensor):
            mu = (mu - scale[0].view(1, self.z_dim, 1, 1, 1)) * scale[1].view(
                1, self.z_dim, 1, 1, 1)
        else:
            mu = (mu - scale[0]) * scale[1]
        self.clear_cache()
        return mu

    def decode(self, z, scale):
        self.clear_cache()
        if isinstance(scale[0], torch.Tensor):
            z = z / scale[1].view(1, self.z_dim, 1, 1, 1) + scale[0].view(
                1, self.z_dim, 1, 1, 1)
        else:
            z = z / scale[1] + scale[0]
        iter_ = z.shape[2]
        x = self.conv2(z)
        ## One latent frame per chunk; the first one with first_chunk=True
        for i in range(iter_):
            self._conv_idx = [0]
            if i == 0:
                out = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx,
                    first_chunk=True,
                )
            else:
                out_ = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx,
                )
                out = torch.cat([out, out_], 2)
        out = unpatchify(out, patch_size=2)
        self.clear_cache()
        return out

    def clear_cache(self):
        self._conv_num = count_conv3d(self.decoder)
        self._conv_idx = [0]
        self._feat_map = [None] * self._conv_num
        # cache encode
        self._enc_conv_num = count_conv3d(self.encoder)
        self._enc_conv_idx = [0]
        self._enc_feat_map = [None] * self._enc_conv_num


WanVAE22 = WanVAE_


# ------------------------------------------------------------ kiln's view


def latent_scale(dtype=torch.float64):
    """Wan2_2_VAE.scale: [mean, 1 / std], as the original builds it (in `dtype`)."""
    mean = torch.tensor(LATENTS_MEAN, dtype=dtype)
    std = torch.tensor(LATENTS_STD, dtype=dtype)
    return [mean, 1.0 / std]


def encode_normalized(vae, video):
    """video [B, 3, 1 + 4k, H, W] in [-1, 1] -> the normalised mean
    (mu - mean) / std [B, 48, 1 + k, H / 16, W / 16]: WanVAE_.encode with
    Wan2_2_VAE.scale (Wan2_2_VAE.encode runs each clip alone, B = 1)."""
    return vae.encode(video, latent_scale(video.dtype))


def decode_normalized(vae, z):
    """z [B, 48, T, h, w] (normalised) -> video [B, 3, 1 + 4 (T - 1), 16 h, 16 w]:
    WanVAE_.decode with Wan2_2_VAE.scale, not clamped (Wan2_2_VAE.decode
    clamps to [-1, 1] after this)."""
    return vae.decode(z, latent_scale(z.dtype))


def encode_one_frame_batch(vae, images):
    """images [B, 3, H, W] in [-1, 1], each its own one-frame clip ->
    normalised mu [B, 48, H / 16, W / 16] (the original run on each item alone)."""
    return torch.cat([encode_normalized(vae, images[i:i + 1, :, None])[:, :, 0]
                      for i in range(images.shape[0])])


def decode_one_frame_batch(vae, z):
    """z [B, 48, h, w] (normalised), each its own one-frame latent ->
    images [B, 3, 16 h, 16 w], not clamped (the original run on each item alone)."""
    return torch.cat([decode_normalized(vae, z[i:i + 1, :, None])[:, :, 0]
                      for i in range(z.shape[0])])


def wan22_vae_tensor_shapes(cfg):
    """Every parameter name of WanVAE_(**cfg) and its shape, from the
    configuration alone (the constructors' arithmetic written out).
    cfg: dim, dec_dim, z_dim, dim_mult, num_res_blocks, temperal_downsample
    (attn_scales must be empty: Wan 2.2 has attention only in the middle blocks)."""
    dim, dec_dim, z_dim = cfg["dim"], cfg.get("dec_dim", 256), cfg["z_dim"]
    dim_mult, nrb = list(cfg["dim_mult"]), cfg["num_res_blocks"]
    tdown = list(cfg["temperal_downsample"])
    assert not cfg.get("attn_scales"), "only attn_scales = [] is listed"
    shapes = {}

    def conv3d(name, cin, cout, k):
        kt, kh, kw = k if isinstance(k, tuple) else (k, k, k)
        shapes[name + ".weight"] = (cout, cin, kt, kh, kw)
        shapes[name + ".bias"] = (cout,)

    def conv2d(name, cin, cout, k):
        shapes[name + ".weight"] = (cout, cin, k, k)
        shapes[name + ".bias"] = (cout,)

    def residual(p, cin, cout):
        shapes[p + ".residual.0.gamma"] = (cin, 1, 1, 1)
        conv3d(p + ".residual.2", cin, cout, 3)
        shapes[p + ".residual.3.gamma"] = (cout, 1, 1, 1)
        conv3d(p + ".residual.6", cout, cout, 3)
        if cin != cout:
            conv3d(p + ".shortcut", cin, cout, 1)

    def attention(p, c):
        shapes[p + ".norm.gamma"] = (c, 1, 1)
        conv2d(p + ".to_qkv", c, 3 * c, 1)
        conv2d(p + ".proj", c, c, 1)

    # encoder: patchified input (3 * 2 * 2 = 12 channels)
    dims = [dim * u for u in [1] + dim_mult]
    conv3d("encoder.conv1", 3 * PATCH * PATCH, dims[0], 3)
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        p = "encoder.downsamples.%d.downsamples." % i
        for j in range(nrb):
            residual(p + str(j), cin, cout)
            cin = cout
        if i != len(dim_mult) - 1:  # AvgDown3D (avg_shortcut) has no parameters
            conv2d(p + "%d.resample.1" % nrb, cout, cout, 3)
            if i < len(tdown) and tdown[i]:
                conv3d(p + "%d.time_conv" % nrb, cout, cout, (3, 1, 1))
    top = dims[-1]
    residual("encoder.middle.0", top, top)
    attention("encoder.middle.1", top)
    residual("encoder.middle.2", top, top)
    shapes["encoder.head.0.gamma"] = (top, 1, 1, 1)
    conv3d("encoder.head.2", top, 2 * z_dim, 3)
    conv3d("conv1", 2 * z_dim, 2 * z_dim, 1)
    conv3d("conv2", z_dim, z_dim, 1)
    # decoder (width dec_dim)
    tup = tdown[::-1]
    dims = [dec_dim * u for u in [dim_mult[-1]] + dim_mult[::-1]]
    conv3d("decoder.conv1", z_dim, dims[0], 3)
    residual("decoder.middle.0", dims[0], dims[0])
    attention("decoder.middle.1", dims[0])
    residual("decoder.middle.2", dims[0], dims[0])
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        p = "decoder.upsamples.%d.upsamples." % i
        for j in range(nrb + 1):
            residual(p + str(j), cin, cout)
            cin = cout
        if i != len(dim_mult) - 1:  # DupUp3D (avg_shortcut) has no parameters
            conv2d(p + "%d.resample.1" % (nrb + 1), cout, cout, 3)
            if i < len(tup) and tup[i]:
                conv3d(p + "%d.time_conv" % (nrb + 1), cout, 2 * cout, (3, 1, 1))
    shapes["decoder.head.0.gamma"] = (cout, 1, 1, 1)
    conv3d("decoder.head.2", cout, 3 * PATCH * PATCH, 3)
    return shapes
