#!/usr/bin/python3
"""Writes the tiny FLUX.2 [klein] DiT and autoencoder of
tests/golden/models/flux2_tiny.safetensors and flux2_ae_tiny.safetensors
(BFL's names) in diffusers' names, as a diffusers folder (Flux2KleinPipeline,
Flux2Pipeline) holds them in transformer/ and vae/:

  flux2_tiny_diffusers_transformer.safetensors      Flux2Transformer2DModel (klein)
  flux2_dev_tiny_diffusers_transformer.safetensors  Flux2Transformer2DModel ([dev])
  flux2_ae_tiny_diffusers.safetensors               AutoencoderKLFlux2

The renames are transcribed from diffusers' scripts/convert_flux2_to_diffusers.py
(convert_flux2_transformer_checkpoint_to_diffusers and
convert_flux2_vae_checkpoint_to_diffusers), not from kiln's name tables:
  - the DiT: img_in -> x_embedder, time_in -> time_guidance_embed.timestep_embedder
    (guidance_in -> time_guidance_embed.guidance_embedder),
    the modulations' .lin -> .linear, a double block's fused qkv split into
    to_q / to_k / to_v (add_q_proj / add_k_proj / add_v_proj for the text
    stream), norms' .scale -> .weight, the MLPs -> ff.linear_in / linear_out,
    a single block's linear1 -> attn.to_qkv_mlp_proj (kept whole), linear2 ->
    attn.to_out, final_layer.linear -> proj_out, and
    final_layer.adaLN_modulation.1 -> norm_out.linear with (shift, scale)
    swapped to (scale, shift);
  - the autoencoder: diffusers' AutoencoderKL block names (down_blocks,
    up_blocks numbered from the lowest resolution, resnets, conv_shortcut,
    mid_block, attentions' to_q / to_k / to_v / to_out.0 as linear weights),
    encoder.quant_conv -> quant_conv, decoder.post_quant_conv ->
    post_quant_conv, bn.running_mean / running_var kept, and
    bn.num_batches_tracked dropped.
The DiT keeps its file's metadata (the tiny model's RoPE axes), as the
conversion keeps the config beside the weights.

    /usr/bin/python3 training/make_flux2_diffusers_fixture.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
import safetensors_io  # noqa: E402

MODELS = os.path.join(HERE, "..", "tests", "golden", "models")

TRANSFORMER_RENAMES = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
}
DOUBLE_BLOCK = {
    "img_attn.norm.query_norm": "attn.norm_q",
    "img_attn.norm.key_norm": "attn.norm_k",
    "img_attn.proj": "attn.to_out.0",
    "img_mlp.0": "ff.linear_in",
    "img_mlp.2": "ff.linear_out",
    "txt_attn.norm.query_norm": "attn.norm_added_q",
    "txt_attn.norm.key_norm": "attn.norm_added_k",
    "txt_attn.proj": "attn.to_add_out",
    "txt_mlp.0": "ff_context.linear_in",
    "txt_mlp.2": "ff_context.linear_out",
}
SINGLE_BLOCK = {
    "linear1": "attn.to_qkv_mlp_proj",
    "linear2": "attn.to_out",
    "norm.query_norm": "attn.norm_q",
    "norm.key_norm": "attn.norm_k",
}


def swap_scale_shift(weight):
    shift, scale = weight.chunk(2, dim=0)
    return torch.cat([scale, shift], dim=0)


def convert_transformer(sd):
    renamed = {}
    for key, value in sd.items():
        new_key = key
        for src, dst in TRANSFORMER_RENAMES.items():
            new_key = new_key.replace(src, dst)
        renamed[new_key] = value
    out = {}
    for key, value in renamed.items():
        if "adaLN_modulation" in key:
            stem, param = key.rsplit(".", 1)
            assert stem == "final_layer.adaLN_modulation.1", key
            out["norm_out.linear." + param] = swap_scale_shift(value)
        elif key.startswith("double_blocks."):
            parts = key.split(".")
            block, modality, within, param = parts[1], parts[2], ".".join(parts[2:-1]), parts[-1]
            param = "weight" if param == "scale" else param
            prefix = "transformer_blocks." + block + "."
            if "qkv" in within:
                q, k, v = torch.chunk(value, 3, dim=0)
                names = ("attn.to_q", "attn.to_k", "attn.to_v") if "img" in modality else \
                    ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")
                for name, part in zip(names, (q, k, v)):
                    out[prefix + name + "." + param] = part
            else:
                out[prefix + DOUBLE_BLOCK[within] + "." + param] = value
        elif key.startswith("single_blocks."):
            parts = key.split(".")
            block, within, param = parts[1], ".".join(parts[2:-1]), parts[-1]
            param = "weight" if param == "scale" else param
            out["single_transformer_blocks." + block + "." + SINGLE_BLOCK[within] + "." + param] = value
        else:
            out[key] = value
    return out


VAE_TOP = {
    "encoder.conv_in.weight": "encoder.conv_in.weight",
    "encoder.conv_in.bias": "encoder.conv_in.bias",
    "encoder.conv_out.weight": "encoder.conv_out.weight",
    "encoder.conv_out.bias": "encoder.conv_out.bias",
    "encoder.conv_norm_out.weight": "encoder.norm_out.weight",
    "encoder.conv_norm_out.bias": "encoder.norm_out.bias",
    "decoder.conv_in.weight": "decoder.conv_in.weight",
    "decoder.conv_in.bias": "decoder.conv_in.bias",
    "decoder.conv_out.weight": "decoder.conv_out.weight",
    "decoder.conv_out.bias": "decoder.conv_out.bias",
    "decoder.conv_norm_out.weight": "decoder.norm_out.weight",
    "decoder.conv_norm_out.bias": "decoder.norm_out.bias",
    "quant_conv.weight": "encoder.quant_conv.weight",
    "quant_conv.bias": "encoder.quant_conv.bias",
    "post_quant_conv.weight": "decoder.post_quant_conv.weight",
    "post_quant_conv.bias": "decoder.post_quant_conv.bias",
    "bn.running_mean": "bn.running_mean",
    "bn.running_var": "bn.running_var",
}


def resnets(keys, out, sd, old, new):
    for key in keys:
        out[key.replace(old, new).replace("nin_shortcut", "conv_shortcut")] = sd[key]


def attentions(keys, out, sd, old, new):
    for key in keys:
        name = (key.replace(old, new)
                .replace("norm.weight", "group_norm.weight").replace("norm.bias", "group_norm.bias")
                .replace("q.weight", "to_q.weight").replace("q.bias", "to_q.bias")
                .replace("k.weight", "to_k.weight").replace("k.bias", "to_k.bias")
                .replace("v.weight", "to_v.weight").replace("v.bias", "to_v.bias")
                .replace("proj_out.weight", "to_out.0.weight").replace("proj_out.bias", "to_out.0.bias"))
        value = sd[key]
        out[name] = value[:, :, 0, 0] if value.dim() == 4 else value[:, :, 0] if value.dim() == 3 else value


def convert_vae(sd, levels):
    out = {new: sd[old] for new, old in VAE_TOP.items() if old in sd}
    for i in range(levels):
        keys = [k for k in sd if f"down.{i}" in k and f"down.{i}.downsample" not in k]
        resnets(keys, out, sd, f"down.{i}.block", f"down_blocks.{i}.resnets")
        if f"encoder.down.{i}.downsample.conv.weight" in sd:
            for p in ("weight", "bias"):
                out[f"encoder.down_blocks.{i}.downsamplers.0.conv.{p}"] = sd[f"encoder.down.{i}.downsample.conv.{p}"]
    for half in ("encoder", "decoder"):
        for i in (1, 2):
            keys = [k for k in sd if f"{half}.mid.block_{i}" in k]
            resnets(keys, out, sd, f"mid.block_{i}", f"mid_block.resnets.{i - 1}")
        attentions([k for k in sd if f"{half}.mid.attn" in k], out, sd, "mid.attn_1", "mid_block.attentions.0")
    for i in range(levels):
        block = levels - 1 - i
        keys = [k for k in sd if f"up.{block}" in k and f"up.{block}.upsample" not in k]
        resnets(keys, out, sd, f"up.{block}.block", f"up_blocks.{i}.resnets")
        if f"decoder.up.{block}.upsample.conv.weight" in sd:
            for p in ("weight", "bias"):
                out[f"decoder.up_blocks.{i}.upsamplers.0.conv.{p}"] = sd[f"decoder.up.{block}.upsample.conv.{p}"]
    return out


def write_transformer(source, target):
    dit, dit_meta = safetensors_io.load_file(os.path.join(MODELS, source))
    transformer = convert_transformer(dict(dit))
    # Each fused qkv became three tensors.
    assert len(transformer) == len(dit) + 2 * sum(1 for k in dit if ".qkv." in k), "a tensor was lost"
    meta = dict(dit_meta or {})
    meta["kiln.fixture.generator"] = "training/make_flux2_diffusers_fixture.py"
    path = os.path.join(MODELS, target)
    safetensors_io.save_file(transformer, path, metadata=meta)
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    write_transformer("flux2_tiny.safetensors", "flux2_tiny_diffusers_transformer.safetensors")
    # [dev]'s: its guidance embedder too.
    write_transformer("flux2_dev_tiny.safetensors", "flux2_dev_tiny_diffusers_transformer.safetensors")

    ae, _ = safetensors_io.load_file(os.path.join(MODELS, "flux2_ae_tiny.safetensors"))
    levels = 1 + max(int(k.split(".")[2]) for k in ae if k.startswith("decoder.up."))
    vae = convert_vae(ae, levels)
    dropped = {k for k in ae if k.endswith("num_batches_tracked")}
    assert len(vae) == len(ae) - len(dropped), sorted(set(ae) - dropped)
    path = os.path.join(MODELS, "flux2_ae_tiny_diffusers.safetensors")
    safetensors_io.save_file(vae, path, metadata={"kiln.fixture.generator": "training/make_flux2_diffusers_fixture.py"})
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
