#!/usr/bin/python3
"""Writes a tiny random-weight Qwen-Image-Edit (2509 / "Plus") text side - a Qwen2.5-VL LLM, its vision tower
and a tokenizer with the vision specials - and the golden results of a whole image-edit job on it and on the
text-to-image fixture's DiT and VAE, computed with the PyTorch references in training/reference/ (no kiln code):
the end-to-end truth for kiln's Qwen-Image-Edit pipeline.

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_qwen_image_edit_fixtures.py

Reads (not copied; written by make_qwen_image_pipeline_fixtures.py, whose functions this script imports):
  tests/golden/pipeline/qwen_image_tiny/qwen_image_dit.safetensors  the DiT (diffusers' names, BF16, context
      width 48, axes_dim 4,14,14), run with zero_cond_t False and, for the *_zero_cond_t tensors, True
  tests/golden/pipeline/qwen_image_tiny/qwen_image_vae.safetensors  the Wan 2.1 VAE (8x per side)
  tests/golden/pipeline/qwen_image_tiny/tokenizer/  the tokenizer the new one extends

Writes, relative to the repository root (in tests/golden/pipeline/qwen_image_edit_tiny/):
  qwen_2.5_vl.safetensors  a new tiny Qwen2 (Qwen2.5-VL's text model: q/k/v biases, no QK norm), HF names under
      model. (embed_tokens, layers.N.*, norm; no LM head), F16: vocab 320 (the tokenizer's 289 rounded up to a
      multiple of 32), hidden 48, 3 layers, 4 heads and 2 K/V heads of 32, FFN 96, theta 1e6, eps 1e-6;
      metadata qwen2.attention.key_length "32", qwen2.rope.freq_base "1000000.0" and
      qwen2.rope.dimension_sections "4,6,6" (Qwen2.5-VL's mrope_section [16, 24, 24] for head_dim 128, scaled
      to head_dim 32: each half of a head is t | h | w = channels [0, 4) | [4, 10) | [10, 16))
  qwen_2.5_vl_vision.safetensors  a new tiny Qwen2.5-VL vision tower (reference/qwen25_vl.py), HF names under
      visual., F32: width 32, 2 heads of 16, 4 blocks (window attention in 0 and 2, full in 1 and 3), MLP 48,
      patch 14 x 14 x 2 frames, merge 2, window 112 (4 x 4 merged units), out width 48 = the LLM's; weights as
      make_qwen25_vl_vision_fixtures.make_tower; metadata clip.vision.n_wa_pattern "2" and
      clip.vision.attention.head_count "2" (what the weights cannot say)
  (ComfyUI's qwen_2.5_vl_7b.safetensors holds both in one file, model.* and visual.*: the test joins the two
  files itself rather than keep a third copy of their bytes)
  tokenizer/  qwen_image_tiny/tokenizer with <|vision_start|> 286, <|vision_end|> 287, <|image_pad|> 288 added
      to tokenizer_config.json's added_tokens_decoder (special true, like <|endoftext|> 283, <|im_start|> 284,
      <|im_end|> 285); vocab.json and merges.txt unchanged
  ref.png  the reference image: 64 x 48 (W x H) RGB, seeded (gradients, an orange cat's head, a blue square,
      a little noise)
  qwen_image_edit_tiny_job.safetensors  the job (F32 but the I32 ids and positions and the U8 image):
      vl.size I32 [2] (width, height of the VL image: 448, 308), vl.image U8 [3, 308, 448] (the VL image after
      both resizes, 0..255: the tower sees (vl.image * (1/255) - mean) / std, in float32, per channel, with
      OpenAI CLIP's mean 0.48145466 0.4578275 0.40821073 and std 0.26862954 0.26130258 0.27577711; stored as
      U8 rather than the F32 pixels to keep the folder near its size budget: exact, and 1/4 the bytes),
      vl.rows [176, 48] (the tower's output, merged tokens in raster order), llm.tokens I32 [1, n],
      llm.positions I32 [3, n] (M-RoPE t, h, w), llm.dropped [1], llm.hidden [1, n - dropped, 48] (the context),
      llm.uncond_tokens, llm.uncond_positions, llm.uncond_dropped, llm.uncond_hidden (the negative prompt ""),
      ref.latent [1, 16, 6, 8] (the reference's normalised VAE mean), noise [1, 16, 6, 8], sigmas [4],
      velocity0 [1, 16, 6, 8] (the guided velocity of the first step), latent [1, 16, 6, 8] (final),
      image [1, 3, 48, 64] (decoded, in [-1, 1], not clamped); velocity0_zero_cond_t and image_zero_cond_t:
      the same job with the DiT run with zero_cond_t (Qwen-Image-Edit-2511's marker)

The job (kiln follows diffusers' QwenImageEditPlusPipeline (pipelines/qwenimage/pipeline_qwenimage_edit_plus.py)
for the prompt and the VL image, sd-cli for the VAE reference and the sampling): prompt "make the cat blue",
negative prompt "", one reference image ref.png, output 64 x 48, seed 11, --rng cuda, 3 steps, euler, cfg 2.5,
--flow-shift 3, zero_cond_t False.
  1. the VAE reference (deliberately sd-cli's size rule, not diffusers'): sd-cli resizes a reference to about the
     output's area, at most 1024 x 1024, aspect kept, sides multiples of 16; a 64 x 48 reference for a 64 x 48
     output is kept as it is. (diffusers resizes every reference to the output's size, vae_width, vae_height =
     width, height, with LANCZOS: the same 64 x 48 here; its default output size, when none is given, is
     calculate_dimensions(1024 * 1024, the last image's ratio) = 1184 x 896 for this one.)
     Pixels / 127.5 - 1, the VAE's encode, the latent distribution's mean, normalised per channel as the VAE
     does ((mu - mean) / std with Wan 2.1's statistics; diffusers' _encode_vae_image with sample_mode "argmax").
     Packed into 2 x 2 patches and given to the DiT after the image's tokens (prepare_latents,
     torch.cat([latents, image_latents], dim=1)) with img_shapes [(1, 3, 4), (1, 3, 4)]: the reference is at
     frame index 1 (QwenEmbedRope._compute_video_freqs' idx), its rows and columns centred like the image's; the
     text's positions start after the largest half-extent over both (2). The prediction is cut back to the
     image's tokens.
  2. the VL image (QwenImageEditPlusPipeline.__call__ and transformers' Qwen2VLImageProcessor._preprocess):
     (cw, ch) = calculate_dimensions(384 * 384, 64 / 48) (width = sqrt(area * ratio), height = width / ratio
     from the unrounded width, each round(x / 32) * 32 with Python's round, which takes halves to even) =
     (448, 320); VaeImageProcessor.resize = PIL resize to (448, 320) with LANCZOS; then smart_resize(320, 448,
     factor 28, min_pixels 3136, max_pixels 12845056) = (308, 448) and image_transforms.resize = PIL resize to
     (448, 308) with BICUBIC on the uint8 image (uint8 out); rescale (x.astype(float64) * (1/255), then float32),
     normalise ((x - mean) / std in float32); patches as _preprocess lays them out (the frame repeated twice);
     the tower (reference/qwen25_vl.py: Qwen2_5_VisionTransformerPretrainedModel.forward) gives N = 11 x 16 =
     176 rows [176, 48] for the grid (1, 22, 32).
  3. the prompt (_get_qwen_prompt_embeds): prompt_template_encode with "Picture 1: <|vision_start|>
     <|image_pad|><|vision_end|>" + prompt in its {} (img_prompt_template), the processor expanding the one
     <|image_pad|> to N of them:
        "<|im_start|>system\\nDescribe the key features of the input image (color, shape, size, texture, objects,
        background), then explain how the user's text instruction should alter or modify the image. Generate a
        new image that meets the user's requirements while maintaining consistency with the original input where
        appropriate.<|im_end|>\\n<|im_start|>user\\nPicture 1: <|vision_start|>" + "<|image_pad|>" * N
        + "<|vision_end|>" + prompt + "<|im_end|>\\n<|im_start|>assistant\\n",
     tokenized whole (the six specials cut out first, then make_z_image_pipeline_fixtures.py's Qwen2
     pre-tokenizer and byte-level BPE on tokenizer/merges.txt, no BOS). diffusers drops a fixed
     prompt_template_encode_start_idx = 64, the token count of the system part (everything up to and including
     "<|im_start|>user\\n") under Qwen's real tokenizer (3 specials and 61 pre-tokenizer pieces, each a word of
     Qwen's vocabulary: checked here by counting the pieces); this tokenizer has few merges, so its system part
     is 294 tokens: the count dropped here is the system part's own token count, checked to be a prefix of the
     whole prompt's ids.
  4. the LLM (Qwen2_5_VLModel.forward, get_rope_index, Qwen2_5_VLTextModel): the token embeddings with the image
     pads' rows replaced in order by the tower's rows (masked_scatter; the LLM reads the stored F32 rows);
     M-RoPE positions from get_rope_index: text 0, 1, ... on all three axes up to the pads, the pads at
     (s, s + row, s + column) over the 11 x 16 merged grid with s the first pad's index, the text after from
     max + 1; causal, no padding; hidden_states[-1] (the final-normed output of the last layer); the first
     `dropped` rows cut -> the context.
  5. the negative prompt "" the same way, with the same image (diffusers encodes it with condition_images too):
     its own length.
  6. sampling as make_qwen_image_pipeline_fixtures.py: noise = webui's Philox randn (kiln's --rng cuda) of the
     16 x 6 x 8 latent, seed 11; sigmas from t = linspace(999, 0, 3), s = (t + 1) / 1000, 3 s / (1 + 2 s), then 0;
     the DiT (reference/qwen_image.py's predict, the reference latent's tokens after the image's on every pass)
     at timestep sigma, cond and uncond each with its own context length, v = u + 2.5 (c - u) (sd-cli's plain
     guidance: diffusers' true-CFG also rescales the guided velocity to the cond velocity's norm per token, which
     sd-cli and kiln do not); Euler x <- x + (sigma_next - sigma) v from x = noise * sigma_0; decode with the
     VAE's own normalisation, one frame.

Self-checks (asserted before anything is kept): calculate_dimensions against sizes worked out by hand and the
same arithmetic in 60-digit decimals, for several ratios (printed with their VL sizes and token counts); the
tokenizer's specials are single tokens and the templated ids equal the parts' ids one after the other; the
tower's output equals an explicit same-window mask formulation, and its rows number the image pads N; the LLM's
system-part rows equal the plain causal Qwen2 on those tokens; zeroing the image rows changes the context; the
reference latent changes the velocity; zero_cond_t changes velocity0 and the image; two builds from the seed
write byte-identical files.

Every stage runs in float64 on the stored weights (the VL image's rescale and normalisation in float32, as the
processor does); deterministic (byte-identical files).
"""

