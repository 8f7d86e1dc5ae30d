#!/usr/bin/python3
"""Writes a tiny random-weight T5 v1.1 encoder and its golden fixtures for the
C++ tests (tests/unit/t5_encoder_test.cpp), computed with the PyTorch
reference in training/reference/t5.py.

Run with Debian's python3-torch (not a pyenv python):
    /usr/bin/python3 training/make_t5_fixtures.py [--out DIR]

Writes into tests/golden/models/ (see training/README.md for the contents):
  t5_tiny.safetensors      HF T5EncoderModel names with no prefix (as
                           t5xxl_fp16.safetensors): shared.weight,
                           encoder.block.N.*, encoder.final_layer_norm.weight; F16
  t5_tiny_io.safetensors   tokens, key mask, per-block and final outputs, the
                           masked output, a 160-token prompt (past
                           max_distance) and the bucket of every relative
                           position in [-199, 199] (F32, tokens I32)

Everything is seeded: running twice gives byte-identical files.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_model_fixtures as mmf  # noqa: E402
from reference.t5 import T5EncoderV11, exact_bucket, relative_position_bucket  # noqa: E402

SEED = 500
DTYPE = torch.float16
# d_kv * heads = 48 differs from d_model = 64 (as in T5 v1.1 small: 6 x 64 =
# 384 against 512), so the attention's inner width is not taken for d_model.
T5 = dict(vocab=128, d_model=64, d_kv=12, heads=4, d_ff=96, layers=3, num_buckets=32, max_distance=128)
PAD, EOS = 0, 1  # T5's SentencePiece ids
# 40 tokens: relative positions up to 39 reach the log-spaced buckets 8..12
# of each direction; the long prompt (160 > max_distance) reaches the clamped
# last bucket of each half.
TOKENS = 40
REAL = (40, 23)  # real tokens of each prompt (the rest is padding)
LONG_TOKENS = 160
BUCKET_RANGE = 199  # t5.buckets: relative positions -199..199


def log(msg):
    print(msg, flush=True)


def init_value(name, shape, gen, d_kv):
    shape = tuple(shape)
    if name in ("shared.weight",) or name.endswith("relative_attention_bias.weight"):
        return torch.randn(shape, generator=gen)
    if len(shape) == 1:  # RMSNorm scales
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    scale = shape[1] ** -0.5
    if name.endswith("SelfAttention.q.weight"):
        scale *= d_kv ** -0.5  # the 1/sqrt(d_kv) T5 leaves out of the attention lives in q's init
    return torch.randn(shape, generator=gen) * scale


def randomize(module, seed):
    """Seeded weights in state_dict order, rounded to DTYPE; returns them as
    stored and loads the widened values into `module`."""
    gen = torch.Generator().manual_seed(seed)
    stored = {}
    for name, param in module.state_dict().items():
        stored[name] = init_value(name, param.shape, gen, T5["d_kv"]).to(DTYPE).contiguous()
    module.load_state_dict({k: v.to(torch.float32) for k, v in stored.items()})
    return stored


def make_tokens(gen, n, real_counts):
    rows = []
    for real in real_counts:
        ids = torch.randint(2, T5["vocab"], (real - 1,), generator=gen).tolist()
        rows.append(ids + [EOS] + [PAD] * (n - real))
    return torch.tensor(rows, dtype=torch.int32)


def check_buckets():
    """The float32 bucket path against exact integer arithmetic."""
    rel = torch.arange(-BUCKET_RANGE, BUCKET_RANGE + 1, dtype=torch.long)
    buckets = relative_position_bucket(rel, T5["num_buckets"], T5["max_distance"])
    exact = [exact_bucket(int(r), T5["num_buckets"], T5["max_distance"]) for r in rel]
    assert buckets.tolist() == exact, "float32 buckets disagree with exact arithmetic"
    return buckets.to(torch.int32)


def build():
    io = {}
    model = T5EncoderV11(**T5)
    ckpt = randomize(model, SEED + 1)
    model = model.double().eval()
    gen = torch.Generator().manual_seed(SEED + 1000)
    tokens = make_tokens(gen, TOKENS, REAL)
    mask = (tokens != PAD).to(torch.float32)
    with torch.no_grad():
        out, blocks = model(tokens)
        out_masked, _ = model(tokens, mask.double())
        long_tokens = make_tokens(gen, LONG_TOKENS, (LONG_TOKENS,))
        long_out, _ = model(long_tokens)
    io["t5.tokens"] = tokens
    io["t5.key_mask"] = mask
    io["t5.out"] = mmf.f32(out)
    for i, b in enumerate(blocks):
        io["t5.block.%d" % i] = mmf.f32(b)
    io["t5.out_masked"] = mmf.f32(out_masked)
    io["t5.long.tokens"] = long_tokens
    io["t5.long.out"] = mmf.f32(long_out)
    io["t5.buckets"] = check_buckets()
    used = sorted(set(relative_position_bucket(
        torch.arange(-(TOKENS - 1), TOKENS, dtype=torch.long), T5["num_buckets"], T5["max_distance"]).tolist()))
    log("buckets used by %d tokens: %s" % (TOKENS, used))
    return ckpt, io


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=mmf.DEFAULT_OUT, help="fixture folder (default tests/golden/models)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    torch.manual_seed(SEED)
    ckpt, io = build()
    os.makedirs(args.out, exist_ok=True)
    mmf.save_fixture_pair(args.out, "t5_tiny", ckpt, io, "training/make_t5_fixtures.py", "[batch, tokens, d_model]")

if __name__ == "__main__":
    main()
