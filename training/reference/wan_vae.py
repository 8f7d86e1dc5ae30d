"""PyTorch reference for Wan 2.1's causal 3D VAE (Alibaba's Wan team), the
autoencoder Wan 2.1 video models use on clips and Qwen-Image uses on one
frame. Transcribed module by module from the original code,
``wan/modules/vae.py`` of github.com/Wan-Video/Wan2.1 (CausalConv3d, RMS_norm,
Upsample, Resample, ResidualBlock, AttentionBlock, Encoder3d, Decoder3d,
count_conv3d, WanVAE_, _video_vae's configuration and WanVAE's latent
statistics), and checked against diffusers' ``autoencoder_kl_wan.py``
(AutoencoderKLWan, the same layers under other names) and
stable-diffusion.cpp's ``wan.hpp``.

Parameter names are the original module tree's, so ``WanVAE_(**WAN21).state_dict()``
has the names and shapes of ``Wan2.1_VAE.pth`` and of its safetensors copies
(ComfyUI's ``wan_2.1_vae.safetensors``, ``qwen_image_vae.safetensors``):
``encoder.conv1``, ``encoder.downsamples.N.*``, ``encoder.middle.{0,1,2}.*``,
``encoder.head.{0,2}.*``, ``conv1``, ``conv2``, ``decoder.conv1``,
``decoder.middle.*``, ``decoder.upsamples.N.*``, ``decoder.head.{0,2}.*``.
``wan_vae_tensor_shapes(...)`` lists them from the configuration alone.

What differs from the original, none of it in the numbers:

- torch 1.13 has neither ``F.scaled_dot_product_attention`` nor einops here:
  ``scaled_dot_product_attention`` below is torch 2's without mask or dropout,
  softmax(q k^T / sqrt(d)) v, and each ``rearrange`` is the permute and
  reshape it stands for.
- ``Upsample`` casts to float32 around the interpolation (the original's fix
  for bfloat16); a float64 input is left float64, so the reference stays in
  float64 (nearest-neighbour interpolation only copies values).
- Resample's unused ``init_weight``/``init_weight2``, the ``amp.autocast``
  and the meta-device loading of ``_video_vae`` are left out.

The causal cache (``feat_cache`` / ``feat_idx``), as the original runs it:
encode splits a clip of 1 + 4k frames into chunks of 1, 4, 4, ... frames and
decode a latent of T frames into chunks of one frame; each CausalConv3d with
a temporal kernel of 3 keeps the last CACHE_T = 2 frames of its input for the
next chunk (zeros before the clip). On the first chunk each Resample in
``downsample3d`` mode keeps its spatial convolution's output and skips
``time_conv`` (the first frame passes alone; later chunks prepend the kept
last frame to a stride-2 ``time_conv`` without padding); each
``upsample3d`` stores the marker "Rep" and skips
``time_conv`` too, so the first latent frame gives one image frame; on later
chunks the marker reads as two zero frames of history, and ``time_conv``
makes two frames (channels [0, C) then [C, 2C)) of each.

The latent the diffusion models see is normalised per channel by WanVAE's
statistics (LATENTS_MEAN, LATENTS_STD: constants of the original code, not
in the weights): encode's ``scale`` = [mean, 1 / std] gives
``(mu - mean) / std``; decode takes ``z * std + mean`` (the original writes
``z / (1 / std) + mean``).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CACHE_T = 2

# WanVAE.__init__'s mean and std (wan/modules/vae.py), 16 latent channels.
LATENTS_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921
]
LATENTS_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160
]

# _video_vae's configuration with WanVAE's z_dim = 16: Wan 2.1's VAE.
WAN21 = dict(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0)


def scaled_dot_product_attention(q, k, v):
    """torch 2's F.scaled_dot_product_attention(q, k, v): no mask, no dropout."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def frames_to_batch(x):
    """rearrange(x, 'b c t h w -> (b t) c h w')"""
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def batch_to_frames(x, t):
    """rearrange(x, '(b t) c h w -> b c t h w', t=t)"""
    bt, c, h, w = x.shape
    return x.reshape(bt // t, t, c, h, w).permute(0, 2, 1, 3, 4)


class CausalConv3d(nn.Conv3d):
    """
    Causal 3d convolusion.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._padding = (self.padding[2], self.padding[2], self.padding[1],
                         self.padding[1], 2 * self.padding[0], 0)
        self.padding = (0, 0, 0)

    def forward(self, x, cache_x=None):
        padding = list(self._padding)
        if cache_x is not None and self._padding[4] > 0:
            cache_x = cache_x.to(x.device)
            x = torch.cat([cache_x, x], dim=2)
            padding[4] -= cache_x.shape[2]
        x = F.pad(x, padding)

        return super().forward(x)


class RMS_norm(nn.Module):

    def __init__(self, dim, channel_first=True, images=True, bias=False):
        super().__init__()
        broadcastable_dims = (1, 1, 1) if not images else (1, 1)
        shape = (dim, *broadcastable_dims) if channel_first else (dim,)

        self.channel_first = channel_first
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else 0.

    def forward(self, x):
        return F.normalize(
            x, dim=(1 if self.channel_first else
                    -1)) * self.scale * self.gamma + self.bias


class Upsample(nn.Upsample):

    def forward(self, x):
        """
        Fix bfloat16 support for nearest neighbor interpolation.
        """
        # The original casts every input to float32; float64 stays float64
        # here (the interpolation copies values, so nothing else changes).
        if x.dtype == torch.float64:
            return super().forward(x)
        return super().forward(x.float()).type_as(x)


class Resample(nn.Module):

    def __init__(self, dim, mode):
        assert mode in ('none', 'upsample2d', 'upsample3d', 'downsample2d',
                        'downsample3d')
        super().__init__()
        self.dim = dim
        self.mode = mode

        # layers
        if mode == 'upsample2d':
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2., 2.), mode='nearest-exact'),
                nn.Conv2d(dim, dim // 2, 3, padding=1))
        elif mode == 'upsample3d':
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2., 2.), mode='nearest-exact'),
                nn.Conv2d(dim, dim // 2, 3, padding=1))
            self.time_conv = CausalConv3d(
                dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))

        elif mode == 'downsample2d':
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        elif mode == 'downsample3d':
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
            self.time_conv = CausalConv3d(
                dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))

        else:
            self.resample = nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        b, c, t, h, w = x.size()
        if self.mode == 'upsample3d':
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = 'Rep'
                    feat_idx[0] += 1
                else:

                    cache_x = x[:, :, -CACHE_T:, :, :].clone()
                    if cache_x.shape[2] < 2 and feat_cache[
                            idx] is not None and feat_cache[idx] != 'Rep':
                        # cache last frame of last two chunk
                        cache_x = torch.cat([
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device), cache_x
                        ],
                                            dim=2)
                    if cache_x.shape[2] < 2 and feat_cache[
                            idx] is not None and feat_cache[idx] == 'Rep':
                        cache_x = torch.cat([
                            torch.zeros_like(cache_x).to(cache_x.device),
                            cache_x
                        ],
                                            dim=2)
                    if feat_cache[idx] == 'Rep':
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

        if self.mode == 'downsample3d':
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = x.clone()
                    feat_idx[0] += 1
                else:

                    cache_x = x[:, :, -1:, :, :].clone()
                    # if cache_x.shape[2] < 2 and feat_cache[idx] is not None and feat_cache[idx]!='Rep':
                    #     # cache last frame of last two chunk
                    #     cache_x = torch.cat([feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(cache_x.device), cache_x], dim=2)

                    x = self.time_conv(
                        torch.cat([feat_cache[idx][:, :, -1:, :, :], x], 2))
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
        return x


class ResidualBlock(nn.Module):

    def __init__(self, in_dim, out_dim, dropout=0.0):
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim

        # layers
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False), nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMS_norm(out_dim, images=False), nn.SiLU(), nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3, padding=1))
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) \
            if in_dim != out_dim else nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        h = self.shortcut(x)
        for layer in self.residual:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x + h


class AttentionBlock(nn.Module):
    """
    Causal self-attention with a single head.
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

        # layers
        self.norm = RMS_norm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

        # zero out the last layer params
        nn.init.zeros_(self.proj.weight)

    def forward(self, x):
        identity = x
        b, c, t, h, w = x.size()
        x = frames_to_batch(x)
        x = self.norm(x)
        # compute query, key, value
        q, k, v = self.to_qkv(x).reshape(b * t, 1, c * 3,
                                         -1).permute(0, 1, 3,
                                                     2).contiguous().chunk(
                                                         3, dim=-1)

        # apply attention
        x = scaled_dot_product_attention(
            q,
            k,
            v,
        )
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)

        # output
        x = self.proj(x)
        x = batch_to_frames(x, t)
        return x + identity


