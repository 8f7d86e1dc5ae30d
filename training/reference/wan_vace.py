"""PyTorch reference for Wan 2.1 VACE (Alibaba's Wan team; "All-in-One Video Creation and Editing"):
the DiT ``VaceWanModel`` and the context preparation of ``WanVace``, transcribed from the original code of
github.com/Wan-Video/Wan2.1:

- ``wan/modules/vace_model.py``: ``VaceWanAttentionBlock``, ``BaseWanAttentionBlock``, ``VaceWanModel``
  (``__init__``, ``forward_vace``, ``forward``). The upstream repository's copy of this file is not in the
  code index used to write this; read were two forks that carry it unchanged in everything numeric:
  HighDoping/Wan2.1 (commit 4cbb716fa866bc8ad00148f69bc5037a403a08ba; its only change is ``torch.amp``
  with a device picker in place of ``torch.cuda.amp``) and basetenlabs/Wan2.1 (commit
  ea90d9b44a1fa9ba5f9e306b4c042f3cca4bf440; adds an attention cache keyed by block, off by default).
- ``wan/vace.py`` (Wan-Video/Wan2.1 itself, commit 9146033b2320de524029a19c39c8ea8b5a30a845):
  ``WanVace.vace_encode_frames``, ``vace_encode_masks``, ``vace_latent``, ``prepare_source``,
  ``decode_latent`` and ``generate`` (the noise shape and the sampling loop).

The rest of the network (embeddings, blocks, head, RoPE, unpatchify) is reference/wan_dit.py's ``WanModel``,
transcribed from ``wan/modules/model.py``; this file reuses its classes.

Parameter names are the original module tree's: a t2v ``WanModel``'s (``patch_embedding``, ``blocks.N.*``,
``head.*``, ...) and

- ``vace_patch_embedding.{weight,bias}``: Conv3d(vace_in_dim, dim, kernel = stride = patch_size);
- ``vace_blocks.N.*``: a whole WanAttentionBlock (``modulation``, ``self_attn.*``, ``norm3.*`` (the model's
  cross_attn_norm, True, is passed on), ``cross_attn.*``, ``ffn.{0,2}``) plus ``after_proj`` (Linear dim ->
  dim) and, for the block whose ``block_id`` is 0 only, ``before_proj`` (Linear dim -> dim). A VACE block's
  ``block_id`` is its MAIN layer index (``block_id=i for i in self.vace_layers``), so ``before_proj`` sits
  on the VACE block that serves main layer 0 (the original asserts ``0 in vace_layers``); with the layers
  in ascending order, as every configuration has them, that is ``vace_blocks.0``.

The network (``VaceWanModel.forward``), per item:

- ``x`` = patch_embedding(latent) tokens, the time embedding e / e0 and the text context exactly as
  ``WanModel`` (t2v: text cross-attention only; no CLIP).
- ``forward_vace`` runs BEFORE the main blocks: ``c = vace_patch_embedding(vace_context)`` tokens (padded
  with zero tokens to seq_len as x); for each VACE block n in order: block 0 (block_id 0) first sets
  ``c = before_proj(c) + x`` with x the PATCH-EMBEDDED latent tokens (not any block's output); then
  ``c = WanAttentionBlock(c)`` with the main blocks' e0, RoPE grid, context; ``hints[n] = after_proj(c)``.
  So every hint depends on the latent x only through block 0's ``+ x``.
- main block i: ``x = block_i(x)``, then, if i is in vace_layers, ``x = x + hints[mapping[i]] * scale``
  (``mapping = {layer: n}``, ``scale`` = ``vace_context_scale``).
- head and unpatchify as ``WanModel``.

Because the hints never read the main blocks' outputs, running VACE block n right after main block
vace_layers[n] (keeping c between them and the patch-embedded x for block 0's before_proj) gives the same
numbers as the original's all-first order: ``forward(..., order="interleaved")`` does that, for
implementations that compute them interleaved.

The context (``vace_context``, 96 planes for the released models: ``vace_in_dim`` in their config.json),
``WanVace.vace_encode_frames`` + ``vace_encode_masks`` + ``vace_latent`` for one item:

- frames [3, T, H, W] in [-1, 1], mask [C, T, H, W] in [0, 1] (the original's prepare_source gives C = 1
  from a mask video, or ``ones_like`` the 3-channel video when there is none);
- ``m = where(mask > 0.5, 1, 0)`` (for the frames only); ``inactive = frames * (1 - m)``, ``reactive =
  frames * m``, each VAE-encoded on its own (WanVAE.encode: the normalised mean, (mu - mean) / std), and
  concatenated along the channels: 32 planes [inactive 16, reactive 16] x (1 + (T - 1) / 4) frames;
- reference images (each [3, 1, H, W]): each encoded alone (a one-frame clip), followed by 16 zero channels,
  and put BEFORE the frames' latent along time, in the given order;
- the mask planes (``vace_encode_masks``; the RAW mask, channel 0, not thresholded): with h = 2 (H // 16),
  w = 2 (W // 16), ``mask[0].view(T, h, 8, w, 8).permute(2, 4, 0, 1, 3).reshape(64, T, h, w)`` (plane 8 i + j
  at (f, y, x) is the pixel (f, 8 y + i, 8 x + j)), then ``F.interpolate(size=((T + 3) // 4, h, w),
  mode='nearest-exact')`` (in space the identity; in time latent frame k takes pixel frame
  floor((k + 0.5) T / T'), T' = (T + 3) // 4: for T = 5 frames 1 and 3, NOT 0 and 1..4); then one zero
  frame per reference image prepended;
- ``vace_latent``: [32 frame planes, 64 mask planes] along the channels: 96.

``WanVace.generate`` draws the noise for the whole latent, 16 channels x (refs + latent frames) (the
shape of the 32-plane frame latent, halved), samples with the same ``vace_context`` and
``vace_context_scale`` (``context_scale``) in the conditional and the unconditional pass, and
``decode_latent`` drops the first len(refs) latent frames before the VAE decode.

What differs from the original, none of it in the numbers of a float64 run: as reference/wan_dit.py (no
autocast or float casts, plain softmax attention); ``forward`` takes only one timestep per item (t [B], as
Wan 2.1's VACE); ``vace_in_dim`` defaults to 96 (the released configurations' value; the original's
default is in_dim); the VAE is reference/wan_vae.py's ``WanVAE_`` through ``encode_normalized`` (float64);
the reference images' canvas fitting of ``prepare_source`` (resize into a white canvas when the size
differs from the video's) is left to the caller.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference import wan_dit as ref
from reference import wan_vae as wan

VACE_IN_DIM = 96  # 16 inactive + 16 reactive latent channels + 64 mask planes (8 x 8 pixel-unshuffle)
VAE_STRIDE = (4, 8, 8)  # Wan 2.1's VAE: time, height, width


# The released configurations (their config.json): VACE blocks after every second of the 1.3B's 30 blocks,
# after every fifth of the 14B's 40.
WAN21_VACE_1_3B = dict(ref.WAN21_1_3B, vace_layers=list(range(0, 30, 2)), vace_in_dim=VACE_IN_DIM)
WAN21_VACE_14B = dict(ref.WAN21_14B, vace_layers=list(range(0, 40, 5)), vace_in_dim=VACE_IN_DIM)


def wan_vace_tensor_shapes(cfg):
    """{name: shape} of a VaceWanModel (t2v main model), from the configuration alone (vace_layers default
    range(0, num_layers, 2), vace_in_dim default 96)."""
    dim, p = cfg["dim"], cfg["patch_size"]
    main = {k: v for k, v in cfg.items() if k not in ("vace_layers", "vace_in_dim")}
    s = ref.wan_dit_tensor_shapes(dict(main, model_type="t2v"))
    layers = cfg.get("vace_layers")
    layers = list(range(0, cfg["num_layers"], 2)) if layers is None else list(layers)
    block = {k[len("blocks.0."):]: v for k, v in s.items() if k.startswith("blocks.0.")}
    for n, i in enumerate(layers):
        b = "vace_blocks.%d." % n
        s.update({b + k: v for k, v in block.items()})
        if i == 0:
            s[b + "before_proj.weight"] = (dim, dim)
            s[b + "before_proj.bias"] = (dim,)
        s[b + "after_proj.weight"] = (dim, dim)
        s[b + "after_proj.bias"] = (dim,)
    s["vace_patch_embedding.weight"] = (dim, cfg.get("vace_in_dim", VACE_IN_DIM)) + tuple(p)
    s["vace_patch_embedding.bias"] = (dim,)
    return s


class VaceWanAttentionBlock(ref.WanAttentionBlock):
    """A WanAttentionBlock on the VACE stream c; block_id is the main layer it serves (0: with before_proj)."""

    def __init__(self, dim, ffn_dim, num_heads, qk_norm=True, cross_attn_norm=True, eps=ref.EPS, block_id=0):
        super().__init__(dim, ffn_dim, num_heads, qk_norm, cross_attn_norm, eps, "t2v_cross_attn")
        self.block_id = block_id
        if block_id == 0:
            self.before_proj = nn.Linear(dim, dim)  # zero-initialised in the original (training)
        self.after_proj = nn.Linear(dim, dim)  # zero-initialised in the original (training)

    def forward(self, c, x, e, seq_lens, grid_sizes, freqs, context, context_lens):
        """c: the VACE tokens; x: the PATCH-EMBEDDED latent tokens (read by block_id 0 only). Returns (c,
        hint)."""
        if self.block_id == 0:
            c = self.before_proj(c) + x
        c = super().forward(c, e, seq_lens, grid_sizes, freqs, context, context_lens)
        return c, self.after_proj(c)


class VaceWanModel(ref.WanModel):

    def __init__(self, vace_layers=None, vace_in_dim=VACE_IN_DIM, **kwargs):
        kwargs = dict(kwargs)
        assert kwargs.pop("model_type", "t2v") in ("t2v", "vace")
        super().__init__(model_type="t2v", **kwargs)  # the original's WanModel(model_type='vace'): t2v blocks
        self.model_type = "vace"
        num_layers = len(self.blocks)
        self.vace_layers = list(range(0, num_layers, 2)) if vace_layers is None else list(vace_layers)
        self.vace_in_dim = vace_in_dim
        assert 0 in self.vace_layers
        self.vace_layers_mapping = {i: n for n, i in enumerate(self.vace_layers)}
        dim = self.dim
        blk = self.blocks[0]
        ffn_dim = blk.ffn[0].out_features
        num_heads = blk.self_attn.num_heads
        qk_norm = not isinstance(blk.self_attn.norm_q, nn.Identity)
        cross_attn_norm = not isinstance(blk.norm3, nn.Identity)
        eps = blk.norm1.eps
        self.vace_blocks = nn.ModuleList([
            VaceWanAttentionBlock(dim, ffn_dim, num_heads, qk_norm, cross_attn_norm, eps, block_id=i)
            for i in self.vace_layers
        ])
        self.vace_patch_embedding = nn.Conv3d(vace_in_dim, dim, kernel_size=self.patch_size,
                                              stride=self.patch_size)

    def _tokens(self, embedding, x, seq_len):
        x = [embedding(u.unsqueeze(0)) for u in x]
        grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
        x = [u.flatten(2).transpose(1, 2) for u in x]
        seq_lens = torch.tensor([u.size(1) for u in x], dtype=torch.long)
        assert seq_lens.max() <= seq_len
        x = torch.cat([torch.cat([u, u.new_zeros(1, seq_len - u.size(1), u.size(2))], dim=1) for u in x])
        return x, grid_sizes, seq_lens

    def forward_vace(self, x, vace_context, seq_len, kwargs):
        """The original's forward_vace: all hints, from the patch-embedded x, before the main blocks."""
        c, _, _ = self._tokens(self.vace_patch_embedding, vace_context, seq_len)
        hints = []
        for block in self.vace_blocks:
            c, c_skip = block(c, x, **kwargs)
            hints.append(c_skip)
        return hints

    def forward(self, x, t, vace_context, context, seq_len, vace_context_scale=1.0, blocks=None, hints=None,
                order="first"):
        """x: list of [C_in, F, H, W]; t: [B] timesteps in [0, 1000]; vace_context: list of
        [vace_in_dim, F, H, W]; context: list of [L_i, text_dim]. Returns the list of [C_out, F, H, W].
        `blocks` (a dict) gets 'blocks.N', the tokens after main block N (its hint added); `hints` (a
        list) gets the hints [B, seq_len, dim]. order "first": the original's (every hint before the main
        blocks); "interleaved": VACE block n right after main block vace_layers[n]."""
        assert t.dim() == 1, "Wan 2.1 VACE: one timestep per item"
        x, grid_sizes, seq_lens = self._tokens(self.patch_embedding, x, seq_len)
        e = self.time_embedding(ref.sinusoidal_embedding_1d(self.freq_dim, t).to(x.dtype))
        e0 = self.time_projection(e).unflatten(1, (6, self.dim))
        context = self.text_embedding(
            torch.stack([torch.cat([u, u.new_zeros(self.text_len - u.size(0), u.size(1))]) for u in context]))
        kwargs = dict(e=e0, seq_lens=seq_lens, grid_sizes=grid_sizes, freqs=self.freqs, context=context,
                      context_lens=None)

        if order == "first":
            got = self.forward_vace(x, vace_context, seq_len, kwargs)
            for i, block in enumerate(self.blocks):
                x = block(x, **kwargs)
                if i in self.vace_layers_mapping:
                    x = x + got[self.vace_layers_mapping[i]] * vace_context_scale
                if blocks is not None:
                    blocks["blocks.%d" % i] = x
        else:
            assert order == "interleaved"
            assert self.vace_layers == sorted(self.vace_layers)
            c, _, _ = self._tokens(self.vace_patch_embedding, vace_context, seq_len)
            x_embedded = x
            got = []
            for i, block in enumerate(self.blocks):
                x = block(x, **kwargs)
                if i in self.vace_layers_mapping:
                    c, hint = self.vace_blocks[self.vace_layers_mapping[i]](c, x_embedded, **kwargs)
                    got.append(hint)
                    x = x + hint * vace_context_scale
                if blocks is not None:
                    blocks["blocks.%d" % i] = x
        if hints is not None:
            hints.extend(got)
        x = self.head(x, e)
        return self.unpatchify(x, grid_sizes)


