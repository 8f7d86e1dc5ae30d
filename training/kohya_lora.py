"""LoRA on the reference SD1 modules, in kohya sd-scripts' file format.

kohya's networks/lora.py (what A1111, ComfyUI and stable-diffusion.cpp load
as "a LoRA") wraps every nn.Linear and 1x1 nn.Conv2d inside the UNet's
Transformer2DModel blocks and the text encoder's CLIPAttention / CLIPMLP:

    y = base(x) + multiplier * (alpha / rank) * lora_up(lora_down(x))

lora_down is [rank, in] (a 1x1 conv [rank, in, 1, 1]), lora_up [out, rank]
([out, rank, 1, 1]); lora_up starts at zero, so the untrained LoRA changes
nothing. The file is safetensors with, per wrapped module,

    <name>.lora_down.weight, <name>.lora_up.weight, <name>.alpha (0-d)

where <name> is "lora_unet_" or "lora_te_" followed by the module's path in
diffusers' / HF transformers' naming with "." replaced by "_":
lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q,
lora_te_text_model_encoder_layers_0_self_attn_q_proj.

The reference UNet (training/reference/unet.py) has ldm's names, so a
transformer's ldm block maps to its diffusers path as diffusers'
convert_ldm_unet_checkpoint (scripts/convert_original_stable_diffusion_to_
diffusers.py) maps it: with L res blocks per level, input_blocks.i.1 is
down_blocks.((i-1) // (L+1)).attentions.((i-1) % (L+1)), middle_block.1 is
mid_block.attentions.0, output_blocks.i.1 is up_blocks.(i // (L+1)).attentions.
(i % (L+1)). Inside a transformer the names agree on both sides. The text
encoder's reference module already has HF's names (text_model.encoder...).
"""

import re

import torch
import torch.nn as nn

UNET_PREFIX = "lora_unet_"
TE_PREFIX = "lora_te_"

# The modules kohya wraps, by their path inside one transformer / CLIP layer.
UNET_TARGETS = ("proj_in", "proj_out") + tuple(
    "transformer_blocks.0.%s" % m for m in (
        "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
        "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
        "ff.net.0.proj", "ff.net.2"))
TE_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2")


def diffusers_transformer_path(ldm_block, layers_per_block):
    """diffusers' path of the SpatialTransformer at ldm `ldm_block` ("input_blocks.3.1")."""
    stride = layers_per_block + 1
    m = re.fullmatch(r"(input_blocks|output_blocks)\.(\d+)\.1", ldm_block)
    if ldm_block == "middle_block.1":
        return "mid_block.attentions.0"
    if not m:
        raise ValueError("%s is not a transformer block" % ldm_block)
    i = int(m.group(2))
    if m.group(1) == "input_blocks":
        return "down_blocks.%d.attentions.%d" % ((i - 1) // stride, (i - 1) % stride)
    return "up_blocks.%d.attentions.%d" % (i // stride, i % stride)


def kohya_name(prefix, diffusers_path):
    return prefix + diffusers_path.replace(".", "_")


def target_modules(unet, clip, layers_per_block, text_encoder=True):
    """[(kohya name, owning model, module path in the reference model)] of every
    module the LoRA wraps, in model order."""
    out = []
    blocks = [n for n, m in unet.named_modules() if type(m).__name__ == "SpatialTransformer"]
    for block in blocks:
        base = diffusers_transformer_path(block, layers_per_block)
        for t in UNET_TARGETS:
            out.append((kohya_name(UNET_PREFIX, base + "." + t), unet, block + "." + t))
    if text_encoder:
        for i in range(len(clip.text_model.encoder.layers)):
            for t in TE_TARGETS:
                path = "text_model.encoder.layers.%d.%s" % (i, t)
                out.append((kohya_name(TE_PREFIX, path), clip, path))
    return out


class LoraWrapped(nn.Module):
    """A frozen nn.Linear / 1x1 nn.Conv2d plus kohya's trainable down/up pair."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.multiplier = rank, float(alpha), 1.0
        if isinstance(base, nn.Conv2d):
            if base.kernel_size != (1, 1):
                raise ValueError("only 1x1 convolutions are wrapped, got %s" % (base.kernel_size,))
            self.lora_down = nn.Conv2d(base.in_channels, rank, 1, bias=False)
            self.lora_up = nn.Conv2d(rank, base.out_channels, 1, bias=False)
        else:
            self.lora_down = nn.Linear(base.in_features, rank, bias=False)
            self.lora_up = nn.Linear(rank, base.out_features, bias=False)
        # kohya's initialisation: kaiming-uniform down (nn's default), zero up
        nn.init.zeros_(self.lora_up.weight)

    def forward(self, x):
        return self.base(x) + self.lora_up(self.lora_down(x)) * (self.multiplier * self.alpha / self.rank)


def _get_set(root, path):
    parent_path, _, child = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    return parent, child


def inject(targets, rank, alpha):
    """Wraps every target module in place; returns {kohya name: LoraWrapped}."""
    wrapped = {}
    for name, model, path in targets:
        parent, child = _get_set(model, path)
        w = LoraWrapped(getattr(parent, child), rank, alpha)
        setattr(parent, child, w)
        wrapped[name] = w
    return wrapped


def state_dict(wrapped, dtype=torch.float16):
    """kohya's tensors: down/up in `dtype` (kohya's usual save precision F16),
    alpha an F32 0-d tensor."""
    out = {}
    for name, w in wrapped.items():
        out[name + ".lora_down.weight"] = w.lora_down.weight.detach().to(dtype).contiguous()
        out[name + ".lora_up.weight"] = w.lora_up.weight.detach().to(dtype).contiguous()
        out[name + ".alpha"] = torch.tensor(w.alpha, dtype=torch.float32)
    return out


def merge(tensors, targets, multiplier=1.0):
    """Adds a kohya LoRA's delta multiplier * alpha / rank * up @ down to the
    weights of the (unwrapped) target modules, as a loader that merges does;
    every tensor of the file must belong to a target."""
    by_name = {name: (model, path) for name, model, path in targets}
    names = sorted({k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in tensors})
    for name in names:
        if name not in by_name:
            raise ValueError("LoRA tensor %s names no module of this model" % name)
        model, path = by_name[name]
        module = model.get_submodule(path)
        down = tensors[name + ".lora_down.weight"].float()
        up = tensors[name + ".lora_up.weight"].float()
        alpha = float(tensors[name + ".alpha"])
        rank = down.shape[0]
        delta = up.flatten(1) @ down.flatten(1)
        with torch.no_grad():
            module.weight += (multiplier * alpha / rank) * delta.reshape(module.weight.shape)
    return len(names)
