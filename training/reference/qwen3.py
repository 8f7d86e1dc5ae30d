"""PyTorch reference for the Qwen3 decoder used as a text encoder (Z-Image's
Qwen3-4B reads its hidden states), written from HF transformers'
``modeling_qwen3`` (Qwen3Model, Qwen3DecoderLayer, Qwen3Attention, Qwen3MLP,
Qwen3RMSNorm, Qwen3RotaryEmbedding) without the KV cache, dropout and
generation machinery; with ``qk_norm=False, qkv_bias=True`` it is HF's
``modeling_qwen2`` (Qwen2.5, the text model of Qwen2.5-VL), and with
``qk_norm=False`` alone ``modeling_llama`` / ``modeling_mistral`` (Mistral
Small 3.x's text model): the same layer without the QK norm, with or without
q/k/v biases.

Parameter names are HF ``Qwen3ForCausalLM``'s without the LM head, so
``state_dict()`` is an HF file: ``model.embed_tokens.weight``,
``model.layers.N.self_attn.{q,k,v,o}_proj.weight``,
``model.layers.N.self_attn.{q,k}_norm.weight``,
``model.layers.N.mlp.{gate,up,down}_proj.weight``,
``model.layers.N.{input,post_attention}_layernorm.weight``, ``model.norm.weight``.

The computation, per layer (pre-norm, residual adds, no biases):

  h = RMSNorm(x)                       x * rsqrt(mean(x^2) + eps) * weight
  q, k, v = q_proj h, k_proj h, v_proj h, split in heads of head_dim
            (q: heads, k and v: kv_heads; head_dim need not be hidden / heads)
  q, k = RMSNorm over each head's head_dim (q_norm, k_norm; Qwen3's QK norm),
         then rotary embedding in the NeoX layout (rotate_half: the pairs are
         (i, i + head_dim / 2)), frequencies theta^(-2i / head_dim)
  attention: each group of heads / kv_heads query heads shares one K/V head
             (repeat_kv), scores q.k / sqrt(head_dim) + causal mask, softmax
  x = x + o_proj(attention)
  h = RMSNorm(x)
  x = x + down_proj(silu(gate_proj h) * up_proj h)

then a final RMSNorm.

``forward(tokens)`` returns ``(out, hidden_states)`` with HF's
``output_hidden_states`` semantics: ``hidden_states[0]`` is the embedding,
``hidden_states[i + 1]`` the output of layer i for i < layers - 1, and
``hidden_states[layers]`` is ``out``, the final-normed output of the last
layer (HF replaces the last layer's raw output by the normed one).
``layer_outputs`` (the raw output of every layer, the last one included) is
kept on the module after each call.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_cos_sin(n, head_dim, theta, dtype):
    """cos, sin [n, head_dim] for positions 0..n-1 (HF's default rope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, eps, qk_norm=True, qkv_bias=False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        self.qk_norm = qk_norm

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, -1, self.head_dim)
        k = self.k_proj(x).view(b, n, -1, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, n, hd]
        v = self.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)  # repeat_kv: query head h reads K/V head h // groups
        v = v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-1, -2) * self.head_dim ** -0.5
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(causal, float("-inf"))
        out = F.softmax(scores, dim=-1) @ v  # [B, heads, n, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, ffn, eps, qk_norm=True, qkv_bias=False):
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps, qk_norm, qkv_bias)
        self.mlp = MLP(hidden, ffn)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, kv_heads, head_dim, ffn, eps, qk_norm=True, qkv_bias=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            [DecoderLayer(hidden, heads, kv_heads, head_dim, ffn, eps, qk_norm, qkv_bias) for _ in range(layers)])
        self.norm = RMSNorm(hidden, eps)


class Qwen3Model(nn.Module):
    """HF Qwen3ForCausalLM's ``model`` (the LM head is not part of a text encoder)."""

    def __init__(self, vocab, hidden, layers, heads, kv_heads, head_dim, ffn, rope_theta=1e6, eps=1e-6, qk_norm=True,
                 qkv_bias=False):
        super().__init__()
        assert heads % kv_heads == 0 and head_dim % 2 == 0
        self.model = Qwen3Body(vocab, hidden, layers, heads, kv_heads, head_dim, ffn, eps, qk_norm, qkv_bias)
        self.head_dim = head_dim
        self.rope_theta = rope_theta
        self.layer_outputs = []

    def forward(self, tokens):
        """tokens: [B, n] integer ids. Returns (out [B, n, hidden], hidden_states)."""
        x = self.model.embed_tokens(tokens.long())
        cos, sin = rotary_cos_sin(tokens.shape[1], self.head_dim, self.rope_theta, x.dtype)
        hidden_states = [x]
        self.layer_outputs = []
        for layer in self.model.layers:
            x = layer(x, cos, sin)
            self.layer_outputs.append(x)
            hidden_states.append(x)
        out = self.model.norm(x)
        hidden_states[-1] = out
        return out, hidden_states
