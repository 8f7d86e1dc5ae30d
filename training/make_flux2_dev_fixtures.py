#!/usr/bin/python3
"""Writes the tiny fixtures of FLUX.2 [dev]: its DiT with the guidance
embedding, a tiny Mistral in Mistral3ForConditionalGeneration's names (the
layout of FLUX.2-dev's text_encoder/) with its hidden states 10, 20 and 30 side
by side, and a tiny Tekken tokenizer (Mistral Small 3.1 / 3.2's, as
transformers converts it to tokenizer.json). References:
training/reference/flux2.py (BFL's flux2 model.py), training/reference/qwen3.py
in its Llama mode (HF modeling_mistral), training/reference/tekken.py
(tiktoken's byte-pair algorithm).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_flux2_dev_fixtures.py [--out DIR] [--tokenizer-out DIR]

Writes into tests/golden/models/ (shapes in PyTorch order):

  flux2_dev_tiny.safetensors       the DiT, BFL names, no prefix: flux2_tiny's
                                   config (hidden 64, 2 heads of 32, axes 4,
                                   10, 10, 8, theta 2000, SwiGLU 192, 2 double
                                   + 2 single blocks, in 128, context 48 = 3 x
                                   the tiny Mistral's 16) with
                                   guidance_in.{in,out}_layer (use_guidance_embed,
                                   as flux2-dev.safetensors); the same metadata
                                   as flux2_tiny; weights F16 (under 1 MB).
  flux2_dev_tiny_io.safetensors    x [2, 128, 3, 5], context [2, 7, 48],
                                   timesteps [2] = (1, 0.35) (sigma),
                                   guidance [2] = (4, 2.5) (as BFL passes it;
                                   the model multiplies both by 1000 inside),
                                   ids [22, 4] (text then image positions),
                                   vec [2, 64] (time_in(t) + guidance_in(g)),
                                   out [2, 128, 3, 5]; out.guidance_swapped:
                                   the output with the two guidances swapped.
  flux2_dev_mistral_tiny.safetensors
                                   Mistral3ForConditionalGeneration's names:
                                   language_model.model.{embed_tokens,
                                   layers.N.*, norm}, language_model.lm_head,
                                   and a few small random vision_tower.* and
                                   multi_modal_projector.* tensors (never to be
                                   read). Llama layout (no QK norm, no biases):
                                   32 layers of width 16, 2 heads of 8 over 1
                                   K/V head, SwiGLU 32, RMSNorm eps 1e-5, rope
                                   theta 1e9 in HF's rotate-half layout; vocab =
                                   the tiny Tekken's. Metadata (kiln's llama
                                   keys): llama.rope.freq_base 1e9,
                                   llama.attention.key_length 8,
                                   llama.attention.layer_norm_rms_epsilon 1e-5.
                                   F32.
  flux2_dev_mistral_tiny_io.safetensors
                                   ids [L] (I32): the fixture prompt (FLUX.2's
                                   system message and "a red fox in the snow"
                                   under Mistral's template) by the tiny
                                   Tekken, unpadded; out [L, 48]: HF's
                                   hidden_states[10], [20], [30] side by side
                                   (hidden_states[0] the embeddings, [k] the
                                   output of layer k, no final norm), as BFL's
                                   Mistral embedder stacks them.

and into tests/golden/pipeline/flux2_dev_tiny/tokenizer/:

  tokenizer.json                   HF tokenizers' format as transformers'
                                   MistralConverter writes Tekken: ids 0..999
                                   the special tokens (added_tokens, special,
                                   also in model.vocab), 1000..1255 the bytes
                                   (GPT-2's byte-level characters), then
                                   MERGES tokens learned tiktoken-style from a
                                   small English corpus (the fixture prompt and
                                   FLUX.2's system message in it); model BPE
                                   with ignore_merges, merges = every split of
                                   each merged token into two tokens, in rank
                                   order (the converter's); pre_tokenizer
                                   Split(Tekken's pattern, Isolated) then
                                   ByteLevel without its regex; no normalizer.

Before writing, the script checks: the DiT's guidance is BFL's (vec =
time_in(emb(1000 t)) + guidance_in(emb(1000 g)) computed apart), the guidance
changes the output; the tokenizer's ids decode to the text, the HF-style BPE
over the written merges (lowest merge rank first, whole-token pieces kept)
gives tiktoken's ids on the prompt and the corpus, the prompt is not tokenized
byte by byte; the Mistral's hidden states from the reference equal an
independent computation (complex rotation of HF's (i, i + d/2) pairs) and are
causal. Everything is seeded and built twice: the second build must equal the
first bit for bit.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_flux2_fixtures as mff  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from reference import flux2 as ref  # noqa: E402
from reference import tekken  # noqa: E402
from reference.qwen3 import Qwen3Model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "models")
DEFAULT_TOKENIZER_OUT = os.path.join(ROOT, "tests", "golden", "pipeline", "flux2_dev_tiny", "tokenizer")
GENERATOR = "training/make_flux2_dev_fixtures.py"
MAX_BYTES = 1 << 20

SEED = 2700
DIT = dict(mff.TINY, use_guidance_embed=True)
DIT_METADATA = dict(mff.DIT_METADATA)
BATCH, GRID, TXT = 2, (3, 5), 7
TIMESTEPS = (1.0, 0.35)
GUIDANCE = (4.0, 2.5)  # FLUX.2 [dev]'s default guidance is 4

# ------------------------------------------------------------ the tokenizer

MERGES = 150
# BFL src/flux2/text_encoder.py (Mistral's embedder): the system message. The
# fixture prompt carries it with a newline after "object" (a piece of its own).
SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing on "
                  "object relationships, object attribution and actions without speculation.")
PROMPT = "a red fox in the snow"
FIXTURE_TEXT = ("<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You give structured "
                "responses focusing on object relationships, object\nattribution and actions without speculation."
                "[/SYSTEM_PROMPT][INST]" + PROMPT + "[/INST]")
CORPUS = [
    FIXTURE_TEXT,
    "<s>[SYSTEM_PROMPT]" + SYSTEM_MESSAGE + "[/SYSTEM_PROMPT][INST]a photo of a cat[/INST]",
    "A red fox stands in the snow at the edge of the forest, its fur bright against the white ground.",
    "The fox is looking at the camera. Snow is falling on the trees and on the river in the background.",
    "A photo of a cat sitting on a wooden table in a sunny kitchen, with a red apple and a cup of tea.",
    "An image of two dogs running on the beach at sunset; the sea and the sky are orange and pink.",
    "A portrait of an old man with a white beard, wearing a red hat and a blue coat in the snow.",
    "The object on the left is a red box and the object on the right is a blue ball on the table.",
    "Describe the image: a small house in the mountains, snow on the roof, smoke rising from the chimney.",
    "Actions in the scene: the girl reads a book, the boy plays with a red kite, the dog sleeps.",
    "Relationships between objects: the lamp stands on the desk, the cat sleeps under the lamp.",
    "The fox jumps into the snow to catch a mouse; its tail is red and white.",
    "A city street at night with red and green lights, people walking in the rain with umbrellas.",
    "A bowl of fruit on a table: red apples, green pears and a bunch of yellow bananas.",
    "Without speculation, list the objects in the image and their attributes and positions.",
    "A red car parked in front of a white house with a green door and two windows.",
    "In the forest there is a river, and a bear is standing in the river catching a fish.",
    "The sky is blue, the snow is white and the fox is red: a winter scene in the mountains.",
]


def hf_bpe_encode(tokenizer_json, text, tok):
    """An HF tokenizers-style encode from the written tokenizer.json alone: the pieces of the
    reference pre-tokenizer, each kept whole when it is a vocabulary token (ignore_merges),
    else its byte-level characters merged by the merges list (the lowest merge index among
    adjacent pairs first, leftmost on ties). Cross-checks tiktoken's rank rule."""
    vocab = tokenizer_json["model"]["vocab"]
    merge_rank = {}
    for i, (a, b) in enumerate(tokenizer_json["model"]["merges"]):
        merge_rank.setdefault((a, b), i)
    ids = []
    for part, special in tok.split_specials(text):
        if special is not None:
            ids.append(special)
            continue
        for piece in tok.pieces(part):
            word = tekken.token_string(piece.encode("utf-8"))
            if word in vocab:
                ids.append(vocab[word])
                continue
            symbols = list(word)
            while True:
                ranked = [(merge_rank[(symbols[i], symbols[i + 1])], i) for i in range(len(symbols) - 1)
                          if (symbols[i], symbols[i + 1]) in merge_rank]
                if not ranked:
                    break
                _, i = min(ranked)
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
            ids.extend(vocab[s] for s in symbols)
    return ids


