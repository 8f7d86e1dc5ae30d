#!/usr/bin/python3
"""Writes a tiny random-weight Qwen-Image in its released parts and the golden
results of a whole text-to-image job on it, computed with the PyTorch
references in training/reference/ (no kiln code): the end-to-end truth for
kiln's Qwen-Image pipeline (tests/unit/qwen_image_pipeline_test.cpp).

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_qwen_image_pipeline_fixtures.py

Writes, relative to the repository root (in tests/golden/pipeline/):
  qwen_image_tiny/qwen_2.5_vl.safetensors  a tiny Qwen2 (Qwen2.5-VL's text model: q/k/v biases, no QK norm)
      in HF names under model. (model.embed_tokens.weight, model.layers.N.*, model.norm.weight; no LM head,
      as tests/golden/pipeline/z_image_tiny/qwen3.safetensors), F16: vocab 288 (the tokenizer's 286 rounded up
      to a multiple of 32), hidden 48, 3 layers, 4 heads and 2 K/V heads of 32, FFN 96, theta 1e6, eps 1e-6;
      metadata qwen2.attention.key_length "32" and qwen2.rope.freq_base (an HF file without QK norm says
      nothing of the head width; as tests/golden/models/qwen2_tiny.safetensors)
  qwen_image_tiny/qwen_image_dit.safetensors  the DiT in diffusers' names, no prefix (a transformer/ folder's),
      BF16 (as qwen_image_bf16.safetensors), metadata kiln.qwen_image.axes_dim "4,14,14":
      make_qwen_image_fixtures.py's configuration (width 64, 2 heads of 32, 2 blocks, MLP 256, 16 latent
      channels in 2x2 patches) with its context width the tiny Qwen2's, 48
  qwen_image_tiny/qwen_image_vae.safetensors  tests/golden/models/wan_vae_tiny.safetensors byte for byte
      (Wan 2.1's VAE in the original names, 5-D CausalConv3d weights, F32; make_wan_vae_fixtures.py's
      configuration: dim 4, dim_mult (1, 2, 3, 4), so 8x smaller along each side)
  qwen_image_tiny/tokenizer/  tests/golden/pipeline/z_image_tiny/tokenizer byte for byte (Qwen2's layout:
      vocab.json, merges.txt, tokenizer_config.json with <|endoftext|>, <|im_start|>, <|im_end|> as added
      tokens 283-285; written by make_z_image_pipeline_fixtures.py)
  qwen_image_tiny_txt2img.safetensors  the job (F32 but the I32 tokens):
      llm.tokens [1, n] (the templated prompt, the system turn included), llm.dropped [1] (the system
      turn's tokens, whose states are dropped), llm.hidden [1, n - dropped, 48], llm.uncond_tokens,
      llm.uncond_dropped, llm.uncond_hidden (the negative prompt ""), noise [1, 16, 6, 8], sigmas [4],
      velocity0 [1, 16, 6, 8] (the guided velocity of the first step), latent [1, 16, 6, 8] (final),
      image [1, 3, 48, 64] (decoded, in [-1, 1], not clamped)

The job (sd-cli's docs/qwen_image.md method): prompt "a red cat on a blue square", negative prompt "",
64x48 (W x H: the VAE's latent is 8 wide and 6 high, 4 x 3 patches: an odd side), seed 11, --rng cuda,
3 steps, euler, cfg 2.5, --flow-shift 3.
  - text (diffusers' QwenImagePipeline._get_qwen_prompt_embeds): the prompt in Qwen's chat template after
    Qwen-Image's system turn,
        "<|im_start|>system\\nDescribe the image by detailing the color, shape, size, texture, quantity,
        text, spatial relationships of the objects and background:<|im_end|>\\n<|im_start|>user\\n"
        + prompt + "<|im_end|>\\n<|im_start|>assistant\\n",
    tokenized whole (the specials cut out first, Qwen2's pre-tokenizer, byte-level BPE by merge rank, no
    BOS: make_z_image_pipeline_fixtures.py's tokenizer on the merges of tokenizer/merges.txt), encoded
    whole with a causal mask and no padding; the context is HF's hidden_states[-1] (the final-normed
    output of the last layer) less the rows of the system turn's tokens. diffusers drops a fixed
    prompt_template_encode_start_idx = 34, the token count of the system turn under Qwen's real
    tokenizer (3 specials and 31 pre-tokenizer pieces, each a word of Qwen's vocabulary); this tokenizer
    has few merges, so its system turn is more tokens: the count dropped here is the system turn's own
    token count, checked to be a prefix of the whole prompt's ids;
  - the negative prompt "" the same way (its own length: the template's suffix alone after the drop);
  - noise: webui's Philox randn (kiln's --rng cuda) of the 16 x 6 x 8 latent, one draw, seed 11;
  - schedule ("discrete" on the flow table, shift 3): t = linspace(999, 0, 3), s = (t + 1) / 1000,
    sigma = 3 s / (1 + 2 s), rounded to float32, then 0 (t = 499.5 in the middle: a fractional timestep);
  - the DiT (reference/qwen_image.py's predict: 2x2 patches, the image's RoPE positions centred, text
    after them) at timestep sigma gives the velocity v; the cond and uncond passes each with their own
    context, v = u + 2.5 (c - u) (sd-cli's plain classifier-free guidance; diffusers' QwenImagePipeline
    rescales the guided velocity to the cond velocity's norm per token, which sd-cli and kiln do not);
  - Euler: x <- x + (sigma_next - sigma) v, from x = noise * sigma_0;
  - decode with the VAE's own normalisation (z * std + mean per channel, Wan 2.1's statistics; the
    family adds no scale or shift), one frame.

Every stage runs in float64 on the stored weights; deterministic (byte-identical files).
"""

