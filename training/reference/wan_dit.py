"""PyTorch reference for Wan's video diffusion transformer (Alibaba's Wan team;
Wan 2.1 and Wan 2.2), ``WanModel`` with ``model_type`` 't2v' (text-to-video;
also Wan 2.2's I2V-A14B, whose 36 input planes carry the condition but which
has no CLIP), 'i2v' (Wan 2.1 image-to-video) and 'flf2v' (Wan 2.1
first-last-frame-to-video), transcribed from the original code,
``wan/modules/model.py`` of github.com/Wan-Video/Wan2.1
(``sinusoidal_embedding_1d``, ``rope_params``, ``rope_apply``, ``WanRMSNorm``,
``WanLayerNorm``, ``WanSelfAttention``, ``WanT2VCrossAttention``,
``WanI2VCrossAttention``, ``WanAttentionBlock``, ``Head``, ``MLPProj``,
``WanModel``'s ``__init__``, ``forward`` and ``unpatchify``). Wan 2.2's file
(github.com/Wan-Video/Wan2.2) has the same layers and names; its forward
takes one timestep per token (``t`` of shape [B, seq_len], expanding a [B]
``t`` to that): TI2V-5B's image-to-video (``WanTI2V.i2v``) gives the first
latent frame's tokens t = 0 and the others the step's t. ``forward`` here
takes either form: ``t`` [B] runs the per-item path (one embedding per item,
broadcast over the tokens: for a text-to-video evaluation the same numbers as
Wan 2.2's expansion), ``t`` [B, seq_len] Wan 2.2's per-token path.

Parameter names are the original module tree's, so
``WanModel(**WAN21_1_3B).state_dict()`` has the names and shapes of
``Wan2.1-T2V-1.3B`` (and of ComfyUI's ``wan2.1_t2v_1.3B_fp16.safetensors``,
which prefixes them with ``model.diffusion_model.``):
``patch_embedding``, ``text_embedding.{0,2}``, ``time_embedding.{0,2}``,
``time_projection.1``, ``blocks.N.{modulation, self_attn.{q,k,v,o,norm_q,
norm_k}, norm3, cross_attn.{q,k,v,o,norm_q,norm_k}, ffn.{0,2}}``,
``head.head``, ``head.modulation``. The image models ('i2v', 'flf2v') add
``blocks.N.cross_attn.{k_img, v_img, norm_k_img}`` and
``img_emb.proj.{0,1,3,4}`` (LayerNorm, Linear, GELU, Linear, LayerNorm), and
'flf2v' ``img_emb.emb_pos`` [1, 514, 1280]. ``wan_dit_tensor_shapes(cfg)`` lists them from the
configuration alone (``cfg['model_type']``, default 't2v').

The network, as the original computes it (t is the timestep in [0, 1000]:
the flow sigma times 1000, as Wan's schedulers give it):

- ``e = time_embedding(sinusoidal_embedding_1d(freq_dim, t))``: [cos, sin]
  of ``t * 10000 ** (-i / (freq_dim / 2))``, then Linear, SiLU, Linear;
  ``e0 = time_projection(e)`` (SiLU, Linear to 6 * dim), six vectors. With
  per-token t (Wan 2.2's model.py): the sinusoid of every token's t
  (``t.flatten()``, ``unflatten(0, (B, seq_len))``), so e is [B, seq_len,
  dim] and e0 [B, seq_len, 6, dim] (computed here a token column at a time:
  see "What differs"); each block adds ``modulation.unsqueeze(0)``
  to e0 and chunks along dim 2 (shift, scale, gate per token), and the head
  adds ``modulation.unsqueeze(0)`` to ``e.unsqueeze(2)`` (its shift and scale
  per token).
- Tokens: ``patch_embedding``, a Conv3d with kernel = stride = patch (1, 2,
  2) over the latent [C, F, H, W], flattened in (f, h, w) order.
- Context: each item's [L, text_dim] rows are padded with ZERO rows to
  ``text_len`` = 512 before ``text_embedding`` (Linear, GELU tanh, Linear),
  so the padded rows become text_embedding(0) and the cross-attention,
  which has no mask (``context_lens`` is None), attends to them.
- Block: ``modulation`` [1, 6, dim] + e0 -> (shift, scale, gate) of the
  self-attention, then of the FFN;
  ``x += gate_sa * self_attn(LN(x) * (1 + scale_sa) + shift_sa)`` with q and
  k RMS-normed over the whole width (norm_q, norm_k with weights, eps 1e-6)
  and rotated by the 3-D RoPE; ``x += cross_attn(norm3(x), context)``
  (norm3 a LayerNorm with affine, cross_attn_norm=True; q from x, k and v
  from the context, norm_q / norm_k, no RoPE, no gate);
  ``x += gate_ffn * ffn(LN(x) * (1 + scale_ffn) + shift_ffn)`` with
  ``ffn = Linear(dim, ffn_dim), GELU tanh, Linear(ffn_dim, dim)``. LN is a
  LayerNorm without affine, eps 1e-6.
- Image models: the CLIP tokens (``clip_fea``: CLIP ViT-H/14's tokens after
  its 31st of 32 layers, [B, 257, 1280], reference/clip_vision.py) become
  context rows ``img_emb(clip_fea)`` = LayerNorm, Linear, GELU (erf),
  Linear to dim, LayerNorm (eps 1e-5, with affine), put BEFORE the 512 text
  rows. flf2v's clip_fea holds the first and the last frame's tokens, [2B,
  257, 1280]; ``img_emb`` reads them as one item of 514 tokens (``view(-1,
  514, d)``) and adds ``emb_pos`` before the projection. The cross-attention
  (``WanI2VCrossAttention``) splits the context again: q attends to the text
  rows with k, v, norm_k (as t2v's) and to the image rows with k_img, v_img,
  norm_k_img (no mask), and ``o`` maps the sum of the two results. The
  condition (a mask's 4 planes and the image latent's 16) enters as input
  planes of ``patch_embedding`` (in_dim 36); the caller concatenates it.
- Head: ``head.modulation`` [1, 2, dim] + e (the embedding before the
  projection, no SiLU) -> (shift, scale); ``head.head(LN(x) * (1 + scale) +
  shift)`` gives ``prod(patch) * out_dim`` features per token, in the order
  (pt, ph, pw, c) (``unpatchify``'s einsum 'fhwpqrc->cfphqwr').
- RoPE (``rope_apply``): head_dim d in d / 2 complex pairs (adjacent
  features, ``view_as_complex`` of ``reshape(..., -1, 2)``); the first
  ``d/2 - 2 (d/2 // 3)`` pairs turn with the frame, the next ``d/2 // 3``
  with the row, the last ``d/2 // 3`` with the column; pair j of an axis of
  ``n`` features (``rope_params(1024, n)``) turns by ``pos * 10000 ** (-2j /
  n)``. Frames, rows and columns count from 0.

What differs from the original, none of it in the numbers of a float64 run:

- The original's ``.float()`` casts (WanRMSNorm, WanLayerNorm, the
  sinusoidal embedding, rope_apply's result, forward's output) are there for
  bfloat16 runs; here they keep float64 (``_wide``), so the whole reference
  runs in the inputs' dtype. ``amp.autocast`` contexts and the dtype
  assertions that go with them are left out.
- ``flash_attention`` is plain softmax(q k^T / sqrt(d)) v per head, masking
  keys at or past ``k_lens`` as the varlen kernel does.
- ``MLPProj``'s in_dim (and emb_pos's width) is 1280 in the original; here
  it is ``clip_dim`` (default 1280), so a tiny CLIP can feed a tiny model.
- The condition ``y`` is not a separate argument of ``forward``: the caller
  concatenates it to x along the channels, as the original's first line does.
- No ``model_type='vace'``, nor Wan 2.2's 'ti2v' name: TI2V-5B is a 't2v'
  model here (in_dim = out_dim = 48); Wan 2.2's forward treats 'ti2v' as
  't2v' (only 'i2v' asserts a condition).
- Per-token timesteps: the time embedding and projection run on each token
  column t[:, l] ([B] rows, as the per-item form) rather than on all B x
  seq_len rows at once: the same arithmetic, and equal timesteps give bit
  for bit the per-item numbers (a GEMM's rounding depends on its row count).
- Wan 2.2's forward always expands a [B] t to [B, seq_len] (its padding
  tokens too); the [B] form here broadcasts one embedding per item, the same
  numbers.
"""

