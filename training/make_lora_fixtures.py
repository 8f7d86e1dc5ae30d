#!/usr/bin/python3
"""Writes LoRA, LoHa and LoKr files for the tiny SD1 model
(tests/golden/models/sd1_tiny.safetensors) and the UNet and CLIP outputs of
that model with each applied, computed with the PyTorch reference modules
(training/reference/) in float64 from the stored weights plus the adapter's
change (training/reference/lora.py).

    /usr/bin/python3 training/make_lora_fixtures.py

Writes into tests/golden/lora/:
  sd1_lora_kohya.safetensors      kohya names on diffusers paths (lora_unet_down_blocks_0_...,
                                  lora_te_text_model_...), lora_down / lora_up / alpha: 8 UNet layers
                                  (attention, 1x1-conv proj_in / proj_out, feed-forward, a 3x3 resnet
                                  convolution) and 2 text-encoder layers, rank 4, alpha 2
  sd1_lora_kohya_ldm.safetensors  the same adapter, kohya names on ldm paths (lora_unet_input_blocks_1_1_...)
  sd1_lora_peft.safetensors       the same adapter in diffusers / PEFT names (unet.down_blocks.0...lora_A.weight,
                                  text_encoder.text_model...), no alpha (alpha / rank folded into lora_B)
  sd1_loha.safetensors            LyCORIS LoHa (hada_w1_a ...), 3 layers, rank 4, alpha 4
  sd1_lokr.safetensors            LyCORIS LoKr (lokr_w1, lokr_w2_a/_b, lokr_w2), 2 layers
  sd1_lycoris.safetensors         LyCORIS's other parts, each on its own UNet layer (kohya ldm names):
                                  Tucker cores of a LoRA (lora_mid), a LoHa (hada_t1/t2) and a LoKr
                                  (lokr_t2) on 3x3 convolutions; a full difference with its bias's
                                  (diff, diff_b) and a bias-only change; DoRA magnitudes (dora_scale)
                                  per output row of a linear layer and per input channel of a conv
  sd1_adapters_io.safetensors     for each adapter at strength 0.8: unet.out.<kind> on the model's golden
                                  inputs (sd1_tiny_io's unet.x, unet.t, unet.context) and clip.out.<kind>
                                  (clip skip 1 on clip.tokens); <kind> = lora, loha, lokr, lycoris

The ldm-to-diffusers paths are written out here by hand, from diffusers'
convert_original_stable_diffusion_to_diffusers block numbering for this
UNet's layout (2 levels, 1 resnet per level, attention on both), not taken
from kiln's name tables.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_model_fixtures import PRESETS, make_clip, make_unet  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference.lora import dora_weight, lokr_delta, loha_delta, lora_delta  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "lora")
MODEL = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny.safetensors")
IO = os.path.join(ROOT, "tests", "golden", "models", "sd1_tiny_io.safetensors")
UNET = "model.diffusion_model."
CLIP = "cond_stage_model.transformer."
STRENGTH = 0.8

# ldm path -> diffusers path of the layers the adapters change.
UNET_LAYERS = {
    "input_blocks.1.1.transformer_blocks.0.attn1.to_q": "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
    "input_blocks.1.1.transformer_blocks.0.attn2.to_k": "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k",
    "input_blocks.1.1.proj_in": "down_blocks.0.attentions.0.proj_in",
    "input_blocks.1.1.transformer_blocks.0.ff.net.0.proj":
        "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj",
    "middle_block.1.transformer_blocks.0.attn1.to_out.0": "mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0",
    "middle_block.1.proj_out": "mid_block.attentions.0.proj_out",
    "output_blocks.3.1.transformer_blocks.0.attn2.to_v": "up_blocks.1.attentions.1.transformer_blocks.0.attn2.to_v",
    "input_blocks.1.0.in_layers.2": "down_blocks.0.resnets.0.conv1",
}
# ... and one more only the LoHa changes.
DIFFUSERS_PATHS = dict(UNET_LAYERS, **{
    "input_blocks.1.1.transformer_blocks.0.ff.net.2": "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.2"})
CLIP_LAYERS = ["text_model.encoder.layers.0.self_attn.q_proj", "text_model.encoder.layers.1.mlp.fc1"]


def kohya(path, te=False):
    return ("lora_te_" if te else "lora_unet_") + path.replace(".", "_")


def main():
    torch.set_num_threads(1)
    weights, _ = safetensors_io.load_file(MODEL)
    io, _ = safetensors_io.load_file(IO)
    gen = torch.Generator().manual_seed(4242)
    rank, alpha = 4, 2.0

    def rand(*shape, std=0.3):
        return (torch.randn(*shape, generator=gen) * std).to(torch.float16).to(torch.float32)

    # --- LoRA (rank 4, alpha 2), the same values in three namings.
    lora = {}  # full model weight name -> (down, up)
    for ldm in UNET_LAYERS:
        w = weights[UNET + ldm + ".weight"]
        down_shape = (rank,) + tuple(w.shape[1:])
        up_shape = (w.shape[0], rank) + (1,) * (w.dim() - 2)
        lora[UNET + ldm + ".weight"] = (rand(*down_shape), rand(*up_shape))
    for path in CLIP_LAYERS:
        w = weights[CLIP + path + ".weight"]
        lora[CLIP + path + ".weight"] = (rand(rank, w.shape[1]), rand(w.shape[0], rank))

    def names(full):
        """(kohya diffusers-path, kohya ldm-path, PEFT) layer names."""
        if full.startswith(CLIP):
            path = full[len(CLIP):-len(".weight")]
            return kohya(path, te=True), kohya(path, te=True), "text_encoder." + path
        ldm = full[len(UNET):-len(".weight")]
        return kohya(UNET_LAYERS[ldm]), kohya(ldm), "unet." + UNET_LAYERS[ldm]

    files = {"sd1_lora_kohya": {}, "sd1_lora_kohya_ldm": {}, "sd1_lora_peft": {}}
    for full, (down, up) in lora.items():
        k_diff, k_ldm, peft = names(full)
        for name, f in (("sd1_lora_kohya", k_diff), ("sd1_lora_kohya_ldm", k_ldm)):
            files[name][f + ".lora_down.weight"] = down.to(torch.float16)
            files[name][f + ".lora_up.weight"] = up.to(torch.float16)
            files[name][f + ".alpha"] = torch.tensor(alpha, dtype=torch.float32)
        files["sd1_lora_peft"][peft + ".lora_A.weight"] = down.to(torch.float32)
        files["sd1_lora_peft"][peft + ".lora_B.weight"] = (up * (alpha / rank)).to(torch.float32)
    # A key no weight answers to: counted, not an error.
    files["sd1_lora_kohya"]["lora_unet_not_a_layer.lora_down.weight"] = torch.zeros(rank, 8, dtype=torch.float16)
    files["sd1_lora_kohya"]["lora_unet_not_a_layer.lora_up.weight"] = torch.zeros(8, rank, dtype=torch.float16)

    deltas = {"lora": {full: lora_delta(weights[full].shape, d.double(), u.double(), alpha)
                       for full, (d, u) in lora.items()}}

    # --- LoHa (rank 4, alpha 4).
    loha_layers = ["input_blocks.1.1.transformer_blocks.0.attn1.to_q",
                   "input_blocks.1.1.transformer_blocks.0.ff.net.2", "input_blocks.1.1.proj_in"]
    loha_file, loha = {}, {}
    for ldm in loha_layers:
        w = weights[UNET + ldm + ".weight"]
        out_dim, in_dim = w.shape[0], w[0].numel()
        f = {"w1a": rand(out_dim, 4), "w1b": rand(4, in_dim), "w2a": rand(out_dim, 4), "w2b": rand(4, in_dim)}
        key = kohya(DIFFUSERS_PATHS[ldm])
        for part, v in f.items():
            loha_file[key + ".hada_" + part[:2] + "_" + part[2]] = v.to(torch.float16)
        loha_file[key + ".alpha"] = torch.tensor(4.0)
        loha[UNET + ldm + ".weight"] = loha_delta(w.shape, *(f[p].double() for p in ("w1a", "w1b", "w2a", "w2b")),
                                                  alpha=4.0)
    files["sd1_loha"] = loha_file
    deltas["loha"] = loha

    # --- LoKr: to_k (32x32) = kron(w1 [4, 4], w2a [8, 2] @ w2b [2, 8]) with alpha 1 (scale 1/2);
    # ff.net.0.proj (256x32) = kron(w1 [8, 2], w2 [32, 16]) unfactored (scale 1 whatever alpha says).
    lokr_file, lokr = {}, {}
    k1 = "input_blocks.1.1.transformer_blocks.0.attn2.to_k"
    w = weights[UNET + k1 + ".weight"]  # (32, 64)
    f1 = {"w1": rand(4, 4), "w2_a": rand(8, 2), "w2_b": rand(2, 16)}
    key = kohya(UNET_LAYERS[k1])
    for part, v in f1.items():
        lokr_file[key + ".lokr_" + part] = v.to(torch.float16)
    lokr_file[key + ".alpha"] = torch.tensor(1.0)
    lokr[UNET + k1 + ".weight"] = lokr_delta(w.shape, w1=f1["w1"].double(), w2a=f1["w2_a"].double(),
                                            w2b=f1["w2_b"].double(), alpha=1.0)
    k2 = "input_blocks.1.1.transformer_blocks.0.ff.net.0.proj"
    w = weights[UNET + k2 + ".weight"]  # (256, 32)
    f2 = {"w1": rand(8, 2), "w2": rand(32, 16)}
    key = kohya(UNET_LAYERS[k2])
    for part, v in f2.items():
        lokr_file[key + ".lokr_" + part] = v.to(torch.float16)
    lokr_file[key + ".alpha"] = torch.tensor(3.0)
    lokr[UNET + k2 + ".weight"] = lokr_delta(w.shape, w1=f2["w1"].double(), w2=f2["w2"].double(), alpha=3.0)
    files["sd1_lokr"] = lokr_file
    deltas["lokr"] = lokr

    # --- LyCORIS's other parts (drawn after the above, which stay as they were).
    ly_file, ly, ly_set = {}, {}, {}  # file; weight -> delta; weight -> whole new value (DoRA)

    def ldm_key(ldm):
        return kohya(ldm)

    conv = "input_blocks.1.0.out_layers.3"  # (32, 32, 3, 3): LoRA with a Tucker core
    f = {"down": rand(4, 32, 1, 1), "mid": rand(4, 4, 3, 3), "up": rand(32, 4, 1, 1)}
    for part, v in (("lora_down.weight", f["down"]), ("lora_mid.weight", f["mid"]), ("lora_up.weight", f["up"])):
        ly_file[ldm_key(conv) + "." + part] = v.to(torch.float16)
    ly_file[ldm_key(conv) + ".alpha"] = torch.tensor(2.0)
    ly[UNET + conv + ".weight"] = lora_delta((32, 32, 3, 3), f["down"].double(), f["up"].double(), 2.0,
                                             mid=f["mid"].double())
    conv = "middle_block.0.in_layers.2"  # (64, 64, 3, 3): LoHa with Tucker cores
    f = {"w1_a": rand(4, 64), "w1_b": rand(4, 64), "t1": rand(4, 4, 3, 3),
         "w2_a": rand(4, 64), "w2_b": rand(4, 64), "t2": rand(4, 4, 3, 3)}
    for part, v in f.items():
        ly_file[ldm_key(conv) + ".hada_" + part] = v.to(torch.float16)
    ly_file[ldm_key(conv) + ".alpha"] = torch.tensor(4.0)
    d = {k: v.double() for k, v in f.items()}
    ly[UNET + conv + ".weight"] = loha_delta((64, 64, 3, 3), d["w1_a"], d["w1_b"], d["w2_a"], d["w2_b"], 4.0,
                                             t1=d["t1"], t2=d["t2"])
    conv = "middle_block.0.out_layers.3"  # (64, 64, 3, 3): LoKr with a Tucker core, kron([4, 4], [16, 16, 3, 3])
    f = {"w1": rand(4, 4), "w2_a": rand(4, 16), "w2_b": rand(4, 16), "t2": rand(4, 4, 3, 3)}
    for part, v in f.items():
        ly_file[ldm_key(conv) + ".lokr_" + part] = v.to(torch.float16)
    ly_file[ldm_key(conv) + ".alpha"] = torch.tensor(2.0)
    d = {k: v.double() for k, v in f.items()}
    ly[UNET + conv + ".weight"] = lokr_delta((64, 64, 3, 3), w1=d["w1"], w2a=d["w2_a"], w2b=d["w2_b"], alpha=2.0,
                                             t2=d["t2"])
    layer = "input_blocks.1.1.proj_in"  # (32, 32, 1, 1) with a bias: a full difference
    diff, diff_b = rand(32, 32, 1, 1, std=0.05), rand(32, std=0.2)
    ly_file[ldm_key(layer) + ".diff"] = diff.to(torch.float16)
    ly_file[ldm_key(layer) + ".diff_b"] = diff_b.to(torch.float16)
    ly[UNET + layer + ".weight"] = diff.double()
    ly[UNET + layer + ".bias"] = diff_b.double()
    layer = "middle_block.1.proj_out"  # a bias-only change
    diff_b = rand(64, std=0.2)
    ly_file[ldm_key(layer) + ".diff_b"] = diff_b.to(torch.float16)
    ly[UNET + layer + ".bias"] = diff_b.double()
    # DoRA per output row (a linear layer) and per input channel (a conv), magnitudes near W's norms.
    for layer, down_shape, up_shape, per_row in (
            ("middle_block.1.transformer_blocks.0.attn2.to_q", (4, 64), (64, 4), True),
            ("input_blocks.3.0.in_layers.2", (4, 32, 3, 3), (64, 4, 1, 1), False)):
        w = weights[UNET + layer + ".weight"].double()
        down, up = rand(*down_shape), rand(*up_shape)
        if per_row:
            norms = w.reshape(w.shape[0], -1).norm(dim=1).reshape(w.shape[0], *[1] * (w.dim() - 1))
        else:
            norms = w.transpose(0, 1).reshape(w.shape[1], -1).norm(dim=1).reshape(1, w.shape[1], *[1] * (w.dim() - 2))
        magnitude = (norms * (1 + 0.3 * torch.randn(norms.shape, generator=gen, dtype=torch.float64))).float()
        key = ldm_key(layer)
        ly_file[key + ".lora_down.weight"] = down.to(torch.float16)
        ly_file[key + ".lora_up.weight"] = up.to(torch.float16)
        ly_file[key + ".alpha"] = torch.tensor(2.0)
        ly_file[key + ".dora_scale"] = magnitude.to(torch.float16)
        delta = lora_delta(w.shape, down.double(), up.double(), 2.0)
        ly_set[UNET + layer + ".weight"] = dora_weight(w, delta, magnitude.to(torch.float16).double(), STRENGTH)
    files["sd1_lycoris"] = ly_file
    deltas["lycoris"] = ly

    os.makedirs(OUT, exist_ok=True)
    for name, tensors in files.items():
        path = os.path.join(OUT, name + ".safetensors")
        safetensors_io.save_file(tensors, path)
        print("wrote %s: %d tensors, %.1f KB" % (os.path.relpath(path, ROOT), len(tensors), os.path.getsize(path) / 1e3))

    # --- The model with each adapter at STRENGTH, in float64.
    spec = PRESETS["compact"]["sd1"]
    results = {}
    for kind, delta in deltas.items():
        patched = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
        for full, d in delta.items():
            patched[full] = patched[full] + STRENGTH * d
        if kind == "lycoris":
            patched.update(ly_set)
        unet = make_unet(spec["unet"], 4, spec["clip"]["width"], linear=False).double().eval()
        unet.load_state_dict({k[len(UNET):]: v for k, v in patched.items() if k.startswith(UNET)})
        clip = make_clip("hf", spec["clip"]).double().eval()
        clip.load_state_dict({k[len(CLIP):]: v for k, v in patched.items() if k.startswith(CLIP)}, strict=False)
        with torch.no_grad():
            out, _ = unet(io["unet.x"].double(), io["unet.t"].double(), io["unet.context"].double())
            results["unet.out." + kind] = out.float().contiguous()
            results["clip.out." + kind] = clip(io["clip.tokens"], clip_skip=1).float().contiguous()
        print("  %s: unet.out differs from the base by %.4f (max abs), clip.out by %.4f" % (
            kind, (out.float() - io["unet.out"]).abs().max(), (results["clip.out." + kind] - io["clip.out.skip1"]).abs().max()))
    path = os.path.join(OUT, "sd1_adapters_io.safetensors")
    safetensors_io.save_file(results, path, {"kiln.fixture.generator": "training/make_lora_fixtures.py",
                                             "kiln.fixture.strength": str(STRENGTH)})
    print("wrote %s: %.1f KB" % (os.path.relpath(path, ROOT), os.path.getsize(path) / 1e3))


if __name__ == "__main__":
    main()
