#include "io/model_summary.h"

#include <algorithm>

namespace kiln::io {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A rule: tensors whose name starts with `prefix` belong to component `name`.
// First match wins, so longer prefixes come first.
struct ComponentRule {
    const char* prefix;
    const char* name;
    ComponentKind kind;
};

constexpr ComponentRule kRules[] = {
    // Single-file (ldm / sgm) checkpoints.
    {"model.diffusion_model.", "diffusion_model", ComponentKind::DiffusionModel},
    {"first_stage_model.", "vae", ComponentKind::Vae},
    {"cond_stage_model.transformer.", "clip_l", ComponentKind::TextEncoder},
    {"cond_stage_model.model.", "open_clip_h", ComponentKind::TextEncoder},
    {"conditioner.embedders.0.transformer.", "clip_l", ComponentKind::TextEncoder},
    {"conditioner.embedders.1.model.", "open_clip_g", ComponentKind::TextEncoder},
    {"text_encoders.clip_l.", "clip_l", ComponentKind::TextEncoder},
    {"text_encoders.clip_g.", "clip_g", ComponentKind::TextEncoder},
    {"text_encoders.t5xxl.", "t5xxl", ComponentKind::TextEncoder},
    {"text_encoders.qwen3_4b.", "qwen3_4b", ComponentKind::TextEncoder},
    {"text_encoders.mistral3_24b.", "mistral3_24b", ComponentKind::TextEncoder},
    {"text_encoders.qwen25_7b.", "qwen25_7b", ComponentKind::TextEncoder},
    {"vae.", "vae", ComponentKind::Vae},
    // Diffusers folders (ModelFile prefixes each tensor with its subfolder).
    {"unet/", "unet", ComponentKind::DiffusionModel},
    {"transformer/", "transformer", ComponentKind::DiffusionModel},
    {"vae/", "vae", ComponentKind::Vae},
    {"text_encoder/", "text_encoder", ComponentKind::TextEncoder},
    {"text_encoder_2/", "text_encoder_2", ComponentKind::TextEncoder},
    {"text_encoder_3/", "text_encoder_3", ComponentKind::TextEncoder},
};

// Files that hold one module without a prefix: a standalone VAE, UNet or text
// encoder (what --vae, --diffusion-model and --clip_l take).
const char* bare_component(std::string_view name, ComponentKind* kind) {
    // Text encoders first: T5's "encoder.block." would otherwise look like a VAE.
    if (starts_with(name, "text_model.") || starts_with(name, "transformer.resblocks.") ||
        starts_with(name, "token_embedding") || starts_with(name, "positional_embedding") ||
        starts_with(name, "text_projection") || starts_with(name, "encoder.block.") ||
        starts_with(name, "encoder.final_layer_norm.") || starts_with(name, "shared.")) {
        *kind = ComponentKind::TextEncoder;
        return "text_encoder";
    }
    // A decoder-only LLM: HF's Qwen3 (lm_head.* is part of the file, unused
    // by kiln) or llama.cpp's GGUF names (T5's GGUF encoder too: enc.blk.).
    if (starts_with(name, "model.embed_tokens.") || starts_with(name, "model.layers.") ||
        starts_with(name, "model.norm.") || starts_with(name, "lm_head.") || starts_with(name, "token_embd.") ||
        starts_with(name, "blk.") || starts_with(name, "enc.") || starts_with(name, "output_norm.") ||
        starts_with(name, "output.")) {
        *kind = ComponentKind::TextEncoder;
        return "text_encoder";
    }
    // A vision-language model's text encoder (Mistral3ForConditionalGeneration,
    // FLUX.2-dev's text_encoder/: language_model.*; Qwen2.5-VL's visual.*);
    // its vision tower and projector are part of the file, never read.
    if (starts_with(name, "language_model.") || starts_with(name, "model.language_model.") ||
        starts_with(name, "vision_tower.") || starts_with(name, "model.vision_tower.") ||
        starts_with(name, "multi_modal_projector.") || starts_with(name, "model.multi_modal_projector.") ||
        starts_with(name, "visual.") || starts_with(name, "model.visual.")) {
        *kind = ComponentKind::TextEncoder;
        return "text_encoder";
    }
    // Wan 2.1's VAE has its 1x1x1 convolutions between encoder and decoder at the top.
    if (starts_with(name, "encoder.") || starts_with(name, "decoder.") || starts_with(name, "quant_conv") ||
        starts_with(name, "post_quant_conv") || starts_with(name, "conv1.") || starts_with(name, "conv2.")) {
        *kind = ComponentKind::Vae;
        return "vae";
    }
    if (starts_with(name, "input_blocks.") || starts_with(name, "middle_block.") ||
        starts_with(name, "output_blocks.") || starts_with(name, "time_embed.") || starts_with(name, "down_blocks.") ||
        starts_with(name, "up_blocks.") || starts_with(name, "mid_block.") || starts_with(name, "double_blocks.") ||
        starts_with(name, "single_blocks.") || starts_with(name, "joint_blocks.") ||
        starts_with(name, "transformer_blocks.") || starts_with(name, "blocks.") || starts_with(name, "label_emb.") ||
        starts_with(name, "out.") || starts_with(name, "conv_in.") || starts_with(name, "conv_out.") ||
        starts_with(name, "time_embedding.") || starts_with(name, "conv_norm_out.") ||
        // Flux's and FLUX.2's embedders and modulation layers (BFL's names;
        // Chroma's approximator).
        starts_with(name, "img_in.") || starts_with(name, "txt_in.") || starts_with(name, "time_in.") ||
        starts_with(name, "vector_in.") || starts_with(name, "guidance_in.") ||
        starts_with(name, "double_stream_modulation_") || starts_with(name, "single_stream_modulation.") ||
        starts_with(name, "distilled_guidance_layer.") ||
        // Z-Image's DiT (single-file and diffusers names).
        starts_with(name, "noise_refiner.") || starts_with(name, "context_refiner.") || starts_with(name, "layers.") ||
        starts_with(name, "x_embedder.") || starts_with(name, "all_x_embedder.") ||
        starts_with(name, "cap_embedder.") || starts_with(name, "t_embedder.") || starts_with(name, "final_layer.") ||
        starts_with(name, "all_final_layer.") || name == "x_pad_token" || name == "cap_pad_token" ||
        // Qwen-Image's DiT (diffusers' names).
        starts_with(name, "time_text_embed.") || starts_with(name, "txt_norm.") || starts_with(name, "norm_out.") ||
        starts_with(name, "proj_out.") ||
        // Wan's DiT (the original names).
        starts_with(name, "patch_embedding.") || starts_with(name, "text_embedding.") ||
        starts_with(name, "time_projection.") || starts_with(name, "head.")) {
        *kind = ComponentKind::DiffusionModel;
        return "diffusion_model";
    }
    *kind = ComponentKind::Other;
    return "other";
}

}  // namespace