import math

import torch
import torch.nn as nn

TEXT_LEN = 512  # WanModel's text_len (T5_CONTEXT_TOKEN_NUMBER)
EPS = 1e-6
THETA = 10000
ROPE_POSITIONS = 1024  # rope_params(1024, ...)
CLIP_DIM = 1280  # MLPProj's in_dim, hard-coded in the original: CLIP ViT-H/14's width
FLF_CONTEXT_TOKENS = 2 * 257  # FIRST_LAST_FRAME_CONTEXT_TOKEN_NUMBER: two images' CLS + 16 x 16 patches

# The released text-to-video configurations (WanModel's arguments).
WAN21_1_3B = dict(patch_size=(1, 2, 2), in_dim=16, dim=1536, ffn_dim=8960, freq_dim=256, text_dim=4096, out_dim=16,
                  num_heads=12, num_layers=30)
WAN21_14B = dict(patch_size=(1, 2, 2), in_dim=16, dim=5120, ffn_dim=13824, freq_dim=256, text_dim=4096, out_dim=16,
                 num_heads=40, num_layers=40)
WAN21_I2V_14B = dict(WAN21_14B, model_type="i2v", in_dim=36)  # Wan2.1-I2V-14B-480P / -720P
WAN21_FLF2V_14B = dict(WAN21_14B, model_type="flf2v", in_dim=36)  # Wan2.1-FLF2V-14B-720P
WAN22_5B = dict(patch_size=(1, 2, 2), in_dim=48, dim=3072, ffn_dim=14336, freq_dim=256, text_dim=4096, out_dim=48,
                num_heads=24, num_layers=30)


