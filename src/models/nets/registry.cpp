#include "models/nets/registry.h"

#include "models/nets/clip_text.h"
#include "models/nets/clip_vision.h"
#include "models/nets/controlnet.h"
#include "models/nets/flux2_dit.h"
#include "models/nets/flux2_vae.h"
#include "models/nets/flux_dit.h"
#include "models/nets/llm_encoder.h"
#include "models/nets/mmdit.h"
#include "models/nets/qwen25_vl_vision.h"
#include "models/nets/qwen_image_dit.h"
#include "models/nets/t5_encoder.h"
#include "models/nets/taesd.h"
#include "models/nets/unet.h"
#include "models/nets/vae.h"
#include "models/nets/wan_dit.h"
#include "models/nets/wan_vae.h"
#include "models/nets/z_image_dit.h"

namespace kiln::models {
namespace {

// A network's create() as the registry calls it.
template <class Net>
Result<std::unique_ptr<Network>> create(io::WeightDeclarer& weights, const NetworkOptions&) {
    auto net = Net::create(weights);
    if (!net.ok()) return net.error();
    return std::unique_ptr<Network>(std::move(net).value());
}

Result<std::unique_ptr<Network>> create_clip(io::WeightDeclarer& weights, const NetworkOptions& options) {
    auto net = ClipTextEncoder::create(weights, options.hf_named_openclip);
    if (!net.ok()) return net.error();
    return std::unique_ptr<Network>(std::move(net).value());
}

Result<std::unique_ptr<Network>> create_llm(io::WeightDeclarer& weights, const NetworkOptions& options) {
    auto net = LlmEncoder::create(weights, options.unused_last_layers, options.first_layers, options.llm_defaults);
    if (!net.ok()) return net.error();
    return std::unique_ptr<Network>(std::move(net).value());
}

Result<std::unique_ptr<Network>> create_qwen_image_dit(io::WeightDeclarer& weights, const NetworkOptions& options) {
    auto net = QwenImageDit::create(weights, options.zero_cond_t);
    if (!net.ok()) return net.error();
    return std::unique_ptr<Network>(std::move(net).value());
}

const std::vector<NetworkEntry>& entries() {
    static const std::vector<NetworkEntry> list = {
        {NetworkKind::ClipText,
         {"text_model.embeddings.token_embedding.weight", "token_embedding.weight"},
         create_clip},
        {NetworkKind::Unet, {"input_blocks.0.0.weight"}, create<Unet>},
        {NetworkKind::Vae, {"decoder.conv_in.weight"}, create<Vae>},
        {NetworkKind::T5,
         // HF's, llama.cpp's, and Wan's own names for umT5.
         {"encoder.block.0.layer.0.SelfAttention.q.weight", "enc.blk.0.attn_q.weight",
          "blocks.0.pos_embedding.embedding.weight"},
         create<T5Encoder>},
        {NetworkKind::FluxDit, {"double_blocks.0.img_attn.qkv.weight", "x_embedder.weight"}, create<FluxDit>},
        // HF names (Qwen3ForCausalLM's "model." becomes part of the prefix,
        // as ComfyUI's text_encoders.*. and a diffusers folder's
        // text_encoder/ do) and llama.cpp's GGUF names; the embedding rather
        // than a layer, so a GGUF of another architecture reaches
        // LlmEncoder's clear error instead of "no llm in it".
        {NetworkKind::Llm, {"embed_tokens.weight", "token_embd.weight"}, create_llm},
        {NetworkKind::ZImageDit, {"cap_pad_token"}, create<ZImageDit>},
        {NetworkKind::ControlNet, {"input_hint_block.0.weight"}, create<ControlNet>},
        {NetworkKind::Taesd, {"decoder.layers.0.weight", "1.weight"}, create<Taesd>},
        // BFL's names and diffusers' Flux2Transformer2DModel's.
        {NetworkKind::Flux2Dit,
         {"double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight"},
         create<Flux2Dit>},
        // The KL decoder's marker in ldm's names, so a FLUX.1 or SD
        // autoencoder given for FLUX.2 reaches Flux2Vae's error naming what
        // it lacks, and a file in diffusers' names (decoder.up_blocks) is
        // renamed first.
        {NetworkKind::Flux2Vae, {"decoder.up.0.block.0.conv1.weight"}, create<Flux2Vae>},
        {NetworkKind::Mmdit, {"joint_blocks.0.x_block.attn.qkv.weight", "pos_embed.pos_embed"}, create<Mmdit>},
        // img_mod is Qwen-Image's name alone among the DiTs' (diffusers'
        // SD3 and Flux blocks have norm1.linear); create() also wants
        // txt_norm.weight.
        {NetworkKind::QwenImageDit, {"transformer_blocks.0.img_mod.1.weight"}, create_qwen_image_dit},
        // The original module tree's names (wan_2.1_vae.safetensors,
        // qwen_image_vae.safetensors); also the KL decoder's in ldm's names,
        // so an SD or Flux autoencoder given for a Wan VAE reaches WanVae's
        // error naming what it lacks, while diffusers' names
        // (AutoencoderKLQwenImage: decoder.up_blocks) are renamed first.
        {NetworkKind::WanVae, {"decoder.conv1.weight", "decoder.up.0.block.0.conv1.weight"}, create<WanVae>},
        // HF's Conv3d patch embedding (under "visual." in a Qwen2.5-VL file)
        // and llama.cpp's mmproj name for its first temporal kernel.
        {NetworkKind::QwenVision, {"patch_embed.proj.weight", "v.patch_embd.weight"}, create<QwenVisionEncoder>},
        // The cross-attention's QK norm is Wan's name alone (diffusers' Wan
        // has attn2.norm_k).
        {NetworkKind::WanDit, {"blocks.0.cross_attn.norm_k.weight"}, create<WanDit>},
        // HF's CLIPVisionModel names (ComfyUI's clip_vision_h.safetensors).
        {NetworkKind::ClipVision, {"vision_model.embeddings.patch_embedding.weight"}, create<ClipVisionEncoder>},
    };
    return list;
}

}  // namespace

const NetworkEntry& network_entry(NetworkKind kind) {
    for (const NetworkEntry& e : entries()) {
        if (e.kind == kind) return e;
    }
    return entries().front();  // unreachable: every kind has its line (NetworkRegistry.EveryKindHasItsLine)
}

}  // namespace kiln::models
