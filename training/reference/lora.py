"""Weight changes of LoRA, LoHa and LoKr adapters, written from their
definitions as kohya's sd-scripts, LyCORIS and ComfyUI's loader apply them
(comfy/weight_adapter/{lora,loha,lokr}.py):

  LoRA  W += s * alpha / rank * (up.flatten(1) @ down.flatten(1)).reshape(W.shape)
        rank = down.shape[0]; no alpha: the factor is 1 (alpha = rank)
  LoHa  W += s * alpha / rank * ((w1a @ w1b) * (w2a @ w2b)).reshape(W.shape)
        rank = w1b.shape[0]; no alpha: 1
  LoKr  W += s * a * kron(w1, w2).reshape(W.shape), w1 = w1 or w1a @ w1b, w2 = w2 or w2a @ w2b,
        a = alpha / dim where dim = the rank of the last factored pair; nothing factored or no alpha: 1
  diff  W += s * diff; diff_b: bias += s * diff_b (LyCORIS "full"; no alpha)

Tucker cores (LyCORIS use_tucker, ComfyUI's "cp decomposition"):
  LoRA  lora_mid [r, r, kh, kw]: down becomes
        (down.T.flatten(1) @ mid.transpose(0, 1).flatten(1)).reshape(in, r, kh, kw).transpose(0, 1)
  LoHa  hada_t1 / hada_t2: w1a @ w1b becomes einsum("i j k l, j r, i p -> p r k l", t1, w1b, w1a)
        (w1a is then [rank, out]), and the same for the second pair
  LoKr  lokr_t2: w2 = einsum("i j k l, j r, i p -> p r k l", t2, w2b, w2a); w1 gets two unit dims
DoRA (dora_scale), as ComfyUI's weight_decompose (comfy/weight_adapter/base.py): c = W + delta
  (alpha included); n = the norm of each output row of W when dora_scale has one value per row,
  else of each input channel of c; W += s * (c * dora_scale / (n + eps) - W), eps = float32's.
"""

import torch


def tucker(t, b, a):
    return torch.einsum("i j k l, j r, i p -> p r k l", t, b, a)


def lora_delta(weight_shape, down, up, alpha=None, mid=None):
    rank = down.shape[0]
    scale = 1.0 if alpha is None else float(alpha) / rank
    if mid is not None:
        shape = [down.shape[1], down.shape[0], mid.shape[2], mid.shape[3]]
        down = (down.transpose(0, 1).flatten(1) @ mid.transpose(0, 1).flatten(1)).reshape(shape).transpose(0, 1)
    return scale * (up.flatten(1) @ down.flatten(1)).reshape(weight_shape)


def loha_delta(weight_shape, w1a, w1b, w2a, w2b, alpha=None, t1=None, t2=None):
    scale = 1.0 if alpha is None else float(alpha) / w1b.shape[0]
    if t1 is not None:
        return scale * (tucker(t1, w1b, w1a) * tucker(t2, w2b, w2a)).reshape(weight_shape)
    return scale * ((w1a @ w1b) * (w2a @ w2b)).reshape(weight_shape)


def lokr_delta(weight_shape, w1=None, w1a=None, w1b=None, w2=None, w2a=None, w2b=None, alpha=None, t2=None):
    dim = None
    if w1 is None:
        dim = w1b.shape[0]
        w1 = w1a @ w1b
    if w2 is None:
        dim = w2b.shape[0]
        w2 = w2a @ w2b if t2 is None else tucker(t2, w2b, w2a)
    scale = float(alpha) / dim if (alpha is not None and dim is not None) else 1.0
    if w2.dim() == 4:
        # ComfyUI's kron(w1[:, :, None, None], w2), written out: torch 1.13's kron fails on it.
        a, b = w1.shape
        c, d, kh, kw = w2.shape
        return scale * torch.einsum("ab,cdkl->acbdkl", w1, w2).reshape(a * c, b * d, kh, kw).reshape(weight_shape)
    return scale * torch.kron(w1, w2).reshape(weight_shape)


def dora_weight(weight, delta, dora_scale, strength):
    """The weight after a DoRA layer of change `delta` (alpha included) at `strength`."""
    calc = weight + delta
    if dora_scale.shape[0] == calc.shape[0]:
        norm = weight.reshape(weight.shape[0], -1).norm(dim=1, keepdim=True)
        norm = norm.reshape(weight.shape[0], *[1] * (weight.dim() - 1))
    else:
        norm = calc.transpose(0, 1).reshape(calc.shape[1], -1).norm(dim=1, keepdim=True)
        norm = norm.reshape(calc.shape[1], *[1] * (calc.dim() - 1)).transpose(0, 1)
    calc = calc * (dora_scale / (norm + torch.finfo(torch.float32).eps))
    return weight + strength * (calc - weight)