class Encoder3d(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_downsample=[True, True, False],
                 dropout=0.0):
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
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)

        # downsample blocks
        downsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            for _ in range(num_res_blocks):
                downsamples.append(ResidualBlock(in_dim, out_dim, dropout))
                if scale in attn_scales:
                    downsamples.append(AttentionBlock(out_dim))
                in_dim = out_dim

            # downsample block
            if i != len(dim_mult) - 1:
                mode = 'downsample3d' if temperal_downsample[
                    i] else 'downsample2d'
                downsamples.append(Resample(out_dim, mode=mode))
                scale /= 2.0
        self.downsamples = nn.Sequential(*downsamples)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(out_dim, out_dim, dropout), AttentionBlock(out_dim),
            ResidualBlock(out_dim, out_dim, dropout))

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False), nn.SiLU(),
            CausalConv3d(out_dim, z_dim, 3, padding=1))

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = torch.cat([
                    feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                        cache_x.device), cache_x
                ],
                                    dim=2)
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
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x


class Decoder3d(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_upsample=[False, True, True],
                 dropout=0.0):
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
            ResidualBlock(dims[0], dims[0], dropout), AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], dropout))

        # upsample blocks
        upsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            if i == 1 or i == 2 or i == 3:
                in_dim = in_dim // 2
            for _ in range(num_res_blocks + 1):
                upsamples.append(ResidualBlock(in_dim, out_dim, dropout))
                if scale in attn_scales:
                    upsamples.append(AttentionBlock(out_dim))
                in_dim = out_dim

            # upsample block
            if i != len(dim_mult) - 1:
                mode = 'upsample3d' if temperal_upsample[i] else 'upsample2d'
                upsamples.append(Resample(out_dim, mode=mode))
                scale *= 2.0
        self.upsamples = nn.Sequential(*upsamples)

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False), nn.SiLU(),
            CausalConv3d(out_dim, 3, 3, padding=1))

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        ## conv1
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = torch.cat([
                    feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                        cache_x.device), cache_x
                ],
                                    dim=2)
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        ## middle
        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## upsamples
        for layer in self.upsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x


