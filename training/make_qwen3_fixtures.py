#!/usr/bin/python3
"""Writes a tiny random-weight Qwen3 decoder and its golden fixtures for the
C++ tests (tests/unit/llm_encoder_test.cpp), computed with the PyTorch
reference in training/reference/qwen3.py.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_qwen3_fixtures.py [--out DIR]

Writes into tests/golden/models/:
  qwen3_tiny.safetensors     HF Qwen3ForCausalLM names with no prefix and no
                             LM head: model.embed_tokens.weight,
                             model.layers.N.*, model.norm.weight; F16
  qwen3_tiny.gguf            the same values in llama.cpp's names
                             (token_embd, blk.N.attn_q ... output_norm) with
                             llama.cpp's qwen3.* metadata; matrices F16, norm
                             scales F32 (as convert_hf_to_gguf.py writes them)
  qwen3_tiny_io.safetensors  tokens; the embedding; the raw output of every
                             layer (llm.layer.<i>; HF's hidden_states[i + 1]
                             for i < layers - 1); the final-normed output
                             (llm.out, HF's hidden_states[layers]); a batch of
                             two prompts and its output (F32, tokens I32)

The model has GQA (4 query heads over 2 K/V heads) and head_dim 32 with
hidden 64, so heads * head_dim = 128 is not the width, as in Qwen3-4B (32
heads of 128 over a width of 2560). Everything is seeded: running twice gives
byte-identical files.

The same three files for two decoders without QK norm, the same sizes:
  qwen2_tiny.*   Qwen2.5's layout (q/k/v biases; Qwen2.5-VL's text model), HF
                 names with metadata qwen2.attention.key_length "32" (an HF
                 file has no head width without QK norm); its GGUF in
                 llama.cpp's qwen2 names (attn_q.bias ...), q/k rows as HF's
  llama_tiny.*   Llama's / Mistral's layout (no biases, rope theta 1e9 as
                 Mistral Small 3.x), metadata llama.attention.key_length and
                 llama.rope.freq_base; its GGUF with q and k rows permuted as
                 llama.cpp's convert_hf_to_gguf.py does for llama (each head's
                 rotate-half pairs (i, i + d/2) made adjacent (2i, 2i + 1), for
                 llama.cpp's normal rope)
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_gguf  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from reference.qwen3 import Qwen3Model  # noqa: E402

SEED = 700
DTYPE = torch.float16
QWEN3 = dict(vocab=300, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=32, ffn=96, rope_theta=1e6, eps=1e-6)
# The decoders without QK norm: (config, seed offset, GGUF architecture).
NO_QK_NORM = {
    "qwen2": (dict(QWEN3, qk_norm=False, qkv_bias=True), 100, "qwen2"),
    "llama": (dict(QWEN3, qk_norm=False, rope_theta=1e9, eps=1e-5), 200, "llama"),
}
TOKENS = 20
BATCH_TOKENS = 16  # the batch test: two prompts of this length


def log(msg):
    print(msg, flush=True)


def init_value(name, shape, gen):
    shape = tuple(shape)
    if name == "model.embed_tokens.weight":
        return torch.randn(shape, generator=gen)
    if len(shape) == 1:  # RMSNorm scales
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) * shape[1] ** -0.5


def randomize(module, seed):
    """Seeded weights in state_dict order, rounded to DTYPE; returns them as
    stored and loads the widened values into `module`."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for name, param in module.state_dict().items():
        stored[name] = init_value(name, param.shape, gen).to(DTYPE).contiguous()
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()})
    return stored


# HF names to llama.cpp's (convert_hf_to_gguf.py / gguf-py tensor_mapping for qwen3).
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    assert parts[:2] == ["model", "layers"] and parts[-1] in ("weight", "bias"), hf
    return "blk.%s.%s.%s" % (parts[2], LAYER_NAMES[".".join(parts[3:-1])], parts[-1])