const char* component_kind_name(ComponentKind kind) {
    switch (kind) {
        case ComponentKind::DiffusionModel: return "diffusion model";
        case ComponentKind::TextEncoder: return "text encoder";
        case ComponentKind::Vae: return "VAE";
        case ComponentKind::Other: return "other";
    }
    return "?";
}

ModelSummary summarize_model(const ModelFile& model) {
    ModelSummary summary;
    std::map<std::string, ComponentSummary> by_name;
    std::vector<std::string> order;
    for (const TensorInfo& t : model.tensors()) {
        std::string name, prefix;
        ComponentKind kind = ComponentKind::Other;
        bool matched = false;
        for (const ComponentRule& rule : kRules) {
            if (starts_with(t.name, rule.prefix)) {
                name = rule.name;
                prefix = rule.prefix;
                kind = rule.kind;
                matched = true;
                break;
            }
        }
        if (!matched) name = bare_component(t.name, &kind);
        auto [it, inserted] = by_name.try_emplace(name);
        ComponentSummary& c = it->second;
        if (inserted) {
            c.kind = kind;
            c.name = name;
            c.prefix = prefix;
            order.push_back(name);
        }
        ++c.tensor_count;
        c.bytes += t.nbytes;
        c.parameters += t.element_count();
        ++c.dtype_counts[dtype_name(t.dtype)];
        ++summary.tensor_count;
        summary.bytes += t.nbytes;
    }
    for (const std::string& name : order) summary.components.push_back(by_name[name]);
    std::stable_sort(summary.components.begin(), summary.components.end(),
                     [](const ComponentSummary& a, const ComponentSummary& b) { return a.kind < b.kind; });
    return summary;
}

}  // namespace kiln::io