import math
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import make_qwen3_fixtures as mq  # noqa: E402
import make_qwen_image_fixtures as mqi  # noqa: E402
import make_wan_vae_fixtures as mw  # noqa: E402
import make_z_image_pipeline_fixtures as mzp  # noqa: E402
from reference import qwen_image as ref  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.qwen3 import Qwen3Model  # noqa: E402
from reference.sampling import PhiloxGenerator, bfl_time_shift  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "qwen_image_tiny")
TOKENIZER_SOURCE = os.path.join(OUT, "z_image_tiny", "tokenizer")
VAE_SOURCE = os.path.join(ROOT, "tests", "golden", "models", "wan_vae_tiny.safetensors")
JOB = "qwen_image_tiny_txt2img.safetensors"
SEED = 4700

PROMPT = "a red cat on a blue square"
NEGATIVE = ""
WIDTH, HEIGHT = 64, 48
NOISE_SEED = 11
STEPS = 3
CFG = 2.5
SHIFT_FACTOR = 3.0  # --flow-shift 3: mu = ln 3
CHAT_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
               "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
DIFFUSERS_DROP = 34  # QwenImagePipeline.prompt_template_encode_start_idx

LLM_WIDTH = 48  # not z_image_tiny/qwen3.safetensors' 64: that one is a wrong --llm here
VOCAB_MULTIPLE = 32
QWEN2 = dict(mq.QWEN3, hidden=LLM_WIDTH, qk_norm=False, qkv_bias=True)
DIT = dict(mqi.TINY, joint_attention_dim=LLM_WIDTH)
DIT_METADATA = dict(mqi.DIT_METADATA)  # kiln.qwen_image.axes_dim "4,14,14"
DIT_DTYPE = torch.bfloat16
VAE = mw.TINY
LATENT_CHANNELS = 16
MAX_TOTAL_BYTES = 2 * 1000 * 1000


def templated(prompt):
    return CHAT_PREFIX + prompt + CHAT_SUFFIX


# ------------------------------------------------------------ tokenizer