def llama_cpp_permute(t, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows in rotate-half order (i, i + d/2)
    become interleaved pairs (2i, 2i + 1), for llama.cpp's normal-mode rope."""
    return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def metadata(arch, c):
    return {
        "%s.block_count" % arch: c["layers"],
        "%s.context_length" % arch: 4096,
        "%s.embedding_length" % arch: c["hidden"],
        "%s.feed_forward_length" % arch: c["ffn"],
        "%s.attention.head_count" % arch: c["heads"],
        "%s.attention.head_count_kv" % arch: c["kv_heads"],
        "%s.attention.key_length" % arch: c["head_dim"],
        "%s.attention.value_length" % arch: c["head_dim"],
        "%s.rope.freq_base" % arch: float(c["rope_theta"]),
        "%s.attention.layer_norm_rms_epsilon" % arch: float(c["eps"]),
    }


def write_gguf(path, ckpt, arch="qwen3", c=QWEN3):
    meta = {"general.architecture": arch, "general.name": arch + "-tiny", "general.alignment": export_gguf.ALIGN}
    meta.update(metadata(arch, c))
    tensors = []
    for name, t in ckpt.items():
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = llama_cpp_permute(t, c["heads"] if "q_proj" in name else c["kv_heads"])
        arr = t.numpy() if t.dim() >= 2 else t.to(torch.float32).numpy()
        tensors.append((llama_cpp_name(name), arr))
    tensors.sort(key=lambda nt: nt[0])
    export_gguf.write_gguf(path, meta, tensors)
    log("wrote %s: %d tensors, %.1f KB" % (os.path.relpath(path, mmf.ROOT), len(tensors),
                                            os.path.getsize(path) / 1e3))


def build(c=QWEN3, seed=SEED):
    model = Qwen3Model(**c)
    ckpt = randomize(model, seed + 1)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(0, c["vocab"], (1, TOKENS), generator=gen, dtype=torch.int64).to(torch.int32)
    batch_tokens = torch.randint(0, c["vocab"], (2, BATCH_TOKENS), generator=gen,
                                 dtype=torch.int64).to(torch.int32)
    io = {}
    with torch.no_grad():
        out, hidden = model(tokens)
        io["llm.tokens"] = tokens
        io["llm.embedding"] = mmf.f32(hidden[0])
        for i, h in enumerate(model.layer_outputs):
            io["llm.layer.%d" % i] = mmf.f32(h)
        io["llm.out"] = mmf.f32(out)
        # HF's tuple: hidden_states[i + 1] is layer i's raw output except the last, replaced by the normed one.
        assert len(hidden) == c["layers"] + 1 and torch.equal(hidden[-1], out)
        assert all(torch.equal(hidden[i + 1], model.layer_outputs[i]) for i in range(c["layers"] - 1))
        batch_out, _ = model(batch_tokens)
        io["llm.batch.tokens"] = batch_tokens
        io["llm.batch.out"] = mmf.f32(batch_out)
        # Causality: the first half of a prompt does not see the second.
        half = TOKENS // 2
        head_out, _ = model(tokens[:, :half])
        assert torch.allclose(head_out, out[:, :half], rtol=0, atol=1e-9)
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=mmf.DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.manual_seed(SEED)
    ckpt, io = build()
    os.makedirs(args.out, exist_ok=True)
    mmf.save_fixture_pair(args.out, "qwen3_tiny", ckpt, io, "training/make_qwen3_fixtures.py",
                          "[batch, tokens, hidden]")
    write_gguf(os.path.join(args.out, "qwen3_tiny.gguf"), ckpt)
    for name, (c, offset, arch) in NO_QK_NORM.items():
        ckpt, io = build(c, SEED + offset)
        # Without QK norm an HF file says nothing of the head width; kiln reads llama.cpp's keys from
        # the safetensors metadata too.
        meta = {k: str(v) for k, v in metadata(arch, c).items() if "key_length" in k or "freq_base" in k}
        mmf.save_fixture_pair(args.out, name + "_tiny", ckpt, io, "training/make_qwen3_fixtures.py",
                              "[batch, tokens, hidden]", meta)
        write_gguf(os.path.join(args.out, name + "_tiny.gguf"), ckpt, arch, c)
    check_llama_permute()


def check_llama_permute():
    """The permuted rows under interleaved (GPT-J) rope give HF's rotate-half rope: the GGUF's
    llama arch is the same network."""
    gen = torch.Generator().manual_seed(5)
    heads, d, n = 2, 8, 5
    w = torch.randn(heads * d, 6, generator=gen, dtype=torch.float64)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    inv = 1.0 / (1e4 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    hf = (x @ w.t()).view(n, heads, d)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    from reference.qwen3 import rotate_half
    want = hf * cos + rotate_half(hf) * sin
    p = (x @ llama_cpp_permute(w, heads).t()).view(n, heads, d // 2, 2)
    c, s_ = ang.cos()[:, None], ang.sin()[:, None]
    got = torch.stack([p[..., 0] * c - p[..., 1] * s_, p[..., 0] * s_ + p[..., 1] * c], -1).view(n, heads, d)
    # Interleaved pair j of the permuted head is HF's pair (j, j + d/2).
    unpermuted = torch.cat([got[..., 0::2], got[..., 1::2]], -1)
    assert torch.allclose(unpermuted, want, atol=1e-12), "llama.cpp's permute does not match HF's rope"


if __name__ == "__main__":
    main()
