#!/usr/bin/python3
"""Writes a tiny random-weight Z-Image (Turbo and Base) in its released parts
and the golden results of whole text-to-image jobs on it, computed with the
PyTorch references in training/reference/ (no kiln code): the end-to-end truth
for kiln's Z-Image pipeline (tests/unit/z_image_pipeline_test.cpp).

Run with Debian's python3-torch:
    /usr/bin/python3 training/make_z_image_pipeline_fixtures.py

Writes, relative to the repository root (in tests/golden/pipeline/):
  z_image_tiny/z_image_turbo_dit.safetensors  the DiT in the single-file (ComfyUI) names, no prefix (as
      z_image_turbo_bf16.safetensors), BF16, metadata kiln.z_image.axes_dim "8,12,12": dim 64, 2 heads
      of 32, FFN 170, 1 noise refiner, 1 context refiner, 2 main layers, caption width 64 (the tiny
      Qwen3's), 16 latent channels in 2x2 patches. "turbo" in the name: kiln takes it for Z-Image-Turbo.
  z_image_tiny/diffusers_transformer.safetensors  the same Turbo DiT in the original / diffusers names
      (ZImageTransformer2DModel: all_x_embedder.2-1, attention.to_q/to_k/to_v/to_out.0, norm_q/norm_k,
      all_final_layer.2-1), as a diffusers folder's transformer/ holds it
  z_image_tiny/z_image_base_dit.safetensors   another DiT of the same shapes (other weights) whose name
      does not say "turbo": Z-Image Base
  z_image_tiny/qwen3.safetensors  a tiny Qwen3 (HF names model.embed_tokens.weight, model.layers.N.*,
      model.norm.weight; F16): vocab 288 (the tokenizer's 286 rounded up to a multiple of 32, as Qwen's
      table is larger than its tokenizer), hidden 64, 3 layers, 4 heads and 2 K/V heads of 32, FFN 96,
      theta 1e6, eps 1e-6
  z_image_tiny/qwen3.gguf  the same weights in llama.cpp's names (make_qwen3_fixtures.py's) with the
      tokenizer in its metadata as convert_hf_to_gguf.py writes Qwen's: tokenizer.ggml.model "gpt2",
      .pre "qwen2", .tokens (the 286, then "[PAD<i>]" up to the table's 288), .merges, .token_type
      (1 normal, 3 control for the <|...|> specials, 5 unused for the pads), eos <|im_end|>,
      padding <|endoftext|>, add_bos_token false
  z_image_tiny/tokenizer/  vocab.json + merges.txt + tokenizer_config.json, Qwen2's layout: a GPT-2
      byte-level BPE whose vocab.json holds the 256 byte characters (GPT-2's bytes_to_unicode, id = the
      byte) and the merged tokens; merges.txt 27 merges learned here by greedy BPE (most frequent pair,
      the smallest on ties) over the prompt's and the template's words; tokenizer_config.json's
      added_tokens_decoder has the specials <|endoftext|>, <|im_start|>, <|im_end|> (283, 284, 285),
      which vocab.json does not hold (as Qwen's)
  z_image_tiny_txt2img.safetensors  the Turbo job (F32 but the I32 tokens): llm.tokens [1, n],
      llm.hidden [1, n, 64], noise [1, 16, 16, 16], sigmas [5], velocity0 [1, 16, 16, 16] (the DiT's
      velocity at the first step), latent [1, 16, 16, 16] (final), image [1, 3, 32, 32] (decoded, in
      [-1, 1], not clamped)
  z_image_base_txt2img.safetensors  the Base job: the same and llm.uncond_tokens, llm.uncond_hidden
      (the negative prompt); velocity0 is the guided velocity

The autoencoder is tests/golden/pipeline/flux_tiny/ae.safetensors (Flux's 16-channel one, written by
make_flux_pipeline_fixtures.py; its config is that script's AE): read here, not written.

The jobs (kiln's documented Z-Image method, sd-cli's): prompt "a red cat on a blue square", 32x32 (the
tiny autoencoder's latent is 16x16), seed 11, 4 steps, euler.
  - text: "<|im_start|>user\\n" + prompt + "<|im_end|>\\n<|im_start|>assistant\\n" tokenized with the
    tokenizer above (written here from the definition: the specials cut out first, Qwen2's
    pre-tokenizer regex, byte-level BPE by merge rank, no BOS); the context is Qwen3's
    hidden_states[-2] (the raw output of the first 2 of the 3 layers, no final norm), causal, no
    padding;
  - noise: webui's Philox randn (kiln's --rng cuda) of the 16 x 16 x 16 latent, one draw, seed 11;
  - schedule ("discrete" on the flow table, shift 3): t = linspace(999, 0, 4), s = (t + 1) / 1000,
    sigma = 3 s / (1 + 2 s) (= BFL's time_shift with mu = ln 3), then 0;
  - the DiT at sigma (the reference runs the network at t = 1 - sigma and negates its output: the
    velocity noise - x0), Euler x <- x + (sigma_next - sigma) v;
  - Turbo: cfg 1 (one pass); Base: cfg 5 against the negative prompt "" under the same template
    (encoded alone: its own token count), v = u + 5 (c - u);
  - decode z / 0.3611 + 0.1159 with the autoencoder.

Every stage runs in float64 on the stored weights; deterministic (byte-identical files).
"""