import io as iolib
import json
import math
import os
import shutil
import sys
import tempfile
from decimal import ROUND_HALF_EVEN, Decimal, getcontext

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import make_qwen25_vl_vision_fixtures as mvl  # noqa: E402
import make_qwen3_fixtures as mq  # noqa: E402
import make_qwen_image_pipeline_fixtures as qp  # noqa: E402
import make_z_image_pipeline_fixtures as mzp  # noqa: E402
from reference import qwen25_vl as vl  # noqa: E402
from reference import qwen_image as ref  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.qwen3 import Qwen3Model  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "qwen_image_edit_tiny")
T2I_PARTS = qp.PARTS  # tests/golden/pipeline/qwen_image_tiny: its DiT, VAE and tokenizer are read, not copied
DIT_PATH = os.path.join(T2I_PARTS, "qwen_image_dit.safetensors")
VAE_PATH = os.path.join(T2I_PARTS, "qwen_image_vae.safetensors")
TOKENIZER_SOURCE = os.path.join(T2I_PARTS, "tokenizer")
JOB = "qwen_image_edit_tiny_job.safetensors"
REF_PNG = "ref.png"
LLM_FILE = "qwen_2.5_vl.safetensors"
VISION_FILE = "qwen_2.5_vl_vision.safetensors"
SEED = 5300

