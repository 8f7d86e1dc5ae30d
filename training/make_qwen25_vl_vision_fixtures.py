#!/usr/bin/python3
"""Writes a tiny random-weight Qwen2.5-VL vision tower and its golden fixtures
for the C++ tests, computed with the PyTorch reference in
training/reference/qwen25_vl.py (transcribed from HF transformers'
modeling_qwen2_5_vl.py and the Qwen2-VL image processor), plus a Qwen2.5-VL
text-side golden (an image's rows scattered into the prompt, M-RoPE) on the
tiny Qwen2 decoder that training/make_qwen3_fixtures.py writes.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_qwen25_vl_vision_fixtures.py [--out DIR]

Tiny tower: hidden 32, 2 heads (head_dim 16), depth 4, intermediate 48,
out_hidden 24, fullatt_block_indexes [1, 3] (window attention in blocks 0 and
2, full attention in 1 and 3: llama.cpp's n_wa_pattern 2), window_size 112
(4x4 merged units), patch 14, merge 2, temporal patch 2. Weights F32.

Writes into tests/golden/models/:
  qwen25_vl_vision_tiny.safetensors   the tower's state dict with HF's /
        ComfyUI's names under `visual.` (patch_embed.proj.weight
        [32, 3, 2, 14, 14], blocks.N.{norm1,norm2,attn.qkv,attn.proj,
        mlp.gate_proj,mlp.up_proj,mlp.down_proj}, merger.{ln_q,mlp.0,mlp.2});
        header metadata clip.vision.n_wa_pattern "2" and
        clip.vision.attention.head_count "2" (llama.cpp's keys: what the
        weights cannot say; the real tower's 16 heads follow from its width)
  qwen25_vl_vision_tiny_mmproj.gguf   the same values under llama.cpp's
        mmproj names: v.patch_embd.weight / v.patch_embd.weight.1 (the Conv3d
        kernel's frame 0 / frame 1, [32, 3, 14, 14] each), v.blk.N.attn_q|k|v
        (qkv split in thirds, q first), attn_out, ln1, ln2, ffn_gate|up|down,
        v.post_ln.weight (merger.ln_q), mm.0.*, mm.2.*; all F32
  qwen25_vl_vision_tiny_io.safetensors
        image [3, 168, 224] (normalised, ~N(0, 1)), grid_thw I32 [3] = 1 12 16,
        embeds [48, 24];
        image_small [3, 56, 84] and embeds_small [6, 24] (a grid smaller than
        one window); window_index I32 [48] (HF's get_window_index for the big
        image); block.0, block.1 [192, 32] (hidden states after blocks 0 and 1,
        in HF's window-reordered row order); smart_resize I32 [k, 6] rows
        (height, width, min_pixels, max_pixels, out_h, out_w);
        llm.ids I32 [20] (vision_start 290 at 4, image pad 291 at 5..10),
        llm.image_embeds [6, 64], llm.positions I32 [3, 20] (get_rope_index with
        image_grid_thw [1, 4, 6]), llm.hidden [20, 64] (final-normed last
        hidden state, image rows scattered, M-RoPE with mrope_section [4, 6, 6])
        and llm.hidden_text_rope [20, 64] (the same inputs with positions
        0..19 on all three rows, i.e. plain RoPE)

GGUF metadata. Verified against llama.cpp (convert_hf_to_gguf.py's
Qwen2VLVisionModel and MmprojModel.set_gguf_parameters, gguf-py constants.py,
tools/mtmd/clip-impl.h and clip.cpp's load_hparams): general.architecture
"clip", general.type "mmproj", general.file_type, clip.has_vision_encoder,
clip.projector_type "qwen2.5vl_merger", clip.use_silu true,
clip.vision.{image_size (560, the converter's default when config.json has
none), patch_size, embedding_length, feed_forward_length, block_count,
projection_dim, attention.head_count, attention.layer_norm_epsilon,
image_mean, image_std, n_wa_pattern}. n_wa_pattern = fullatt_block_indexes[0]
+ 1 as the converter derives it (it rejects non-periodic index lists).
Written although llama.cpp's converter does not write them for Qwen2.5-VL:
clip.vision.window_size (112; llama.cpp's clip.cpp hard-codes 112 for this
projector, the key exists for other models) and clip.vision.spatial_merge_size
(2; clip.cpp reads it as optional with default 2); general.name and
general.alignment (32, the default) are this project's habit. Tensor names verified
against clip-impl.h (TN_PATCH_EMBD, TN_PATCH_EMBD_1, TN_ATTN_Q/K/V,
TN_ATTN_OUTPUT, TN_LN_1/2, TN_FFN_GATE/UP/DOWN, TN_LN_POST, TN_LLAVA_PROJ),
gguf-py tensor_mapping.py (visual.blocks.{bid}.norm1 -> V_ENC_INPUT_NORM,
visual.merger.ln_q -> V_POST_NORM, visual.merger.mlp.{bid} -> V_MMPROJ ...)
and the converter's qkv / Conv3d splits.

The io file is about 1.5 MB, mostly image (450 KB) and pixel_values (900 KB),
both F32 as the C++ patchifier test reads them.

Self-checks (asserted before anything is written): M-RoPE with equal rows is
plain rotate-half RoPE; the window index is a permutation; a window covering
the whole image gives full attention; with every block full attention the
window permutation does not change the output; HF's permute-window-unpermute
equals attention with an explicit same-window mask in raster order (how
llama.cpp does it); the GGUF's two 2-D patch kernels applied to the image give
the Conv3d embedding; the qwen2 stack as loaded reproduces qwen2_tiny_io's
llm.out; the real 7B tower's parameter count; two builds are bit-identical.
"""

