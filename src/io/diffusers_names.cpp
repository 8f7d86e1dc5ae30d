#include "io/diffusers_names.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace kiln::io {
namespace {

constexpr ModelComponent kComponents[] = {ModelComponent::Unet, ModelComponent::Vae, ModelComponent::TextEncoder,
                                          ModelComponent::TextEncoder2, ModelComponent::Transformer};

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// "unet/down_blocks.3.resnets.1.conv1.weight", "down_blocks." -> 3
std::optional<int> index_after(std::string_view name, std::string_view marker) {
    const size_t at = name.find(marker);
    if (at == std::string_view::npos) return std::nullopt;
    const char* digits = name.data() + at + marker.size();
    if (at + marker.size() >= name.size() || *digits < '0' || *digits > '9') return std::nullopt;
    return static_cast<int>(std::strtol(digits, nullptr, 10));
}

}  // namespace

std::optional<ModelFamily> detect_diffusers_family(const std::vector<TensorInfo>& tensors) {
    std::optional<int64_t> text_width;
    // Qwen-Image's pipelines (QwenImagePipeline, QwenImageEditPlusPipeline):
    // their VAE is Wan 2.1's, under its own names (name_map.h).
    for (const TensorInfo& t : tensors) {
        if (t.name == "transformer/transformer_blocks.0.img_mod.1.weight") return ModelFamily::QwenImage;
        // Wan's pipelines (WanTransformer3DModel's time projection).
        if (t.name == "transformer/condition_embedder.time_proj.weight") return ModelFamily::Wan;
    }
    // A DiT pipeline (FluxPipeline: transformer/, T5 in text_encoder_2/):
    // its transformer and T5 keep their names (their networks read them);
    // its VAE and CLIP are SD's and take SD's renames.
    for (const TensorInfo& t : tensors) {
        if (starts_with(t.name, "transformer/")) return ModelFamily::SD1;
    }
    for (const TensorInfo& t : tensors) {
        if (starts_with(t.name, "text_encoder_2/")) return ModelFamily::SDXL;
        if (t.name == "text_encoder/text_model.embeddings.token_embedding.weight" && t.shape.size() == 2) {
            text_width = t.shape[1];
        }
    }
    if (text_width == 768) return ModelFamily::SD1;
    if (text_width == 1024) return ModelFamily::SD2;
    // No text encoder: the UNet's cross-attention width decides.
    for (const TensorInfo& t : tensors) {
        if (starts_with(t.name, "unet/") && t.name.find("attn2.to_k.weight") != std::string::npos &&
            t.shape.size() == 2) {
            if (t.shape[1] == 768) return ModelFamily::SD1;
            if (t.shape[1] == 1024) return ModelFamily::SD2;
            if (t.shape[1] == 2048) return ModelFamily::SDXL;
        }
    }
    // Unusual widths (small models): SD2's UNet projects into its
    // transformers with linear layers, SD1's with 1x1 convolutions.
    for (const TensorInfo& t : tensors) {
        if (starts_with(t.name, "unet/") && t.name.size() > 15 &&
            t.name.compare(t.name.size() - 15, 15, ".proj_in.weight") == 0) {
            return t.shape.size() == 2 ? ModelFamily::SD2 : ModelFamily::SD1;
        }
    }
    return std::nullopt;
}

UnetLayout detect_unet_layout(const std::vector<TensorInfo>& tensors, std::string_view prefix) {
    UnetLayout layout;
    int levels = 0, layers = 0;
    unsigned attention = 0;
    const std::string down_blocks = std::string(prefix) + "down_blocks.";
    for (const TensorInfo& t : tensors) {
        if (!starts_with(t.name, down_blocks)) continue;
        const auto level = index_after(t.name, "down_blocks.");
        if (!level || *level > 31) continue;
        levels = std::max(levels, *level + 1);
        if (auto resnet = index_after(t.name, ".resnets.")) layers = std::max(layers, *resnet + 1);
        if (t.name.find(".attentions.") != std::string::npos) attention |= 1u << *level;
    }
    if (levels > 0) {
        layout.levels = levels;
        layout.layers_per_block = std::max(layers, 1);
        layout.attention_levels = attention;
    }
    return layout;
}

