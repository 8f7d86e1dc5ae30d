"""Flux.1's DiT and sampling transcribed from Black Forest Labs' original code.

A second, independent PyTorch reference for kiln's Flux goldens: it is written
from BFL's repository only (github.com/black-forest-labs/flux), module by
module and with BFL's names, and shares no code with training/reference/flux.py
(the reference kiln's Flux goldens were first computed with). Sources:

  src/flux/model.py            FluxParams, Flux
  src/flux/modules/layers.py   EmbedND, timestep_embedding, MLPEmbedder, RMSNorm, QKNorm,
                               SelfAttention, ModulationOut, Modulation, DoubleStreamBlock,
                               SingleStreamBlock, LastLayer
  src/flux/math.py             attention, rope, apply_rope
  src/flux/sampling.py         prepare (the tensor part), time_shift, get_lin_function,
                               get_schedule, denoise, unpack

The parameter names are BFL's state-dict names (the names of flux1-dev.safetensors),
so such a file loads with ``load_state_dict(strict=True)``.

Deliberate departures from BFL's code, none of which changes the math:
  * Everything computes in the dtype of the inputs and weights (float64 in kiln's
    checks). BFL computes the sinusoidal timestep embedding's arguments in float32
    (``torch.arange(..., dtype=torch.float32)``, ``t[:, None].float()``), returns
    the RoPE table as float32 (``out.float()``) and applies it in float32
    (``xq.float()``); here those casts keep the working dtype instead, unless
    ``timestep_embedding(..., bfl_float32=True)`` asks for BFL's float32 arguments.
  * einops' ``rearrange``/``repeat`` are spelled with reshape/permute/expand (each
    call site names the pattern it replaces).
  * ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch >= 2.0) is spelled
    out: softmax(q k^T / sqrt(D)) v, no mask, no dropout, which is what BFL's call
    (no mask, no scale argument) computes.
  * ``prepare`` takes the already-encoded T5 hidden states and CLIP pooled vector
    instead of the HFEmbedder modules and a prompt (conditioner.py's HFEmbedder
    returns T5's ``last_hidden_state`` and CLIP's ``pooler_output``).
  * LoRA wrappers, image-conditioning inputs (img_cond) and Kontext are left out.
"""

import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
from torch import Tensor, nn

# ---------------------------------------------------------------------------
# src/flux/math.py
# ---------------------------------------------------------------------------


def _sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention(q, k, v) without mask or dropout."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    weights = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * scale, dim=-1)
    return torch.matmul(weights, v)


def attention(q: Tensor, k: Tensor, v: Tensor, pe: Tensor) -> Tensor:
    q, k = apply_rope(q, k, pe)

    x = _sdpa(q, k, v)
    # rearrange(x, "B H L D -> B L (H D)")
    B, H, L, D = x.shape
    x = x.permute(0, 2, 1, 3).reshape(B, L, H * D)

    return x


def rope(pos: Tensor, dim: int, theta: int) -> Tensor:
    assert dim % 2 == 0
    # BFL: dtype=torch.float64 (early revisions: pos.dtype)
    scale = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    omega = 1.0 / (theta**scale)
    # torch.einsum("...n,d->...nd", pos, omega)
    out = pos.to(omega.dtype)[..., None] * omega
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    # rearrange(out, "b n d (i j) -> b n d i j", i=2, j=2)
    out = out.reshape(*out.shape[:-1], 2, 2)
    # BFL: out.float(); the table keeps float64 here.
    return out


