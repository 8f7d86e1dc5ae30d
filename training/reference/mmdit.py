"""PyTorch reference for SD3's and SD3.5's MMDiT (Stability AI), written from
Stability's own inference code, github.com/Stability-AI/sd3.5:

- ``mmditx.py``: MMDiTX (PatchEmbed, the cropped position embedding,
  TimestepEmbedder, VectorEmbedder, DismantledBlock with pre_attention /
  post_attention and the MMDiT-X pair pre_attention_x / post_attention_x,
  block_mixing, JointBlock, FinalLayer, unpatchify, layer_drops);
- ``sd3_infer.py``: the configurations (``CONFIGS``: shift 3, SD3.5 Large cfg
  4.5, Large Turbo cfg 1 and 4 steps, Medium cfg 5 with skip-layer guidance
  on layers 7, 8, 9) and ``get_cond``, the conditioning: CLIP-L's and
  CLIP-G's penultimate hidden states side by side, padded with zeros to T5's
  4096 features and joined with T5-XXL's states along the token axis; the
  pooled vector CLIP-L's pooled output then CLIP-G's projected one (2048).

Parameter names are Stability's (``model.diffusion_model.`` stripped), so
``MMDiT(...).state_dict()`` has the names of ``sd3.5_large.safetensors``'s
DiT. ``sd3_tensor_shapes(cfg)`` lists them from the configuration alone.

The network (run it in float64 on the stored weights):

- ``hidden = x_embedder.proj`` (a p x p convolution of stride p; p = 2) of
  the latent, plus the position embedding ``pos_embed`` [1, M*M, hidden]
  cropped to the image's h x w patches around the centre
  (top = (M - h) // 2, left = (M - w) // 2).
- ``c = t_embedder(t) + y_embedder(y)``, t = sigma * 1000, the sinusoidal
  embedding ``cat([cos, sin])`` of 256 features with ``f_i = exp(-ln(10000)
  i / 128)``, each embedder ``mlp.2(silu(mlp.0(.)))``.
- ``context = context_embedder(context)`` (a linear layer from 4096).
- Joint block i (heads = depth in Stability's models, head width 64; in
  SD3.5 q and k are RMS-normed per head, ``attn.ln_q`` / ``attn.ln_k``, eps
  1e-6): each stream's ``adaLN_modulation.1(silu(c))`` chunked into (shift,
  scale, gate) x (attention, MLP); ``qkv`` of ``(1 + scale) * LN(x) + shift``
  (LN without affine, eps 1e-6), q, k, v the first, second and third
  ``hidden`` rows; one attention over cat(context, x) (no position
  encoding: the position embedding was added once); each stream
  ``x += gate * proj(attn)``, ``x += gate * fc2(gelu_tanh(fc1((1 + scale)
  * LN(x) + shift)))``.
- The last block's context stream is "pre only": two chunks (shift, scale),
  only q, k, v; the context is not used afterwards.
- MMDiT-X (SD3.5 Medium, ``x_block_self_attn_layers``): the x stream of
  those blocks has nine chunks; a second attention ``attn2`` over x alone
  from the same LN(x) with its own shift and scale, added with its own gate
  after the joint attention's, before the MLP.
- Final layer: ``(1 + scale) * LN(x) + shift`` (two chunks of
  ``adaLN_modulation.1(silu(c))``: shift first), then ``linear`` to
  p * p * channels features per token in the order (p, q, c), unpatchified
  to [B, C, H, W].
- Skip-layer guidance drops whole joint blocks (``layer_drops``).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Stability's models: depth (blocks = heads), pos_embed_max_size, MMDiT-X layers.
SD3_MEDIUM = dict(depth=24, pos_embed_max_size=192, qk_norm=False, x_block_self_attn_layers=())
SD35_LARGE = dict(depth=38, pos_embed_max_size=192, qk_norm=True, x_block_self_attn_layers=())
SD35_MEDIUM = dict(depth=24, pos_embed_max_size=384, qk_norm=True, x_block_self_attn_layers=tuple(range(13)))
HEAD_DIM = 64  # "apply magic --> this defines a head_size of 64"
CONTEXT_DIM = 4096  # T5-XXL's width; CLIP-L + CLIP-G (2048) are padded to it
ADM_DIM = 2048  # pooled CLIP-L (768) + CLIP-G (1280)
EPS = 1e-6


def real_config(model):
    depth = model["depth"]
    return dict(model, hidden=HEAD_DIM * depth, heads=depth, in_channels=16, patch=2, context_dim=CONTEXT_DIM,
                adm_dim=ADM_DIM, mlp_ratio=4.0)


def timestep_embedding(t, dim=256, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half).to(t.dtype)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],), eps=EPS)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def attention(q, k, v, heads):
    B, L, D = q.shape
    q, k, v = (t.view(B, -1, heads, D // heads).transpose(1, 2) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // heads), dim=-1)
    return (w @ v).transpose(1, 2).reshape(B, -1, D)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, qk_norm, pre_only):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        if not pre_only:
            self.proj = nn.Linear(hidden, hidden)
        if qk_norm:
            self.ln_q = RMSNorm(hidden // heads)
            self.ln_k = RMSNorm(hidden // heads)
        self.qk_norm = qk_norm

    def pre_attention(self, x):
        B, L, H = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, H // self.heads).unbind(2)
        if self.qk_norm:
            q, k = self.ln_q(q), self.ln_k(k)
        return q.reshape(B, L, H), k.reshape(B, L, H), v.reshape(B, L, H)


class Mlp(nn.Module):
    def __init__(self, hidden, mlp):
        super().__init__()
        self.fc1 = nn.Linear(hidden, mlp)
        self.fc2 = nn.Linear(mlp, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DismantledBlock(nn.Module):
    def __init__(self, hidden, heads, mlp, qk_norm, pre_only=False, self_attn=False):
        super().__init__()
        self.pre_only, self.self_attn = pre_only, self_attn
        self.attn = SelfAttention(hidden, heads, qk_norm, pre_only)
        if self_attn:
            self.attn2 = SelfAttention(hidden, heads, qk_norm, False)
        if not pre_only:
            self.mlp = Mlp(hidden, mlp)
        n_mods = 9 if self_attn else (2 if pre_only else 6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, n_mods * hidden))

    def pre_attention(self, x, c):
        """q, k, v of the joint attention, and what post_attention needs."""
        mods = self.adaLN_modulation(c).chunk(9 if self.self_attn else (2 if self.pre_only else 6), dim=1)
        normed = layer_norm(x)
        qkv = self.attn.pre_attention(modulate(normed, mods[0], mods[1]))
        if self.pre_only:
            return qkv, None, None
        qkv2 = self.attn2.pre_attention(modulate(normed, mods[6], mods[7])) if self.self_attn else None
        return qkv, qkv2, (x, mods)

    def post_attention(self, attn, attn2, state):
        x, mods = state
        x = x + mods[2][:, None] * self.attn.proj(attn)
        if self.self_attn:
            x = x + mods[8][:, None] * self.attn2.proj(attn2)
        return x + mods[5][:, None] * self.mlp(modulate(layer_norm(x), mods[3], mods[4]))


class JointBlock(nn.Module):
    def __init__(self, hidden, heads, mlp, qk_norm, pre_only, self_attn):
        super().__init__()
        self.heads = heads
        self.context_block = DismantledBlock(hidden, heads, mlp, qk_norm, pre_only=pre_only)
        self.x_block = DismantledBlock(hidden, heads, mlp, qk_norm, self_attn=self_attn)

    def forward(self, context, x, c):
        c_qkv, _, c_state = self.context_block.pre_attention(context, c)
        x_qkv, x_qkv2, x_state = self.x_block.pre_attention(x, c)
        T = context.shape[1]
        attn = attention(*(torch.cat([a, b], dim=1) for a, b in zip(c_qkv, x_qkv)), self.heads)
        attn2 = attention(*x_qkv2, self.heads) if x_qkv2 is not None else None
        context = None if self.context_block.pre_only else self.context_block.post_attention(attn[:, :T], None,
                                                                                            c_state)
        return context, self.x_block.post_attention(attn[:, T:], attn2, x_state)


class Embedder(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, x):
        return self.mlp(x)


class PatchEmbed(nn.Module):
    def __init__(self, channels, hidden, patch):
        super().__init__()
        self.proj = nn.Conv2d(channels, hidden, patch, stride=patch)


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, channels):
        super().__init__()
        self.linear = nn.Linear(hidden, patch * patch * channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(layer_norm(x), shift, scale))


class MMDiT(nn.Module):
    def __init__(self, depth, hidden, heads, in_channels=16, patch=2, context_dim=CONTEXT_DIM, adm_dim=ADM_DIM,
                 pos_embed_max_size=192, qk_norm=True, x_block_self_attn_layers=(), mlp_ratio=4.0):
        super().__init__()
        self.patch, self.channels, self.max_size = patch, in_channels, pos_embed_max_size
        mlp = int(hidden * mlp_ratio)
        self.x_embedder = PatchEmbed(in_channels, hidden, patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_embed_max_size ** 2, hidden))
        self.t_embedder = Embedder(256, hidden)
        self.y_embedder = Embedder(adm_dim, hidden)
        self.context_embedder = nn.Linear(context_dim, hidden)
        self.joint_blocks = nn.ModuleList(
            JointBlock(hidden, heads, mlp, qk_norm, pre_only=i == depth - 1, self_attn=i in x_block_self_attn_layers)
            for i in range(depth))
        self.final_layer = FinalLayer(hidden, patch, in_channels)

    def cropped_pos_embed(self, h, w):
        M = self.max_size
        top, left = (M - h) // 2, (M - w) // 2
        grid = self.pos_embed.view(1, M, M, -1)[:, top:top + h, left:left + w, :]
        return grid.reshape(1, h * w, -1)

    def forward(self, x, sigma, y, context, layer_drops=(), blocks=None):
        """x [B, C, H, W], sigma [B] in [0, 1], y [B, adm], context [B, T, 4096] -> [B, C, H, W].
        `blocks`, a dict, receives each joint block's output: cat(context, x) along the tokens, x
        alone after the last (whose context stream ends in its attention)."""
        B, C, H, W = x.shape
        p = self.patch
        h, w = H // p, W // p
        tokens = self.x_embedder.proj(x).flatten(2).transpose(1, 2) + self.cropped_pos_embed(h, w)
        c = self.t_embedder(timestep_embedding(sigma * 1000)) + self.y_embedder(y)
        context = self.context_embedder(context)
        for i, block in enumerate(self.joint_blocks):
            if i in layer_drops:
                continue
            context, tokens = block(context, tokens, c)
            if blocks is not None:
                blocks["joint_blocks.%d" % i] = tokens if context is None else torch.cat([context, tokens], dim=1)
        out = self.final_layer(tokens, c).view(B, h, w, p, p, C)
        return torch.einsum("nhwpqc->nchpwq", out).reshape(B, C, H, W)


def sd3_tensor_shapes(cfg):
    """{name: shape} of an SD3 / SD3.5 DiT (PyTorch order, no prefix), from the configuration alone."""
    H, C, p, depth = cfg["hidden"], cfg["in_channels"], cfg["patch"], cfg["depth"]
    M, D = int(H * cfg.get("mlp_ratio", 4.0)), H // cfg["heads"]
    s = {"x_embedder.proj.weight": (H, C, p, p), "x_embedder.proj.bias": (H,),
         "pos_embed": (1, cfg["pos_embed_max_size"] ** 2, H),
         "context_embedder.weight": (H, cfg["context_dim"]), "context_embedder.bias": (H,),
         "final_layer.linear.weight": (p * p * C, H), "final_layer.linear.bias": (p * p * C,),
         "final_layer.adaLN_modulation.1.weight": (2 * H, H), "final_layer.adaLN_modulation.1.bias": (2 * H,)}
    for e, dim in (("t_embedder", 256), ("y_embedder", cfg["adm_dim"])):
        s.update({e + ".mlp.0.weight": (H, dim), e + ".mlp.0.bias": (H,), e + ".mlp.2.weight": (H, H),
                  e + ".mlp.2.bias": (H,)})

    def attn(prefix, pre_only):
        a = {prefix + ".qkv.weight": (3 * H, H), prefix + ".qkv.bias": (3 * H,)}
        if not pre_only:
            a.update({prefix + ".proj.weight": (H, H), prefix + ".proj.bias": (H,)})
        if cfg["qk_norm"]:
            a.update({prefix + ".ln_q.weight": (D,), prefix + ".ln_k.weight": (D,)})
        return a

    for i in range(depth):
        for stream in ("context_block", "x_block"):
            b = "joint_blocks.%d.%s." % (i, stream)
            pre_only = stream == "context_block" and i == depth - 1
            self_attn = stream == "x_block" and i in cfg["x_block_self_attn_layers"]
            mods = 9 if self_attn else (2 if pre_only else 6)
            s.update({b + "adaLN_modulation.1.weight": (mods * H, H), b + "adaLN_modulation.1.bias": (mods * H,)})
            s.update(attn(b + "attn", pre_only))
            if self_attn:
                s.update(attn(b + "attn2", False))
            if not pre_only:
                s.update({b + "mlp.fc1.weight": (M, H), b + "mlp.fc1.bias": (M,), b + "mlp.fc2.weight": (H, M),
                          b + "mlp.fc2.bias": (H,)})
    return s


def sd3_context(l_hidden, g_hidden, t5_hidden, context_dim=CONTEXT_DIM):
    """sd3_infer.get_cond's join: [B, 77k, 768] and [B, 77k, 1280] side by side, zero-padded to
    context_dim, then T5's [B, T, context_dim] after them along the tokens (zeros [B, 77,
    context_dim] stand for a missing T5, as the reference did before it required T5)."""
    lg = torch.cat([l_hidden, g_hidden], dim=-1)
    lg = F.pad(lg, (0, context_dim - lg.shape[-1]))
    if t5_hidden is None:
        t5_hidden = torch.zeros(lg.shape[0], 77, context_dim, dtype=lg.dtype)
    return torch.cat([lg, t5_hidden], dim=-2)


def sd3_pooled(l_pooled, g_pooled):
    """get_cond's pooled vector: CLIP-L's pooled output then CLIP-G's projected one."""
    return torch.cat([l_pooled, g_pooled], dim=-1)