def tokenizer_json(ranks):
    """transformers' MistralConverter output for these ranks (tokenizers' JSON layout)."""
    specials = tekken.special_tokens()
    vocab = {s: i for i, s in enumerate(specials)}
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges = []
    for token, rank in by_rank:
        vocab[tekken.token_string(token)] = tekken.NUM_SPECIAL + rank
        if len(token) == 1:
            continue
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        assert local, "merged token %r has no split into two tokens" % token
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend([tekken.token_string(a), tekken.token_string(b)] for a, b in local)
    added = [dict(id=i, content=s, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, s in enumerate(specials)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": tekken.TEKKEN_PATTERN}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def build_tokenizer(path):
    """Trains, writes tokenizer.json to `path`, reads it back; returns (Tekken, json text, prompt ids)."""
    ranks = tekken.train(CORPUS, MERGES)
    assert len(ranks) == 256 + MERGES
    tj = tokenizer_json(ranks)
    text = json.dumps(tj, ensure_ascii=False, indent=2) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    tok = tekken.Tekken.from_tokenizer_json(path)
    assert tok.ranks == ranks and tok.vocab_size == 1000 + 256 + MERGES
    for t in CORPUS + [SYSTEM_MESSAGE, "Ünïcödé, 12 345 and CamelCase\r\n\n  tabs\there / slashes//\n"]:
        ids = tok.encode(t)
        assert tok.decode(ids) == t, t
        assert hf_bpe_encode(tj, t, tok) == ids, "HF-style merges differ from tiktoken's ranks on %r" % t
    ids = tok.encode(FIXTURE_TEXT)
    text_ids = [i for i in ids if i >= tekken.NUM_SPECIAL]
    # The prompt's words are whole tokens or merged pieces, not bytes.
    assert len(text_ids) < len(FIXTURE_TEXT.encode("utf-8")) // 3, len(text_ids)
    assert ids[:2] == [1, 17] and ids[-1] == 4 and ids.count(18) == 1 and ids.count(3) == 1
    return tok, text, ids


def check_pattern():
    """The pre-tokenizer's pieces on what tells Tekken's pattern apart from Qwen2's."""
    tok = tekken.Tekken({bytes([b]): b for b in range(256)})
    assert tok.pieces("Hello WORLD CamelCase") == ["Hello", " WORLD", " Camel", "Case"]
    assert tok.pieces("it's 2024!") == ["it", "'s", " ", "2", "0", "2", "4", "!"]
    assert tok.pieces("object\nattribution") == ["object", "\n", "attribution"]
    assert tok.pieces("a/b\n//\n c") == ["a", "/b", "\n", "//\n", " c"]
    assert tok.split_specials("<s>[INST]x[/INST]") == [(None, 1), (None, 3), ("x", None), (None, 4)]
    assert tok.split_specials("<SPECIAL_200>") == [(None, 200)], "the longest special token wins"
    assert tekken.byte_pair_merge({b"a": 0, b"b": 1, b"ab": 2, b"ba": 3}, b"aba") == [b"ab", b"a"]


# ------------------------------------------------------------ the DiT with guidance


def f16_randomize(module, seed):
    """mff's seeded values in state_dict order, stored F16; loads the widened values."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for k, v in module.state_dict().items():
        stored[k] = mff.init_value(k, tuple(v.shape), gen).to(torch.float16).contiguous()
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()}, strict=True)
    return stored


def build_dit(seed):
    model = ref.Flux2(**DIT)
    want = ref.bfl_dit_tensor_shapes(DIT)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == want
    assert "guidance_in.in_layer.weight" in want and "guidance_in.out_layer.weight" in want
    ckpt = f16_randomize(model, seed)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(BATCH, 128, *GRID, generator=gen)
    context = torch.randn(BATCH, TXT, DIT["context_in_dim"], generator=gen)
    timesteps = torch.tensor(TIMESTEPS)
    guidance = torch.tensor(GUIDANCE)
    io = {"x": x, "context": context, "timesteps": timesteps, "guidance": guidance}
    with torch.no_grad():
        out, blocks = model(x.double(), context.double(), timesteps.double(), guidance=guidance.double())
        swapped, _ = model(x.double(), context.double(), timesteps.double(), guidance=guidance.flip(0).double())
        # BFL's Flux2.forward: vec = time_in(timestep_embedding(t)) + guidance_in(timestep_embedding(g)),
        # timestep_embedding(u) = cat(cos, sin) of 1000 u * exp(-ln(10000) i / 128), computed apart here.
        freqs = torch.exp(-math.log(10000.0) * torch.arange(128, dtype=torch.float64) / 128)

        def emb(u):
            a = 1000.0 * u.double()[:, None] * freqs[None]
            return torch.cat([a.cos(), a.sin()], dim=-1)

        def mlp(name, e):
            w1, w2 = ckpt[name + ".in_layer.weight"].double(), ckpt[name + ".out_layer.weight"].double()
            return F.silu(e @ w1.t()) @ w2.t()

        vec = mlp("time_in", emb(timesteps)) + mlp("guidance_in", emb(guidance))
        assert torch.allclose(vec, blocks["vec"], rtol=0, atol=1e-12), "vec is not time_in + guidance_in"
        assert not torch.allclose(out, swapped, atol=1e-3), "the guidance does not change the output"
    io["ids"] = mmf.f32(model.token_ids(TXT, GRID))
    io["vec"] = mmf.f32(blocks["vec"])
    io["out"] = mmf.f32(out)
    io["out.guidance_swapped"] = mmf.f32(swapped)
    return ckpt, io


# ------------------------------------------------------------ the tiny Mistral

MISTRAL = dict(hidden=16, layers=32, heads=2, kv_heads=1, head_dim=8, ffn=32, rope_theta=1e9, eps=1e-5,
               qk_norm=False)
OUTPUT_LAYERS = (10, 20, 30)  # BFL's Mistral embedder: HF hidden_states indices
HF_PREFIX = "language_model."  # Mistral3ForConditionalGeneration: language_model.model.* and language_model.lm_head
MISTRAL_METADATA = {"llama.rope.freq_base": "1000000000.0", "llama.attention.key_length": "8",
                    "llama.attention.layer_norm_rms_epsilon": "1e-05"}
# Pixtral's vision tower and Mistral3's projector: a few of their names, small shapes.
VISION_SHAPES = {
    "vision_tower.patch_conv.weight": (8, 3, 2, 2),
    "vision_tower.ln_pre.weight": (8,),
    "vision_tower.transformer.layers.0.attention_norm.weight": (8,),
    "vision_tower.transformer.layers.0.attention.q_proj.weight": (8, 8),
    "vision_tower.transformer.layers.0.attention.k_proj.weight": (8, 8),
    "vision_tower.transformer.layers.0.feed_forward.gate_proj.weight": (12, 8),
    "multi_modal_projector.norm.weight": (8,),
    "multi_modal_projector.patch_merger.merging_layer.weight": (8, 32),
    "multi_modal_projector.linear_1.weight": (16, 8),
    "multi_modal_projector.linear_2.weight": (16, 16),
}


def mistral_init(name, shape, gen):
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    if len(shape) == 1:
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) * shape[1] ** -0.5


def independent_hidden_states(w, ids, c):
    """HF modeling_mistral's hidden_states from the stored names alone: RMSNorm, q/k rotated as
    complex numbers (x[j] + i x[j + d/2]) * exp(i pos theta^(-2j/d)), grouped K/V, causal softmax."""
    p = HF_PREFIX + "model."
    d, n = c["head_dim"], ids.shape[0]

    def norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c["eps"]) * weight

    angle = torch.arange(n, dtype=torch.float64)[:, None] * c["rope_theta"] ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)[None]
    turn = torch.polar(torch.ones_like(angle), angle)  # [n, d/2]

    def rotate(t):  # [n, heads, d]
        z = torch.complex(t[..., :d // 2], t[..., d // 2:]) * turn[:, None, :]
        return torch.cat([z.real, z.imag], dim=-1)

    x = w[p + "embed_tokens.weight"][ids]
    hs = [x]
    for i in range(c["layers"]):
        lp = p + "layers.%d." % i
        h = norm(x, w[lp + "input_layernorm.weight"])
        q = rotate((h @ w[lp + "self_attn.q_proj.weight"].t()).view(n, c["heads"], d))
        k = rotate((h @ w[lp + "self_attn.k_proj.weight"].t()).view(n, c["kv_heads"], d))
        v = (h @ w[lp + "self_attn.v_proj.weight"].t()).view(n, c["kv_heads"], d)
        heads = []
        for j in range(c["heads"]):
            kv = j * c["kv_heads"] // c["heads"]
            s = q[:, j] @ k[:, kv].t() / math.sqrt(d)
            s = s + torch.full((n, n), float("-inf"), dtype=s.dtype).triu(1)
            heads.append(torch.softmax(s, dim=-1) @ v[:, kv])
        x = x + torch.cat(heads, dim=-1) @ w[lp + "self_attn.o_proj.weight"].t()
        h = norm(x, w[lp + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ w[lp + "mlp.gate_proj.weight"].t()) * (h @ w[lp + "mlp.up_proj.weight"].t())) @ \
            w[lp + "mlp.down_proj.weight"].t()
        hs.append(x)
    return hs


def build_mistral(seed, ids, vocab):
    model = Qwen3Model(vocab=vocab, **MISTRAL)
    gen = torch.Generator().manual_seed(seed)
    ckpt = {}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            ckpt[HF_PREFIX + name] = mistral_init(name, tuple(t.shape), gen).to(torch.float32).contiguous()
        model.load_state_dict({k[len(HF_PREFIX):]: v for k, v in ckpt.items()}, strict=True)
        ckpt[HF_PREFIX + "lm_head.weight"] = (torch.randn(vocab, MISTRAL["hidden"], generator=gen) * 0.25).contiguous()
        for name, shape in VISION_SHAPES.items():
            ckpt[name] = mistral_init(name, shape, gen).to(torch.float32).contiguous()
    assert not any(k.endswith(".bias") or "_norm." in k.replace("_layernorm", "") for k in ckpt if "model.layers" in k)
    model = model.double().eval()
    tokens = torch.tensor(ids, dtype=torch.int64)
    with torch.no_grad():
        _, hs = model(tokens[None])
        assert len(hs) == MISTRAL["layers"] + 1
        context = ref.klein_context([h for h in hs], OUTPUT_LAYERS)[0]  # [L, 3 * 16]: [h10 | h20 | h30]
        other = independent_hidden_states({k: v.double() for k, v in ckpt.items()}, tokens, MISTRAL)
        for k in OUTPUT_LAYERS:
            assert torch.allclose(hs[k][0], other[k], rtol=0, atol=1e-9 * other[k].abs().max()), k
        # Causal: the first tokens' states do not see the rest.
        _, head = model(tokens[None, :10])
        assert torch.allclose(head[30][0], hs[30][0, :10], rtol=0, atol=1e-9 * hs[30].abs().max())
    assert context.shape == (len(ids), 48)
    assert torch.equal(context[:, 16:32], hs[20][0])
    io = {"ids": tokens.to(torch.int32), "out": mmf.f32(context)}
    return ckpt, io


def same(a, b):
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    ap.add_argument("--tokenizer-out", default=DEFAULT_TOKENIZER_OUT,
                    help="tokenizer folder (default tests/golden/pipeline/flux2_dev_tiny/tokenizer)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.tokenizer_out, exist_ok=True)
    check_pattern()

    path = os.path.join(args.tokenizer_out, "tokenizer.json")
    tok, text, ids = build_tokenizer(path)
    tok2, text2, ids2 = build_tokenizer(path)
    assert text == text2 and ids == ids2, "a second tokenizer build differs"
    size = os.path.getsize(path)
    assert size < MAX_BYTES
    mmf.log("wrote %s: vocabulary %d (1000 special, 256 bytes, %d merged), %d merges, %.1f KB"
            % (os.path.relpath(path, ROOT), tok.vocab_size, MERGES, len(json.loads(text)["model"]["merges"]),
               size / 1e3))
    mmf.log("fixture prompt: %d ids {%s}" % (len(ids), ", ".join(str(i) for i in ids)))
    mmf.log("  pieces: %s" % " | ".join(repr(tok.decode([i])) for i in ids))

    for name, build, seed, metadata, note in (
            ("flux2_dev_tiny", build_dit, SEED, DIT_METADATA, "NCHW, [batch, tokens, width]"),
            ("flux2_dev_mistral_tiny", lambda s: build_mistral(s, ids, tok.vocab_size), SEED + 10,
             MISTRAL_METADATA, "[tokens], [tokens, 3 x width]")):
        ckpt, io = build(seed)
        ckpt2, io2 = build(seed)
        assert same(ckpt, ckpt2) and same(io, io2), name + ": a second build differs"
        mmf.save_fixture_pair(args.out, name, ckpt, io, GENERATOR, note, metadata, max_bytes=MAX_BYTES)


if __name__ == "__main__":
    main()