def read_tokenizer(folder):
    """make_z_image_pipeline_fixtures.py's tokenizer on the merges of folder/merges.txt; its ids checked
    against folder/vocab.json."""
    import json
    with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0].startswith("#version")
    merges = [tuple(line.split(" ")) for line in lines[1:] if line]
    tok = mzp.Tokenizer(merges)
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    assert vocab == {t: i for i, t in enumerate(tok.tokens) if t not in mzp.SPECIALS}
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        added = json.load(f)["added_tokens_decoder"]
    assert {int(i): a["content"] for i, a in added.items()} == {tok.ids[s]: s for s in mzp.SPECIALS}
    return tok


def check_template(tok):
    """The template's specials are single added tokens; the system turn's ids are a prefix of every
    templated prompt's; under a vocabulary holding each of its words (Qwen's) it is diffusers' 34."""
    for special in ("<|im_start|>", "<|im_end|>"):
        assert tok(special) == [tok.ids[special]]
    pieces = 0
    for special, part in mzp.split_specials(CHAT_PREFIX):
        pieces += 1 if special else len(mzp.pre_tokenize(part))
    assert pieces == DIFFUSERS_DROP, pieces
    prefix = tok(CHAT_PREFIX)
    for prompt in (PROMPT, NEGATIVE):
        whole = tok(templated(prompt))
        assert whole[:len(prefix)] == prefix, prompt
        # kiln tokenizes the template's parts one by one: the same ids.
        assert whole == prefix + tok(prompt) + tok(CHAT_SUFFIX), prompt
    return len(prefix)


# ------------------------------------------------------------ the parts


def write_llm(tok):
    vocab = -(-len(tok.tokens) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    cfg = dict(QWEN2, vocab=vocab)
    llm = Qwen3Model(**cfg)
    ckpt = mq.randomize(llm, SEED + 1)
    assert not any("lm_head" in k or "q_norm" in k for k in ckpt) and "model.layers.0.self_attn.q_proj.bias" in ckpt
    meta = {k: str(v) for k, v in mq.metadata("qwen2", cfg).items() if "key_length" in k or "freq_base" in k}
    safetensors_io.save_file(ckpt, os.path.join(PARTS, "qwen_2.5_vl.safetensors"), meta)
    return llm.double().eval()


def write_dit():
    dit = ref.QwenImageTransformer2DModel(**DIT)
    gen = torch.Generator().manual_seed(SEED + 2)
    stored = {k: mqi.init_value(k, tuple(v.shape), gen).to(DIT_DTYPE).contiguous()
              for k, v in dit.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in stored.items()} == ref.qwen_image_tensor_shapes(DIT)
    dit.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()}, strict=True)
    safetensors_io.save_file(stored, os.path.join(PARTS, "qwen_image_dit.safetensors"), dict(DIT_METADATA))
    return dit.double().eval()


def write_vae():
    path = os.path.join(PARTS, "qwen_image_vae.safetensors")
    shutil.copyfile(VAE_SOURCE, path)
    weights, _ = safetensors_io.load_file(path)
    vae = wan.WanVAE_(**VAE)
    vae.load_state_dict({k: v.to(torch.float64) for k, v in weights.items()}, strict=True)
    vae = vae.double().eval()
    assert vae.dim_mult == [1, 2, 3, 4]  # three 2x resamples: 8x per side
    return vae


def copy_tokenizer():
    folder = os.path.join(PARTS, "tokenizer")
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(TOKENIZER_SOURCE)):
        shutil.copyfile(os.path.join(TOKENIZER_SOURCE, name), os.path.join(folder, name))
    return read_tokenizer(folder)


# ------------------------------------------------------------ the job


def flow_sigmas():
    out = []
    for t in torch.linspace(999, 0, STEPS, dtype=torch.float64).tolist():
        s = (t + 1) / 1000
        sigma = SHIFT_FACTOR * s / (1 + (SHIFT_FACTOR - 1) * s)
        assert abs(sigma - bfl_time_shift(math.log(SHIFT_FACTOR), 1.0, s)) < 1e-12
        out.append(float(torch.tensor(sigma, dtype=torch.float32)))
    return out + [0.0]


