"""PyTorch reference for SDXL's conditioning vector ``y`` (the UNet's label_emb
input), as sgm's GeneralConditioner builds it for sd_xl_base: the "vector"
outputs of its embedders concatenated in order,

  embedders.1  FrozenOpenCLIPEmbedder2     pooled bigG output @ text_projection (1280)
  embedders.2  ConcatTimestepEmbedderND    original_size_as_tuple (h, w)       (2 x 256)
  embedders.3  ConcatTimestepEmbedderND    crop_coords_top_left (top, left)    (2 x 256)
  embedders.4  ConcatTimestepEmbedderND    target_size_as_tuple (h, w)         (2 x 256)

1280 + 6 * 256 = 2816 (adm_in_channels). ConcatTimestepEmbedderND flattens the
[b, 2] numbers, embeds each with Timestep(outdim) (= timestep_embedding:
cat([cos, sin]) of v * exp(-ln(10000) i / half)), and lays each number's
embedding after the previous one's ("(b d) d2 -> b (d d2)").

Computed in float64 here (sgm computes the sinusoid in float32).
"""

import torch

from .unet import timestep_embedding


def concat_timestep_embedding(values, outdim):
    """values: [B, D] -> [B, D * outdim] (ConcatTimestepEmbedderND)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim == 1:
        values = values[:, None]
    b, d = values.shape
    emb = timestep_embedding(values.reshape(b * d), outdim)
    return emb.reshape(b, d * outdim)


def sdxl_vector(pooled, original_size, crop_top_left, target_size, outdim=256):
    """pooled: [B, P]; the sizes: [B, 2] (or one pair for every prompt).
    Returns [B, P + 6 * outdim]."""
    pooled = torch.as_tensor(pooled, dtype=torch.float64)
    b = pooled.shape[0]
    parts = [pooled]
    for pair in (original_size, crop_top_left, target_size):
        pair = torch.as_tensor(pair, dtype=torch.float64)
        if pair.ndim == 1:
            pair = pair[None].expand(b, 2)
        parts.append(concat_timestep_embedding(pair, outdim))
    return torch.cat(parts, dim=1)
