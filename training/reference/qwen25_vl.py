"""PyTorch reference for Qwen2.5-VL's vision tower, its image preprocessing and
the multimodal RoPE of its text model, transcribed from Hugging Face
transformers (read from the source, not run):

  src/transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py
      Qwen2_5_VisionPatchEmbed, Qwen2_5_VisionRotaryEmbedding, Qwen2RMSNorm,
      Qwen2_5_VLPatchMerger, Qwen2_5_VLMLP (bias=True), rotate_half,
      apply_rotary_pos_emb_vision, Qwen2_5_VLVisionAttention (the non-flash
      path: attention run separately on every cu_seqlens segment),
      Qwen2_5_VLVisionBlock, Qwen2_5_VisionTransformerPretrainedModel
      (rot_pos_emb, get_window_index, forward), Qwen2_5_VLRotaryEmbedding,
      apply_multimodal_rotary_pos_emb, Qwen2_5_VLModel.get_rope_index (images
      only) and Qwen2_5_VLModel.forward's masked_scatter of image features
  src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py and
  src/transformers/models/qwen2_5_vl/image_processing_qwen2_5_vl.py
      smart_resize, and the patch flattening at the end of _preprocess

Everything runs in the dtype of its inputs (float64 for the goldens); there is
no flash attention, KV cache, dropout or video path.

Vision tower, for pixel_values [N, 3*2*14*14] (N = t*h*w patches, rows in the
processor's order, see image_to_pixel_values) and grid_thw [[t, h, w]]:

  x = Conv3d(pixel_values.view(N, 3, 2, 14, 14)) -> [N, hidden] (no bias)
  rotary: head_dim/2 angles per patch, the first head_dim/4 from the patch's
          row h with frequencies 10000^(-2i/(head_dim/2)), the last
          head_dim/4 from its column w with the same frequencies;
          emb = cat(angles, angles) (rotate_half layout)
  window_index: a permutation of the N/4 merged 2x2 units that lists them
          window by window (windows of window_size/merge/patch = 4x4 merged
          units, row-major over windows and row-major inside each; edge
          windows are partial); x and the rotary angles are permuted by it in
          groups of 4 rows, and cu_window_seqlens marks the window segments
  blocks: x += proj(attn(norm1 x)); x += down(silu(gate(norm2 x)) * up(norm2 x))
          attention is restricted to each cu_window_seqlens segment, except
          in fullatt_block_indexes blocks which use one segment per frame
  merger: RMSNorm(ln_q) per patch, 4 consecutive rows concatenated ->
          [N/4, 4*hidden], Linear, exact GELU, Linear -> [N/4, out_hidden]
  out = merged[argsort(window_index)]   (back to raster order of merged units)

All RMSNorms are x * rsqrt(mean(x^2) + 1e-6) * weight. Parameter names are
HF's under `visual.` (Qwen25VLVisionTower.state_dict()).
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .qwen3 import RMSNorm, rotate_half

# OpenAI CLIP's normalisation (image_utils OPENAI_CLIP_MEAN / OPENAI_CLIP_STD), the Qwen2-VL processor's default.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class VisionConfig:
    """Qwen2_5_VLVisionConfig's fields that shape the tower (Qwen2.5-VL-7B: hidden 1280, heads 16,
    depth 32, intermediate 3420, out 3584, fullatt [7, 15, 23, 31])."""
    hidden_size: int = 1280
    num_heads: int = 16
    depth: int = 32
    intermediate_size: int = 3420
    out_hidden_size: int = 3584
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: list = field(default_factory=lambda: [7, 15, 23, 31])
    in_channels: int = 3

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads


# --- preprocessing ------------------------------------------------------------------------------------------


def smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280):
    """Qwen2-VL / Qwen2.5-VL image_processing smart_resize: (height, width) -> (h_bar, w_bar), both
    multiples of `factor`, area within [min_pixels, max_pixels], aspect kept as closely as possible.

    Python's round() rounds halves to even (round(2.5) == 2). The max_pixels branch keeps at least one
    `factor` (max(factor, ...)) as newer transformers versions do; older ones lack the max(), which
    only matters for aspect ratios near the 200 limit."""
    if height < factor or width < factor:
        raise ValueError("height:%d or width:%d must be larger than factor:%d" % (height, width, factor))
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200, got %r"
                         % (max(height, width) / min(height, width)))
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def normalize_image(image_chw_01, mean=IMAGE_MEAN, std=IMAGE_STD):
    """The processor's rescale (already done: values in [0, 1]) and normalize, per channel."""
    m = torch.tensor(mean, dtype=image_chw_01.dtype)[:, None, None]
    s = torch.tensor(std, dtype=image_chw_01.dtype)[:, None, None]
    return (image_chw_01 - m) / s


