"""PyTorch reference for the CLIP vision tower that Wan 2.1's image-to-video
and first-last-frame-to-video models read their images with (open_clip's
ViT-H/14, which ComfyUI ships as ``clip_vision_h.safetensors``).

The network is HF transformers' ``CLIPVisionModelWithProjection``
(``models/clip/modeling_clip.py``: ``CLIPVisionEmbeddings``,
``CLIPAttention``, ``CLIPMLP``, ``CLIPEncoderLayer``, ``CLIPEncoder``,
``CLIPVisionTransformer``), transcribed module by module so that
``ClipVisionModel(**CLIP_VISION_H).state_dict()`` has exactly the names and
shapes of ``clip_vision_h.safetensors``:

  vision_model.embeddings.class_embedding            [W]
  vision_model.embeddings.patch_embedding.weight     [W, 3, P, P] (no bias)
  vision_model.embeddings.position_embedding.weight  [(S / P)^2 + 1, W]
  vision_model.pre_layrnorm.{weight,bias}            (HF's spelling)
  vision_model.encoder.layers.N.self_attn.{k,v,q,out}_proj.{weight,bias}
  vision_model.encoder.layers.N.{layer_norm1,layer_norm2}.{weight,bias}
  vision_model.encoder.layers.N.mlp.{fc1,fc2}.{weight,bias}
  vision_model.post_layernorm.{weight,bias}
  visual_projection.weight                           [proj, W] (no bias)

``clip_vision_tensor_shapes(cfg)`` lists them from the configuration alone.

The computation, as HF's: tokens = [class_embedding, patches] (the Conv2d
with kernel = stride = P over the image, flattened row by row) plus
position_embedding; pre_layrnorm; each layer
``x += out_proj(attention(layer_norm1(x)))`` (q, k, v with biases, softmax(q
k^T / sqrt(d)) per head, no mask) and ``x += fc2(gelu(fc1(layer_norm2(x))))``
with the exact (erf) GELU: ViT-H/14's ``hidden_act`` is "gelu" (OpenAI's
ViT-L/14 uses quick_gelu; open_clip's LAION towers do not); every LayerNorm
with eps 1e-5. The pooled output is post_layernorm of the class token after
the last layer, and ``image_embeds = visual_projection(pooled)``.

Wan's use of it (``wan/modules/clip.py`` of github.com/Wan-Video/Wan2.1,
``CLIPModel.visual``, which runs open_clip's ``VisionTransformer`` with
``use_31_block=True``), is ``wan_clip_pixels`` then ``wan_clip_features``:

- pixels: the [-1, 1] frame stretched to 224 x 224 by ``F.interpolate(...,
  mode='bicubic', align_corners=False)`` (no crop, no antialias), then
  ``mul(0.5).add(0.5)`` back to [0, 1], then ``T.Normalize`` with CLIP's
  mean and std;
- features: ``self.transformer[:-1](x)``, the tokens after all layers but
  the last (31 of 32), without post_layernorm or the projection: all 257
  tokens of every image, [N, 257, 1280]. (Wan's ViT is open_clip's layout,
  fused ``attn`` and ``mlp.{0,2}``; the computation is the same as HF's
  layer for layer, and ComfyUI reads the same tensor as
  ``penultimate_hidden_states`` from the HF-named file.)

What differs from the originals, none of it in the numbers of a float64 run:

- the whole reference runs in the inputs' dtype (Wan's ``amp.autocast`` to
  float16 and HF's cast of the pixels to the weights' dtype are left out);
- attention is the plain scaled dot product (HF scales q before the product,
  Wan's flash_attention inside the kernel: the same numbers up to rounding);
- no dropout, no attention-weight outputs, no interpolated positions
  (``interpolation=False`` in Wan: 224 x 224 only).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5  # layer_norm_eps

# open_clip ViT-H/14 (laion2b) as HF's CLIPVisionConfig gives it; ComfyUI's clip_vision_h.safetensors.
CLIP_VISION_H = dict(image_size=224, patch_size=14, width=1280, layers=32, heads=16, intermediate=5120,
                     projection=1024)

# CLIPModel.visual's preprocessing (wan/modules/clip.py): OpenAI CLIP's normalisation.
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def clip_vision_tensor_shapes(cfg):
    """{name: shape} of CLIPVisionModelWithProjection (PyTorch order), from the configuration alone."""
    w, p, m = cfg["width"], cfg["patch_size"], cfg["intermediate"]
    tokens = (cfg["image_size"] // p) ** 2 + 1
    v = "vision_model."
    s = {v + "embeddings.class_embedding": (w,),
         v + "embeddings.patch_embedding.weight": (w, 3, p, p),
         v + "embeddings.position_embedding.weight": (tokens, w),
         v + "pre_layrnorm.weight": (w,),
         v + "pre_layrnorm.bias": (w,)}

    def linear(name, n_in, n_out):
        s[name + ".weight"] = (n_out, n_in)
        s[name + ".bias"] = (n_out,)

    for i in range(cfg["layers"]):
        b = v + "encoder.layers.%d." % i
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(b + "self_attn." + proj, w, w)
        for norm in ("layer_norm1", "layer_norm2"):
            s[b + norm + ".weight"] = (w,)
            s[b + norm + ".bias"] = (w,)
        linear(b + "mlp.fc1", w, m)
        linear(b + "mlp.fc2", m, w)
    s[v + "post_layernorm.weight"] = (w,)
    s[v + "post_layernorm.bias"] = (w,)
    s["visual_projection.weight"] = (cfg["projection"], w)
    return s


# ------------------------------------------------------------ modules (HF's tree)


class CLIPVisionEmbeddings(nn.Module):

    def __init__(self, width, image_size, patch_size):
        super().__init__()
        self.class_embedding = nn.Parameter(torch.randn(width))
        self.patch_embedding = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        self.num_positions = (image_size // patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(self.num_positions, width)

    def forward(self, pixel_values):
        b = pixel_values.shape[0]
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, grid^2, W], row by row
        x = torch.cat([self.class_embedding.expand(b, 1, -1), patches], dim=1)
        # HF adds position_embedding(position_ids), position_ids = arange(num_positions): the whole table
        return x + self.position_embedding.weight[None]


class CLIPAttention(nn.Module):

    def __init__(self, width, heads):
        super().__init__()
        assert width % heads == 0
        self.heads = heads
        # HF's definition order (k, v, q, out): the order a seeded init walks the state dict in
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x):
        b, n, w = x.shape
        d = w // self.heads
        q, k, v = (p(x).view(b, n, self.heads, d).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d), dim=-1)  # no mask
        return self.out_proj(torch.matmul(a, v).transpose(1, 2).reshape(b, n, w))


class CLIPMLP(nn.Module):

    def __init__(self, width, intermediate):
        super().__init__()
        self.fc1 = nn.Linear(width, intermediate)
        self.fc2 = nn.Linear(intermediate, width)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # hidden_act "gelu": erf, not quick_gelu


class CLIPEncoderLayer(nn.Module):

    def __init__(self, width, heads, intermediate):
        super().__init__()
        self.self_attn = CLIPAttention(width, heads)
        self.layer_norm1 = nn.LayerNorm(width, eps=EPS)
        self.mlp = CLIPMLP(width, intermediate)
        self.layer_norm2 = nn.LayerNorm(width, eps=EPS)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):

    def __init__(self, width, layers, heads, intermediate):
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(width, heads, intermediate) for _ in range(layers)])


class CLIPVisionTransformer(nn.Module):

    def __init__(self, image_size, patch_size, width, layers, heads, intermediate):
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(width, image_size, patch_size)
        self.pre_layrnorm = nn.LayerNorm(width, eps=EPS)
        self.encoder = CLIPEncoder(width, layers, heads, intermediate)
        self.post_layernorm = nn.LayerNorm(width, eps=EPS)


class ClipVisionModel(nn.Module):
    """CLIPVisionModelWithProjection: ``vision_model`` and ``visual_projection``."""

    def __init__(self, image_size=224, patch_size=14, width=1280, layers=32, heads=16, intermediate=5120,
                 projection=1024):
        super().__init__()
        self.image_size = image_size
        self.vision_model = CLIPVisionTransformer(image_size, patch_size, width, layers, heads, intermediate)
        self.visual_projection = nn.Linear(width, projection, bias=False)

    def hidden_states(self, pixel_values, layers=None):
        """The tokens [B, (S / P)^2 + 1, W] after the first `layers` encoder layers (all when None), after
        pre_layrnorm and without post_layernorm: HF's hidden_states[layers]."""
        vm = self.vision_model
        x = vm.pre_layrnorm(vm.embeddings(pixel_values))
        for layer in vm.encoder.layers[:layers]:
            x = layer(x)
        return x

    def forward(self, pixel_values):
        """(last_hidden_state, image_embeds): HF's output; the pooled output is the class token, post-normed."""
        last = self.hidden_states(pixel_values)
        return last, self.visual_projection(self.vision_model.post_layernorm(last[:, 0]))


# ------------------------------------------------------------ Wan's use (CLIPModel.visual)


def wan_clip_pixels(videos, size=224):
    """Images [N, 3, H, W] in [-1, 1] -> the ViT's input [N, 3, 224, 224]: stretched (not cropped) with
    bicubic interpolation, align_corners=False, no antialias; back to [0, 1]; CLIP's Normalize."""
    x = F.interpolate(videos, size=(size, size), mode="bicubic", align_corners=False)
    x = x.mul(0.5).add(0.5)
    mean = torch.tensor(MEAN, dtype=x.dtype).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=x.dtype).view(1, 3, 1, 1)
    return (x - mean) / std  # T.Normalize: sub_(mean).div_(std)


def wan_clip_features(model, pixels):
    """use_31_block=True: the tokens after all layers but the last, no post_layernorm: [N, 257, W]."""
    return model.hidden_states(pixels, layers=len(model.vision_model.encoder.layers) - 1)