import argparse
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_gguf  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from make_qwen3_fixtures import NO_QK_NORM  # noqa: E402
from reference import qwen25_vl as ref  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.qwen3 import Qwen3Model, rotary_cos_sin, rotate_half  # noqa: E402

SEED = 2505
NAME = "qwen25_vl_vision_tiny"
TINY = ref.VisionConfig(hidden_size=32, num_heads=2, depth=4, intermediate_size=48, out_hidden_size=24,
                        patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                        fullatt_block_indexes=[1, 3], in_channels=3)
REAL_7B = ref.VisionConfig()  # hidden 1280, heads 16, depth 32, ffn 3420, out 3584
IMAGE_HW = (168, 224)  # grid 12 x 16 patches, 6 x 8 merged: 2 x 2 windows of 4 x 4, partial at the bottom
IMAGE_SMALL_HW = (56, 84)  # grid 4 x 6, 2 x 3 merged: inside one window

# The text-side golden: qwen2_tiny (make_qwen3_fixtures.py's "qwen2" config).
QWEN2 = NO_QK_NORM["qwen2"][0]
LLM_TOKENS = 20
VISION_START_ID, IMAGE_PAD_ID, VISION_END_ID = 290, 291, 292
IMAGE_AT = 5  # the pads: positions 5..10, vision_start at 4
LLM_IMAGE_GRID = (1, 4, 6)  # 1 x 2 x 3 merged tokens
MROPE_SECTION = (4, 6, 6)  # Qwen2.5-VL-7B's [16, 24, 24] for head_dim 128, scaled to head_dim 32

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# (height, width, min_pixels, max_pixels) for the smart_resize table.
SMART_RESIZE_CASES = [
    (1024, 1024, 384 * 384, 560 * 560),
    (1024, 1024, 56 * 56, 28 * 28 * 1280),
    (384, 384, 384 * 384, 560 * 560),
    (384, 384, 56 * 56, 28 * 28 * 1280),
    (1080, 1920, 384 * 384, 560 * 560),  # wide
    (1920, 1080, 56 * 56, 28 * 28 * 1280),  # tall
    (300, 2000, 56 * 56, 28 * 28 * 1280),  # very wide
    (4000, 600, 384 * 384, 560 * 560),  # very tall, above max
    (40, 60, 384 * 384, 560 * 560),  # tiny, below min
    (30, 33, 56 * 56, 28 * 28 * 1280),  # tiny, below HF's default min
    (8000, 6000, 3136, 12845056),  # huge, above max
    (70, 126, 56 * 56, 28 * 28 * 1280),  # 2.5 and 4.5 factors: round() halves to even (56 x 112)
    (42, 98, 3136, 12845056),  # 1.5 and 3.5 factors round up to even (56 x 112)
    (224, 168, 3136, 12845056),  # already multiples of 28: unchanged
]