import json
import math
import os
import re
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import export_gguf  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
import make_qwen3_fixtures as mq  # noqa: E402
import make_z_image_fixtures as mz  # noqa: E402
from make_flux_pipeline_fixtures import AE, SCALE, SHIFT  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import z_image as ref  # noqa: E402
from reference.qwen3 import Qwen3Model  # noqa: E402
from reference.sampling import PhiloxGenerator, bfl_time_shift  # noqa: E402
from reference.vae import AutoencoderKL  # noqa: E402

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "golden", "pipeline")
PARTS = os.path.join(OUT, "z_image_tiny")
AE_PATH = os.path.join(OUT, "flux_tiny", "ae.safetensors")
SEED = 1100

PROMPT = "a red cat on a blue square"
NEGATIVE = ""
WIDTH = HEIGHT = 32
NOISE_SEED = 11
STEPS = 4
SHIFT_FACTOR = 3.0  # the scheduler configs' shift: mu = ln 3
BASE_CFG = 5.0
CHAT_PREFIX = "<|im_start|>user\n"
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
HIDDEN_LAYER = -2  # hidden_states[-2]

MERGES = 27
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_MULTIPLE = 32
QWEN3_WIDTH = 64
DIT = dict(mz.TINY, cap_feat_dim=QWEN3_WIDTH)
DIT_METADATA = dict(mz.METADATA)  # kiln.z_image.axes_dim "8,12,12"
MAX_DIT_BYTES = 600 * 1000

# Qwen2's pre-tokenizer for ASCII text: \p{L} is [A-Za-z], \p{N} [0-9].
PRE_TOKENIZER = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|"
                           r"\s*[\r\n]+|\s+(?!\S)|\s+")


# ------------------------------------------------------------ tokenizer


def bytes_to_unicode():
    """GPT-2's map from the 256 byte values to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_CHARS = bytes_to_unicode()


def pre_tokenize(text):
    assert all(ord(c) < 128 for c in text), "the [A-Za-z] / [0-9] classes are exact for ASCII only"
    pieces = PRE_TOKENIZER.findall(text)
    assert "".join(pieces) == text
    return pieces


def byte_word(piece):
    return [BYTE_CHARS[b] for b in piece.encode("utf-8")]


def split_specials(text):
    """[(is_special, text)]: the specials cut out leftmost first, the longest at one place."""
    out = []
    i = start = 0
    while i < len(text):
        hits = [s for s in SPECIALS if text.startswith(s, i)]
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


def learn_merges(corpus, count):
    """Greedy BPE: `count` times, the adjacent pair with the most occurrences over the corpus' words
    (the smallest pair on ties) is merged everywhere."""
    words = {}
    for text in corpus:
        for special, part in split_specials(text):
            if not special:
                for piece in pre_tokenize(part):
                    key = tuple(byte_word(piece))
                    words[key] = words.get(key, 0) + 1
    words = [(list(w), n) for w, n in sorted(words.items())]
    merges = []
    for _ in range(count):
        pairs = {}
        for w, n in words:
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w, _ in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = merges
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.tokens = [BYTE_CHARS[b] for b in range(256)] + [a + b for a, b in merges] + SPECIALS
        assert len(set(self.tokens)) == len(self.tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def bpe(self, piece):
        word = byte_word(piece)
        while len(word) > 1:
            ranked = [(self.ranks.get((a, b), math.inf), i) for i, (a, b) in enumerate(zip(word, word[1:]))]
            rank, i = min(ranked)
            if rank == math.inf:
                break
            word[i:i + 2] = [word[i] + word[i + 1]]
        return [self.ids[t] for t in word]

    def __call__(self, text):
        out = []
        for special, part in split_specials(text):
            if special:
                out.append(self.ids[part])
            else:
                for piece in pre_tokenize(part):
                    out += self.bpe(piece)
        return out


def templated(prompt):
    return CHAT_PREFIX + prompt + CHAT_SUFFIX


def write_tokenizer(tok, folder):
    os.makedirs(folder, exist_ok=True)
    vocab = {t: i for i, t in enumerate(tok.tokens) if t not in SPECIALS}
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, indent=2, sort_keys=True, ensure_ascii=False)  # as HF's save_vocabulary
        f.write("\n")
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in tok.merges:
            f.write("%s %s\n" % (a, b))
    added = {str(tok.ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True} for s in SPECIALS}
    config = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "errors": "replace", "model_max_length": 40960, "split_special_tokens": False,
              "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def check_tokenizer(tok):
    """The definition's corner cases, independent of the prompt."""
    assert pre_tokenize("user\na red cat") == ["user", "\n", "a", " red", " cat"]
    assert pre_tokenize("it's 42  x!\n\n") == ["it", "'s", " ", "4", "2", " ", " x", "!\n\n"]
    assert pre_tokenize("\n<x y") == ["\n", "<x", " y"]
    assert split_specials("a<|im_end|><|im_start|>b") == [(False, "a"), (True, "<|im_end|>"),
                                                         (True, "<|im_start|>"), (False, "b")]
    # A word's ids decode back to its bytes.
    chars = {c: b for b, c in BYTE_CHARS.items()}
    for piece in (" square", "assistant", "xyz"):
        ids = tok.bpe(piece)
        assert bytes(chars[c] for i in ids for c in tok.tokens[i]).decode() == piece