PROMPT = "make the cat blue"
NEGATIVE = ""
WIDTH, HEIGHT = qp.WIDTH, qp.HEIGHT  # 64 x 48, the reference image's size too
NOISE_SEED = qp.NOISE_SEED  # 11
STEPS = qp.STEPS  # 3
CFG = qp.CFG  # 2.5
LATENT_CHANNELS = qp.LATENT_CHANNELS

# QwenImageEditPlusPipeline.prompt_template_encode, cut at its "{}".
CHAT_PREFIX = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
               "objects, background), then explain how the user's text instruction should alter or modify the "
               "image. Generate a new image that meets the user's requirements while maintaining consistency with "
               "the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
IMAGE_PROMPT = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"  # _get_qwen_prompt_embeds' img_prompt_template
DIFFUSERS_DROP = 64  # QwenImageEditPlusPipeline.prompt_template_encode_start_idx
VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIALS = mzp.SPECIALS + VISION_SPECIALS  # ids 283 .. 288

# The VL image (QwenImageEditPlusPipeline.__call__ and the Qwen2-VL processor).
CONDITION_IMAGE_SIZE = 384 * 384
VL_FACTOR = 28  # patch 14 x merge 2
VL_MIN_PIXELS, VL_MAX_PIXELS = 3136, 12845056  # Qwen2.5-VL's preprocessor_config.json

LLM_WIDTH = qp.LLM_WIDTH  # 48
QWEN2 = dict(qp.QWEN2)  # hidden 48, 3 layers, 4 heads / 2 K/V heads of 32, FFN 96, theta 1e6, eps 1e-6, q/k/v biases
MROPE_SECTION = (4, 6, 6)  # HF's [16, 24, 24] for head_dim 128, scaled to head_dim 32
VISION = vl.VisionConfig(hidden_size=32, num_heads=2, depth=4, intermediate_size=48, out_hidden_size=LLM_WIDTH,
                         patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                         fullatt_block_indexes=[1, 3], in_channels=3)
VISION_METADATA = {"clip.vision.n_wa_pattern": str(VISION.fullatt_block_indexes[0] + 1),
                   "clip.vision.attention.head_count": str(VISION.num_heads)}
DIT = dict(qp.DIT)  # make_qwen_image_fixtures.TINY with context width 48, zero_cond_t False
MAX_TOTAL_BYTES = 2 * 1000 * 1000


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------ the VL image's size


def calculate_dimensions(target_area, ratio):
    """diffusers' pipeline_qwenimage_edit_plus.calculate_dimensions, verbatim: the width from the area, the
    height from the unrounded width, each rounded to a multiple of 32 with Python's round (halves to even)."""
    width = math.sqrt(target_area * ratio)
    height = width / ratio
    width = round(width / 32) * 32
    height = round(height / 32) * 32
    return width, height