def log(msg):
    print(msg, flush=True)


# --- weights ------------------------------------------------------------------------------------------------


def init_value(name, shape, gen):
    """RMSNorm gammas 1 + 0.1 N(0, 1); biases 0.1 N(0, 1); matrices and the Conv3d kernel
    N(0, 1) / sqrt(fan in), so activations stay O(1)."""
    shape = tuple(shape)
    if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("ln_q.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    fan_in = int(np.prod(shape[1:]))
    return torch.randn(shape, generator=gen) * fan_in ** -0.5


def make_tower(cfg, seed):
    """(tower in float64, stored F32 state dict)."""
    tower = ref.Qwen25VLVisionTower(cfg)
    gen = torch.Generator().manual_seed(seed)
    stored = {k: init_value(k, p.shape, gen).to(torch.float32).contiguous() for k, p in tower.state_dict().items()}
    tower.load_state_dict(stored)
    return tower.double().eval(), stored


# --- llama.cpp mmproj GGUF -----------------------------------------------------------------------------------

BLOCK_NAMES = {
    "norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def mmproj_tensors(sd):
    """HF state dict (visual.*) -> [(llama.cpp name, tensor)] as convert_hf_to_gguf.py's
    Qwen2VLVisionModel.modify_tensors and tensor_mapping.py name them."""
    out = []
    for name, t in sd.items():
        assert name.startswith("visual."), name
        n = name[len("visual."):]
        if n == "patch_embed.proj.weight":
            assert t.shape[2] == 2
            out.append(("v.patch_embd.weight", t[:, :, 0]))
            out.append(("v.patch_embd.weight.1", t[:, :, 1]))
        elif n.startswith("blocks."):
            _, bid, rest = n.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            if module == "attn.qkv":
                c = t.shape[0] // 3
                for j, qkv in enumerate("qkv"):
                    out.append(("v.blk.%s.attn_%s.%s" % (bid, qkv, kind), t[j * c:(j + 1) * c]))
            else:
                out.append(("v.blk.%s.%s.%s" % (bid, BLOCK_NAMES[module], kind), t))
        elif n == "merger.ln_q.weight":
            out.append(("v.post_ln.weight", t))
        elif n.startswith("merger.mlp."):
            _, _, idx, kind = n.split(".")
            out.append(("mm.%s.%s" % (idx, kind), t))
        else:
            raise KeyError(name)
    return [(k, v.contiguous()) for k, v in sorted(out, key=lambda kv: kv[0])]


def mmproj_metadata(cfg):
    n_wa = cfg.fullatt_block_indexes[0] + 1
    assert all(b - a == n_wa for a, b in zip(cfg.fullatt_block_indexes, cfg.fullatt_block_indexes[1:]))
    return {
        "general.architecture": "clip",
        "general.type": "mmproj",
        "general.name": NAME,
        "general.file_type": 0,  # ALL_F32
        "general.alignment": export_gguf.ALIGN,
        "clip.has_vision_encoder": True,
        "clip.projector_type": "qwen2.5vl_merger",
        "clip.use_silu": True,
        "clip.vision.image_size": 560,
        "clip.vision.patch_size": cfg.patch_size,
        "clip.vision.embedding_length": cfg.hidden_size,
        "clip.vision.feed_forward_length": cfg.intermediate_size,
        "clip.vision.block_count": cfg.depth,
        "clip.vision.projection_dim": cfg.out_hidden_size,
        "clip.vision.attention.head_count": cfg.num_heads,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_mean": [float(v) for v in CLIP_MEAN],
        "clip.vision.image_std": [float(v) for v in CLIP_STD],
        "clip.vision.n_wa_pattern": n_wa,
        "clip.vision.window_size": cfg.window_size,
        "clip.vision.spatial_merge_size": cfg.spatial_merge_size,
    }


def gguf_value(v):
    """export_gguf.gguf_value plus arrays of floats (image_mean / image_std are f32 arrays)."""
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, float) for x in v):
        return export_gguf.T_ARRAY, struct.pack("<IQ", export_gguf.T_FLOAT32, len(v)) + struct.pack(
            "<%df" % len(v), *v)
    return export_gguf.gguf_value(v)