# ------------------------------------------------------------ Qwen3 GGUF


def gguf_value(v):
    """export_gguf.gguf_value, plus arrays of ints (tokenizer.ggml.token_type is an INT32 array)."""
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return export_gguf.T_ARRAY, struct.pack("<IQ", export_gguf.T_INT32, len(v)) + \
            struct.pack("<%di" % len(v), *v)
    return STRING_GGUF_VALUE(v)


STRING_GGUF_VALUE = export_gguf.gguf_value


def write_qwen3_gguf(path, cfg, ckpt, tok):
    """make_qwen3_fixtures.py's llama.cpp names and metadata, plus the tokenizer as
    convert_hf_to_gguf.py writes Qwen's: the table's rows past the tokenizer are "[PAD<i>]", unused."""
    tokens = list(tok.tokens)
    types = [3 if t in SPECIALS else 1 for t in tokens]
    for i in range(len(tokens), cfg["vocab"]):
        tokens.append("[PAD%d]" % i)
        types.append(5)
    meta = {
        "general.architecture": "qwen3",
        "general.name": "qwen3-tiny-z-image",
        "general.alignment": export_gguf.ALIGN,
        "qwen3.block_count": cfg["layers"],
        "qwen3.context_length": 4096,
        "qwen3.embedding_length": cfg["hidden"],
        "qwen3.feed_forward_length": cfg["ffn"],
        "qwen3.attention.head_count": cfg["heads"],
        "qwen3.attention.head_count_kv": cfg["kv_heads"],
        "qwen3.attention.key_length": cfg["head_dim"],
        "qwen3.attention.value_length": cfg["head_dim"],
        "qwen3.rope.freq_base": float(cfg["rope_theta"]),
        "qwen3.attention.layer_norm_rms_epsilon": float(cfg["eps"]),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": ["%s %s" % m for m in tok.merges],
        "tokenizer.ggml.eos_token_id": tok.ids["<|im_end|>"],
        "tokenizer.ggml.padding_token_id": tok.ids["<|endoftext|>"],
        "tokenizer.ggml.bos_token_id": tok.ids["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
    }
    tensors = sorted(((mq.llama_cpp_name(name), t.numpy() if t.dim() >= 2 else t.to(torch.float32).numpy())
                      for name, t in ckpt.items()), key=lambda nt: nt[0])
    export_gguf.gguf_value = gguf_value
    try:
        export_gguf.write_gguf(path, meta, tensors)
    finally:
        export_gguf.gguf_value = STRING_GGUF_VALUE


# ------------------------------------------------------------ the jobs


def flow_sigmas():
    out = []
    for t in torch.linspace(999, 0, STEPS, dtype=torch.float64).tolist():
        s = (t + 1) / 1000
        sigma = SHIFT_FACTOR * s / (1 + (SHIFT_FACTOR - 1) * s)
        assert abs(sigma - bfl_time_shift(math.log(SHIFT_FACTOR), 1.0, s)) < 1e-12
        out.append(float(torch.tensor(sigma, dtype=torch.float32)))
    return out + [0.0]


def encode(llm, tok, prompt):
    ids = tok(templated(prompt))
    tokens = torch.tensor([ids], dtype=torch.int32)
    _, hidden = llm(tokens)
    h = hidden[HIDDEN_LAYER]
    assert torch.equal(h, llm.layer_outputs[len(llm.layer_outputs) - 2])  # raw, no final norm
    return tokens, h


def velocity(dit, x, sigma, context):
    v, _, _ = ref.velocity(dit, x, torch.tensor([sigma], dtype=torch.float64), [context[0]])
    return v


def run_job(dit, llm, ae, tok, cfg):
    io = {}
    tokens, hidden = encode(llm, tok, PROMPT)
    io["llm.tokens"] = tokens
    io["llm.hidden"] = mmf.f32(hidden)
    if cfg != 1.0:
        uncond_tokens, uncond_hidden = encode(llm, tok, NEGATIVE)
        io["llm.uncond_tokens"] = uncond_tokens
        io["llm.uncond_hidden"] = mmf.f32(uncond_hidden)
    sigmas = flow_sigmas()
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)
    lw, lh = WIDTH // 2, HEIGHT // 2  # the tiny autoencoder downsamples by 2
    noise = torch.tensor(PhiloxGenerator(NOISE_SEED).randn(16 * lh * lw), dtype=torch.float32)
    io["noise"] = noise.reshape(1, 16, lh, lw)
    x = io["noise"].double() * sigmas[0]
    for i in range(STEPS):
        v = velocity(dit, x, sigmas[i], hidden)
        if cfg != 1.0:
            u = velocity(dit, x, sigmas[i], uncond_hidden)
            v = u + cfg * (v - u)
        if i == 0:
            io["velocity0"] = mmf.f32(v)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    io["latent"] = mmf.f32(x)
    image, _ = ae.decode(x / SCALE + SHIFT)
    io["image"] = mmf.f32(image)
    return io