def encode(llm, tok, prompt, dropped):
    ids = tok(templated(prompt))
    tokens = torch.tensor([ids], dtype=torch.int32)
    out, hidden = llm(tokens)
    assert torch.equal(hidden[-1], out)  # HF's hidden_states[-1]: the final-normed last layer
    return tokens, out[:, dropped:]


def velocity(dit, x, sigma, context):
    return ref.predict(dit, x, context, torch.tensor([sigma], dtype=torch.float64))


def run_job(dit, llm, vae, tok, dropped):
    io = {}
    tokens, hidden = encode(llm, tok, PROMPT, dropped)
    uncond_tokens, uncond_hidden = encode(llm, tok, NEGATIVE, dropped)
    io["llm.tokens"] = tokens
    io["llm.dropped"] = torch.tensor([dropped], dtype=torch.int32)
    io["llm.hidden"] = mmf.f32(hidden)
    io["llm.uncond_tokens"] = uncond_tokens
    io["llm.uncond_dropped"] = torch.tensor([dropped], dtype=torch.int32)
    io["llm.uncond_hidden"] = mmf.f32(uncond_hidden)
    assert hidden.shape[1] == len(tok(PROMPT)) + len(tok(CHAT_SUFFIX))
    assert uncond_hidden.shape[1] == len(tok(CHAT_SUFFIX))

    sigmas = flow_sigmas()
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
    lw, lh = WIDTH // 8, HEIGHT // 8
    noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(LATENT_CHANNELS * lh * lw), dtype=torch.float32)
    io["noise"] = noise.reshape(1, LATENT_CHANNELS, lh, lw)
    # The reference sees the stored (F32) context, as kiln's DiT does.
    cond, uncond = io["llm.hidden"].double(), io["llm.uncond_hidden"].double()
    x = io["noise"].double() * sigmas[0]
    for i in range(STEPS):
        c = velocity(dit, x, sigmas[i], cond)
        u = velocity(dit, x, sigmas[i], uncond)
        v = u + CFG * (c - u)
        if i == 0:
            io["velocity0"] = mmf.f32(v)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    io["latent"] = mmf.f32(x)
    image = wan.decode_normalized(vae, x[:, :, None])[:, :, 0]
    assert image.shape == (1, 3, HEIGHT, WIDTH)
    io["image"] = mmf.f32(image)
    return io


def save_job(io):
    meta = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "seed": str(NOISE_SEED), "steps": str(STEPS),
            "width": str(WIDTH), "height": str(HEIGHT), "cfg_scale": repr(CFG), "sampler": "euler",
            "scheduler": "discrete", "flow_shift": repr(SHIFT_FACTOR), "rng": "cuda",
            "model": "qwen_image_tiny/qwen_image_dit.safetensors",
            "generator": "training/make_qwen_image_pipeline_fixtures.py"}
    path = os.path.join(OUT, JOB)
    safetensors_io.save_file(io, path, metadata=meta)
    print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), os.path.getsize(path)))
    for k, v in io.items():
        if v.is_floating_point():
            print("  %-20s %-18s mean %+.4f std %.4f min %+.4f max %+.4f" % (
                k, mmf.shape_str(v), v.double().mean(), v.double().std(), v.min(), v.max()))
        else:
            print("  %-20s %-18s %s" % (k, mmf.shape_str(v), v.flatten().tolist()))


def main():
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(PARTS, exist_ok=True)
    tok = copy_tokenizer()
    dropped = check_template(tok)
    llm = write_llm(tok)
    dit = write_dit()
    vae = write_vae()
    with torch.no_grad():
        save_job(run_job(dit, llm, vae, tok, dropped))
    total = os.path.getsize(os.path.join(OUT, JOB))
    for folder in (PARTS, os.path.join(PARTS, "tokenizer")):
        for name in sorted(os.listdir(folder)):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                total += os.path.getsize(p)
                print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("total %d bytes; system turn %d tokens (diffusers drops %d under Qwen's tokenizer); prompt %s" % (
        total, dropped, DIFFUSERS_DROP, tok(templated(PROMPT))[dropped:]))
    assert total < MAX_TOTAL_BYTES, total


if __name__ == "__main__":
    main()