def write_gguf(path, metadata, tensors):
    """export_gguf.write_gguf's layout (GGUF v3, 32-byte alignment) with gguf_value above."""
    out = bytearray()
    out += b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        t, b = gguf_value(v)
        out += export_gguf.gguf_string(k) + struct.pack("<I", t) + b
    offset, blobs = 0, []
    for name, t in tensors:
        arr = np.ascontiguousarray(t.detach().to(torch.float32).numpy())
        ne = list(reversed(arr.shape))
        out += export_gguf.gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", export_gguf.GGML_F32, offset)
        data = arr.tobytes()
        blobs.append(data + b"\0" * export_gguf.pad(len(data)))
        offset += len(blobs[-1])
    out += b"\0" * export_gguf.pad(len(out))
    with open(path + ".tmp", "wb") as f:
        f.write(out)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


# --- self-checks that do not depend on the reference's reading of HF ----------------------------------------


def check_param_count():
    shapes = ref.vision_param_shapes(REAL_7B)
    n = sum(int(np.prod(s)) for s in shapes.values())
    h, f, o, m = 1280, 3420, 3584, 1280 * 4
    per_block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * (f * h + f) + (h * f + h)
    analytic = h * 3 * 2 * 14 * 14 + 32 * per_block + h + (m * m + m) + (o * m + o)
    assert n == analytic, (n, analytic)
    assert 670e6 < n < 680e6, n
    log("self-check: Qwen2.5-VL-7B vision tower (hidden 1280, 16 heads, depth 32, ffn 3420, out 3584): "
        "%d parameters (%.2fM), %d tensors" % (n, n / 1e6, len(shapes)))
    return n


