"""Weight changes of LoRA, LoHa and LoKr adapters, written from their
definitions as kohya's sd-scripts, LyCORIS and ComfyUI's loader apply them
(comfy/weight_adapter/{lora,loha,lokr}.py):

  LoRA  W += s * alpha / rank * (up.flatten(1) @ down.flatten(1)).reshape(W.shape)
        rank = down.shape[0]; no alpha: the factor is 1 (alpha = rank)
  LoHa  W += s * alpha / rank * ((w1a @ w1b) * (w2a @ w2b)).reshape(W.shape)
        rank = w1b.shape[0]; no alpha: 1
  LoKr  W += s * a * kron(w1, w2).reshape(W.shape), w1 = w1 or w1a @ w1b, w2 = w2 or w2a @ w2b,
        a = alpha / dim where dim = the rank of the last factored pair; nothing factored or no alpha: 1
"""

import torch


def lora_delta(weight_shape, down, up, alpha=None):
    rank = down.shape[0]
    scale = 1.0 if alpha is None else float(alpha) / rank
    return scale * (up.flatten(1) @ down.flatten(1)).reshape(weight_shape)


def loha_delta(weight_shape, w1a, w1b, w2a, w2b, alpha=None):
    scale = 1.0 if alpha is None else float(alpha) / w1b.shape[0]
    return scale * ((w1a @ w1b) * (w2a @ w2b)).reshape(weight_shape)


def lokr_delta(weight_shape, w1=None, w1a=None, w1b=None, w2=None, w2a=None, w2b=None, alpha=None):
    dim = None
    if w1 is None:
        dim = w1b.shape[0]
        w1 = w1a @ w1b
    if w2 is None:
        dim = w2b.shape[0]
        w2 = w2a @ w2b
    scale = float(alpha) / dim if (alpha is not None and dim is not None) else 1.0
    return scale * torch.kron(w1, w2).reshape(weight_shape)
