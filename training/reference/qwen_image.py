"""PyTorch reference for Qwen-Image's diffusion transformer (Alibaba's Qwen
team, 2025), diffusers' ``QwenImageTransformer2DModel``, transcribed module by
module from github.com/huggingface/diffusers:

- ``src/diffusers/models/transformers/transformer_qwenimage.py``:
  ``get_timestep_embedding``, ``QwenTimestepProjEmbeddings``,
  ``QwenEmbedRope`` (``rope_params``, ``forward``, ``_compute_video_freqs``),
  ``apply_rotary_emb_qwen`` (the ``use_real=False`` branch the processor
  takes), ``QwenDoubleStreamAttnProcessor2_0``, ``QwenImageTransformerBlock``
  (``_modulate`` with ``modulate_index``) and
  ``QwenImageTransformer2DModel.forward`` (``zero_cond_t``);
- the modules those build on: ``models/embeddings.py`` (``Timesteps``,
  ``TimestepEmbedding``: linear_1, SiLU, linear_2),
  ``models/attention_processor.py`` (``Attention`` with
  ``added_kv_proj_dim``, ``qk_norm="rms_norm"``, ``context_pre_only=False``:
  to_q/k/v, add_q/k/v_proj, norm_q/k, norm_added_q/k, to_out.0,
  to_add_out, every projection with a bias), ``models/attention.py``
  (``FeedForward`` with ``activation_fn="gelu-approximate"``: net.0.proj,
  GELU tanh, net.2; mult 4) and ``models/normalization.py`` (``RMSNorm``,
  ``AdaLayerNormContinuous``);
- ``pipelines/qwenimage/pipeline_qwenimage_edit_plus.py``: ``_pack_latents``
  / ``_unpack_latents`` (the 2 x 2 patches, features (c, ph, pw)), the
  reference latents' tokens concatenated after the image's,
  ``img_shapes = [[(1, h/2, w/2), (1, h_i/2, w_i/2), ...]] * batch``, the
  timestep passed as ``t / 1000`` (sigma), and the prediction cut back to
  the image's tokens.

Cross-checked against ComfyUI's ``comfy/ldm/qwen_image/model.py`` and
stable-diffusion.cpp's ``qwen_image.hpp`` for the names and chunk orders.
ComfyUI differs from diffusers in two position details this reference
follows diffusers on: an odd side's positions run from -(n // 2) there but
from -(n - n // 2) here (3 rows: -1, 0, 1 there, -2, -1, 0 here), and its
text positions start after the image's half-extent alone, where diffusers
takes the largest half-extent over the image and every reference.

Parameter names are diffusers' (a ``transformer/`` folder's; ComfyUI's
single files prefix them with ``model.diffusion_model.``), so
``QwenImageTransformer2DModel(...).state_dict()`` has the names of
Qwen-Image's transformer. ``qwen_image_tensor_shapes(cfg)`` lists them from
the configuration alone. The RoPE tables are not parameters (diffusers keeps
them off the state dict).

The network (run it in float64 on the stored weights; diffusers computes the
timestep embedding, the RoPE angles and RMSNorm's mean square in float32,
this reference in the inputs' dtype):

- ``temb = timestep_embedder(time_proj(t))``: 256 sinusoidal features of
  ``1000 * t`` (t = sigma), ``[cos, sin]`` (flip_sin_to_cos) with
  ``f_i = exp(-ln(10000) i / 128)`` (downscale_freq_shift 0);
  ``linear_2(silu(linear_1(.)))``.
- ``img = img_in(tokens)`` (64 = 16 latent channels x 2 x 2 per token);
  ``txt = txt_in(txt_norm(context))``, txt_norm an RMSNorm over the 3584
  text features (eps 1e-6, with weight).
- Block (each stream its own weights; LayerNorms without affine, eps 1e-6):
  ``img_mod.1(silu(temb))`` and ``txt_mod.1(silu(temb))`` give 6 chunks,
  (shift, scale, gate) for the attention then for the MLP;
  ``m = LN(x) * (1 + scale) + shift``; q, k, v of the image (to_q ...) and
  of the text (add_q_proj ...), per-head RMSNorm on q and k (norm_q, norm_k,
  norm_added_q, norm_added_k, eps 1e-6), RoPE, one attention over
  ``cat(txt, img)``; ``img += gate * to_out.0(attn_img)``,
  ``txt += gate * to_add_out(attn_txt)``; ``x += gate * mlp(LN(x) * (1 +
  scale) + shift)`` with ``mlp = net.2(gelu_tanh(net.0.proj(.)))``.
- ``zero_cond_t`` (Qwen-Image-Edit-2511): the timesteps run as ``cat(t,
  0 * t)``, so ``temb`` has 2B rows; the image stream's modulation takes the
  first B rows for the image's own tokens and the last B (t = 0) for every
  reference token (``modulate_index`` 0 and 1); the text stream and the final
  layer take the first B rows.
- Final layer: ``norm_out`` is AdaLayerNormContinuous: ``linear(silu(temb))``
  chunked into (scale, shift) - scale first - and ``LN(x) * (1 + scale) +
  shift``; then ``proj_out`` to 2 x 2 x 16 features per token.
- RoPE (QwenEmbedRope, scale_rope=True, theta 10000, axes_dim (16, 56, 56)
  over (frame, row, column)): pairs (x[2j], x[2j + 1]) rotate as complex
  numbers; axis a owns its consecutive block of axes_dim[a] / 2 pairs with
  angle ``pos_a * theta ** (-2j / axes_dim[a])``. Image i of ``img_shapes``
  (0: the image, then the references) is at frame i; its row r of h at
  ``r - (h - h // 2)`` and column c of w at ``c - (w - w // 2)`` (centred).
  Text token l is at ``(s + l, s + l, s + l)`` with ``s`` the largest
  ``max(h // 2, w // 2)`` over all the images.
- No attention mask when the text has no padding (kiln's case); diffusers'
  ``encoder_hidden_states_mask`` would mask text keys.

Not transcribed: ``use_additional_t_cond`` and ``use_layer3d_rope``
(Qwen-Image-Layered), ``guidance_embeds`` (no released model has it) and the
ControlNet residuals.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
THETA = 10000
TIME_CHANNELS = 256
PATCH = 2
FF_MULT = 4  # FeedForward's default mult

# QwenImageTransformer2DModel's defaults, which are Qwen-Image's (and the
# Edit models') transformer/config.json; Edit-2511 adds zero_cond_t=True.
QWEN_IMAGE = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), zero_cond_t=False)


def qwen_image_tensor_shapes(cfg):
    """{name: shape} of a diffusers QwenImageTransformer2DModel (PyTorch [out, in] order), from the config alone."""
    D = cfg["attention_head_dim"]
    H = D * cfg["num_attention_heads"]
    M = FF_MULT * H
    C = cfg["joint_attention_dim"]
    out = cfg["patch_size"] ** 2 * cfg["out_channels"]
    s = {}

    def linear(name, n_in, n_out):
        s[name + ".weight"] = (n_out, n_in)
        s[name + ".bias"] = (n_out,)

    linear("time_text_embed.timestep_embedder.linear_1", TIME_CHANNELS, H)
    linear("time_text_embed.timestep_embedder.linear_2", H, H)
    s["txt_norm.weight"] = (C,)
    linear("img_in", cfg["in_channels"], H)
    linear("txt_in", C, H)
    for i in range(cfg["num_layers"]):
        p = "transformer_blocks.%d." % i
        for st in ("img", "txt"):
            linear(p + st + "_mod.1", H, 6 * H)
            linear(p + st + "_mlp.net.0.proj", H, M)
            linear(p + st + "_mlp.net.2", M, H)
        for proj in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            linear(p + "attn." + proj, H, H)
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            s[p + "attn." + norm + ".weight"] = (D,)
    linear("norm_out.linear", H, 2 * H)
    linear("proj_out", H, out)
    return s


# ------------------------------------------------------------ embeddings


def get_timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, scale=1,
                           max_period=10000):
    """diffusers' get_timestep_embedding, in the timesteps' dtype."""
    assert len(timesteps.shape) == 1, "Timesteps should be a 1d-array"
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=timesteps.dtype)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None] * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


class Timesteps(nn.Module):
    def __init__(self, num_channels, flip_sin_to_cos, downscale_freq_shift, scale=1):
        super().__init__()
        self.num_channels = num_channels
        self.flip_sin_to_cos = flip_sin_to_cos
        self.downscale_freq_shift = downscale_freq_shift
        self.scale = scale

    def forward(self, timesteps):
        return get_timestep_embedding(timesteps, self.num_channels, flip_sin_to_cos=self.flip_sin_to_cos,
                                      downscale_freq_shift=self.downscale_freq_shift, scale=self.scale)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, time_embed_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class QwenTimestepProjEmbeddings(nn.Module):
    def __init__(self, embedding_dim):
        super().__init__()
        self.time_proj = Timesteps(num_channels=TIME_CHANNELS, flip_sin_to_cos=True, downscale_freq_shift=0,
                                   scale=1000)
        self.timestep_embedder = TimestepEmbedding(in_channels=TIME_CHANNELS, time_embed_dim=embedding_dim)

    def forward(self, timestep, hidden_states):
        timesteps_proj = self.time_proj(timestep)
        return self.timestep_embedder(timesteps_proj.to(dtype=hidden_states.dtype))


class QwenEmbedRope(nn.Module):
    """diffusers' QwenEmbedRope: complex frequencies of positions 0..4095 (pos_freqs) and -4096..-1 (neg_freqs)
    per axis, side by side; angles in float64 (diffusers: float32)."""

    def __init__(self, theta, axes_dim, scale_rope=False, max_index=4096):
        super().__init__()
        self.theta = theta
        self.axes_dim = axes_dim
        pos_index = torch.arange(max_index)
        neg_index = torch.arange(max_index).flip(0) * -1 - 1
        self.pos_freqs = torch.cat([self.rope_params(pos_index, d, self.theta) for d in self.axes_dim], dim=1)
        self.neg_freqs = torch.cat([self.rope_params(neg_index, d, self.theta) for d in self.axes_dim], dim=1)
        self.scale_rope = scale_rope

    def rope_params(self, index, dim, theta=10000):
        assert dim % 2 == 0
        freqs = torch.outer(index.to(torch.float64),
                            1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
        return torch.polar(torch.ones_like(freqs), freqs)

    def forward(self, video_fhw, max_txt_seq_len):
        if isinstance(video_fhw, list):
            video_fhw = video_fhw[0]  # the first batch item's shapes stand for all
        if not isinstance(video_fhw, list):
            video_fhw = [video_fhw]
        vid_freqs = []
        max_vid_index = 0
        for idx, fhw in enumerate(video_fhw):
            frame, height, width = fhw
            vid_freqs.append(self._compute_video_freqs(frame, height, width, idx))
            if self.scale_rope:
                max_vid_index = max(height // 2, width // 2, max_vid_index)
            else:
                max_vid_index = max(height, width, max_vid_index)
        txt_freqs = self.pos_freqs[max_vid_index:max_vid_index + int(max_txt_seq_len), ...]
        return torch.cat(vid_freqs, dim=0), txt_freqs

    def _compute_video_freqs(self, frame, height, width, idx=0):
        seq_lens = frame * height * width
        freqs_pos = self.pos_freqs.split([x // 2 for x in self.axes_dim], dim=1)
        freqs_neg = self.neg_freqs.split([x // 2 for x in self.axes_dim], dim=1)
        freqs_frame = freqs_pos[0][idx:idx + frame].view(frame, 1, 1, -1).expand(frame, height, width, -1)
        if self.scale_rope:
            freqs_height = torch.cat([freqs_neg[1][-(height - height // 2):], freqs_pos[1][:height // 2]], dim=0)
            freqs_height = freqs_height.view(1, height, 1, -1).expand(frame, height, width, -1)
            freqs_width = torch.cat([freqs_neg[2][-(width - width // 2):], freqs_pos[2][:width // 2]], dim=0)
            freqs_width = freqs_width.view(1, 1, width, -1).expand(frame, height, width, -1)
        else:
            freqs_height = freqs_pos[1][:height].view(1, height, 1, -1).expand(frame, height, width, -1)
            freqs_width = freqs_pos[2][:width].view(1, 1, width, -1).expand(frame, height, width, -1)
        freqs = torch.cat([freqs_frame, freqs_height, freqs_width], dim=-1).reshape(seq_lens, -1)
        return freqs.clone().contiguous()


def apply_rotary_emb_qwen(x, freqs_cis):
    """apply_rotary_emb_qwen(use_real=False): x [B, S, H, D] with pairs (x[2j], x[2j+1]) as complex numbers,
    times freqs_cis [S, D/2]."""
    x_rotated = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    freqs_cis = freqs_cis.unsqueeze(1)
    x_out = torch.view_as_real(x_rotated * freqs_cis).flatten(3)
    return x_out.type_as(x)


# ------------------------------------------------------------ layers


class RMSNorm(nn.Module):
    """diffusers' RMSNorm (elementwise_affine=True): x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return hidden_states * torch.rsqrt(variance + self.eps) * self.weight