def write_dit(name, seed, diffusers_name=None):
    dit = ref.ZImage(**DIT)
    original = mz.randomize(dit, seed)
    stored = ref.comfy_names(original)
    path = os.path.join(PARTS, name)
    safetensors_io.save_file(stored, path, dict(DIT_METADATA))
    assert os.path.getsize(path) < MAX_DIT_BYTES, path
    if diffusers_name:
        safetensors_io.save_file(original, os.path.join(PARTS, diffusers_name), dict(DIT_METADATA))
    return dit.double().eval()


def save_job(io, name, extra):
    meta = {"prompt": PROMPT, "seed": str(NOISE_SEED), "steps": str(STEPS), "width": str(WIDTH),
            "height": str(HEIGHT), "generator": "training/make_z_image_pipeline_fixtures.py"}
    meta.update(extra)
    path = os.path.join(OUT, name)
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

    corpus = [templated(PROMPT), templated(NEGATIVE)]
    tok = Tokenizer(learn_merges(corpus, MERGES))
    assert len(tok.merges) == MERGES
    check_tokenizer(tok)
    write_tokenizer(tok, os.path.join(PARTS, "tokenizer"))

    vocab = -(-len(tok.tokens) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    qwen3 = dict(mq.QWEN3, vocab=vocab, hidden=QWEN3_WIDTH)
    llm = Qwen3Model(**qwen3)
    ckpt = mq.randomize(llm, SEED + 1)
    safetensors_io.save_file(ckpt, os.path.join(PARTS, "qwen3.safetensors"))
    write_qwen3_gguf(os.path.join(PARTS, "qwen3.gguf"), qwen3, ckpt, tok)
    llm = llm.double().eval()

    ae = AutoencoderKL(**AE)
    weights, _ = safetensors_io.load_file(AE_PATH)
    ae.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()})
    ae = ae.double().eval()

    turbo = write_dit("z_image_turbo_dit.safetensors", SEED + 2, "diffusers_transformer.safetensors")
    base = write_dit("z_image_base_dit.safetensors", SEED + 3)
    with torch.no_grad():
        save_job(run_job(turbo, llm, ae, tok, 1.0), "z_image_tiny_txt2img.safetensors",
                 {"model": "z_image_tiny/z_image_turbo_dit.safetensors", "cfg_scale": "1"})
        save_job(run_job(base, llm, ae, tok, BASE_CFG), "z_image_base_txt2img.safetensors",
                 {"model": "z_image_tiny/z_image_base_dit.safetensors", "cfg_scale": repr(BASE_CFG),
                  "negative_prompt": NEGATIVE})
    for folder in (PARTS, os.path.join(PARTS, "tokenizer")):
        for name in sorted(os.listdir(folder)):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), os.path.getsize(p)))
    print("tokenizer: %d tokens (%d merges), table %d; prompt %s" % (
        len(tok.tokens), len(tok.merges), vocab, tok(templated(PROMPT))))


if __name__ == "__main__":
    main()