def apply_rope(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple:
    # BFL: xq.float() / xk.float(); the working dtype here.
    xq_ = xq.reshape(*xq.shape[:-1], -1, 1, 2)
    xk_ = xk.reshape(*xk.shape[:-1], -1, 1, 2)
    freqs_cis = freqs_cis.to(xq.dtype)
    xq_out = freqs_cis[..., 0] * xq_[..., 0] + freqs_cis[..., 1] * xq_[..., 1]
    xk_out = freqs_cis[..., 0] * xk_[..., 0] + freqs_cis[..., 1] * xk_[..., 1]
    return xq_out.reshape(*xq.shape).type_as(xq), xk_out.reshape(*xk.shape).type_as(xk)


# ---------------------------------------------------------------------------
# src/flux/modules/layers.py
# ---------------------------------------------------------------------------


class EmbedND(nn.Module):
    def __init__(self, dim: int, theta: int, axes_dim: List[int]):
        super().__init__()
        self.dim = dim
        self.theta = theta
        self.axes_dim = axes_dim

    def forward(self, ids: Tensor) -> Tensor:
        n_axes = ids.shape[-1]
        emb = torch.cat(
            [rope(ids[..., i], self.axes_dim[i], self.theta) for i in range(n_axes)],
            dim=-3,
        )

        return emb.unsqueeze(1)


def timestep_embedding(t: Tensor, dim, max_period=10000, time_factor: float = 1000.0, bfl_float32: bool = False):
    """
    Create sinusoidal timestep embeddings.
    :param t: a 1-D Tensor of N indices, one per batch element.
                      These may be fractional.
    :param dim: the dimension of the output.
    :param max_period: controls the minimum frequency of the embeddings.
    :param bfl_float32: compute the arguments in float32 as BFL's code does
                      (default: in t's dtype).
    :return: an (N, D) Tensor of positional embeddings.
    """
    t = time_factor * t
    half = dim // 2
    work = torch.float32 if bfl_float32 else t.dtype
    freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=work) / half).to(t.device)

    args = t[:, None].to(work) * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    if torch.is_floating_point(t):
        embedding = embedding.to(t)
    return embedding


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim, bias=True)
        self.silu = nn.SiLU()
        self.out_layer = nn.Linear(hidden_dim, hidden_dim, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(self.silu(self.in_layer(x)))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor):
        # BFL: x.float() and back to x's dtype around the normalisation.
        rrms = torch.rsqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-6)
        return (x * rrms) * self.scale


class QKNorm(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple:
        q = self.query_norm(q)
        k = self.key_norm(k)
        return q.to(v), k.to(v)


def _split_qkv(qkv: Tensor, num_heads: int) -> tuple:
    """rearrange(qkv, "B L (K H D) -> K B H L D", K=3, H=num_heads), unpacked into q, k, v."""
    B, L, C = qkv.shape
    D = C // (3 * num_heads)
    x = qkv.reshape(B, L, 3, num_heads, D).permute(2, 0, 3, 1, 4)
    return x[0], x[1], x[2]


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(head_dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, pe: Tensor) -> Tensor:
        qkv = self.qkv(x)
        q, k, v = _split_qkv(qkv, self.num_heads)
        q, k = self.norm(q, k, v)
        x = attention(q, k, v, pe=pe)
        x = self.proj(x)
        return x


@dataclass
class ModulationOut:
    shift: Tensor
    scale: Tensor
    gate: Tensor


class Modulation(nn.Module):
    def __init__(self, dim: int, double: bool):
        super().__init__()
        self.is_double = double
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=True)

    def forward(self, vec: Tensor) -> tuple:
        out = self.lin(nn.functional.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)

        return (
            ModulationOut(*out[:3]),
            ModulationOut(*out[3:]) if self.is_double else None,
        )