def vl_size(width, height, area=CONDITION_IMAGE_SIZE):
    """(condition width, height) then (VL width, height) for an image width x height resized to about `area`
    pixels, and the merged tokens."""
    cw, ch = calculate_dimensions(area, width / height)
    h, w = vl.smart_resize(ch, cw, VL_FACTOR, VL_MIN_PIXELS, VL_MAX_PIXELS)
    return (cw, ch), (w, h), (h // VL_FACTOR) * (w // VL_FACTOR)


def check_vl_sizes():
    """calculate_dimensions against the same arithmetic done in 60-digit decimals (the two agree away from an
    exact .5 of a multiple of 32), and against sizes worked out by hand; prints the table."""
    getcontext().prec = 60
    hand = {(1, 1): (384, 384), (64, 48): (448, 320), (16, 9): (512, 288), (9, 16): (288, 512),
            (3, 2): (480, 320), (2, 3): (320, 480), (21, 9): (576, 256), (1, 4): (192, 768)}
    log("VL sizes (calculate_dimensions(384*384, w/h), then smart_resize(factor 28)):")
    for (w, h), want in hand.items():
        got = calculate_dimensions(CONDITION_IMAGE_SIZE, w / h)
        dw = (Decimal(CONDITION_IMAGE_SIZE) * Decimal(w) / Decimal(h)).sqrt()
        dh = dw / (Decimal(w) / Decimal(h))
        dec = tuple(int((d / 32).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)) * 32 for d in (dw, dh))
        assert got == want == dec, (w, h, got, want, dec)
        (cw, ch), (vw, vh), n = vl_size(w, h)
        log("  ratio %2d:%-2d  width %.4f height %.4f -> condition %d x %d -> VL %d x %d, %d merged tokens" % (
            w, h, float(dw), float(dh), cw, ch, vw, vh, n))


# ------------------------------------------------------------ tokenizer


def split_specials(text, specials=SPECIALS):
    """make_z_image_pipeline_fixtures.split_specials with the vision specials added: leftmost first, the
    longest at one place."""
    out = []
    i = start = 0
    while i < len(text):
        hits = [s for s in specials if text.startswith(s, i)]
        if hits:
            if start < i:
                out.append((False, text[start:i]))
            best = max(hits, key=len)
            out.append((True, best))
            i = start = i + len(best)
        else:
            i += 1
    if start < len(text):
        out.append((False, text[start:]))
    return out


class EditTokenizer:
    """The text-to-image script's tokenizer (Qwen2's pre-tokenizer, byte-level BPE by merge rank, no BOS) with
    <|vision_start|>, <|vision_end|>, <|image_pad|> as added tokens after its three specials."""

    def __init__(self, base):
        self.base = base
        self.tokens = list(base.tokens) + VISION_SPECIALS
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        assert [self.ids[s] for s in SPECIALS] == list(range(len(base.tokens) - 3, len(self.tokens)))

    def __call__(self, text):
        out = []
        for special, part in split_specials(text):
            if special:
                out.append(self.ids[part])
            else:
                for piece in mzp.pre_tokenize(part):
                    out += self.base.bpe(piece)
        return out