def count_conv3d(model):
    count = 0
    for m in model.modules():
        if isinstance(m, CausalConv3d):
            count += 1
    return count


class WanVAE_(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_downsample=[True, True, False],
                 dropout=0.0):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample
        self.temperal_upsample = temperal_downsample[::-1]

        # modules
        self.encoder = Encoder3d(dim, z_dim * 2, dim_mult, num_res_blocks,
                                 attn_scales, self.temperal_downsample, dropout)
        self.conv1 = CausalConv3d(z_dim * 2, z_dim * 2, 1)
        self.conv2 = CausalConv3d(z_dim, z_dim, 1)
        self.decoder = Decoder3d(dim, z_dim, dim_mult, num_res_blocks,
                                 attn_scales, self.temperal_upsample, dropout)

    def encode(self, x, scale=None):
        self.clear_cache()
        ## cache
        t = x.shape[2]
        iter_ = 1 + (t - 1) // 4
        ## The clip in time chunks of 1, 4, 4, 4, ... frames
        for i in range(iter_):
            self._enc_conv_idx = [0]
            if i == 0:
                out = self.encoder(
                    x[:, :, :1, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx)
            else:
                out_ = self.encoder(
                    x[:, :, 1 + 4 * (i - 1):1 + 4 * i, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx)
                out = torch.cat([out, out_], 2)
        mu, log_var = self.conv1(out).chunk(2, dim=1)
        if scale is not None:
            if isinstance(scale[0], torch.Tensor):
                mu = (mu - scale[0].view(1, self.z_dim, 1, 1, 1)) * scale[1].view(
                    1, self.z_dim, 1, 1, 1)
            else:
                mu = (mu - scale[0]) * scale[1]
        self.clear_cache()
        return mu, log_var

    def decode(self, z, scale=None):
        self.clear_cache()
        # z: [b,c,t,h,w]
        if scale is not None:
            if isinstance(scale[0], torch.Tensor):
                z = z / scale[1].view(1, self.z_dim, 1, 1, 1) + scale[0].view(
                    1, self.z_dim, 1, 1, 1)
            else:
                z = z / scale[1] + scale[0]
        iter_ = z.shape[2]
        x = self.conv2(z)
        for i in range(iter_):
            self._conv_idx = [0]
            if i == 0:
                out = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx)
            else:
                out_ = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx)
                out = torch.cat([out, out_], 2)
        self.clear_cache()
        return out

    def clear_cache(self):
        self._conv_num = count_conv3d(self.decoder)
        self._conv_idx = [0]
        self._feat_map = [None] * self._conv_num
        #cache encode
        self._enc_conv_num = count_conv3d(self.encoder)
        self._enc_conv_idx = [0]
        self._enc_feat_map = [None] * self._enc_conv_num


