#!/usr/bin/python3
"""Writes tests/golden/pipeline/sd3_tiny/diffusers_transformer.safetensors: the
tiny SD3.5 MMDiT of sd3.5_tiny.safetensors (model.diffusion_model.*, Stability's
names) in diffusers' SD3Transformer2DModel names, as a diffusers folder's
transformer/ holds it; and tests/golden/models/sd35x_tiny_diffusers.safetensors,
the tiny MMDiT-X (SD3.5 Medium's attn2) of sd35x_tiny.safetensors the same way. The renames are transcribed from diffusers'
scripts/convert_sd3_to_diffusers.py (convert_sd3_transformer_checkpoint_to_diffusers):
q, k and v split out of qkv (add_*_proj for the context stream), the final
layer's and the last block's context modulation swapped from (shift, scale) to
(scale, shift), the last block's context stream without proj and MLP.

    /usr/bin/python3 training/make_sd3_diffusers_fixture.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
import safetensors_io  # noqa: E402

GOLDEN = os.path.join(HERE, "..", "tests", "golden", "pipeline", "sd3_tiny")
MODELS = os.path.join(HERE, "..", "tests", "golden", "models")


def swap_scale_shift(weight):
    shift, scale = weight.chunk(2, dim=0)
    return torch.cat([scale, shift], dim=0)


def convert(sd):
    out = {}
    out["pos_embed.pos_embed"] = sd.pop("pos_embed")
    out["pos_embed.proj.weight"] = sd.pop("x_embedder.proj.weight")
    out["pos_embed.proj.bias"] = sd.pop("x_embedder.proj.bias")
    for src, dst in [("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"),
                     ("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"),
                     ("context_embedder", "context_embedder"),
                     ("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"),
                     ("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2")]:
        for k in ("weight", "bias"):
            out[f"{dst}.{k}"] = sd.pop(f"{src}.{k}")
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("joint_blocks."))
    attn2 = sorted({int(k.split(".")[1]) for k in sd if "attn2." in k})
    qk_norm = any("ln_q" in k for k in sd)
    for i in range(layers):
        jb, tb = f"joint_blocks.{i}", f"transformer_blocks.{i}"
        last = i == layers - 1
        for k in ("weight", "bias"):
            q, kk, v = torch.chunk(sd.pop(f"{jb}.x_block.attn.qkv.{k}"), 3, dim=0)
            out[f"{tb}.attn.to_q.{k}"], out[f"{tb}.attn.to_k.{k}"], out[f"{tb}.attn.to_v.{k}"] = q, kk, v
            q, kk, v = torch.chunk(sd.pop(f"{jb}.context_block.attn.qkv.{k}"), 3, dim=0)
            out[f"{tb}.attn.add_q_proj.{k}"], out[f"{tb}.attn.add_k_proj.{k}"], out[f"{tb}.attn.add_v_proj.{k}"] = \
                q, kk, v
        if qk_norm:
            out[f"{tb}.attn.norm_q.weight"] = sd.pop(f"{jb}.x_block.attn.ln_q.weight")
            out[f"{tb}.attn.norm_k.weight"] = sd.pop(f"{jb}.x_block.attn.ln_k.weight")
            out[f"{tb}.attn.norm_added_q.weight"] = sd.pop(f"{jb}.context_block.attn.ln_q.weight")
            out[f"{tb}.attn.norm_added_k.weight"] = sd.pop(f"{jb}.context_block.attn.ln_k.weight")
        for k in ("weight", "bias"):
            out[f"{tb}.attn.to_out.0.{k}"] = sd.pop(f"{jb}.x_block.attn.proj.{k}")
            if not last:
                out[f"{tb}.attn.to_add_out.{k}"] = sd.pop(f"{jb}.context_block.attn.proj.{k}")
        if i in attn2:
            for k in ("weight", "bias"):
                q, kk, v = torch.chunk(sd.pop(f"{jb}.x_block.attn2.qkv.{k}"), 3, dim=0)
                out[f"{tb}.attn2.to_q.{k}"], out[f"{tb}.attn2.to_k.{k}"], out[f"{tb}.attn2.to_v.{k}"] = q, kk, v
                out[f"{tb}.attn2.to_out.0.{k}"] = sd.pop(f"{jb}.x_block.attn2.proj.{k}")
            if qk_norm:
                out[f"{tb}.attn2.norm_q.weight"] = sd.pop(f"{jb}.x_block.attn2.ln_q.weight")
                out[f"{tb}.attn2.norm_k.weight"] = sd.pop(f"{jb}.x_block.attn2.ln_k.weight")
        for k in ("weight", "bias"):
            out[f"{tb}.norm1.linear.{k}"] = sd.pop(f"{jb}.x_block.adaLN_modulation.1.{k}")
            context_mod = sd.pop(f"{jb}.context_block.adaLN_modulation.1.{k}")
            out[f"{tb}.norm1_context.linear.{k}"] = swap_scale_shift(context_mod) if last else context_mod
            out[f"{tb}.ff.net.0.proj.{k}"] = sd.pop(f"{jb}.x_block.mlp.fc1.{k}")
            out[f"{tb}.ff.net.2.{k}"] = sd.pop(f"{jb}.x_block.mlp.fc2.{k}")
            if not last:
                out[f"{tb}.ff_context.net.0.proj.{k}"] = sd.pop(f"{jb}.context_block.mlp.fc1.{k}")
                out[f"{tb}.ff_context.net.2.{k}"] = sd.pop(f"{jb}.context_block.mlp.fc2.{k}")
    for k in ("weight", "bias"):
        out[f"proj_out.{k}"] = sd.pop(f"final_layer.linear.{k}")
        out[f"norm_out.linear.{k}"] = swap_scale_shift(sd.pop(f"final_layer.adaLN_modulation.1.{k}"))
    if sd:
        raise SystemExit("tensors left unconverted: " + ", ".join(sorted(sd)))
    return out


def main():
    everything, _ = safetensors_io.load_file(os.path.join(GOLDEN, "sd3.5_tiny.safetensors"))
    prefix = "model.diffusion_model."
    dit = {k[len(prefix):]: v for k, v in everything.items() if k.startswith(prefix)}
    out = os.path.join(GOLDEN, "diffusers_transformer.safetensors")
    safetensors_io.save_file(convert(dit), out, metadata={"kiln.fixture.generator": "training/make_sd3_diffusers_fixture.py"})
    print("wrote", out, os.path.getsize(out), "bytes")
    # SD3.5 Medium's MMDiT-X (x_block.attn2 in its first blocks), the DiT
    # alone as tests/unit/mmdit_test.cpp reads it.
    mmditx, meta = safetensors_io.load_file(os.path.join(MODELS, "sd35x_tiny.safetensors"))
    meta = dict(meta or {})
    meta["kiln.fixture.generator"] = "training/make_sd3_diffusers_fixture.py"
    out = os.path.join(MODELS, "sd35x_tiny_diffusers.safetensors")
    safetensors_io.save_file(convert(dict(mmditx)), out, metadata=meta)
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