def write_tokenizer(folder):
    """qwen_image_tiny/tokenizer with the three vision specials appended to added_tokens_decoder."""
    base = qp.read_tokenizer(TOKENIZER_SOURCE)
    tok = EditTokenizer(base)
    os.makedirs(folder, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(TOKENIZER_SOURCE, name), os.path.join(folder, name))
    with open(os.path.join(TOKENIZER_SOURCE, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    added = config["added_tokens_decoder"]
    template = dict(added[str(base.ids["<|im_start|>"])])
    for s in VISION_SPECIALS:
        assert str(tok.ids[s]) not in added
        added[str(tok.ids[s])] = dict(template, content=s)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    # Read back: the vocabulary and merges are the base's, the added tokens all six specials.
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    assert vocab == {t: i for i, t in enumerate(base.tokens) if t not in mzp.SPECIALS}
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        back = json.load(f)["added_tokens_decoder"]
    assert {int(i): a["content"] for i, a in back.items()} == {tok.ids[s]: s for s in SPECIALS}
    assert all(a["special"] for a in back.values())
    return tok


def image_prompt(n_pads, image_template=IMAGE_PROMPT):
    """The prompt's image part as the Qwen2-VL processor expands it: one <|image_pad|> per merged token."""
    text = image_template.format(1)
    return text.replace("<|image_pad|>", "<|image_pad|>" * n_pads)


def templated(prompt, n_pads, image_template=IMAGE_PROMPT):
    return CHAT_PREFIX + image_prompt(n_pads, image_template) + prompt + CHAT_SUFFIX


def check_template(tok, n_pads, image_template=IMAGE_PROMPT):
    """Every special is one token; the system part's ids are a prefix of each templated prompt's; under a
    vocabulary holding each of its words (Qwen's) it is diffusers' 64 tokens. Returns the count dropped here."""
    for special in SPECIALS:
        assert tok(special) == [tok.ids[special]], special
    pieces = 0
    for special, part in split_specials(CHAT_PREFIX):
        pieces += 1 if special else len(mzp.pre_tokenize(part))
    assert pieces == DIFFUSERS_DROP, pieces
    prefix = tok(CHAT_PREFIX)
    for prompt in (PROMPT, NEGATIVE):
        whole = tok(templated(prompt, n_pads, image_template))
        assert whole[:len(prefix)] == prefix, prompt
        # Tokenized part by part (the image pads are specials, so nothing merges across): the same ids.
        before_image = image_template.format(1).split("<|vision_start|>")[0]
        parts = prefix + (tok(before_image) if before_image else []) + [tok.ids["<|vision_start|>"]]
        parts += [tok.ids["<|image_pad|>"]] * n_pads
        parts += [tok.ids["<|vision_end|>"]] + tok(prompt) + tok(CHAT_SUFFIX)
        assert whole == parts, prompt
        assert whole.count(tok.ids["<|image_pad|>"]) == n_pads
    return len(prefix)


# ------------------------------------------------------------ the parts


def make_llm(tok):
    vocab = -(-len(tok.tokens) // qp.VOCAB_MULTIPLE) * qp.VOCAB_MULTIPLE
    cfg = dict(QWEN2, vocab=vocab)
    llm = Qwen3Model(**cfg)
    stored = mq.randomize(llm, SEED + 1)
    assert not any("lm_head" in k or "q_norm" in k for k in stored)
    assert "model.layers.0.self_attn.q_proj.bias" in stored and all(k.startswith("model.") for k in stored)
    meta = {k: str(v) for k, v in mq.metadata("qwen2", cfg).items() if "key_length" in k or "freq_base" in k}
    meta["qwen2.rope.dimension_sections"] = ",".join(str(s) for s in MROPE_SECTION)
    assert meta["qwen2.attention.key_length"] == "32"
    return llm.double().eval(), stored, meta


def make_vision():
    tower, stored = mvl.make_tower(VISION, SEED + 2)
    assert {k: tuple(v.shape) for k, v in stored.items()} == vl.vision_param_shapes(VISION)
    assert all(k.startswith("visual.") and v.dtype == torch.float32 for k, v in stored.items())
    return tower, stored


def load_dit(zero_cond_t):
    weights, meta = safetensors_io.load_file(DIT_PATH)
    assert meta == qp.DIT_METADATA, meta
    assert all(v.dtype == qp.DIT_DTYPE for v in weights.values())
    dit = ref.QwenImageTransformer2DModel(**dict(DIT, zero_cond_t=zero_cond_t))
    dit.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=True)
    return dit.double().eval()


def load_vae():
    weights, _ = safetensors_io.load_file(VAE_PATH)
    vae = wan.WanVAE_(**qp.VAE)
    vae.load_state_dict({k: v.to(torch.float64) for k, v in weights.items()}, strict=True)
    return vae.double().eval()


def make_ref_image():
    """The reference: 64 x 48 RGB, seeded; gradients, an orange 'cat' (a disc with two ears and dark eyes), a
    blue square, a little noise. [H, W, 3] uint8."""
    gen = torch.Generator().manual_seed(SEED + 3)
    y = torch.arange(HEIGHT, dtype=torch.float64)[:, None].expand(HEIGHT, WIDTH)
    x = torch.arange(WIDTH, dtype=torch.float64)[None, :].expand(HEIGHT, WIDTH)
    img = torch.stack([40 + 150 * x / (WIDTH - 1), 60 + 120 * y / (HEIGHT - 1),
                       200 - 110 * (x + y) / (WIDTH + HEIGHT - 2)], dim=-1)
    cx, cy, r = 22.0, 29.0, 12.0
    cat = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    for ex in (cx - 7, cx + 7):  # ears: triangles on top of the head
        top = cy - r - 7
        cat |= (y >= top) & (y <= cy - r + 4) & ((x - ex).abs() <= 0.6 * (y - top))
    img[cat] = torch.tensor([232.0, 142.0, 44.0], dtype=torch.float64)
    for ex in (cx - 5, cx + 5):
        img[((x - ex) ** 2 + (y - (cy - 3)) ** 2) <= 4] = torch.tensor([20.0, 30.0, 20.0], dtype=torch.float64)
    img[(x >= 44) & (x < 58) & (y >= 8) & (y < 22)] = torch.tensor([30.0, 60.0, 220.0], dtype=torch.float64)
    img = img + 6.0 * torch.randn(HEIGHT, WIDTH, 3, generator=gen, dtype=torch.float64)
    return img.round().clamp(0, 255).to(torch.uint8).numpy()


# ------------------------------------------------------------ the job's stages


def vl_preprocess(image, area=CONDITION_IMAGE_SIZE):
    """PIL RGB image -> (u8 [H, W, 3] of the VL image, pixels float32 [3, H, W] as the tower sees them).

    diffusers: condition_images.append(self.image_processor.resize(img, condition_height, condition_width)),
    VaeImageProcessor.resize = PIL resize with LANCZOS (its config's resample "lanczos");
    transformers' Qwen2VLImageProcessor._preprocess: smart_resize(h, w, factor 28, min_pixels, max_pixels),
    image_transforms.resize (PIL, BICUBIC, on the uint8 array: uint8 out), rescale (x.astype(float64) * (1/255)
    then float32), normalize ((x - mean) / std in float32, OpenAI CLIP's mean/std)."""
    (cw, ch), (w, h), _ = vl_size(image.width, image.height, area)
    cond = image.resize((cw, ch), resample=Image.LANCZOS)
    assert vl.smart_resize(ch, cw, VL_FACTOR, VL_MIN_PIXELS, VL_MAX_PIXELS) == (h, w)
    resized = cond.resize((w, h), resample=Image.BICUBIC)
    u8 = np.asarray(resized, dtype=np.uint8)
    assert u8.shape == (h, w, 3)
    return u8, normalize_u8(u8)


def normalize_u8(u8):
    x = (u8.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.array(vl.IMAGE_MEAN, dtype=np.float32)) / np.array(vl.IMAGE_STD, dtype=np.float32)
    assert x.dtype == np.float32
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def encode_prompt(llm, tok, prompt, rows, dropped, grid, image_template=IMAGE_PROMPT):
    """_get_qwen_prompt_embeds for one image: (tokens [1, n] I32, positions [3, n] I32, hidden [1, n - dropped, 48]).
    The image pads' embeddings are replaced by the tower's rows in order (masked_scatter), M-RoPE positions from
    get_rope_index, causal, hidden_states[-1] (final-normed), the first `dropped` rows cut."""
    ids = torch.tensor(tok(templated(prompt, rows.shape[0], image_template)), dtype=torch.long)
    pad, start = tok.ids["<|image_pad|>"], tok.ids["<|vision_start|>"]
    positions = vl.get_rope_index(ids, torch.tensor([grid]), pad, start, VISION.spatial_merge_size)
    hidden = vl.qwen2_mrope_forward(llm, ids, positions, MROPE_SECTION, rows, pad)
    return ids.to(torch.int32)[None], positions.to(torch.int32), hidden[None, dropped:]


def velocity(dit, x, sigma, context, ref_latent):
    return ref.predict(dit, x, context, torch.tensor([sigma], dtype=torch.float64), refs=[ref_latent])


def sample(dit, vae, noise, sigmas, cond, uncond, ref_latent):
    x = noise * sigmas[0]
    v0 = None
    for i in range(STEPS):
        c = velocity(dit, x, sigmas[i], cond, ref_latent)
        u = velocity(dit, x, sigmas[i], uncond, ref_latent)
        v = u + CFG * (c - u)
        if i == 0:
            v0 = v
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    image = wan.decode_normalized(vae, x[:, :, None])[:, :, 0]
    assert image.shape == (1, 3, HEIGHT, WIDTH)
    return v0, x, image


def build():
    """Everything written, in memory: {file name: bytes or (tensors, metadata)}, the job's io and the numbers."""
    files = {}
    tok = EditTokenizer(qp.read_tokenizer(TOKENIZER_SOURCE))
    llm, llm_stored, llm_meta = make_llm(tok)
    tower, vis_stored = make_vision()
    files[LLM_FILE] = (llm_stored, llm_meta)
    files[VISION_FILE] = (vis_stored, dict(VISION_METADATA))
    assert not set(llm_stored) & set(vis_stored)

    ref_u8 = make_ref_image()
    buf = iolib.BytesIO()
    Image.fromarray(ref_u8, mode="RGB").save(buf, format="PNG")
    files[REF_PNG] = buf.getvalue()
    image = Image.open(iolib.BytesIO(files[REF_PNG]))
    image.load()
    assert image.mode == "RGB" and image.size == (WIDTH, HEIGHT)
    assert np.array_equal(np.asarray(image), ref_u8)

    io = {}
    nums = {}
    # 1. the VAE's reference latent: the image at its own size (sd-cli), pixels / 127.5 - 1, the mean.
    vae = load_vae()
    pixels = torch.from_numpy(np.asarray(image).astype(np.float64)).permute(2, 0, 1)[None, :, None] / 127.5 - 1
    mu, _ = wan.encode_normalized(vae, pixels)
    io["ref.latent"] = mmf.f32(mu[:, :, 0])
    assert io["ref.latent"].shape == (1, LATENT_CHANNELS, HEIGHT // 8, WIDTH // 8)

    # 2. the VL image and the tower.
    u8, vl_pixels = vl_preprocess(image.convert("RGB"))
    h, w = u8.shape[:2]
    pixel_values, grid_thw = vl.image_to_pixel_values(vl_pixels.double(), VISION.patch_size,
                                                      VISION.temporal_patch_size, VISION.spatial_merge_size)
    rows = tower(pixel_values, grid_thw)
    # HF's permuted windows (partial ones at the bottom: 11 merged rows = 4 + 4 + 3) == an explicit same-window
    # mask in raster order (make_qwen25_vl_vision_fixtures.masked_reference).
    assert torch.allclose(mvl.masked_reference(tower, pixel_values, grid_thw), rows, rtol=0, atol=1e-12)
    n_pads = (h // VL_FACTOR) * (w // VL_FACTOR)
    assert rows.shape == (n_pads, LLM_WIDTH), (rows.shape, n_pads)
    io["vl.size"] = torch.tensor([w, h], dtype=torch.int32)
    io["vl.image"] = torch.from_numpy(np.ascontiguousarray(u8.transpose(2, 0, 1)))  # U8 [3, H, W]
    assert torch.equal(normalize_u8(io["vl.image"].numpy().transpose(1, 2, 0)), vl_pixels)
    io["vl.rows"] = mmf.f32(rows)
    nums.update(vl_size=(w, h), condition_size=vl_size(WIDTH, HEIGHT)[0], grid=grid_thw.tolist(), n_pads=n_pads)

    # 3.-5. the prompts, encoded with the image's rows (the LLM sees the stored F32 rows, as kiln's does).
    dropped = check_template(tok, n_pads)
    rows32 = io["vl.rows"].double()
    grid = grid_thw.tolist()
    tokens, positions, hidden = encode_prompt(llm, tok, PROMPT, rows32, dropped, grid)
    utokens, upositions, uhidden = encode_prompt(llm, tok, NEGATIVE, rows32, dropped, grid)
    io["llm.tokens"], io["llm.dropped"], io["llm.positions"] = tokens, torch.tensor([dropped], dtype=torch.int32), \
        positions
    io["llm.hidden"] = mmf.f32(hidden)
    io["llm.uncond_tokens"], io["llm.uncond_dropped"] = utokens, torch.tensor([dropped], dtype=torch.int32)
    io["llm.uncond_positions"] = upositions
    io["llm.uncond_hidden"] = mmf.f32(uhidden)
    n, un = tokens.shape[1], utokens.shape[1]
    assert hidden.shape == (1, n - dropped, LLM_WIDTH) and uhidden.shape == (1, un - dropped, LLM_WIDTH)
    # The system part has no image: its rows are plain causal Qwen2 (positions 0..dropped-1 on all three axes).
    plain, _ = llm(tokens[:, :dropped])
    full = vl.qwen2_mrope_forward(llm, tokens[0].long(), positions.long(), MROPE_SECTION, rows32,
                                  tok.ids["<|image_pad|>"])
    assert torch.allclose(full[:dropped], plain[0], rtol=0, atol=1e-12)
    assert positions[:, :dropped].tolist() == [list(range(dropped))] * 3
    # The image matters: with the pads' rows zeroed the context changes.
    _, _, zeroed = encode_prompt(llm, tok, PROMPT, torch.zeros_like(rows32), dropped, grid)
    nums["zeroed_rows_change"] = float((zeroed - hidden).abs().max())
    assert nums["zeroed_rows_change"] > 1e-2, nums["zeroed_rows_change"]
    # The positions: text, then the image's merged grid at (s, s + row, s + column), then text from max + 1.
    first_pad = tokens[0].tolist().index(tok.ids["<|image_pad|>"])
    gh, gw = grid[1] // 2, grid[2] // 2
    want = torch.stack([torch.full((gh, gw), first_pad), first_pad + torch.arange(gh)[:, None].expand(gh, gw),
                        first_pad + torch.arange(gw)[None, :].expand(gh, gw)]).reshape(3, -1)
    assert torch.equal(positions[:, first_pad:first_pad + n_pads].long(), want)
    after = first_pad + max(gh, gw)
    assert positions[:, first_pad + n_pads].tolist() == [after] * 3
    nums.update(n=n, un=un, dropped=dropped, first_pad=first_pad, last_position=int(positions.max()))

    # 6. sampling, the reference latent on every pass.
    sigmas = qp.flow_sigmas()
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
    lh, lw = HEIGHT // 8, WIDTH // 8
    noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(LATENT_CHANNELS * lh * lw), dtype=torch.float32)
    io["noise"] = noise.reshape(1, LATENT_CHANNELS, lh, lw)
    cond, uncond = io["llm.hidden"].double(), io["llm.uncond_hidden"].double()
    ref_latent = io["ref.latent"].double()
    dit = load_dit(False)
    v0, x, img = sample(dit, vae, io["noise"].double(), sigmas, cond, uncond, ref_latent)
    io["velocity0"], io["latent"], io["image"] = mmf.f32(v0), mmf.f32(x), mmf.f32(img)
    # The reference matters, and the text's RoPE starts after the larger half-extent (both images 3 x 4 patches).
    x0 = io["noise"].double() * sigmas[0]
    no_ref = ref.predict(dit, x0, cond, torch.tensor([sigmas[0]], dtype=torch.float64))
    nums["ref_changes_velocity"] = float((velocity(dit, x0, sigmas[0], cond, ref_latent) - no_ref).abs().max())
    assert nums["ref_changes_velocity"] > 1e-2
    dit_z = load_dit(True)
    vz, _, imgz = sample(dit_z, vae, io["noise"].double(), sigmas, cond, uncond, ref_latent)
    io["velocity0_zero_cond_t"], io["image_zero_cond_t"] = mmf.f32(vz), mmf.f32(imgz)
    nums["zero_cond_t_changes_velocity0"] = float((vz - v0).abs().max())
    nums["zero_cond_t_changes_image"] = float((imgz - img).abs().max())
    assert nums["zero_cond_t_changes_velocity0"] > 1e-3 and nums["zero_cond_t_changes_image"] > 1e-3

    meta = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "seed": str(NOISE_SEED), "steps": str(STEPS),
            "width": str(WIDTH), "height": str(HEIGHT), "cfg_scale": repr(CFG), "sampler": "euler",
            "scheduler": "discrete", "flow_shift": repr(qp.SHIFT_FACTOR), "rng": "cuda",
            "ref_image": "qwen_image_edit_tiny/" + REF_PNG,
            "model": "qwen_image_tiny/qwen_image_dit.safetensors", "vae": "qwen_image_tiny/qwen_image_vae.safetensors",
            "llm": "qwen_image_edit_tiny/" + LLM_FILE, "llm_vision": "qwen_image_edit_tiny/" + VISION_FILE,
            "tokenizer": "qwen_image_edit_tiny/tokenizer", "zero_cond_t": "false (the *_zero_cond_t tensors: true)",
            "generator": "training/make_qwen_image_edit_fixtures.py"}
    files[JOB] = (io, meta)
    return files, tok, nums


def write(files, folder):
    os.makedirs(folder, exist_ok=True)
    for name, content in files.items():
        path = os.path.join(folder, name)
        if isinstance(content, bytes):
            with open(path, "wb") as f:
                f.write(content)
        else:
            safetensors_io.save_file(content[0], path, content[1])
    write_tokenizer(os.path.join(folder, "tokenizer"))


def listing(folder):
    out = {}
    for base, _, names in os.walk(folder):
        for name in names:
            p = os.path.join(base, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = f.read()
    return out


def main():
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    check_vl_sizes()
    with torch.no_grad():
        files, tok, nums = build()
        files2, _, _ = build()
    with tempfile.TemporaryDirectory() as tmp:
        write(files2, tmp)
        first = listing(tmp)
    write(files, PARTS)
    second = listing(PARTS)
    assert sorted(first) == sorted(second) and all(first[k] == second[k] for k in first)
    log("self-check: two builds from the seed give byte-identical files (%d files)" % len(first))

    # Read back what kiln will read.
    io, _ = safetensors_io.load_file(os.path.join(PARTS, JOB))
    assert all(torch.equal(io[k], v) for k, v in files[JOB][0].items())

    log("VL image %d x %d (condition image %d x %d), grid %s -> N = %d image pads = the tower's rows" % (
        nums["vl_size"][0], nums["vl_size"][1], nums["condition_size"][0], nums["condition_size"][1],
        nums["grid"], nums["n_pads"]))
    log("prompt: n = %d tokens, dropped %d (diffusers drops %d under Qwen's tokenizer), context %d rows; "
        "first pad at %d, largest position %d" % (nums["n"], nums["dropped"], DIFFUSERS_DROP,
                                                   nums["n"] - nums["dropped"], nums["first_pad"],
                                                   nums["last_position"]))
    log("negative: n = %d tokens, context %d rows" % (nums["un"], nums["un"] - nums["dropped"]))
    log("prompt ids after the drop, less the pads: %s" % [
        i for i in io["llm.tokens"][0, nums["dropped"]:].tolist() if i != tok.ids["<|image_pad|>"]])
    log("self-check: zeroing the image rows changes the context by up to %.4f; the reference latent changes the "
        "first velocity by up to %.4f; zero_cond_t changes velocity0 by %.4f, the image by %.4f" % (
            nums["zeroed_rows_change"], nums["ref_changes_velocity"], nums["zero_cond_t_changes_velocity0"],
            nums["zero_cond_t_changes_image"]))
    for k, v in io.items():
        if v.is_floating_point():
            log("  %-24s %-18s mean %+.4f std %.4f min %+.4f max %+.4f" % (
                k, mmf.shape_str(v), v.double().mean(), v.double().std(), v.min(), v.max()))
        elif v.numel() <= 8:
            log("  %-24s %-18s %s" % (k, mmf.shape_str(v), v.flatten().tolist()))
        else:
            log("  %-24s %-18s %s" % (k, mmf.shape_str(v), str(v.dtype).replace("torch.", "")))
    total = 0
    for rel in sorted(second):
        total += len(second[rel])
        log("wrote %s (%d bytes)" % (os.path.relpath(os.path.join(PARTS, rel), ROOT), len(second[rel])))
    log("total %d bytes" % total)
    assert total < MAX_TOTAL_BYTES, total


if __name__ == "__main__":
    main()