class GELU(nn.Module):
    def __init__(self, dim_in, dim_out, approximate="none"):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)
        self.approximate = approximate

    def forward(self, hidden_states):
        return F.gelu(self.proj(hidden_states), approximate=self.approximate)


class FeedForward(nn.Module):
    """FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): net = [GELU(tanh), Dropout, Linear]."""

    def __init__(self, dim, dim_out=None, mult=FF_MULT):
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = dim_out if dim_out is not None else dim
        self.net = nn.ModuleList([GELU(dim, inner_dim, approximate="tanh"), nn.Dropout(0.0),
                                  nn.Linear(inner_dim, dim_out)])

    def forward(self, hidden_states):
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


def scaled_dot_product_attention(q, k, v):
    """dispatch_attention_fn's default: q, k, v [B, S, H, D] -> [B, S, H, D], softmax(q k^T / sqrt(D)) v."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return (w @ v).transpose(1, 2)


class Attention(nn.Module):
    """The parts of diffusers' Attention the Qwen block builds (added_kv_proj_dim=dim, qk_norm="rms_norm",
    context_pre_only=False, bias=True, out_bias=True), with QwenDoubleStreamAttnProcessor2_0 as forward."""

    def __init__(self, dim, heads, dim_head, eps):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.norm_q = RMSNorm(dim_head, eps)
        self.norm_k = RMSNorm(dim_head, eps)
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.add_k_proj = nn.Linear(dim, inner)
        self.add_v_proj = nn.Linear(dim, inner)
        self.add_q_proj = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
        self.to_add_out = nn.Linear(inner, dim)
        self.norm_added_q = RMSNorm(dim_head, eps)
        self.norm_added_k = RMSNorm(dim_head, eps)

    def forward(self, hidden_states, encoder_hidden_states, image_rotary_emb=None):
        seq_txt = encoder_hidden_states.shape[1]
        img_query = self.to_q(hidden_states).unflatten(-1, (self.heads, -1))
        img_key = self.to_k(hidden_states).unflatten(-1, (self.heads, -1))
        img_value = self.to_v(hidden_states).unflatten(-1, (self.heads, -1))
        txt_query = self.add_q_proj(encoder_hidden_states).unflatten(-1, (self.heads, -1))
        txt_key = self.add_k_proj(encoder_hidden_states).unflatten(-1, (self.heads, -1))
        txt_value = self.add_v_proj(encoder_hidden_states).unflatten(-1, (self.heads, -1))

        img_query = self.norm_q(img_query)
        img_key = self.norm_k(img_key)
        txt_query = self.norm_added_q(txt_query)
        txt_key = self.norm_added_k(txt_key)

        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_query = apply_rotary_emb_qwen(img_query, img_freqs)
            img_key = apply_rotary_emb_qwen(img_key, img_freqs)
            txt_query = apply_rotary_emb_qwen(txt_query, txt_freqs)
            txt_key = apply_rotary_emb_qwen(txt_key, txt_freqs)

        # Order: [text, image]
        joint_query = torch.cat([txt_query, img_query], dim=1)
        joint_key = torch.cat([txt_key, img_key], dim=1)
        joint_value = torch.cat([txt_value, img_value], dim=1)
        joint_hidden_states = scaled_dot_product_attention(joint_query, joint_key, joint_value).flatten(2, 3)

        txt_attn_output = joint_hidden_states[:, :seq_txt, :]
        img_attn_output = joint_hidden_states[:, seq_txt:, :]
        img_attn_output = self.to_out[1](self.to_out[0](img_attn_output))
        txt_attn_output = self.to_add_out(txt_attn_output)
        return img_attn_output, txt_attn_output


class QwenImageTransformerBlock(nn.Module):
    def __init__(self, dim, num_attention_heads, attention_head_dim, eps=EPS, zero_cond_t=False):
        super().__init__()
        self.img_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim, bias=True))
        self.img_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.attn = Attention(dim, num_attention_heads, attention_head_dim, eps)
        self.img_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.img_mlp = FeedForward(dim=dim, dim_out=dim)
        self.txt_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim, bias=True))
        self.txt_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_mlp = FeedForward(dim=dim, dim_out=dim)
        self.zero_cond_t = zero_cond_t

    def _modulate(self, x, mod_params, index=None):
        shift, scale, gate = mod_params.chunk(3, dim=-1)
        if index is not None:
            # mod_params has 2 * batch rows: the first batch at t, the second at t = 0
            actual_batch = shift.size(0) // 2
            shift_0, shift_1 = shift[:actual_batch], shift[actual_batch:]
            scale_0, scale_1 = scale[:actual_batch], scale[actual_batch:]
            gate_0, gate_1 = gate[:actual_batch], gate[actual_batch:]
            index_expanded = index.unsqueeze(-1)
            shift_result = torch.where(index_expanded == 0, shift_0.unsqueeze(1), shift_1.unsqueeze(1))
            scale_result = torch.where(index_expanded == 0, scale_0.unsqueeze(1), scale_1.unsqueeze(1))
            gate_result = torch.where(index_expanded == 0, gate_0.unsqueeze(1), gate_1.unsqueeze(1))
        else:
            shift_result = shift.unsqueeze(1)
            scale_result = scale.unsqueeze(1)
            gate_result = gate.unsqueeze(1)
        return x * (1 + scale_result) + shift_result, gate_result

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, modulate_index=None):
        img_mod_params = self.img_mod(temb)
        if self.zero_cond_t:
            temb = torch.chunk(temb, 2, dim=0)[0]
        txt_mod_params = self.txt_mod(temb)
        img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)
        txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)

        img_modulated, img_gate1 = self._modulate(self.img_norm1(hidden_states), img_mod1, modulate_index)
        txt_modulated, txt_gate1 = self._modulate(self.txt_norm1(encoder_hidden_states), txt_mod1)
        img_attn_output, txt_attn_output = self.attn(img_modulated, txt_modulated, image_rotary_emb)
        hidden_states = hidden_states + img_gate1 * img_attn_output
        encoder_hidden_states = encoder_hidden_states + txt_gate1 * txt_attn_output

        img_modulated2, img_gate2 = self._modulate(self.img_norm2(hidden_states), img_mod2, modulate_index)
        hidden_states = hidden_states + img_gate2 * self.img_mlp(img_modulated2)
        txt_modulated2, txt_gate2 = self._modulate(self.txt_norm2(encoder_hidden_states), txt_mod2)
        encoder_hidden_states = encoder_hidden_states + txt_gate2 * self.txt_mlp(txt_modulated2)
        return encoder_hidden_states, hidden_states


class AdaLayerNormContinuous(nn.Module):
    """AdaLayerNormContinuous(dim, dim, elementwise_affine=False, eps=1e-6): (scale, shift) in that order."""

    def __init__(self, embedding_dim, conditioning_embedding_dim, eps):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(conditioning_embedding_dim, embedding_dim * 2, bias=True)
        self.norm = nn.LayerNorm(embedding_dim, eps, elementwise_affine=False)

    def forward(self, x, conditioning_embedding):
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class QwenImageTransformer2DModel(nn.Module):
    def __init__(self, patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), zero_cond_t=False):
        super().__init__()
        self.out_channels = out_channels or in_channels
        self.inner_dim = num_attention_heads * attention_head_dim
        self.pos_embed = QwenEmbedRope(theta=THETA, axes_dim=list(axes_dims_rope), scale_rope=True)
        self.time_text_embed = QwenTimestepProjEmbeddings(embedding_dim=self.inner_dim)
        self.txt_norm = RMSNorm(joint_attention_dim, eps=1e-6)
        self.img_in = nn.Linear(in_channels, self.inner_dim)
        self.txt_in = nn.Linear(joint_attention_dim, self.inner_dim)
        self.transformer_blocks = nn.ModuleList([
            QwenImageTransformerBlock(dim=self.inner_dim, num_attention_heads=num_attention_heads,
                                      attention_head_dim=attention_head_dim, zero_cond_t=zero_cond_t)
            for _ in range(num_layers)])
        self.norm_out = AdaLayerNormContinuous(self.inner_dim, self.inner_dim, eps=1e-6)
        self.proj_out = nn.Linear(self.inner_dim, patch_size * patch_size * self.out_channels, bias=True)
        self.zero_cond_t = zero_cond_t

    def forward(self, hidden_states, encoder_hidden_states, timestep, img_shapes, blocks=None):
        """hidden_states [B, tokens, in_channels] (the image's packed latent, then each reference's);
        encoder_hidden_states [B, T, joint_attention_dim]; timestep [B] (sigma); img_shapes as the pipelines
        give it. Returns [B, tokens, p * p * out_channels]; `blocks` (a dict) gets cat(txt, img) after each
        block under "transformer_blocks.N" and temb under "temb"."""
        hidden_states = self.img_in(hidden_states)
        timestep = timestep.to(hidden_states.dtype)
        if self.zero_cond_t:
            timestep = torch.cat([timestep, timestep * 0], dim=0)
            modulate_index = torch.tensor(
                [[0] * math.prod(sample[0]) + [1] * sum([math.prod(s) for s in sample[1:]]) for sample in img_shapes],
                dtype=torch.int)
        else:
            modulate_index = None
        encoder_hidden_states = self.txt_in(self.txt_norm(encoder_hidden_states))
        text_seq_len = encoder_hidden_states.shape[1]
        temb = self.time_text_embed(timestep, hidden_states)
        image_rotary_emb = self.pos_embed(img_shapes, max_txt_seq_len=text_seq_len)
        for i, block in enumerate(self.transformer_blocks):
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb,
                                                         image_rotary_emb, modulate_index)
            if blocks is not None:
                blocks["transformer_blocks.%d" % i] = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        if self.zero_cond_t:
            temb = temb.chunk(2, dim=0)[0]
        if blocks is not None:
            blocks["temb"] = temb
        hidden_states = self.norm_out(hidden_states, temb)
        return self.proj_out(hidden_states)


# ------------------------------------------------------------ the pipeline's side


def pack_latents(latents):
    """_pack_latents on a one-frame latent [B, C, H, W] -> [B, (H/2)(W/2), C * 4], features (c, ph, pw)."""
    B, C, H, W = latents.shape
    latents = latents.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(B, (H // 2) * (W // 2), C * 4)


def unpack_latents(latents, H, W):
    """_unpack_latents for a latent H x W -> [B, C, H, W] (the frame axis of the pipeline's 5-D latent dropped)."""
    B, _, channels = latents.shape
    latents = latents.view(B, H // 2, W // 2, channels // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return latents.reshape(B, channels // 4, H, W)


def image_shapes(x, refs):
    """One batch item's img_shapes entry: (frame, rows, columns) in patches of the image, then each reference."""
    return [(1, t.shape[2] // PATCH, t.shape[3] // PATCH) for t in [x] + list(refs)]


def predict(model, x, context, sigma, refs=(), blocks=None):
    """One transformer call as QwenImageEditPlusPipeline makes it (QwenImagePipeline without refs): x [B, 16, H, W],
    refs [B, 16, h_i, w_i] each, context [B, T, width], sigma [B] -> the velocity [B, 16, H, W]."""
    tokens = pack_latents(x)
    n = tokens.shape[1]
    if refs:
        tokens = torch.cat([tokens] + [pack_latents(r) for r in refs], dim=1)
    out = model(tokens, context, sigma, [image_shapes(x, refs)] * x.shape[0], blocks)
    return unpack_latents(out[:, :n], x.shape[2], x.shape[3])


def rope_freqs(model, x, refs, txt_len):
    """The complex RoPE factor of every token in kiln's order (text, image, references): [tokens, head_dim / 2]."""
    vid, txt = model.pos_embed([image_shapes(x, refs)], max_txt_seq_len=txt_len)
    return torch.cat([txt, vid], dim=0)
