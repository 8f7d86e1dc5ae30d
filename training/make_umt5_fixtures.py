#!/usr/bin/python3
"""Writes a tiny random-weight umT5 encoder and its golden fixtures for the
C++ tests (tests/unit/umt5_encoder_test.cpp), computed with the PyTorch
reference in training/reference/umt5.py (Wan's encoder, shared_pos=False).

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_umt5_fixtures.py [--out DIR]

Writes into tests/golden/models/:
  umt5_tiny.safetensors     HF UMT5EncoderModel names with no prefix (as
                            ComfyUI's umt5_xxl_fp16.safetensors): shared.weight,
                            encoder.block.N.* with a relative_attention_bias in
                            every block, encoder.final_layer_norm.weight; F16
  umt5_tiny.gguf            the same values in llama.cpp's names
                            (token_embd, enc.blk.N.attn_rel_b, ...: city96's
                            umt5-xxl-encoder GGUFs); 1-D norms F32
  umt5_tiny_io.safetensors  tokens, key mask, per-block and final outputs, the
                            masked output, and the output with every block
                            using block 0's table (what a T5-style shared
                            table would give); F32, tokens I32

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_gguf  # noqa: E402
import make_model_fixtures as mmf  # noqa: E402
from reference.t5 import T5EncoderV11  # noqa: E402
from reference.umt5 import UMT5Encoder, hf_name  # noqa: E402

SEED = 700
DTYPE = torch.float16
# Small enough that the three files stay under 200 KB together.
UMT5 = dict(vocab=300, dim=32, dim_attn=32, dim_ffn=48, num_heads=4, num_layers=3, num_buckets=32)
D_KV = UMT5["dim_attn"] // UMT5["num_heads"]
PAD, EOS = 0, 1  # umT5's SentencePiece ids, as T5's
# 24 tokens: relative positions up to 23 reach the log-spaced buckets of
# each direction; the second prompt is padded.
TOKENS = 24
REAL = (24, 13)

# HF names to llama.cpp's (convert_hf_to_gguf.py / gguf-py's tensor_mapping for T5's encoder).
LLAMA_CPP_BLOCK_NAMES = {
    "layer.0.SelfAttention.q": "attn_q",
    "layer.0.SelfAttention.k": "attn_k",
    "layer.0.SelfAttention.v": "attn_v",
    "layer.0.SelfAttention.o": "attn_o",
    "layer.0.SelfAttention.relative_attention_bias": "attn_rel_b",
    "layer.0.layer_norm": "attn_norm",
    "layer.1.DenseReluDense.wi_0": "ffn_gate",
    "layer.1.DenseReluDense.wi_1": "ffn_up",
    "layer.1.DenseReluDense.wo": "ffn_down",
    "layer.1.layer_norm": "ffn_norm",
}


def log(msg):
    print(msg, flush=True)


def llama_cpp_name(hf):
    if hf == "shared.weight":
        return "token_embd.weight"
    if hf == "encoder.final_layer_norm.weight":
        return "enc.output_norm.weight"
    parts = hf.split(".")  # encoder.block.N.<module...>.weight
    assert parts[:2] == ["encoder", "block"] and parts[-1] == "weight", hf
    return "enc.blk.%s.%s.weight" % (parts[2], LLAMA_CPP_BLOCK_NAMES[".".join(parts[3:-1])])


def init_value(name, shape, gen):
    shape = tuple(shape)
    if name == "token_embedding.weight" or name.endswith("pos_embedding.embedding.weight"):
        return torch.randn(shape, generator=gen)  # every block's table differs
    if len(shape) == 1:  # RMSNorm scales
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    scale = shape[1] ** -0.5
    if name.endswith("attn.q.weight"):
        scale *= D_KV ** -0.5  # the 1/sqrt(d_kv) T5 leaves out of the attention lives in q's init
    return torch.randn(shape, generator=gen) * scale


def randomize(module, seed):
    """Seeded weights in state_dict order, rounded to DTYPE; loads the
    widened values into `module` and returns them as stored, in HF names."""
    gen = torch.Generator().manual_seed(seed)
    stored = {name: init_value(name, p.shape, gen).to(DTYPE).contiguous() for name, p in module.state_dict().items()}
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()})
    return {hf_name(k): v for k, v in stored.items()}


def make_tokens(gen):
    rows = []
    for real in REAL:
        ids = torch.randint(2, UMT5["vocab"], (real - 1,), generator=gen).tolist()
        rows.append(ids + [EOS] + [PAD] * (TOKENS - real))
    return torch.tensor(rows, dtype=torch.int32)


def with_block0_table(model):
    """The model with every block's table replaced by block 0's."""
    shared = copy.deepcopy(model)
    table = model.blocks[0].pos_embedding.embedding.weight
    for block in shared.blocks:
        block.pos_embedding.embedding.weight.data.copy_(table)
    return shared


def check_against_t5(ckpt, tokens, expected):
    """The shared-table output from the T5 v1.1 reference (reference/t5.py,
    written from the T5 paper and HF's layout): two transcriptions agree."""
    t5 = T5EncoderV11(vocab=UMT5["vocab"], d_model=UMT5["dim"], d_kv=D_KV, heads=UMT5["num_heads"],
                      d_ff=UMT5["dim_ffn"], layers=UMT5["num_layers"], num_buckets=UMT5["num_buckets"])
    state = {k: v.to(torch.float64) for k, v in ckpt.items()
             if "relative_attention_bias" not in k or k.startswith("encoder.block.0.")}
    t5.double().load_state_dict(state)
    with torch.no_grad():
        out, _ = t5.eval()(tokens)
    assert torch.allclose(out, expected, rtol=0, atol=1e-10), "umt5.py and t5.py disagree on a shared table"


def build():
    model = UMT5Encoder(**UMT5)
    ckpt = randomize(model, SEED + 1)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(SEED + 1000)
    tokens = make_tokens(gen)
    mask = (tokens != PAD).to(torch.float32)
    io = {}
    with torch.no_grad():
        out, blocks = model(tokens)
        out_masked, _ = model(tokens, mask.double())
        out_block0, _ = with_block0_table(model)(tokens)
    check_against_t5(ckpt, tokens, out_block0)
    difference = ((out - out_block0).abs().max() / out.abs().max()).item()
    log("block 0's table everywhere changes the output by %.2f of its scale" % difference)
    assert difference > 0.05, "the per-block tables must matter"
    io["umt5.tokens"] = tokens
    io["umt5.key_mask"] = mask
    io["umt5.out"] = mmf.f32(out)
    for i, b in enumerate(blocks):
        io["umt5.block.%d" % i] = mmf.f32(b)
    io["umt5.out_masked"] = mmf.f32(out_masked)
    io["umt5.out_block0_table"] = mmf.f32(out_block0)
    return ckpt, io


def write_gguf(path, ckpt):
    meta = {"general.architecture": "t5encoder", "general.name": "umt5-tiny", "general.alignment": export_gguf.ALIGN}
    tensors = []
    for name, t in ckpt.items():
        arr = t.numpy() if t.dim() >= 2 else t.to(torch.float32).numpy()
        tensors.append((llama_cpp_name(name), arr))
    tensors.sort(key=lambda nt: nt[0])
    export_gguf.write_gguf(path, meta, tensors)
    log("wrote %s: %d tensors, %.1f KB" % (os.path.relpath(path, mmf.ROOT), len(tensors), os.path.getsize(path) / 1e3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=mmf.DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.manual_seed(SEED)
    ckpt, io = build()
    os.makedirs(args.out, exist_ok=True)
    mmf.save_fixture_pair(args.out, "umt5_tiny", ckpt, io, "training/make_umt5_fixtures.py", "[batch, tokens, dim]")
    write_gguf(os.path.join(args.out, "umt5_tiny.gguf"), ckpt)


if __name__ == "__main__":
    main()