def check_mrope_equal_rows():
    gen = torch.Generator().manual_seed(11)
    hd, n, theta = 32, 9, 1e6
    q = torch.randn(1, 4, n, hd, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, n, hd, generator=gen, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 3, 7, 7, 8, 11, 12])
    cos3, sin3 = ref.mrope_cos_sin(pos.view(1, -1).expand(3, -1), hd, theta)
    qm, km = ref.apply_multimodal_rotary_pos_emb(q, k, cos3[:, None], sin3[:, None], MROPE_SECTION)
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    assert torch.allclose(qm, q * cos + rotate_half(q) * sin, rtol=0, atol=1e-12)
    assert torch.allclose(km, k * cos + rotate_half(k) * sin, rtol=0, atol=1e-12)
    # And with different rows the sections really come from t, h, w: channel j of each half uses row
    # 0 for j < 4, row 1 for 4 <= j < 10, row 2 for 10 <= j < 16.
    pos3 = torch.stack([pos, pos + 100, pos + 1000])
    c3, _ = ref.mrope_cos_sin(pos3, hd, theta)
    sel = ref.mrope_select(c3, MROPE_SECTION)
    rows = [0] * 4 + [1] * 6 + [2] * 6
    for half in (0, hd // 2):
        for j, r in enumerate(rows):
            assert torch.equal(sel[:, half + j], c3[r, :, half + j])
    log("self-check: M-RoPE with three equal position rows == plain NeoX (rotate_half) RoPE; sections t|h|w "
        "= channels [0,4)|[4,10)|[10,16) of each half")


def masked_reference(tower, pixel_values, grid_thw):
    """An independent formulation for one image: no permutation; window attention as an explicit mask in
    raster order of the rows (tokens attend iff their merged units lie in the same window), full attention
    in fullatt blocks, merger on consecutive groups of 4 rows."""
    v = tower.visual
    c = v.cfg
    t, gh, gw = [int(x) for x in grid_thw]
    assert t == 1
    m = c.spatial_merge_size
    win = c.window_size // m // c.patch_size
    # Row r of pixel_values: merged unit u = r // 4 in raster order over (gh/m, gw/m).
    u = torch.arange(gh * gw) // (m * m)
    uh, uw = u // (gw // m), u % (gw // m)
    wid = (uh // win) * 1000 + (uw // win)
    same_window = wid[:, None] == wid[None, :]
    # Rotary angles from the patch's (row, column), recomputed from the row layout.
    i = torch.arange(gh * gw) % (m * m)
    ph, pw = uh * m + i // m, uw * m + i % m
    inv = ref.vision_inv_freq(c.head_dim)
    ang = torch.cat([ph.double()[:, None] * inv, pw.double()[:, None] * inv], -1)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    x = F.linear(pixel_values, v.patch_embed.proj.weight.reshape(c.hidden_size, -1))
    for bi, blk in enumerate(v.blocks):
        a = blk.attn
        h = blk.norm1(x)
        q, k, vv = a.qkv(h).reshape(-1, 3, a.heads, a.head_dim).permute(1, 2, 0, 3)  # [heads, n, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = q @ k.transpose(-1, -2) / math.sqrt(a.head_dim)
        if bi not in c.fullatt_block_indexes:
            s = s.masked_fill(~same_window, float("-inf"))
        o = (F.softmax(s, -1) @ vv).transpose(0, 1).reshape(x.shape[0], -1)
        x = x + a.proj(o)
        x = x + blk.mlp(blk.norm2(x))
    return v.merger(x)


def with_config(stored, cfg):
    tower = ref.Qwen25VLVisionTower(cfg)
    tower.load_state_dict(stored)
    return tower.double().eval()


def check_vision(tower, stored, pixel_values, grid_thw, image):
    v = tower.visual
    with torch.no_grad():
        out = tower(pixel_values, grid_thw)
        # Window index: a permutation of the merged units.
        wi, cu = v.get_window_index(grid_thw.view(1, 3))
        n_units = pixel_values.shape[0] // 4
        assert torch.equal(torch.sort(wi).values, torch.arange(n_units)), "window index is not a permutation"
        assert cu[-1] == pixel_values.shape[0]
        # A window covering the whole image: window attention is full attention.
        big = dict(TINY.__dict__, window_size=14 * 2 * 64)
        all_full = dict(TINY.__dict__, fullatt_block_indexes=list(range(TINY.depth)))
        out_big_window = with_config(stored, ref.VisionConfig(**big))(pixel_values, grid_thw)
        out_full = with_config(stored, ref.VisionConfig(**all_full))(pixel_values, grid_thw)
        assert torch.allclose(out_big_window, out_full, rtol=0, atol=1e-12)
        # All blocks full attention: the permutation must be undone exactly (same output, any window size).
        out_full_big = with_config(stored, ref.VisionConfig(**dict(all_full, window_size=14 * 2 * 64)))(
            pixel_values, grid_thw)
        assert torch.allclose(out_full, out_full_big, rtol=0, atol=1e-12)
        # Windows matter here.
        assert (out - out_full).abs().max() > 1e-3
        # The mask formulation in raster order gives HF's output.
        masked = masked_reference(tower, pixel_values, grid_thw)
        assert torch.allclose(masked, out, rtol=0, atol=1e-12), (masked - out).abs().max()
        # The GGUF's two 2-D kernels on the (twice repeated) image == the Conv3d embedding.
        w = stored["visual.patch_embed.proj.weight"].double()
        conv2d = F.conv2d(image[None], w[:, :, 0] + w[:, :, 1], stride=14)[0]  # [hidden, gh, gw]
        gh, gw = conv2d.shape[1:]
        conv2d = conv2d.reshape(-1, gh // 2, 2, gw // 2, 2).permute(1, 3, 2, 4, 0).reshape(gh * gw, -1)
        assert torch.allclose(conv2d, v.patch_embed(pixel_values), rtol=0, atol=1e-12)
    log("self-check: window index is a permutation; window covering the image == full attention; all-full "
        "output independent of the window permutation; HF's permuted windows == same-window mask in raster "
        "order; GGUF patch_embd + patch_embd.1 as 2-D convs == Conv3d")
    return out


def check_qwen2_reuse(model):
    io, _ = safetensors_io.load_file(os.path.join(mmf.DEFAULT_OUT, "qwen2_tiny_io.safetensors"))
    tokens = io["llm.tokens"][0].long()
    n = tokens.shape[0]
    with torch.no_grad():
        got = ref.qwen2_mrope_forward(model, tokens, torch.arange(n).view(1, -1).expand(3, -1), MROPE_SECTION)
        want, _ = model(tokens[None])
    assert torch.allclose(got, want[0], rtol=0, atol=1e-12)
    err = (got.float() - io["llm.out"][0]).abs().max()
    assert err < 1e-5, err
    cos, _ = rotary_cos_sin(n, model.head_dim, model.rope_theta, torch.float64)
    c3, _ = ref.mrope_cos_sin(torch.arange(n).view(1, -1).expand(3, -1), model.head_dim, model.rope_theta)
    assert torch.allclose(ref.mrope_select(c3, MROPE_SECTION), cos, rtol=0, atol=1e-15)
    log("self-check: the qwen2 stack with M-RoPE on positions 0..n-1 reproduces qwen2_tiny_io's llm.out")


# --- build --------------------------------------------------------------------------------------------------


def build():
    tower, stored = make_tower(TINY, SEED)
    gen = torch.Generator().manual_seed(SEED + 1000)
    image = torch.randn((3,) + IMAGE_HW, generator=gen).to(torch.float32)
    image_small = torch.randn((3,) + IMAGE_SMALL_HW, generator=gen).to(torch.float32)
    pixel_values, grid_thw = ref.image_to_pixel_values(image.double(), 14, 2, 2)
    pixel_small, grid_small = ref.image_to_pixel_values(image_small.double(), 14, 2, 2)
    assert grid_thw.tolist() == [1, 12, 16] and grid_small.tolist() == [1, 4, 6]

    io = {}
    with torch.no_grad():
        embeds = check_vision(tower, stored, pixel_values, grid_thw, image.double())
        block_outputs = [b.clone() for b in tower.visual.block_outputs]
        embeds_small = tower(pixel_small, grid_small)
        wi_small, cu_small = tower.visual.get_window_index(grid_small.view(1, 3))
        assert torch.equal(wi_small, torch.arange(6)) and sorted(set(cu_small)) == [0, 24]
        wi, cu = tower.visual.get_window_index(grid_thw.view(1, 3))
    log("window_index (big image, merged-unit order): %s" % wi.tolist())
    log("cu_window_seqlens (before unique_consecutive): %s" % cu)
    io["image"] = image
    io["grid_thw"] = grid_thw.to(torch.int32)
    io["embeds"] = mmf.f32(embeds)
    io["image_small"] = image_small
    io["embeds_small"] = mmf.f32(embeds_small)
    io["window_index"] = wi.to(torch.int32)
    io["block.0"] = mmf.f32(block_outputs[0])
    io["block.1"] = mmf.f32(block_outputs[1])

    rows = []
    for h, w, lo, hi in SMART_RESIZE_CASES:
        oh, ow = ref.smart_resize(h, w, 28, lo, hi)
        assert oh % 28 == 0 and ow % 28 == 0 and lo <= oh * ow <= hi, (h, w, lo, hi, oh, ow)
        rows.append([h, w, lo, hi, oh, ow])
    io["smart_resize"] = torch.tensor(rows, dtype=torch.int32)
    log("smart_resize cases (h, w, min, max -> out_h, out_w):")
    for r in rows:
        log("  %5d x %5d  [%8d, %8d] -> %5d x %5d" % tuple(r))

    # Text side: tiny Qwen2 with an image.
    llm = Qwen3Model(**QWEN2)
    ckpt, _ = safetensors_io.load_file(os.path.join(mmf.DEFAULT_OUT, "qwen2_tiny.safetensors"))
    llm.load_state_dict({k: v.to(torch.float32) for k, v in ckpt.items()})
    llm = llm.double().eval()
    check_qwen2_reuse(llm)
    ids = torch.randint(0, 280, (LLM_TOKENS,), generator=gen)
    ids[IMAGE_AT - 1] = VISION_START_ID
    n_img = LLM_IMAGE_GRID[0] * (LLM_IMAGE_GRID[1] // 2) * (LLM_IMAGE_GRID[2] // 2)
    ids[IMAGE_AT:IMAGE_AT + n_img] = IMAGE_PAD_ID
    ids[IMAGE_AT + n_img] = VISION_END_ID
    image_embeds = torch.randn(n_img, QWEN2["hidden"], generator=gen).to(torch.float32)
    positions = ref.get_rope_index(ids, torch.tensor([LLM_IMAGE_GRID]), IMAGE_PAD_ID, VISION_START_ID, 2)
    want_pos = [list(range(5)) + [5] * 6 + list(range(8, 17)),
                list(range(5)) + [5, 5, 5, 6, 6, 6] + list(range(8, 17)),
                list(range(5)) + [5, 6, 7, 5, 6, 7] + list(range(8, 17))]
    assert positions.tolist() == want_pos, positions.tolist()
    with torch.no_grad():
        hidden = ref.qwen2_mrope_forward(llm, ids, positions, MROPE_SECTION, image_embeds.double(), IMAGE_PAD_ID)
        plain = torch.arange(LLM_TOKENS).view(1, -1).expand(3, -1)
        hidden_text = ref.qwen2_mrope_forward(llm, ids, plain, MROPE_SECTION, image_embeds.double(), IMAGE_PAD_ID)
    # Up to the vision_start token the two position schemes agree (causal attention); after it they differ.
    assert torch.allclose(hidden[:IMAGE_AT + 1], hidden_text[:IMAGE_AT + 1], rtol=0, atol=1e-12)
    assert (hidden[IMAGE_AT + 1:] - hidden_text[IMAGE_AT + 1:]).abs().max() > 1e-3
    io["llm.ids"] = ids.to(torch.int32)
    io["llm.image_embeds"] = image_embeds
    io["llm.positions"] = positions.to(torch.int32)
    io["llm.hidden"] = mmf.f32(hidden)
    io["llm.hidden_text_rope"] = mmf.f32(hidden_text)
    log("llm.ids: %s" % ids.tolist())
    log("llm.positions: %s" % positions.tolist())
    return stored, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=mmf.DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.manual_seed(SEED)
    check_param_count()
    check_mrope_equal_rows()
    stored, io = build()
    stored2, io2 = build()
    assert sorted(stored) == sorted(stored2) and all(torch.equal(stored[k], stored2[k]) for k in stored)
    assert sorted(io) == sorted(io2) and all(torch.equal(io[k], io2[k]) for k in io)
    log("self-check: two builds from the seed are bit-identical")

    shapes = ref.vision_param_shapes(TINY)
    assert {k: tuple(v.shape) for k, v in stored.items()} == shapes

    os.makedirs(args.out, exist_ok=True)
    n_wa = str(TINY.fullatt_block_indexes[0] + 1)
    mmf.save_fixture_pair(args.out, NAME, stored, io, "training/make_qwen25_vl_vision_fixtures.py",
                          "pixel_values [patches, 3*2*14*14], embeds [merged tokens, out_hidden]",
                          {"clip.vision.n_wa_pattern": n_wa,
                           "clip.vision.attention.head_count": str(TINY.num_heads)})
    gguf_path = os.path.join(args.out, NAME + "_mmproj.gguf")
    tensors = mmproj_tensors(stored)
    write_gguf(gguf_path, mmproj_metadata(TINY), tensors)
    log("wrote %s: %d tensors, %.1f KB" % (os.path.relpath(gguf_path, mmf.ROOT), len(tensors),
                                            os.path.getsize(gguf_path) / 1e3))
    # Read the GGUF back and rebuild the HF tensors from it.
    import gguf_reader
    meta, back = gguf_reader.load(gguf_path)
    assert meta["clip.projector_type"] == "qwen2.5vl_merger" and meta["clip.vision.n_wa_pattern"] == 2
    assert all(torch.equal(back[k], v) for k, v in tensors)
    w = torch.stack([back["v.patch_embd.weight"], back["v.patch_embd.weight.1"]], dim=2)
    assert torch.equal(w, stored["visual.patch_embed.proj.weight"])
    for i in range(TINY.depth):
        for kind in ("weight", "bias"):
            qkv = torch.cat([back["v.blk.%d.attn_%s.%s" % (i, x, kind)] for x in "qkv"], 0)
            assert torch.equal(qkv, stored["visual.blocks.%d.attn.qkv.%s" % (i, kind)])
    log("GGUF read back: metadata and tensors match; q|k|v and the two patch kernels reassemble the HF tensors")


if __name__ == "__main__":
    main()