def image_to_pixel_values(image_chw, patch_size=14, temporal_patch_size=2, merge_size=2):
    """The end of Qwen2VLImageProcessor._preprocess for one resized, normalised image [C, H, W]
    (H, W multiples of patch_size * merge_size).

    A single image is tiled temporal_patch_size times along time (np.tile), then
      reshape(grid_t, tps, C, gh/m, m, p, gw/m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    so the rows run over (t, block row, block column, row in block, column in block) -- every 2x2
    block of patches that the merger fuses is 4 consecutive rows -- and each row holds
    (channel, frame, y in patch, x in patch), the order of the Conv3d kernel [hidden, C, tps, p, p].

    Returns (pixel_values [grid_t*gh*gw, C*tps*p*p], grid_thw LongTensor [3])."""
    c, h, w = image_chw.shape
    assert h % (patch_size * merge_size) == 0 and w % (patch_size * merge_size) == 0, (h, w)
    patches = image_chw.unsqueeze(0).repeat(temporal_patch_size, 1, 1, 1)  # np.tile(patches, (tps, 1, 1, 1))
    grid_t = patches.shape[0] // temporal_patch_size
    gh, gw = h // patch_size, w // patch_size
    patches = patches.reshape(grid_t, temporal_patch_size, c, gh // merge_size, merge_size, patch_size,
                              gw // merge_size, merge_size, patch_size)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * gh * gw, c * temporal_patch_size * patch_size * patch_size)
    return flat, torch.tensor([grid_t, gh, gw], dtype=torch.long)


# --- vision tower -------------------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    """Qwen2_5_VisionPatchEmbed: a Conv3d with kernel = stride = (tps, p, p), no bias, on each row."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        k = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=k, stride=k, bias=False)

    def forward(self, x):
        c = self.cfg
        x = x.view(-1, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
        return self.proj(x.to(self.proj.weight.dtype)).view(-1, c.hidden_size)


def vision_inv_freq(head_dim, theta=10000.0, dtype=torch.float64):
    """Qwen2_5_VisionRotaryEmbedding(dim = head_dim // 2).inv_freq: theta^(-arange(0, dim, 2) / dim)."""
    dim = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))


class VisionAttention(nn.Module):
    """Qwen2_5_VLVisionAttention, the eager/sdpa path: one fused qkv Linear (with bias) split as
    reshape(N, 3, heads, head_dim) -- q = rows [0, hidden), k = [hidden, 2 hidden), v = the rest --
    rotary on q and k, then softmax(q k^T / sqrt(head_dim)) v separately on each segment of cu_seqlens."""

    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x, cu_seqlens, cos, sin):
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)  # each [n, heads, hd]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # apply_rotary_pos_emb_vision
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        outs = []
        bounds = [int(b) for b in cu_seqlens]
        for s, e in zip(bounds[:-1], bounds[1:]):
            qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))  # [heads, len, hd]
            scores = qs @ ks.transpose(-1, -2) * self.head_dim ** -0.5
            outs.append((F.softmax(scores, dim=-1) @ vs).transpose(0, 1))  # [len, heads, hd]
        out = torch.cat(outs, dim=0).reshape(n, -1)
        return self.proj(out)