class DoubleStreamBlock(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float, qkv_bias: bool = False):
        super().__init__()

        mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.num_heads = num_heads
        self.hidden_size = hidden_size
        self.img_mod = Modulation(hidden_size, double=True)
        self.img_norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.img_attn = SelfAttention(dim=hidden_size, num_heads=num_heads, qkv_bias=qkv_bias)

        self.img_norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.img_mlp = nn.Sequential(
            nn.Linear(hidden_size, mlp_hidden_dim, bias=True),
            nn.GELU(approximate="tanh"),
            nn.Linear(mlp_hidden_dim, hidden_size, bias=True),
        )

        self.txt_mod = Modulation(hidden_size, double=True)
        self.txt_norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.txt_attn = SelfAttention(dim=hidden_size, num_heads=num_heads, qkv_bias=qkv_bias)

        self.txt_norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.txt_mlp = nn.Sequential(
            nn.Linear(hidden_size, mlp_hidden_dim, bias=True),
            nn.GELU(approximate="tanh"),
            nn.Linear(mlp_hidden_dim, hidden_size, bias=True),
        )

    def forward(self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor) -> tuple:
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)

        # prepare image for attention
        img_modulated = self.img_norm1(img)
        img_modulated = (1 + img_mod1.scale) * img_modulated + img_mod1.shift
        img_qkv = self.img_attn.qkv(img_modulated)
        img_q, img_k, img_v = _split_qkv(img_qkv, self.num_heads)
        img_q, img_k = self.img_attn.norm(img_q, img_k, img_v)

        # prepare txt for attention
        txt_modulated = self.txt_norm1(txt)
        txt_modulated = (1 + txt_mod1.scale) * txt_modulated + txt_mod1.shift
        txt_qkv = self.txt_attn.qkv(txt_modulated)
        txt_q, txt_k, txt_v = _split_qkv(txt_qkv, self.num_heads)
        txt_q, txt_k = self.txt_attn.norm(txt_q, txt_k, txt_v)

        # run actual attention
        q = torch.cat((txt_q, img_q), dim=2)
        k = torch.cat((txt_k, img_k), dim=2)
        v = torch.cat((txt_v, img_v), dim=2)

        attn = attention(q, k, v, pe=pe)
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]

        # calculate the img blocks
        img = img + img_mod1.gate * self.img_attn.proj(img_attn)
        img = img + img_mod2.gate * self.img_mlp((1 + img_mod2.scale) * self.img_norm2(img) + img_mod2.shift)

        # calculate the txt blocks
        txt = txt + txt_mod1.gate * self.txt_attn.proj(txt_attn)
        txt = txt + txt_mod2.gate * self.txt_mlp((1 + txt_mod2.scale) * self.txt_norm2(txt) + txt_mod2.shift)
        return img, txt