# ------------------------------------------------------------ kiln's view


def latent_scale(dtype=torch.float64):
    """WanVAE.scale: [mean, 1 / std], as the original builds it (in `dtype`)."""
    mean = torch.tensor(LATENTS_MEAN, dtype=dtype)
    std = torch.tensor(LATENTS_STD, dtype=dtype)
    return [mean, 1.0 / std]


def encode_normalized(model, video):
    """video [B, 3, T, H, W] -> (mu, log_var) of the normalised latent
    [B, 16, 1 + (T - 1) / 4, H / 8, W / 8]: mu = (mu - mean) / std as the
    original's encode with WanVAE.scale; log_var is the original's (raw)
    log variance less log std^2, the same Gaussian seen through the
    normalisation (the original returns it raw and never uses it)."""
    scale = latent_scale(video.dtype)
    mu, log_var = model.encode(video, scale)
    log_std2 = (2.0 * torch.log(torch.tensor(LATENTS_STD, dtype=video.dtype))).view(1, -1, 1, 1, 1)
    return mu, log_var - log_std2


def decode_normalized(model, z):
    """z [B, 16, T, h, w] (normalised) -> video [B, 3, 1 + 4 (T - 1), 8 h, 8 w], not clamped
    (WanVAE.decode clamps to [-1, 1] after this)."""
    return model.decode(z, latent_scale(z.dtype))


def wan_vae_tensor_shapes(dim, z_dim, dim_mult, num_res_blocks, temperal_downsample, attn_scales=(), dropout=0.0):
    """Every parameter name of WanVAE_(...) and its shape, from the
    configuration alone (the constructors' arithmetic written out)."""
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

    assert not attn_scales, "only attn_scales = [] (Wan 2.1's) is listed"
    # encoder
    dims = [dim * u for u in [1] + list(dim_mult)]
    conv3d("encoder.conv1", 3, dims[0], 3)
    n = 0
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(num_res_blocks):
            residual("encoder.downsamples.%d" % n, cin, cout)
            cin = cout
            n += 1
        if i != len(dim_mult) - 1:
            conv2d("encoder.downsamples.%d.resample.1" % n, cout, cout, 3)
            if temperal_downsample[i]:
                conv3d("encoder.downsamples.%d.time_conv" % n, cout, cout, (3, 1, 1))
            n += 1
    top = dims[-1]
    residual("encoder.middle.0", top, top)
    attention("encoder.middle.1", top)
    residual("encoder.middle.2", top, top)
    shapes["encoder.head.0.gamma"] = (top, 1, 1, 1)
    conv3d("encoder.head.2", top, 2 * z_dim, 3)
    conv3d("conv1", 2 * z_dim, 2 * z_dim, 1)
    conv3d("conv2", z_dim, z_dim, 1)
    # decoder
    temperal_upsample = list(temperal_downsample)[::-1]
    dims = [dim * u for u in [dim_mult[-1]] + list(dim_mult)[::-1]]
    conv3d("decoder.conv1", z_dim, dims[0], 3)
    residual("decoder.middle.0", dims[0], dims[0])
    attention("decoder.middle.1", dims[0])
    residual("decoder.middle.2", dims[0], dims[0])
    n = 0
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        if i == 1 or i == 2 or i == 3:
            cin = cin // 2
        for _ in range(num_res_blocks + 1):
            residual("decoder.upsamples.%d" % n, cin, cout)
            cin = cout
            n += 1
        if i != len(dim_mult) - 1:
            conv2d("decoder.upsamples.%d.resample.1" % n, cout, cout // 2, 3)
            if temperal_upsample[i]:
                conv3d("decoder.upsamples.%d.time_conv" % n, cout, 2 * cout, (3, 1, 1))
            n += 1
    shapes["decoder.head.0.gamma"] = (cout, 1, 1, 1)
    conv3d("decoder.head.2", cout, 3, 3)
    return shapes