def _wide(x):
    """The original's x.float(), which keeps a float64 reference in float64."""
    return x if x.dtype == torch.float64 else x.float()


def wan_dit_tensor_shapes(cfg):
    """{name: shape} of a WanModel (PyTorch order), from the configuration alone (model_type 't2v' unless
    cfg says 'i2v' or 'flf2v'; clip_dim 1280 unless given)."""
    dim, ffn, p = cfg["dim"], cfg["ffn_dim"], cfg["patch_size"]
    image = cfg.get("model_type", "t2v") in ("i2v", "flf2v")
    clip_dim = cfg.get("clip_dim", CLIP_DIM)
    s = {}

    def linear(name, n_in, n_out):
        s[name + ".weight"] = (n_out, n_in)
        s[name + ".bias"] = (n_out,)

    s["patch_embedding.weight"] = (dim, cfg["in_dim"]) + tuple(p)
    s["patch_embedding.bias"] = (dim,)
    linear("text_embedding.0", cfg["text_dim"], dim)
    linear("text_embedding.2", dim, dim)
    linear("time_embedding.0", cfg["freq_dim"], dim)
    linear("time_embedding.2", dim, dim)
    linear("time_projection.1", dim, 6 * dim)
    for i in range(cfg["num_layers"]):
        b = "blocks.%d." % i
        s[b + "modulation"] = (1, 6, dim)
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                linear(b + attn + "." + proj, dim, dim)
            s[b + attn + ".norm_q.weight"] = (dim,)
            s[b + attn + ".norm_k.weight"] = (dim,)
        if image:
            linear(b + "cross_attn.k_img", dim, dim)
            linear(b + "cross_attn.v_img", dim, dim)
            s[b + "cross_attn.norm_k_img.weight"] = (dim,)
        s[b + "norm3.weight"] = (dim,)
        s[b + "norm3.bias"] = (dim,)
        linear(b + "ffn.0", dim, ffn)
        linear(b + "ffn.2", ffn, dim)
    linear("head.head", dim, math.prod(p) * cfg["out_dim"])
    s["head.modulation"] = (1, 2, dim)
    if image:
        s["img_emb.proj.0.weight"] = s["img_emb.proj.0.bias"] = (clip_dim,)  # LayerNorm(clip_dim)
        linear("img_emb.proj.1", clip_dim, clip_dim)
        linear("img_emb.proj.3", clip_dim, dim)
        s["img_emb.proj.4.weight"] = s["img_emb.proj.4.bias"] = (dim,)  # LayerNorm(dim)
        if cfg.get("model_type") == "flf2v":
            s["img_emb.emb_pos"] = (1, FLF_CONTEXT_TOKENS, clip_dim)
    return s