class SingleStreamBlock(nn.Module):
    """
    A DiT block with parallel linear layers as described in
    https://arxiv.org/abs/2302.05442 and adapted modulation interface.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qk_scale: Optional[float] = None,
    ):
        super().__init__()
        self.hidden_dim = hidden_size
        self.num_heads = num_heads
        head_dim = hidden_size // num_heads
        self.scale = qk_scale or head_dim**-0.5  # unused by BFL's forward, as here

        self.mlp_hidden_dim = int(hidden_size * mlp_ratio)
        # qkv and mlp_in
        self.linear1 = nn.Linear(hidden_size, hidden_size * 3 + self.mlp_hidden_dim)
        # proj and mlp_out
        self.linear2 = nn.Linear(hidden_size + self.mlp_hidden_dim, hidden_size)

        self.norm = QKNorm(head_dim)

        self.hidden_size = hidden_size
        self.pre_norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)

        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(hidden_size, double=False)

    def forward(self, x: Tensor, vec: Tensor, pe: Tensor) -> Tensor:
        mod, _ = self.modulation(vec)
        x_mod = (1 + mod.scale) * self.pre_norm(x) + mod.shift
        qkv, mlp = torch.split(self.linear1(x_mod), [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)

        q, k, v = _split_qkv(qkv, self.num_heads)
        q, k = self.norm(q, k, v)

        # compute attention
        attn = attention(q, k, v, pe=pe)
        # compute activation in mlp stream, cat again and run second linear layer
        output = self.linear2(torch.cat((attn, self.mlp_act(mlp)), 2))
        return x + mod.gate * output


class LastLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        # BFL's order: shift first, then scale (diffusers' norm_out stores scale first).
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        x = (1 + scale[:, None, :]) * self.norm_final(x) + shift[:, None, :]
        x = self.linear(x)
        return x


# ---------------------------------------------------------------------------
# src/flux/model.py
# ---------------------------------------------------------------------------


@dataclass
class FluxParams:
    in_channels: int
    out_channels: int
    vec_in_dim: int
    context_in_dim: int
    hidden_size: int
    mlp_ratio: float
    num_heads: int
    depth: int
    depth_single_blocks: int
    axes_dim: List[int]
    theta: int
    qkv_bias: bool
    guidance_embed: bool


class Flux(nn.Module):
    """
    Transformer model for flow matching on sequences.
    """

    def __init__(self, params: FluxParams):
        super().__init__()

        self.params = params
        self.in_channels = params.in_channels
        self.out_channels = params.out_channels
        if params.hidden_size % params.num_heads != 0:
            raise ValueError(
                f"Hidden size {params.hidden_size} must be divisible by num_heads {params.num_heads}"
            )
        pe_dim = params.hidden_size // params.num_heads
        if sum(params.axes_dim) != pe_dim:
            raise ValueError(f"Got {params.axes_dim} but expected positional dim {pe_dim}")
        self.hidden_size = params.hidden_size
        self.num_heads = params.num_heads
        self.pe_embedder = EmbedND(dim=pe_dim, theta=params.theta, axes_dim=params.axes_dim)
        self.img_in = nn.Linear(self.in_channels, self.hidden_size, bias=True)
        self.time_in = MLPEmbedder(in_dim=256, hidden_dim=self.hidden_size)
        self.vector_in = MLPEmbedder(params.vec_in_dim, self.hidden_size)
        self.guidance_in = (
            MLPEmbedder(in_dim=256, hidden_dim=self.hidden_size) if params.guidance_embed else nn.Identity()
        )
        self.txt_in = nn.Linear(params.context_in_dim, self.hidden_size)

        self.double_blocks = nn.ModuleList(
            [
                DoubleStreamBlock(
                    self.hidden_size,
                    self.num_heads,
                    mlp_ratio=params.mlp_ratio,
                    qkv_bias=params.qkv_bias,
                )
                for _ in range(params.depth)
            ]
        )

        self.single_blocks = nn.ModuleList(
            [
                SingleStreamBlock(self.hidden_size, self.num_heads, mlp_ratio=params.mlp_ratio)
                for _ in range(params.depth_single_blocks)
            ]
        )

        self.final_layer = LastLayer(self.hidden_size, 1, self.out_channels)
        # Not in BFL's module: lets a check ask for BFL's float32 timestep-embedding arguments.
        self.bfl_float32_timesteps = False

    def forward(
        self,
        img: Tensor,
        img_ids: Tensor,
        txt: Tensor,
        txt_ids: Tensor,
        timesteps: Tensor,
        y: Tensor,
        guidance: Optional[Tensor] = None,
    ) -> Tensor:
        if img.ndim != 3 or txt.ndim != 3:
            raise ValueError("Input img and txt tensors must have 3 dimensions.")

        f32 = self.bfl_float32_timesteps
        # running on sequences img
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256, bfl_float32=f32))
        if self.params.guidance_embed:
            if guidance is None:
                raise ValueError("Didn't get guidance strength for guidance distilled model.")
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256, bfl_float32=f32))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(txt)

        ids = torch.cat((txt_ids, img_ids), dim=1)
        pe = self.pe_embedder(ids)

        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe)

        img = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            img = block(img, vec=vec, pe=pe)
        img = img[:, txt.shape[1] :, ...]

        img = self.final_layer(img, vec)  # (N, T, patch_size ** 2 * out_channels)
        return img


# ---------------------------------------------------------------------------
# src/flux/sampling.py
# ---------------------------------------------------------------------------


def pack(img: Tensor) -> Tensor:
    """rearrange(img, "b c (h ph) (w pw) -> b (h w) (c ph pw)", ph=2, pw=2), as in prepare."""
    b, c, hh, ww = img.shape
    h, w = hh // 2, ww // 2
    return img.reshape(b, c, h, 2, w, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, c * 4)


def prepare(txt: Tensor, vec: Tensor, img: Tensor) -> dict:
    """BFL's prepare with the encoders already run: txt is T5's last_hidden_state
    [bs, L, 4096], vec CLIP's pooler_output [bs, 768], img the noise [bs, 16, h, w]."""
    bs, c, h, w = img.shape
    if bs == 1 and txt.shape[0] > 1:
        bs = txt.shape[0]

    img = pack(img)
    if img.shape[0] == 1 and bs > 1:
        # repeat(img, "1 ... -> bs ...", bs=bs)
        img = img.expand(bs, *img.shape[1:]).contiguous()

    img_ids = torch.zeros(h // 2, w // 2, 3)
    img_ids[..., 1] = img_ids[..., 1] + torch.arange(h // 2)[:, None]
    img_ids[..., 2] = img_ids[..., 2] + torch.arange(w // 2)[None, :]
    # repeat(img_ids, "h w c -> b (h w) c", b=bs)
    img_ids = img_ids.reshape(1, (h // 2) * (w // 2), 3).expand(bs, -1, -1).contiguous()

    if txt.shape[0] == 1 and bs > 1:
        txt = txt.expand(bs, *txt.shape[1:]).contiguous()
    txt_ids = torch.zeros(bs, txt.shape[1], 3)

    if vec.shape[0] == 1 and bs > 1:
        vec = vec.expand(bs, *vec.shape[1:]).contiguous()

    return {
        "img": img,
        "img_ids": img_ids.to(img.device, img.dtype),
        "txt": txt.to(img.device),
        "txt_ids": txt_ids.to(img.device, img.dtype),
        "vec": vec.to(img.device),
    }


def time_shift(mu: float, sigma: float, t: Tensor):
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


def get_lin_function(
    x1: float = 256, y1: float = 0.5, x2: float = 4096, y2: float = 1.15
) -> Callable[[float], float]:
    m = (y2 - y1) / (x2 - x1)
    b = y1 - m * x1
    return lambda x: m * x + b


def get_schedule(
    num_steps: int,
    image_seq_len: int,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
    shift: bool = True,
) -> List[float]:
    # extra step for zero
    timesteps = torch.linspace(1, 0, num_steps + 1)  # float32, as in BFL's code

    # shifting the schedule to favor high timesteps for higher signal images
    if shift:
        # estimate mu based on linear estimation between two points
        mu = get_lin_function(y1=base_shift, y2=max_shift)(image_seq_len)
        timesteps = time_shift(mu, 1.0, timesteps)

    return timesteps.tolist()


def denoise(
    model: Flux,
    # model input
    img: Tensor,
    img_ids: Tensor,
    txt: Tensor,
    txt_ids: Tensor,
    vec: Tensor,
    # sampling parameters
    timesteps: List[float],
    guidance: float = 4.0,
    callback=None,
):
    """BFL's Euler loop on the velocity. ``callback(i, t_curr, img, pred)``, when
    given, sees every evaluation (not in BFL's code; used to record steps)."""
    # this is ignored for schnell
    guidance_vec = torch.full((img.shape[0],), guidance, device=img.device, dtype=img.dtype)
    for i, (t_curr, t_prev) in enumerate(zip(timesteps[:-1], timesteps[1:])):
        t_vec = torch.full((img.shape[0],), t_curr, dtype=img.dtype, device=img.device)
        pred = model(
            img=img,
            img_ids=img_ids,
            txt=txt,
            txt_ids=txt_ids,
            y=vec,
            timesteps=t_vec,
            guidance=guidance_vec,
        )
        if callback is not None:
            callback(i, t_curr, img, pred)

        img = img + (t_prev - t_curr) * pred

    return img


def unpack(x: Tensor, height: int, width: int) -> Tensor:
    """rearrange(x, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=ceil(height / 16),
    w=ceil(width / 16), ph=2, pw=2); height and width in pixels of BFL's 8x autoencoder."""
    h = math.ceil(height / 16)
    w = math.ceil(width / 16)
    b, n, cpp = x.shape
    assert n == h * w, (n, h, w)
    c = cpp // 4
    return x.reshape(b, h, w, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h * 2, w * 2)
