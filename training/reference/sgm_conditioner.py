"""SDXL's conditioning as Stability's sgm code computes it: a second,
independent reference, transcribed module by module (same names) from

  Stability-AI/generative-models
    sgm/modules/encoders/modules.py      GeneralConditioner, FrozenCLIPEmbedder,
                                         FrozenOpenCLIPEmbedder2, ConcatTimestepEmbedderND
    sgm/modules/diffusionmodules/util.py timestep_embedding
    sgm/modules/diffusionmodules/openaimodel.py  Timestep
    sgm/modules/diffusionmodules/denoiser.py     DiscreteDenoiser (+ denoiser_scaling EpsScaling)
    sgm/modules/diffusionmodules/discretizer.py  LegacyDDPMDiscretization
    sgm/inference/helpers.py             get_batch (the size keys: (height, width), (top, left))
    configs/inference/sd_xl_base.yaml    the embedders and their parameters
  huggingface/transformers src/transformers/models/clip/modeling_clip.py
                                         CLIPTextModel (embeddings, attention, MLP, encoder layers,
                                         final_layer_norm, pooler_output)
  mlfoundations/open_clip                the text tower FrozenOpenCLIPEmbedder2 reads: token_embedding,
                                         positional_embedding, transformer.resblocks
                                         (ResidualAttentionBlock over nn.MultiheadAttention), ln_final,
                                         text_projection, the causal attn_mask
  openai/CLIP simple_tokenizer.py        the byte-level BPE both tokenizers run

It is written without reading kiln's own references (training/reference/clip_text.py,
sdxl_conditioning.py), so a misreading shared by those and kiln's C++ shows up as a difference.

sd_xl_base.yaml's conditioner, in embedder order:
  0  FrozenCLIPEmbedder(layer="hidden", layer_idx=11)   input_key txt; always_return_pooled is NOT set
     for it in sd_xl_base.yaml, so its output is the hidden state only (crossattn, 768 wide)
  1  FrozenOpenCLIPEmbedder2(arch ViT-bigG-14, layer="penultimate", always_return_pooled=True,
     legacy=False)                                      input_key txt -> crossattn (1280) and vector (1280)
  2  ConcatTimestepEmbedderND(256)  original_size_as_tuple (h, w)   -> vector (512)
  3  ConcatTimestepEmbedderND(256)  crop_coords_top_left (top, left) -> vector (512)
  4  ConcatTimestepEmbedderND(256)  target_size_as_tuple (h, w)     -> vector (512)
GeneralConditioner concatenates outputs by their rank: 3-d ones ("crossattn") along dim 2 (768 + 1280 =
2048), 2-d ones ("vector") along dim 1 (1280 + 3 * 512 = 2816).

Tiny models: layer_idx=11 of CLIP-L's 12 layers is hidden_states[11] of 13 = hidden_states[-2], the
input of the last layer. For a model of n layers the same position is layer_idx = n - 1
(``clip_l_layer_idx``). sgm runs under autocast (fp16 on GPU); here everything runs in the dtype of
the modules (the checks use float64 on the stored weights).

Tokenizers (ASCII text only: CLIP's \\p{L}/\\p{N} classes become [a-zA-Z]/[0-9], ftfy is not run):
  CLIP-L: HF CLIPTokenizer(padding="max_length", max_length=77, truncation): BOS, ids[:75], EOS, then the
          tokenizer's pad token, "<|endoftext|>" for openai/clip-vit-large-patch14 (EOS padding).
  bigG:   open_clip.tokenize(text, context_length=77): SOT, ids, EOT, zeros; a too-long row is cut to 77
          and its last entry set to EOT.
"""

import json
import math
import os
import re
from collections import OrderedDict

import torch
import torch.nn as nn

# ---------------------------------------------------------------------------------------------------------------
# openai/CLIP simple_tokenizer.py (BPE over byte-unicode characters), reading HF's vocab.json / merges.txt.


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    cs = [chr(n) for n in cs]
    return dict(zip(bs, cs))


def get_pairs(word):
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


def whitespace_clean(text):
    text = re.sub(r"\s+", " ", text)
    text = text.strip()
    return text