class VisionMLP(nn.Module):
    """Qwen2_5_VLMLP(bias=True) with hidden_act silu."""

    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    """Qwen2_5_VLVisionBlock: pre-norm (RMSNorm eps 1e-6) attention and MLP with residuals."""

    def __init__(self, cfg):
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, 1e-6)
        self.norm2 = RMSNorm(cfg.hidden_size, 1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, cu_seqlens, cos, sin):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Qwen2_5_VLPatchMerger: ln_q (RMSNorm eps 1e-6 over hidden), view(-1, hidden * merge^2),
    mlp = Sequential(Linear, GELU (exact erf), Linear)."""

    def __init__(self, cfg):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.ln_q = RMSNorm(cfg.hidden_size, 1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(),
                                 nn.Linear(self.merged, cfg.out_hidden_size))

    def forward(self, x):
        return self.mlp(self.ln_q(x).view(-1, self.merged))


class VisionTransformer(nn.Module):
    """Qwen2_5_VisionTransformerPretrainedModel (HF's `visual`)."""

    def __init__(self, cfg):
        super().__init__()
        assert cfg.hidden_size % cfg.num_heads == 0 and cfg.head_dim % 4 == 0
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg)
        self.block_outputs = []  # hidden states after each block, window order, kept after forward

    def rot_pos_emb(self, grid_thw, dtype=torch.float64):
        """[N, head_dim/2] rotary angles in pixel_values row order: per patch, (h, w) of the patch
        laid out in the same 2x2-block order as the rows, then
        cat(h * inv_freq, w * inv_freq) (rotary_pos_emb_full[pos_ids].flatten(1))."""
        m = self.cfg.spatial_merge_size
        pos_ids = []
        for t, h, w in grid_thw.tolist():
            hpos = torch.arange(h).unsqueeze(1).expand(-1, w)
            hpos = hpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            wpos = torch.arange(w).unsqueeze(0).expand(h, -1)
            wpos = wpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            pos_ids.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))
        pos_ids = torch.cat(pos_ids, dim=0)
        max_grid = int(grid_thw[:, 1:].max())
        inv_freq = vision_inv_freq(self.cfg.head_dim, dtype=dtype)
        full = torch.outer(torch.arange(max_grid, dtype=dtype), inv_freq)  # Qwen2_5_VisionRotaryEmbedding(max_grid)
        return full[pos_ids].flatten(1)

    def get_window_index(self, grid_thw):
        """(window_index LongTensor [N/4], cu_window_seqlens list) as HF computes them; cu_window_seqlens
        still holds the repeated bounds of empty padding windows (forward drops them with
        unique_consecutive)."""
        c = self.cfg
        window_index, cu_window_seqlens = [], [0]
        window_index_id = 0
        vit_merger_window_size = c.window_size // c.spatial_merge_size // c.patch_size
        unit = c.spatial_merge_size ** 2
        for grid_t, grid_h, grid_w in grid_thw.tolist():
            llm_h, llm_w = grid_h // c.spatial_merge_size, grid_w // c.spatial_merge_size
            index = torch.arange(grid_t * llm_h * llm_w).reshape(grid_t, llm_h, llm_w)
            # A full window of padding when the size is already a multiple (HF's formula): empty windows.
            pad_h = vit_merger_window_size - llm_h % vit_merger_window_size
            pad_w = vit_merger_window_size - llm_w % vit_merger_window_size
            nwh = (llm_h + pad_h) // vit_merger_window_size
            nww = (llm_w + pad_w) // vit_merger_window_size
            padded = F.pad(index, (0, pad_w, 0, pad_h), "constant", -100)
            padded = padded.reshape(grid_t, nwh, vit_merger_window_size, nww, vit_merger_window_size)
            padded = padded.permute(0, 1, 3, 2, 4).reshape(grid_t, nwh * nww, vit_merger_window_size,
                                                           vit_merger_window_size)
            seqlens = (padded != -100).sum([2, 3]).reshape(-1)
            padded = padded.reshape(-1)
            window_index.append(padded[padded != -100] + window_index_id)
            cu_window_seqlens.extend((seqlens.cumsum(0) * unit + cu_window_seqlens[-1]).tolist())
            window_index_id += grid_t * llm_h * llm_w
        return torch.cat(window_index, dim=0), cu_window_seqlens

    def forward(self, pixel_values, grid_thw):
        """pixel_values [N, C*tps*p*p], grid_thw LongTensor [n_images, 3] -> [N/4, out_hidden_size]
        in raster order of the merged units (HF's output order, after reverse_indices)."""
        grid_thw = torch.as_tensor(grid_thw).reshape(-1, 3).long()
        unit = self.cfg.spatial_merge_size ** 2
        x = self.patch_embed(pixel_values)
        rotary = self.rot_pos_emb(grid_thw, dtype=x.dtype)
        window_index, cu_window_seqlens = self.get_window_index(grid_thw)
        cu_window_seqlens = torch.unique_consecutive(torch.tensor(cu_window_seqlens, dtype=torch.int32))

        n = x.shape[0]
        x = x.reshape(n // unit, unit, -1)[window_index].reshape(n, -1)
        rotary = rotary.reshape(n // unit, unit, -1)[window_index].reshape(n, -1)
        emb = torch.cat((rotary, rotary), dim=-1)
        cos, sin = emb.cos(), emb.sin()

        cu_seqlens = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).cumsum(0)
        cu_seqlens = F.pad(cu_seqlens, (1, 0), value=0)

        self.block_outputs = []
        for i, blk in enumerate(self.blocks):
            bounds = cu_seqlens if i in self.cfg.fullatt_block_indexes else cu_window_seqlens
            x = blk(x, bounds, cos, sin)
            self.block_outputs.append(x)
        x = self.merger(x)
        return x[torch.argsort(window_index)]


class Qwen25VLVisionTower(nn.Module):
    """Holds the tower as `visual` so that state_dict() names are HF's / ComfyUI's
    (visual.patch_embed.proj.weight, visual.blocks.N..., visual.merger...)."""

    def __init__(self, cfg):
        super().__init__()
        self.visual = VisionTransformer(cfg)

    def forward(self, pixel_values, grid_thw):
        return self.visual(pixel_values, grid_thw)


def vision_param_shapes(cfg):
    """name -> shape of every tensor of the tower (`visual.` prefix), computed without building it."""
    h, f, o = cfg.hidden_size, cfg.intermediate_size, cfg.out_hidden_size
    merged = h * cfg.spatial_merge_size ** 2
    shapes = {"visual.patch_embed.proj.weight": (h, cfg.in_channels, cfg.temporal_patch_size,
                                                 cfg.patch_size, cfg.patch_size)}
    for i in range(cfg.depth):
        p = "visual.blocks.%d." % i
        shapes.update({
            p + "norm1.weight": (h,), p + "norm2.weight": (h,),
            p + "attn.qkv.weight": (3 * h, h), p + "attn.qkv.bias": (3 * h,),
            p + "attn.proj.weight": (h, h), p + "attn.proj.bias": (h,),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.gate_proj.bias": (f,),
            p + "mlp.up_proj.weight": (f, h), p + "mlp.up_proj.bias": (f,),
            p + "mlp.down_proj.weight": (h, f), p + "mlp.down_proj.bias": (h,),
        })
    shapes.update({
        "visual.merger.ln_q.weight": (h,),
        "visual.merger.mlp.0.weight": (merged, merged), "visual.merger.mlp.0.bias": (merged,),
        "visual.merger.mlp.2.weight": (o, merged), "visual.merger.mlp.2.bias": (o,),
    })
    return shapes


# --- text side: M-RoPE positions and the Qwen2 stack ------------------------------------------------------


def get_rope_index(input_ids, image_grid_thw, image_token_id, vision_start_token_id, spatial_merge_size=2):
    """Qwen2_5_VLModel.get_rope_index for one sequence with images only (no video, no attention mask).

    input_ids: [n] ids; image_grid_thw: [n_images, 3] (t, h, w in patches). Returns LongTensor [3, n]
    (temporal, height, width). Text runs get the same position on all three rows, continuing from
    max(previous positions) + 1; an image's t*(h/m)*(w/m) pad tokens get
    (t_index * 0, row, column) + (start of the image), where start = the position the first pad would
    have had as text, t_index * second_per_grid_t with second_per_grid_t = 0 for images."""
    ids = [int(i) for i in torch.as_tensor(input_ids).reshape(-1).tolist()]
    grid = torch.as_tensor(image_grid_thw).reshape(-1, 3).long()
    ids_t = torch.tensor(ids)
    vision_start_indices = torch.nonzero(ids_t == vision_start_token_id).reshape(-1)
    vision_start_indices = vision_start_indices[vision_start_indices + 1 < len(ids)]
    image_nums = int((ids_t[vision_start_indices + 1] == image_token_id).sum())
    pos_list = []
    st = 0
    image_index = 0
    for _ in range(image_nums):
        ed = ids.index(image_token_id, st)
        t, h, w = grid[image_index].tolist()
        image_index += 1
        llm_t, llm_h, llm_w = t, h // spatial_merge_size, w // spatial_merge_size
        text_len = ed - st
        st_idx = int(pos_list[-1].max()) + 1 if pos_list else 0
        pos_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)
        t_index = (torch.arange(llm_t).view(-1, 1).expand(-1, llm_h * llm_w) * 0).long().flatten()
        h_index = torch.arange(llm_h).view(1, -1, 1).expand(llm_t, -1, llm_w).flatten()
        w_index = torch.arange(llm_w).view(1, 1, -1).expand(llm_t, llm_h, -1).flatten()
        pos_list.append(torch.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st = ed + llm_t * llm_h * llm_w
    if st < len(ids):
        st_idx = int(pos_list[-1].max()) + 1 if pos_list else 0
        pos_list.append(torch.arange(len(ids) - st).view(1, -1).expand(3, -1) + st_idx)
    return torch.cat(pos_list, dim=1).reshape(3, -1)


def mrope_cos_sin(position_ids, head_dim, theta, dtype=torch.float64):
    """Qwen2_5_VLRotaryEmbedding (default rope): cos, sin [3, n, head_dim] for position_ids [3, n];
    row r uses positions position_ids[r], emb = cat(freqs, freqs)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = position_ids.to(torch.float64)[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def mrope_select(cs, mrope_section):
    """The section choice of apply_multimodal_rotary_pos_emb: split the head_dim channels of cs
    [3, n, head_dim] into mrope_section * 2 chunks and take chunk i from row i % 3, so each half of
    head_dim is [t: s0 | h: s1 | w: s2] -> [n, head_dim]."""
    assert sum(mrope_section) * 2 == cs.shape[-1], (mrope_section, cs.shape)
    return torch.cat([m[i % 3] for i, m in enumerate(cs.split(list(mrope_section) * 2, dim=-1))], dim=-1)


def apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    """HF's function: q, k [B, heads, n, hd]; cos, sin [3, B, n, hd]."""
    mrope_section = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(mrope_section, dim=-1))], dim=-1).unsqueeze(
        unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(mrope_section, dim=-1))], dim=-1).unsqueeze(
        unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def scatter_image_embeds(input_ids, inputs_embeds, image_embeds, image_token_id):
    """Qwen2_5_VLModel.forward's inputs_embeds.masked_scatter(image_mask, image_embeds): the rows of
    the image pad tokens are replaced, in order, by the rows of image_embeds. input_ids [n],
    inputs_embeds [n, d], image_embeds [n_pads, d]."""
    mask = torch.as_tensor(input_ids).reshape(-1) == image_token_id
    if int(mask.sum()) != image_embeds.shape[0]:
        raise ValueError("Image features and image tokens do not match: tokens: %d, features %d"
                         % (int(mask.sum()), image_embeds.shape[0]))
    mask = mask.unsqueeze(-1).expand_as(inputs_embeds)
    return inputs_embeds.masked_scatter(mask, image_embeds.to(inputs_embeds.dtype))


def qwen2_mrope_forward(model, input_ids, position_ids, mrope_section, image_embeds=None, image_token_id=None):
    """Qwen2_5_VLModel -> Qwen2_5_VLTextModel's last_hidden_state for one sequence, using the layer
    stack of reference.qwen3.Qwen3Model (built with qk_norm=False, qkv_bias=True: Qwen2's layer) with
    multimodal RoPE. The decoder layers take one cos/sin [n, head_dim] per position, so the section
    selection of apply_multimodal_rotary_pos_emb is done once here (the same per-element product as
    HF's per-layer call). position_ids [3, n]; image rows scattered in when image_embeds is given.
    Returns the final-normed hidden states [n, hidden]."""
    ids = torch.as_tensor(input_ids).reshape(-1).long()
    x = model.model.embed_tokens(ids)
    if image_embeds is not None:
        x = scatter_image_embeds(ids, x, image_embeds, image_token_id)
    cos3, sin3 = mrope_cos_sin(position_ids, model.head_dim, model.rope_theta, x.dtype)
    cos, sin = mrope_select(cos3, mrope_section), mrope_select(sin3, mrope_section)
    x = x.unsqueeze(0)
    model.layer_outputs = []
    for layer in model.model.layers:
        x = layer(x, cos, sin)
        model.layer_outputs.append(x)
    return model.model.norm(x)[0]