# ------------------------------------------------------------ embeddings


def sinusoidal_embedding_1d(dim, position):
    assert dim % 2 == 0
    half = dim // 2
    position = position.type(torch.float64)
    sinusoid = torch.outer(position, torch.pow(10000, -torch.arange(half).to(position).div(half)))
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1)


def rope_params(max_seq_len, dim, theta=THETA):
    assert dim % 2 == 0
    freqs = torch.outer(torch.arange(max_seq_len),
                        1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


def rope_freqs(head_dim):
    """WanModel's self.freqs: [1024, head_dim / 2] complex."""
    d = head_dim
    return torch.cat([rope_params(ROPE_POSITIONS, d - 4 * (d // 6)),
                      rope_params(ROPE_POSITIONS, 2 * (d // 6)),
                      rope_params(ROPE_POSITIONS, 2 * (d // 6))], dim=1)


def grid_freqs(freqs, f, h, w):
    """rope_apply's freqs_i: the factors of every token of an f x h x w grid, [f h w, head_dim / 2]."""
    c = freqs.shape[1]
    parts = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    return torch.cat([
        parts[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
        parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
        parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)
    ], dim=-1).reshape(f * h * w, -1)


def rope_apply(x, grid_sizes, freqs):
    """x [B, L, n, d]: the first f h w tokens of each item rotated, the rest (padding) kept."""
    n = x.size(2)
    output = []
    for i, (f, h, w) in enumerate(grid_sizes.tolist()):
        seq_len = f * h * w
        x_i = torch.view_as_complex(x[i, :seq_len].to(torch.float64).reshape(seq_len, n, -1, 2))
        freqs_i = grid_freqs(freqs, f, h, w).reshape(seq_len, 1, -1)
        x_i = torch.view_as_real(x_i * freqs_i).flatten(2)
        output.append(torch.cat([x_i, x[i, seq_len:].to(torch.float64)]))
    return torch.stack(output).to(x.dtype)


# ------------------------------------------------------------ layers


def flash_attention(q, k, v, k_lens=None):
    """q [B, Lq, n, d], k and v [B, Lk, n, d] -> [B, Lq, n, d]; keys at or past k_lens[b] ignored."""
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
    if k_lens is not None:
        keep = torch.arange(k.shape[1])[None, :] < k_lens[:, None]  # [B, Lk]
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.einsum("bnqk,bknd->bqnd", torch.softmax(scores, dim=-1), v)


class WanRMSNorm(nn.Module):

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self._norm(_wide(x)).type_as(x) * self.weight

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


class WanLayerNorm(nn.LayerNorm):

    def __init__(self, dim, eps=EPS, elementwise_affine=False):
        super().__init__(dim, elementwise_affine=elementwise_affine, eps=eps)

    def forward(self, x):
        return super().forward(_wide(x)).type_as(x)


class WanSelfAttention(nn.Module):

    def __init__(self, dim, num_heads, qk_norm=True, eps=EPS):
        assert dim % num_heads == 0
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(self, x, seq_lens, grid_sizes, freqs):
        b, s, n, d = *x.shape[:2], self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, s, n, d)
        k = self.norm_k(self.k(x)).view(b, s, n, d)
        v = self.v(x).view(b, s, n, d)
        x = flash_attention(rope_apply(q, grid_sizes, freqs), rope_apply(k, grid_sizes, freqs), v, k_lens=seq_lens)
        return self.o(x.flatten(2))


class WanT2VCrossAttention(WanSelfAttention):

    def forward(self, x, context, context_lens):
        b, n, d = x.size(0), self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, -1, n, d)
        k = self.norm_k(self.k(context)).view(b, -1, n, d)
        v = self.v(context).view(b, -1, n, d)
        x = flash_attention(q, k, v, k_lens=context_lens)
        return self.o(x.flatten(2))


class WanI2VCrossAttention(WanSelfAttention):
    """The image models' cross-attention: the context is [image tokens, 512 text rows]; q attends to each part
    with its own k and v, the text part with k, v (and context_lens), the image part with k_img, v_img (and
    norm_k_img, no mask), and o maps the sum of the two results."""

    def __init__(self, dim, num_heads, qk_norm=True, eps=EPS):
        super().__init__(dim, num_heads, qk_norm, eps)
        self.k_img = nn.Linear(dim, dim)
        self.v_img = nn.Linear(dim, dim)
        self.norm_k_img = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(self, x, context, context_lens):
        image_context_length = context.shape[1] - TEXT_LEN  # 257 (i2v) or 514 (flf2v)
        context_img = context[:, :image_context_length]
        context = context[:, image_context_length:]
        b, n, d = x.size(0), self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, -1, n, d)
        k = self.norm_k(self.k(context)).view(b, -1, n, d)
        v = self.v(context).view(b, -1, n, d)
        k_img = self.norm_k_img(self.k_img(context_img)).view(b, -1, n, d)
        v_img = self.v_img(context_img).view(b, -1, n, d)
        img_x = flash_attention(q, k_img, v_img, k_lens=None)
        x = flash_attention(q, k, v, k_lens=context_lens)
        return self.o(x.flatten(2) + img_x.flatten(2))


CROSS_ATTENTION_CLASSES = {  # the original's WAN_CROSSATTENTION_CLASSES
    "t2v_cross_attn": WanT2VCrossAttention,
    "i2v_cross_attn": WanI2VCrossAttention,
}


class WanAttentionBlock(nn.Module):

    def __init__(self, dim, ffn_dim, num_heads, qk_norm=True, cross_attn_norm=True, eps=EPS,
                 cross_attn_type="t2v_cross_attn"):
        super().__init__()
        self.norm1 = WanLayerNorm(dim, eps)
        self.self_attn = WanSelfAttention(dim, num_heads, qk_norm, eps)
        self.norm3 = WanLayerNorm(dim, eps, elementwise_affine=True) if cross_attn_norm else nn.Identity()
        self.cross_attn = CROSS_ATTENTION_CLASSES[cross_attn_type](dim, num_heads, qk_norm, eps)
        self.norm2 = WanLayerNorm(dim, eps)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x, e, seq_lens, grid_sizes, freqs, context, context_lens):
        """e: e0, [B, 6, dim] (one timestep per item) or [B, L, 6, dim] (per token, Wan 2.2)."""
        if e.dim() == 4:  # Wan 2.2: (modulation.unsqueeze(0) + e).chunk(6, dim=2), each squeezed
            e = [u.squeeze(2) for u in (self.modulation.unsqueeze(0) + e).chunk(6, dim=2)]
        else:
            e = (self.modulation + e).chunk(6, dim=1)
        y = self.self_attn(_wide(self.norm1(x)) * (1 + e[1]) + e[0], seq_lens, grid_sizes, freqs)
        x = x + y * e[2]
        x = x + self.cross_attn(self.norm3(x), context, context_lens)
        y = self.ffn(_wide(self.norm2(x)) * (1 + e[4]) + e[3])
        return x + y * e[5]


class Head(nn.Module):

    def __init__(self, dim, out_dim, patch_size, eps=EPS):
        super().__init__()
        self.norm = WanLayerNorm(dim, eps)
        self.head = nn.Linear(dim, math.prod(patch_size) * out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x, e):
        """e: [B, dim] (one timestep per item) or [B, L, dim] (per token, Wan 2.2)."""
        if e.dim() == 3:  # Wan 2.2: (modulation.unsqueeze(0) + e.unsqueeze(2)).chunk(2, dim=2), each squeezed
            e = [u.squeeze(2) for u in (self.modulation.unsqueeze(0) + e.unsqueeze(2)).chunk(2, dim=2)]
        else:
            e = (self.modulation + e.unsqueeze(1)).chunk(2, dim=1)
        return self.head(self.norm(x) * (1 + e[1]) + e[0])


class MLPProj(nn.Module):
    """img_emb: the CLIP tokens [B, 257, clip_dim] to context rows [B, 257, dim]; flf2v's adds a learnt
    position to each of the 2 x 257 tokens of its two images, read as one item."""

    def __init__(self, in_dim, out_dim, flf_pos_emb=False):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))
        if flf_pos_emb:  # the original: torch.zeros(1, FIRST_LAST_FRAME_CONTEXT_TOKEN_NUMBER, 1280)
            self.emb_pos = nn.Parameter(torch.zeros(1, FLF_CONTEXT_TOKENS, in_dim))

    def forward(self, image_embeds):
        if hasattr(self, "emb_pos"):
            bs, n, d = image_embeds.shape
            image_embeds = image_embeds.view(-1, 2 * n, d)  # [2B, 257, d] (first, last of each item) -> [B, 514, d]
            image_embeds = image_embeds + self.emb_pos
        return self.proj(image_embeds)


class WanModel(nn.Module):

    def __init__(self, model_type="t2v", patch_size=(1, 2, 2), text_len=TEXT_LEN, in_dim=16, dim=2048,
                 ffn_dim=8192, freq_dim=256, text_dim=4096, out_dim=16, num_heads=16, num_layers=32, qk_norm=True,
                 cross_attn_norm=True, eps=EPS, clip_dim=CLIP_DIM):
        super().__init__()
        assert model_type in ("t2v", "i2v", "flf2v")
        self.model_type = model_type
        self.patch_size = patch_size
        self.text_len = text_len
        self.dim = dim
        self.freq_dim = freq_dim
        self.out_dim = out_dim
        self.patch_embedding = nn.Conv3d(in_dim, dim, kernel_size=patch_size, stride=patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(text_dim, dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        cross_attn_type = "t2v_cross_attn" if model_type == "t2v" else "i2v_cross_attn"
        self.blocks = nn.ModuleList([
            WanAttentionBlock(dim, ffn_dim, num_heads, qk_norm, cross_attn_norm, eps, cross_attn_type)
            for _ in range(num_layers)
        ])
        self.head = Head(dim, out_dim, patch_size, eps)
        assert (dim % num_heads) == 0 and (dim // num_heads) % 2 == 0
        self.freqs = rope_freqs(dim // num_heads)
        if model_type in ("i2v", "flf2v"):  # after head, as the original: the state dict's order
            self.img_emb = MLPProj(clip_dim, dim, flf_pos_emb=model_type == "flf2v")

    def forward(self, x, t, context, seq_len, clip_fea=None, blocks=None):
        """x: list of [C_in, F, H, W] (for i2v / flf2v the noise latent and the condition y already
        concatenated along the channels); t: [B] timesteps in [0, 1000], or [B, seq_len] (Wan 2.2: one per
        token, (f, h, w) order, then the padding's); context: list of [L_i, text_dim]
        (L_i <= 512); clip_fea: the CLIP tokens [B, 257, clip_dim] (i2v) or [2B, 257, clip_dim] (flf2v: each
        item's first and last frame) of an image model. Returns the list of [C_out, F, H, W] predictions;
        `blocks`, when a dict, gets 'blocks.N': the tokens [B, seq_len, dim] after block N."""
        if self.model_type in ("i2v", "flf2v"):
            assert clip_fea is not None  # as the original: its image cross-attention needs the image tokens
        x = [self.patch_embedding(u.unsqueeze(0)) for u in x]
        grid_sizes = torch.stack([torch.tensor(u.shape[2:], dtype=torch.long) for u in x])
        x = [u.flatten(2).transpose(1, 2) for u in x]
        seq_lens = torch.tensor([u.size(1) for u in x], dtype=torch.long)
        assert seq_lens.max() <= seq_len
        x = torch.cat([torch.cat([u, u.new_zeros(1, seq_len - u.size(1), u.size(2))], dim=1) for u in x])

        if t.dim() == 1:  # one timestep per item: e [B, dim], e0 [B, 6, dim]
            e = self.time_embedding(sinusoidal_embedding_1d(self.freq_dim, t).to(x.dtype))
            e0 = self.time_projection(e).unflatten(1, (6, self.dim))
        else:  # Wan 2.2, one per token: e [B, seq_len, dim], e0 [B, seq_len, 6, dim]
            assert t.shape == (x.size(0), seq_len), (tuple(t.shape), x.size(0), seq_len)
            # The original embeds t.flatten() in one go; here each token's column t[:, l] goes through the
            # per-item form's [B] computation, the same numbers but bit for bit the per-item form's where the
            # timesteps are equal (a GEMM's rounding depends on its row count).
            e = torch.stack([self.time_embedding(sinusoidal_embedding_1d(self.freq_dim, u).to(x.dtype))
                             for u in t.unbind(1)], dim=1)
            e0 = torch.stack([self.time_projection(u) for u in e.unbind(1)], dim=1).unflatten(2, (6, self.dim))

        context_lens = None
        context = self.text_embedding(
            torch.stack([torch.cat([u, u.new_zeros(self.text_len - u.size(0), u.size(1))]) for u in context]))
        if clip_fea is not None:
            context_clip = self.img_emb(clip_fea)  # [B, 257 (x 2), dim]
            context = torch.concat([context_clip, context], dim=1)

        for i, block in enumerate(self.blocks):
            x = block(x, e0, seq_lens, grid_sizes, self.freqs, context, context_lens)
            if blocks is not None:
                blocks["blocks.%d" % i] = x
        x = self.head(x, e)
        return self.unpatchify(x, grid_sizes)

    def unpatchify(self, x, grid_sizes):
        c = self.out_dim
        out = []
        for u, v in zip(x, grid_sizes.tolist()):
            u = u[:math.prod(v)].view(*v, *self.patch_size, c)
            u = torch.einsum("fhwpqrc->cfphqwr", u)
            u = u.reshape(c, *[i * j for i, j in zip(v, self.patch_size)])
            out.append(u)
        return out


def predict(model, x, sigma, context, context_lengths=None, blocks=None, clip_fea=None, t_tokens=None):
    """kiln's view of one evaluation: x [B, C, F, H, W] (an image model's condition concatenated along C),
    sigma [B] in [0, 1] (t = 1000 sigma), context [B, L, text_dim] of which item b's first
    context_lengths[b] rows (all when None) are its prompt, clip_fea the CLIP tokens of an image model
    ([B, 257, clip_dim] for i2v; for flf2v [2B, 257, clip_dim], each item's first then last frame, as
    Wan's clip.visual gives them for a batch of one). t_tokens, when given, replaces sigma: one sigma per
    patch token, [B, seq_len] in (f, h, w) order (Wan 2.2's per-token timesteps, t = 1000 t_tokens; TI2V's
    image-to-video gives the first latent frame's tokens 0). Returns [B, C_out, F, H, W]."""
    lengths = context_lengths or [context.shape[1]] * x.shape[0]
    seq_len = math.prod(s // p for s, p in zip(x.shape[2:], model.patch_size))
    t = sigma * 1000 if t_tokens is None else t_tokens * 1000
    out = model([u for u in x], t, [c[:n] for c, n in zip(context, lengths)], seq_len, clip_fea=clip_fea,
                blocks=blocks)
    return torch.stack(out)