class SimpleTokenizer:
    def __init__(self, folder):
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
            merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line.strip()]
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.cache = {"<|startoftext|>": "<|startoftext|>", "<|endoftext|>": "<|endoftext|>"}
        self.pat = re.compile(
            r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[a-zA-Z]+|[0-9]|[^\sa-zA-Z0-9]+""",
            re.IGNORECASE)
        self.sot_token = self.encoder["<|startoftext|>"]
        self.eot_token = self.encoder["<|endoftext|>"]

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        pairs = get_pairs(word)
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            new_word = tuple(new_word)
            word = new_word
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        bpe_tokens = []
        text = whitespace_clean(text).lower()
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            # HF's CLIPTokenizer maps a piece missing from the vocabulary to unk_token (<|endoftext|>)
            bpe_tokens.extend(self.encoder.get(bpe_token, self.eot_token) for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens


def hf_clip_tokenize(tokenizer, texts, max_length=77, pad_token_id=None):
    """CLIPTokenizer(texts, truncation=True, max_length=77, padding="max_length")["input_ids"]."""
    pad = tokenizer.eot_token if pad_token_id is None else pad_token_id
    rows = []
    for text in texts:
        ids = [tokenizer.sot_token] + tokenizer.encode(text)[: max_length - 2] + [tokenizer.eot_token]
        rows.append(ids + [pad] * (max_length - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


def open_clip_tokenize(tokenizer, texts, context_length=77):
    """open_clip.tokenize (tokenizer.py): zeros after EOT; truncated rows end in EOT."""
    sot_token = tokenizer.sot_token
    eot_token = tokenizer.eot_token
    all_tokens = [[sot_token] + tokenizer.encode(text) + [eot_token] for text in texts]
    result = torch.zeros(len(all_tokens), context_length, dtype=torch.long)
    for i, tokens in enumerate(all_tokens):
        if len(tokens) > context_length:
            tokens = tokens[:context_length]  # Truncate
            tokens[-1] = eot_token
        result[i, :len(tokens)] = torch.tensor(tokens)
    return result


# ---------------------------------------------------------------------------------------------------------------
# transformers CLIPTextModel (modeling_clip.py), eager attention.


class CLIPTextConfig:
    def __init__(self, vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                 eos_token_id=49407):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.eos_token_id = eos_token_id


class QuickGELUActivation(nn.Module):
    def forward(self, input):
        return input * torch.sigmoid(1.702 * input)


ACT2FN = {"quick_gelu": QuickGELUActivation, "gelu": nn.GELU}


class CLIPTextEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        embed_dim = config.hidden_size
        self.token_embedding = nn.Embedding(config.vocab_size, embed_dim)
        self.position_embedding = nn.Embedding(config.max_position_embeddings, embed_dim)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)),
                             persistent=False)

    def forward(self, input_ids):
        seq_length = input_ids.shape[-1]
        position_ids = self.position_ids[:, :seq_length]
        inputs_embeds = self.token_embedding(input_ids)
        position_embeddings = self.position_embedding(position_ids)
        return inputs_embeds + position_embeddings


def eager_attention_forward(query, key, value, attention_mask, scaling):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous()


class CLIPAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(self, hidden_states, attention_mask=None):
        batch_size, seq_length, embed_dim = hidden_states.shape
        queries = self.q_proj(hidden_states)
        keys = self.k_proj(hidden_states)
        values = self.v_proj(hidden_states)
        queries = queries.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        keys = keys.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        values = values.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        attn_output = eager_attention_forward(queries, keys, values, attention_mask, self.scale)
        attn_output = attn_output.reshape(batch_size, seq_length, -1).contiguous()
        return self.out_proj(attn_output)


class CLIPMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.activation_fn = ACT2FN[config.hidden_act]()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states):
        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)
        return self.fc2(hidden_states)


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_dim = config.hidden_size
        self.self_attn = CLIPAttention(config)
        self.layer_norm1 = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)
        self.layer_norm2 = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask):
        residual = hidden_states
        hidden_states = self.layer_norm1(hidden_states)
        hidden_states = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.layer_norm2(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class CLIPEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, inputs_embeds, attention_mask=None, output_hidden_states=False):
        """(last_hidden_state, hidden_states): hidden_states is the embeddings' output followed by every
        layer's output (num_hidden_layers + 1 entries), as output_hidden_states=True returns them."""
        encoder_states = () if output_hidden_states else None
        hidden_states = inputs_embeds
        for encoder_layer in self.layers:
            if output_hidden_states:
                encoder_states = encoder_states + (hidden_states,)
            hidden_states = encoder_layer(hidden_states, attention_mask)
        if output_hidden_states:
            encoder_states = encoder_states + (hidden_states,)
        return hidden_states, encoder_states


def _causal_attention_mask(seq_len, dtype):
    # the additive causal mask HF builds: dtype's lowest value above the diagonal, 0 elsewhere
    mask = torch.full((seq_len, seq_len), torch.finfo(dtype).min, dtype=dtype)
    mask = torch.triu(mask, diagonal=1)
    return mask[None, None]


class CLIPTextTransformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        embed_dim = config.hidden_size
        self.embeddings = CLIPTextEmbeddings(config)
        self.encoder = CLIPEncoder(config)
        self.final_layer_norm = nn.LayerNorm(embed_dim, eps=config.layer_norm_eps)
        self.eos_token_id = config.eos_token_id

    def forward(self, input_ids, output_hidden_states=False):
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        hidden_states = self.embeddings(input_ids=input_ids)
        causal_attention_mask = _causal_attention_mask(input_shape[-1], hidden_states.dtype)
        last_hidden_state, all_hidden_states = self.encoder(
            inputs_embeds=hidden_states, attention_mask=causal_attention_mask,
            output_hidden_states=output_hidden_states)
        last_hidden_state = self.final_layer_norm(last_hidden_state)
        if self.eos_token_id == 2:
            # the legacy config: the eot embedding is the highest id in each sequence
            pooled_output = last_hidden_state[torch.arange(last_hidden_state.shape[0]),
                                              input_ids.to(dtype=torch.int).argmax(dim=-1)]
        else:
            # the first position holding eos_token_id
            pooled_output = last_hidden_state[
                torch.arange(last_hidden_state.shape[0]),
                (input_ids.to(dtype=torch.int) == self.eos_token_id).int().argmax(dim=-1)]
        return {"last_hidden_state": last_hidden_state, "pooler_output": pooled_output,
                "hidden_states": all_hidden_states}


class CLIPTextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.text_model = CLIPTextTransformer(config)

    def forward(self, input_ids, output_hidden_states=False):
        return self.text_model(input_ids=input_ids, output_hidden_states=output_hidden_states)


# ---------------------------------------------------------------------------------------------------------------
# open_clip's text tower (open_clip/model.py CLIP, transformer.py ResidualAttentionBlock), without the visual one.


class LayerNorm(nn.LayerNorm):
    """open_clip's LayerNorm subclass (casts to the input's dtype)."""

    def forward(self, x):
        orig_type = x.dtype
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.to(orig_type)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, d_model, n_head, mlp_ratio=4.0, act_layer=nn.GELU):
        super().__init__()
        self.ln_1 = LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_head)
        self.ln_2 = LayerNorm(d_model)
        mlp_width = int(d_model * mlp_ratio)
        self.mlp = nn.Sequential(OrderedDict([
            ("c_fc", nn.Linear(d_model, mlp_width)),
            ("gelu", act_layer()),
            ("c_proj", nn.Linear(mlp_width, d_model)),
        ]))

    def attention(self, q_x, attn_mask=None):
        attn_mask = attn_mask.to(q_x.dtype) if attn_mask is not None else None
        return self.attn(q_x, q_x, q_x, need_weights=False, attn_mask=attn_mask)[0]

    def forward(self, q_x, attn_mask=None):
        x = q_x + self.attention(q_x=self.ln_1(q_x), attn_mask=attn_mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class Transformer(nn.Module):
    def __init__(self, width, layers, heads, mlp_ratio=4.0, act_layer=nn.GELU):
        super().__init__()
        self.width = width
        self.layers = layers
        self.grad_checkpointing = False
        self.resblocks = nn.ModuleList([
            ResidualAttentionBlock(width, heads, mlp_ratio, act_layer=act_layer) for _ in range(layers)])


class OpenCLIPTextTower(nn.Module):
    """The attributes FrozenOpenCLIPEmbedder2 reads from open_clip's CLIP model (model.visual deleted)."""

    def __init__(self, vocab_size=49408, context_length=77, width=1280, heads=20, layers=32, mlp_ratio=4.0,
                 embed_dim=1280, act_layer=nn.GELU):
        super().__init__()
        self.transformer = Transformer(width, layers, heads, mlp_ratio, act_layer=act_layer)
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        self.ln_final = LayerNorm(width)
        self.text_projection = nn.Parameter(torch.empty(width, embed_dim))
        self.logit_scale = nn.Parameter(torch.ones([]))
        self.register_buffer("attn_mask", self.build_attention_mask(), persistent=False)

    def build_attention_mask(self):
        # lazily create causal attention mask, with full attention between the vision tokens
        # pytorch uses additive attention mask; fill with -inf
        mask = torch.empty(self.context_length, self.context_length)
        mask.fill_(float("-inf"))
        mask.triu_(1)  # zero out the lower diagonal
        return mask


# ---------------------------------------------------------------------------------------------------------------
# sgm/modules/diffusionmodules/util.py and openaimodel.py


def timestep_embedding(timesteps, dim, max_period=10000, repeat_only=False):
    """Sinusoidal embeddings, computed in float32 as sgm does (freqs and args are float32)."""
    assert not repeat_only
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half).to(
        device=timesteps.device)
    args = timesteps[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


class Timestep(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t):
        return timestep_embedding(t, self.dim)


# ---------------------------------------------------------------------------------------------------------------
# sgm/modules/encoders/modules.py


class AbstractEmbModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.is_trainable = False
        self.ucg_rate = 0.0
        self.input_key = None
        self.legacy_ucg_val = None


class FrozenCLIPEmbedder(AbstractEmbModel):
    """Uses the CLIP transformer encoder for text (from huggingface)"""

    LAYERS = ["last", "pooled", "hidden"]

    def __init__(self, transformer, tokenizer, max_length=77, layer="last", layer_idx=None,
                 always_return_pooled=False):
        super().__init__()
        assert layer in self.LAYERS
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.max_length = max_length
        self.layer = layer
        self.layer_idx = layer_idx
        self.return_pooled = always_return_pooled
        if layer == "hidden":
            assert layer_idx is not None
            assert 0 <= abs(layer_idx) <= 12

    def tokenize(self, text):
        # CLIPTokenizer(..., padding="max_length"): openai/clip-vit-large-patch14 pads with <|endoftext|>
        return hf_clip_tokenize(self.tokenizer, text, self.max_length)

    def forward(self, text):
        tokens = self.tokenize(text)
        outputs = self.transformer(input_ids=tokens, output_hidden_states=self.layer == "hidden")
        if self.layer == "last":
            z = outputs["last_hidden_state"]
        elif self.layer == "pooled":
            z = outputs["pooler_output"][:, None, :]
        else:
            z = outputs["hidden_states"][self.layer_idx]
        if self.return_pooled:
            return z, outputs["pooler_output"]
        return z


class FrozenOpenCLIPEmbedder2(AbstractEmbModel):
    """Uses the OpenCLIP transformer encoder for text"""

    LAYERS = ["pooled", "last", "penultimate"]

    def __init__(self, model, tokenizer, max_length=77, layer="last", always_return_pooled=False, legacy=True):
        super().__init__()
        assert layer in self.LAYERS
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.return_pooled = always_return_pooled
        self.layer = layer
        if self.layer == "last":
            self.layer_idx = 0
        elif self.layer == "penultimate":
            self.layer_idx = 1
        else:
            raise NotImplementedError()
        self.legacy = legacy

    def tokenize(self, text):
        return open_clip_tokenize(self.tokenizer, text, self.max_length)

    def forward(self, text):
        tokens = self.tokenize(text)
        z = self.encode_with_transformer(tokens)
        if not self.return_pooled and self.legacy:
            return z
        if self.return_pooled:
            assert not self.legacy
            return z[self.layer], z["pooled"]
        return z[self.layer]

    def encode_with_transformer(self, text):
        x = self.model.token_embedding(text)  # [batch_size, n_ctx, d_model]
        x = x + self.model.positional_embedding
        x = x.permute(1, 0, 2)  # NLD -> LND
        x = self.text_transformer_forward(x, attn_mask=self.model.attn_mask)
        if self.legacy:
            x = x[self.layer]
            x = self.model.ln_final(x)
            return x
        else:
            # x is a dict and will stay a dict
            o = x["last"]
            o = self.model.ln_final(o)
            pooled = self.pool(o, text)
            x["pooled"] = pooled
            return x

    def pool(self, x, text):
        # take features from the eot embedding (eot_token is the highest number in each sequence)
        x = x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.model.text_projection
        return x

    def text_transformer_forward(self, x, attn_mask=None):
        outputs = {}
        for i, r in enumerate(self.model.transformer.resblocks):
            if i == len(self.model.transformer.resblocks) - 1:
                outputs["penultimate"] = x.permute(1, 0, 2)  # LND -> NLD
            x = r(x, attn_mask=attn_mask)
        outputs["last"] = x.permute(1, 0, 2)  # LND -> NLD
        return outputs


class ConcatTimestepEmbedderND(AbstractEmbModel):
    """embeds each dimension independently and concatenates them"""

    def __init__(self, outdim):
        super().__init__()
        self.timestep = Timestep(outdim)
        self.outdim = outdim

    def forward(self, x):
        if x.ndim == 1:
            x = x[:, None]
        assert len(x.shape) == 2
        b, dims = x.shape[0], x.shape[1]
        x = x.reshape(b * dims)  # rearrange(x, "b d -> (b d)")
        emb = self.timestep(x)
        emb = emb.reshape(b, dims * self.outdim)  # rearrange(emb, "(b d) d2 -> b (d d2)")
        return emb


class GeneralConditioner(nn.Module):
    OUTPUT_DIM2KEYS = {2: "vector", 3: "crossattn", 4: "concat", 5: "concat"}
    KEY2CATDIM = {"vector": 1, "crossattn": 2, "concat": 1}

    def __init__(self, embedders):
        super().__init__()
        self.embedders = nn.ModuleList(embedders)

    def forward(self, batch, force_zero_embeddings=None):
        output = dict()
        if force_zero_embeddings is None:
            force_zero_embeddings = []
        for embedder in self.embedders:
            with torch.no_grad():
                emb_out = embedder(batch[embedder.input_key])
            if not isinstance(emb_out, (list, tuple)):
                emb_out = [emb_out]
            for emb in emb_out:
                out_key = self.OUTPUT_DIM2KEYS[emb.dim()]
                assert embedder.ucg_rate == 0.0  # no conditioning dropout at inference
                if embedder.input_key in force_zero_embeddings:
                    emb = torch.zeros_like(emb)
                if out_key in output:
                    output[out_key] = torch.cat((output[out_key], emb), self.KEY2CATDIM[out_key])
                else:
                    output[out_key] = emb
        return output

    def get_unconditional_conditioning(self, batch_c, batch_uc=None, force_uc_zero_embeddings=None,
                                       force_cond_zero_embeddings=None):
        if force_uc_zero_embeddings is None:
            force_uc_zero_embeddings = []
        c = self(batch_c, force_cond_zero_embeddings)
        uc = self(batch_c if batch_uc is None else batch_uc, force_uc_zero_embeddings)
        return c, uc


def get_batch(value_dict, n=1):
    """sgm/inference/helpers.py get_batch for SDXL base's keys: the sizes as (height, width) and
    (top, left) integer tensors; batch_uc shares every tensor key and takes the negative prompt."""
    batch = {
        "txt": [value_dict["prompt"]] * n,
        "original_size_as_tuple": torch.tensor([value_dict["orig_height"], value_dict["orig_width"]]).repeat(n, 1),
        "crop_coords_top_left": torch.tensor([value_dict["crop_coords_top"],
                                              value_dict["crop_coords_left"]]).repeat(n, 1),
        "target_size_as_tuple": torch.tensor([value_dict["target_height"], value_dict["target_width"]]).repeat(n, 1),
    }
    batch_uc = {"txt": [value_dict["negative_prompt"]] * n}
    for key in batch.keys():
        if key not in batch_uc and isinstance(batch[key], torch.Tensor):
            batch_uc[key] = torch.clone(batch[key])
    return batch, batch_uc


# ---------------------------------------------------------------------------------------------------------------
# Building SDXL's conditioner from a checkpoint's state dict (conditioner.embedders.N.*).


def clip_l_layer_idx(layers):
    """sd_xl_base's layer_idx=11 (of 12) at the same place in a model of `layers` layers."""
    return 11 - (12 - layers)


def sdxl_conditioner(state, tokenizer, clip_l_config, bigg_config, size_outdim=256, dtype=torch.float64):
    """GeneralConditioner of sd_xl_base.yaml on the `state` tensors (checkpoint names).
    clip_l_config: CLIPTextConfig; bigg_config: dict(width, heads, layers, mlp_ratio, embed_dim)."""
    prefix_l = "conditioner.embedders.0.transformer."
    prefix_g = "conditioner.embedders.1.model."
    transformer = CLIPTextModel(clip_l_config)
    sd = {k[len(prefix_l):]: v for k, v in state.items() if k.startswith(prefix_l)}
    sd.pop("text_model.embeddings.position_ids", None)  # a non-persistent buffer in HF's module
    transformer.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    tower = OpenCLIPTextTower(vocab_size=clip_l_config.vocab_size, **bigg_config)
    sd = {k[len(prefix_g):]: v for k, v in state.items() if k.startswith(prefix_g)}
    tower.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    transformer, tower = transformer.to(dtype).eval(), tower.to(dtype).eval()

    e0 = FrozenCLIPEmbedder(transformer, tokenizer, layer="hidden",
                            layer_idx=clip_l_layer_idx(clip_l_config.num_hidden_layers))
    e0.input_key = "txt"
    e1 = FrozenOpenCLIPEmbedder2(tower, tokenizer, layer="penultimate", always_return_pooled=True, legacy=False)
    e1.input_key = "txt"
    sizes = []
    for key in ("original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple"):
        e = ConcatTimestepEmbedderND(size_outdim)
        e.input_key = key
        sizes.append(e)
    return GeneralConditioner([e0, e1] + sizes)


# ---------------------------------------------------------------------------------------------------------------
# sgm's eps denoiser over the discrete schedule, and VanillaCFG.


class LegacyDDPMDiscretization:
    def __init__(self, linear_start=0.00085, linear_end=0.0120, num_timesteps=1000):
        self.num_timesteps = num_timesteps
        betas = (torch.linspace(linear_start ** 0.5, linear_end ** 0.5, num_timesteps, dtype=torch.float64) ** 2).numpy()
        alphas = 1.0 - betas
        import numpy as np

        self.alphas_cumprod = np.cumprod(alphas, axis=0)

    def get_sigmas(self, n):
        assert n == self.num_timesteps
        alphas_cumprod = self.alphas_cumprod
        sigmas = torch.tensor((1 - alphas_cumprod) / alphas_cumprod, dtype=torch.float32) ** 0.5
        return torch.flip(sigmas, (0,))

    def __call__(self, n, do_append_zero=True, flip=False):
        sigmas = self.get_sigmas(n)
        if do_append_zero:
            sigmas = torch.cat([sigmas, sigmas.new_zeros([1])])
        return sigmas if not flip else torch.flip(sigmas, (0,))


class DiscreteEpsDenoiser:
    """DiscreteDenoiser(num_idx=1000, LegacyDDPMDiscretization, EpsScaling, quantize_c_noise=True)."""

    def __init__(self, num_idx=1000):
        self.sigmas = LegacyDDPMDiscretization()(num_idx, do_append_zero=False, flip=True)  # ascending

    def sigma_to_idx(self, sigma):
        dists = sigma - self.sigmas[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape)

    def idx_to_sigma(self, idx):
        return self.sigmas[idx]

    def __call__(self, network, input, sigma, cond):
        """network(x, c_noise, cond) -> eps. Returns (denoised, eps)."""
        sigma = self.idx_to_sigma(self.sigma_to_idx(sigma))  # possibly_quantize_sigma
        sigma_shape = sigma.shape
        s = sigma.to(input.dtype).reshape(-1, *([1] * (input.ndim - 1)))
        c_skip, c_out, c_in, c_noise = 1.0, -s, 1 / (s ** 2 + 1.0) ** 0.5, sigma.clone()  # EpsScaling
        c_noise = self.sigma_to_idx(c_noise.reshape(sigma_shape))  # possibly_quantize_c_noise
        eps = network(input * c_in, c_noise, cond)
        return eps * c_out + input * c_skip, eps


def vanilla_cfg(x, scale):
    """sgm guiders.VanillaCFG.__call__: x holds (uncond, cond) along the batch."""
    x_u, x_c = x.chunk(2)
    return x_u + scale * (x_c - x_u)