def predict_vace(model, x, sigma, vace_context, context, context_lengths=None, scale=1.0, blocks=None,
                 hints=None, order="first"):
    """reference/wan_dit.py's predict for VACE: x [B, 16, F, H, W], sigma [B] in [0, 1] (t = 1000 sigma),
    vace_context [B, 96, F, H, W] (as x's frames: reference frames included), context [B, L, text_dim] of
    which item b's first context_lengths[b] rows (all when None) are its prompt, scale the
    vace_context_scale. Returns [B, C_out, F, H, W]."""
    lengths = context_lengths or [context.shape[1]] * x.shape[0]
    seq_len = math.prod(s // p for s, p in zip(x.shape[2:], model.patch_size))
    out = model([u for u in x], sigma * 1000, [u for u in vace_context], [c[:n] for c, n in zip(context, lengths)],
                seq_len, vace_context_scale=scale, blocks=blocks, hints=hints, order=order)
    return torch.stack(out)


# ------------------------------------------------------------ the context (WanVace)


def vace_encode_frames(vae, frames, mask=None, ref_images=None):
    """WanVace.vace_encode_frames for one item: frames [3, T, H, W] in [-1, 1], mask [C, T, H, W] or None,
    ref_images a list of [3, 1, H, W] or None. Returns [32 (16 without a mask), refs + T', h, w]."""
    enc = lambda v: wan.encode_normalized(vae, v[None])[0][0]  # noqa: E731  WanVAE.encode: normalised mean
    if mask is None:
        latent = enc(frames)
    else:
        m = torch.where(mask > 0.5, 1.0, 0.0).to(frames.dtype)
        inactive = frames * (1 - m) + 0 * m
        reactive = frames * m + 0 * (1 - m)
        latent = torch.cat((enc(inactive), enc(reactive)), dim=0)
    if ref_images:
        refs = []
        for r in ref_images:
            z = enc(r)
            assert z.shape[1] == 1
            refs.append(z if mask is None else torch.cat((z, torch.zeros_like(z)), dim=0))
        latent = torch.cat([*refs, latent], dim=1)
    return latent


def vace_encode_masks(mask, ref_images=None, vae_stride=VAE_STRIDE):
    """WanVace.vace_encode_masks for one item: mask [C, T, H, W] (channel 0 read, not thresholded) ->
    [64, refs + (T + 3) // 4, h, w]."""
    c, depth, height, width = mask.shape
    new_depth = int((depth + 3) // vae_stride[0])
    height = 2 * (int(height) // (vae_stride[1] * 2))
    width = 2 * (int(width) // (vae_stride[2] * 2))
    mask = mask[0, :, :, :]
    mask = mask.view(depth, height, vae_stride[1], width, vae_stride[1])  # depth, height, 8, width, 8
    mask = mask.permute(2, 4, 0, 1, 3)  # 8, 8, depth, height, width
    mask = mask.reshape(vae_stride[1] * vae_stride[2], depth, height, width)
    mask = F.interpolate(mask.unsqueeze(0), size=(new_depth, height, width), mode="nearest-exact").squeeze(0)
    if ref_images:
        mask = torch.cat((torch.zeros_like(mask[:, :len(ref_images)]), mask), dim=1)
    return mask


def vace_latent(z, m):
    """WanVace.vace_latent for one item: [z, m] along the channels."""
    return torch.cat([z, m], dim=0)


def vace_context(vae, frames, masks, ref_image=None):
    """The whole context of one item, [96, refs + T', h, w]: frames [3, T, H, W] in [-1, 1], masks
    [C, T, H, W] (1: regenerate, 0: keep), ref_image None, one [3, 1, H, W] (or [3, H, W]) image, or a list
    of them."""
    if ref_image is None:
        refs = None
    else:
        refs = ref_image if isinstance(ref_image, (list, tuple)) else [ref_image]
        refs = [r if r.dim() == 4 else r[:, None] for r in refs]
    z = vace_encode_frames(vae, frames, masks, refs)
    m = vace_encode_masks(masks, refs)
    return vace_latent(z, m)