bool is_diffusers_vae(const std::vector<TensorInfo>& tensors) {
    return std::any_of(tensors.begin(), tensors.end(), [](const TensorInfo& t) {
        return (starts_with(t.name, "encoder.") || starts_with(t.name, "decoder.")) &&
               (t.name.find(".down_blocks.") != std::string::npos || t.name.find(".up_blocks.") != std::string::npos ||
                t.name.find(".mid_block.") != std::string::npos);
    });
}

bool is_diffusers_controlnet(const std::vector<TensorInfo>& tensors) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [](const TensorInfo& t) { return t.name == "controlnet_cond_embedding.conv_in.weight"; });
}

void rename_diffusers_controlnet(std::vector<TensorInfo>& tensors) {
    constexpr std::string_view kPrefix = "control_model.";
    constexpr std::string_view kEmbedding = "controlnet_cond_embedding.";
    // The encoder's block numbering comes from its layout, read as a UNet's.
    // The family only picks text-encoder tables; a UNet's names are the same in each.
    const NameMap map(ModelFamily::SD1, detect_unet_layout(tensors, ""));
    int hint_blocks = 0;
    for (const TensorInfo& t : tensors) {
        if (auto k = index_after(t.name, "controlnet_cond_embedding.blocks."))
            hint_blocks = std::max(hint_blocks, *k + 1);
    }
    // "<head><index>.<rest>" -> head, index and rest; nullopt when it is not that.
    auto split = [](std::string_view name, std::string_view head) -> std::optional<std::pair<int, std::string_view>> {
        if (!starts_with(name, head)) return std::nullopt;
        const auto index = index_after(name, head);
        const size_t dot = name.find('.', head.size());
        if (!index || dot == std::string_view::npos) return std::nullopt;
        return std::make_pair(*index, name.substr(dot + 1));
    };
    for (TensorInfo& t : tensors) {
        const std::string_view name = t.name;
        std::string renamed;
        if (starts_with(name, kEmbedding)) {
            const std::string_view rest = name.substr(kEmbedding.size());
            if (starts_with(rest, "conv_in.")) {
                renamed = "input_hint_block.0." + std::string(rest.substr(8));
            } else if (starts_with(rest, "conv_out.")) {
                renamed = "input_hint_block." + std::to_string(2 * hint_blocks + 2) + "." + std::string(rest.substr(9));
            } else if (auto block = split(rest, "blocks.")) {
                renamed = "input_hint_block." + std::to_string(2 * block->first + 2) + "." + std::string(block->second);
            }
        } else if (auto zero = split(name, "controlnet_down_blocks.")) {
            renamed = "zero_convs." + std::to_string(zero->first) + ".0." + std::string(zero->second);
        } else if (starts_with(name, "controlnet_mid_block.")) {
            renamed = "middle_block_out.0." + std::string(name.substr(21));
        } else if (auto mapping = map.diffusers_to_ldm(ModelComponent::Unet, name);
                   mapping && mapping->op == NameMapping::Op::Same) {
            renamed = mapping->name.substr(ldm_prefix(ModelFamily::SD1, ModelComponent::Unet).size());
        }
        if (!renamed.empty()) t.name = std::string(kPrefix) + renamed;
    }
}

void rename_diffusers_tensors(ModelFamily family, std::vector<TensorInfo>& tensors) {
    // The VAE's levels from its decoder's up_blocks (a tiny FLUX.2 has 2).
    int vae_levels = 0;
    for (const TensorInfo& t : tensors) {
        if (auto level = index_after(t.name, "vae/decoder.up_blocks."); level && *level < 16)
            vae_levels = std::max(vae_levels, *level + 1);
    }
    const NameMap map(family, detect_unet_layout(tensors), vae_levels > 0 ? vae_levels : 4);
    for (TensorInfo& t : tensors) {
        for (ModelComponent component : kComponents) {
            const std::string folder = std::string(diffusers_folder(component)) + "/";
            if (!starts_with(t.name, folder)) continue;
            const std::string_view raw = std::string_view(t.name).substr(folder.size());
            auto mapping = map.diffusers_to_ldm(component, raw);
            if (!mapping) break;
            if (mapping->op == NameMapping::Op::Same) {
                if (vae_attention_needs_reshape(mapping->name) && t.shape.size() == 2) {
                    t.shape.push_back(1);
                    t.shape.push_back(1);
                }
                t.name = mapping->name;
            } else {
                t.name = std::string(ldm_prefix(family, component)) + std::string(raw);
            }
            break;
        }
    }
}

}  // namespace kiln::io
