#include "io/name_map.h"

#include <array>
#include <cstddef>
#include <utility>

namespace kiln::io {

namespace {

struct Rule;
using RuleTable = std::vector<Rule>;

enum class RuleKind {
    Rename,      // one tensor on each side
    Alias,       // an older diffusers spelling: read, never produced
    Transposed,  // one tensor on each side, transposed
    Fused,       // the ldm tensor is cat(q, k, v) along dim 0; `part` says which third this diffusers name is
};

// One correspondence between an ldm and a diffusers name pattern. A pattern
// that ends in '.' matches a prefix; the rest of the name goes through
// `inner` if set, else is copied unchanged (and must not be empty). Any other
// pattern matches a whole name. '#' matches a decimal index, copied to the
// other side (used for text-encoder layers, whose count varies per model).
struct Rule {
    std::string ldm;
    std::string diffusers;
    const RuleTable* inner = nullptr;
    RuleKind kind = RuleKind::Rename;
    int part = 0;
};

enum class Direction { ToLdm, ToDiffusers };

const std::string& pattern_from(const Rule& rule, Direction dir) {
    return dir == Direction::ToLdm ? rule.diffusers : rule.ldm;
}

const std::string& pattern_to(const Rule& rule, Direction dir) {
    return dir == Direction::ToLdm ? rule.ldm : rule.diffusers;
}

// ---------------------------------------------------------------------------
// The tables.

// UNet ResBlock: the only UNet module whose parameter names differ inside.
const RuleTable& unet_resnet_rules() {
    static const RuleTable rules = {
        {"in_layers.0.", "norm1."},  {"in_layers.2.", "conv1."},  {"emb_layers.1.", "time_emb_proj."},
        {"out_layers.0.", "norm2."}, {"out_layers.3.", "conv2."}, {"skip_connection.", "conv_shortcut."},
    };
    return rules;
}

// One BasicTransformerBlock; identical names on both sides. Listed so that a
// stray name under an attention block (an upsampler at the wrong sub-index,
// say) is rejected rather than copied.
const RuleTable& unet_transformer_block_rules() {
    static const RuleTable rules = {
        {"attn1.", "attn1."}, {"attn2.", "attn2."}, {"ff.", "ff."},
        {"norm1.", "norm1."}, {"norm2.", "norm2."}, {"norm3.", "norm3."},
    };
    return rules;
}

// SpatialTransformer / Transformer2DModel.
const RuleTable& unet_transformer_rules() {
    static const RuleTable rules = {
        {"norm.", "norm."},
        {"proj_in.", "proj_in."},
        {"transformer_blocks.#.", "transformer_blocks.#.", &unet_transformer_block_rules()},
        {"proj_out.", "proj_out."},
    };
    return rules;
}

// VAE ResnetBlock: same names except the shortcut; listed in full so that
// unknown layers are rejected rather than copied.
const RuleTable& vae_resnet_rules() {
    static const RuleTable rules = {
        {"norm1.", "norm1."},
        {"conv1.", "conv1."},
        {"norm2.", "norm2."},
        {"conv2.", "conv2."},
        {"nin_shortcut.", "conv_shortcut."},
    };
    return rules;
}

// VAE mid-block attention. Diffusers renamed these once; files of both ages exist.
const RuleTable& vae_attention_rules() {
    static const RuleTable rules = {
        {"norm.", "group_norm."},
        {"q.", "to_q."},
        {"k.", "to_k."},
        {"v.", "to_v."},
        {"proj_out.", "to_out.0."},
        {"q.", "query.", nullptr, RuleKind::Alias},
        {"k.", "key.", nullptr, RuleKind::Alias},
        {"v.", "value.", nullptr, RuleKind::Alias},
        {"proj_out.", "proj_attn.", nullptr, RuleKind::Alias},
    };
    return rules;
}

// AutoencoderKL, identical in SD1, SD2, SDXL, Flux.1 and FLUX.2: `levels`
// levels (4 in every release), 2 resnets per encoder level and 3 per decoder
// level.
// Diffusers numbers the decoder's up_blocks from the lowest resolution, ldm
// numbers decoder.up from the highest, hence the reversal. FLUX.2's
// AutoencoderKLFlux2 adds its latent statistics (bn.running_mean,
// bn.running_var) under the same names.
RuleTable build_vae_rules(int levels) {
    constexpr int encoder_layers = 2;
    constexpr int decoder_layers = 3;
    RuleTable r;
    const RuleTable* res = &vae_resnet_rules();
    for (const char* part : {"encoder.", "decoder."}) {
        const std::string p = part;
        r.push_back({p + "conv_in.", p + "conv_in."});
        r.push_back({p + "mid.block_1.", p + "mid_block.resnets.0.", res});
        r.push_back({p + "mid.attn_1.", p + "mid_block.attentions.0.", &vae_attention_rules()});
        r.push_back({p + "mid.block_2.", p + "mid_block.resnets.1.", res});
        r.push_back({p + "norm_out.", p + "conv_norm_out."});
        r.push_back({p + "conv_out.", p + "conv_out."});
    }
    for (int i = 0; i < levels; ++i) {
        const std::string down = "encoder.down." + std::to_string(i) + ".";
        const std::string down_blocks = "encoder.down_blocks." + std::to_string(i) + ".";
        for (int j = 0; j < encoder_layers; ++j) {
            const std::string n = std::to_string(j) + ".";
            r.push_back({down + "block." + n, down_blocks + "resnets." + n, res});
        }
        if (i + 1 < levels) r.push_back({down + "downsample.conv.", down_blocks + "downsamplers.0.conv."});

        const std::string up = "decoder.up." + std::to_string(levels - 1 - i) + ".";
        const std::string up_blocks = "decoder.up_blocks." + std::to_string(i) + ".";
        for (int j = 0; j < decoder_layers; ++j) {
            const std::string n = std::to_string(j) + ".";
            r.push_back({up + "block." + n, up_blocks + "resnets." + n, res});
        }
        if (i + 1 < levels) r.push_back({up + "upsample.conv.", up_blocks + "upsamplers.0.conv."});
    }
    r.push_back({"quant_conv.", "quant_conv."});
    r.push_back({"post_quant_conv.", "post_quant_conv."});
    r.push_back({"bn.", "bn."});
    return r;
}

// Wan 2.1's VAE (Qwen-Image's): the original module tree (wan/modules/vae.py,
// as Wan2.1_VAE.pth, ComfyUI's qwen_image_vae.safetensors and
// models/nets/wan_vae.h name it) vs diffusers' AutoencoderKLQwenImage /
// AutoencoderKLWan (scripts/convert_wan_to_diffusers.py, convert_vae). Both
// sides hold the same tensors with the same shapes (the RMS norms' gamma
// [C, 1, 1, 1], the attention's [C, 1, 1]; the 5-D causal convolutions);
// only the names differ.
//
// A residual block: RMS norm, SiLU, conv, RMS norm, SiLU, dropout, conv
// (residual.{0, 2, 3, 6}), with a 1x1x1 shortcut where the widths differ.
const RuleTable& wan_vae_resnet_rules() {
    static const RuleTable rules = {
        {"residual.0.", "norm1."}, {"residual.2.", "conv1."},       {"residual.3.", "norm2."},
        {"residual.6.", "conv2."}, {"shortcut.", "conv_shortcut."},
    };
    return rules;
}

// A Resample: its 2-D convolution (resample.0 is the padding or the
// nearest 2x, with no weights) and, on temporal levels, its time_conv.
const RuleTable& wan_vae_resample_rules() {
    static const RuleTable rules = {
        {"resample.1.", "resample.1."},
        {"time_conv.", "time_conv."},
    };
    return rules;
}

// The encoder's downsamples are one flat list of residual blocks and
// resamples on both sides (diffusers' encoder.down_blocks.N is the
// original's encoder.downsamples.N), so an index is either.
const RuleTable& wan_vae_encoder_layer_rules() {
    static const RuleTable rules = [] {
        RuleTable r = wan_vae_resnet_rules();
        for (const Rule& rule : wan_vae_resample_rules()) r.push_back(rule);
        return r;
    }();
    return rules;
}

// The middle's single-head attention: RMS norm, 1x1 qkv, 1x1 projection.
const RuleTable& wan_vae_attention_rules() {
    static const RuleTable rules = {
        {"norm.", "norm."},
        {"to_qkv.", "to_qkv."},
        {"proj.", "proj."},
    };
    return rules;
}

// The whole VAE: Wan 2.1's and Qwen-Image's layout, 4 levels, 2 residual
// blocks per encoder level and 3 per decoder level. The decoder's
// upsamples are one flat list in the original (per level its 3 residual
// blocks, then a Resample but after the last level: upsamples.0-2, 3,
// 4-6, 7, ...) and nested in diffusers (up_blocks.L.resnets.J,
// up_blocks.L.upsamplers.0), both from the lowest resolution.
const RuleTable& wan_vae_rules() {
    static const RuleTable rules = [] {
        constexpr int levels = 4;
        constexpr int decoder_layers = 3;
        const RuleTable* res = &wan_vae_resnet_rules();
        RuleTable r;
        for (const char* part : {"encoder.", "decoder."}) {
            const std::string p = part;
            r.push_back({p + "conv1.", p + "conv_in."});
            r.push_back({p + "middle.0.", p + "mid_block.resnets.0.", res});
            r.push_back({p + "middle.1.", p + "mid_block.attentions.0.", &wan_vae_attention_rules()});
            r.push_back({p + "middle.2.", p + "mid_block.resnets.1.", res});
            r.push_back({p + "head.0.", p + "norm_out."});
            r.push_back({p + "head.2.", p + "conv_out."});
        }
        r.push_back({"encoder.downsamples.#.", "encoder.down_blocks.#.", &wan_vae_encoder_layer_rules()});
        for (int level = 0; level < levels; ++level) {
            const std::string up_block = "decoder.up_blocks." + std::to_string(level) + ".";
            const int first = level * (decoder_layers + 1);
            for (int j = 0; j < decoder_layers; ++j) {
                r.push_back({"decoder.upsamples." + std::to_string(first + j) + ".",
                             up_block + "resnets." + std::to_string(j) + ".", res});
            }
            if (level + 1 < levels) {
                r.push_back({"decoder.upsamples." + std::to_string(first + decoder_layers) + ".",
                             up_block + "upsamplers.0.", &wan_vae_resample_rules()});
            }
        }
        // The 1x1x1 convolutions around the latent.
        r.push_back({"conv1.", "quant_conv."});
        r.push_back({"conv2.", "post_quant_conv."});
        return r;
    }();
    return rules;
}

// Wan's DiT (wan/modules/model.py, as the original and ComfyUI's files name
// it) vs diffusers' WanTransformer3DModel (scripts/convert_wan_to_diffusers.py,
// TRANSFORMER_KEYS_RENAME_DICT and VACE_TRANSFORMER_KEYS_RENAME_DICT). A
// block (and a VACE block, whose before_proj and after_proj diffusers calls
// proj_in and proj_out): the attentions' projections and norms, the image
// context's key and value (I2V), the feed-forward, the modulation. The
// original's norm3 (the cross-attention's, with weights) is diffusers'
// norm2; its weightless norm2 has no tensors.
const RuleTable& wan_dit_block_rules() {
    static const RuleTable rules = {
        {"self_attn.q.", "attn1.to_q."},
        {"self_attn.k.", "attn1.to_k."},
        {"self_attn.v.", "attn1.to_v."},
        {"self_attn.o.", "attn1.to_out.0."},
        {"self_attn.norm_q.", "attn1.norm_q."},
        {"self_attn.norm_k.", "attn1.norm_k."},
        {"cross_attn.q.", "attn2.to_q."},
        {"cross_attn.k.", "attn2.to_k."},
        {"cross_attn.v.", "attn2.to_v."},
        {"cross_attn.o.", "attn2.to_out.0."},
        {"cross_attn.norm_q.", "attn2.norm_q."},
        {"cross_attn.norm_k.", "attn2.norm_k."},
        {"cross_attn.k_img.", "attn2.add_k_proj."},
        {"cross_attn.v_img.", "attn2.add_v_proj."},
        {"cross_attn.norm_k_img.", "attn2.norm_added_k."},
        {"norm3.", "norm2."},
        {"ffn.0.", "ffn.net.0.proj."},
        {"ffn.2.", "ffn.net.2."},
        {"modulation", "scale_shift_table"},
        {"before_proj.", "proj_in."},
        {"after_proj.", "proj_out."},
    };
    return rules;
}

// The whole DiT: the embeddings (text, time, the I2V image context's MLP
// and FLF2V's position embedding), the blocks, VACE's, and the head.
const RuleTable& wan_dit_rules() {
    static const RuleTable rules = {
        {"patch_embedding.", "patch_embedding."},
        {"vace_patch_embedding.", "vace_patch_embedding."},
        {"text_embedding.0.", "condition_embedder.text_embedder.linear_1."},
        {"text_embedding.2.", "condition_embedder.text_embedder.linear_2."},
        {"time_embedding.0.", "condition_embedder.time_embedder.linear_1."},
        {"time_embedding.2.", "condition_embedder.time_embedder.linear_2."},
        {"time_projection.1.", "condition_embedder.time_proj."},
        {"img_emb.proj.0.", "condition_embedder.image_embedder.norm1."},
        {"img_emb.proj.1.", "condition_embedder.image_embedder.ff.net.0.proj."},
        {"img_emb.proj.3.", "condition_embedder.image_embedder.ff.net.2."},
        {"img_emb.proj.4.", "condition_embedder.image_embedder.norm2."},
        {"img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"},
        {"blocks.#.", "blocks.#.", &wan_dit_block_rules()},
        {"vace_blocks.#.", "vace_blocks.#.", &wan_dit_block_rules()},
        {"head.modulation", "scale_shift_table"},
        {"head.head.", "proj_out."},
    };
    return rules;
}

// HF CLIPTextModel under its ldm prefix: the ldm checkpoints keep the HF names.
const RuleTable& hf_clip_rules() {
    static const RuleTable rules = {{"text_model.", "text_model."}};
    return rules;
}

// One OpenCLIP residual block vs one HF CLIPEncoderLayer. OpenCLIP's
// nn.MultiheadAttention keeps q, k and v in one in_proj tensor.
const RuleTable& open_clip_layer_rules() {
    static const RuleTable rules = {
        {"ln_1.", "layer_norm1."},
        {"ln_2.", "layer_norm2."},
        {"attn.out_proj.", "self_attn.out_proj."},
        {"mlp.c_fc.", "mlp.fc1."},
        {"mlp.c_proj.", "mlp.fc2."},
        {"attn.in_proj_weight", "self_attn.q_proj.weight", nullptr, RuleKind::Fused, 0},
        {"attn.in_proj_weight", "self_attn.k_proj.weight", nullptr, RuleKind::Fused, 1},
        {"attn.in_proj_weight", "self_attn.v_proj.weight", nullptr, RuleKind::Fused, 2},
        {"attn.in_proj_bias", "self_attn.q_proj.bias", nullptr, RuleKind::Fused, 0},
        {"attn.in_proj_bias", "self_attn.k_proj.bias", nullptr, RuleKind::Fused, 1},
        {"attn.in_proj_bias", "self_attn.v_proj.bias", nullptr, RuleKind::Fused, 2},
    };
    return rules;
}

// OpenCLIP text tower (SD2's ViT-H, SDXL's bigG) vs HF CLIPTextModel[WithProjection].
// OpenCLIP's text_projection is applied as x @ P; HF's is a Linear, weight = P^T.
const RuleTable& open_clip_rules() {
    static const RuleTable rules = {
        {"token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
        {"positional_embedding", "text_model.embeddings.position_embedding.weight"},
        {"transformer.resblocks.#.", "text_model.encoder.layers.#.", &open_clip_layer_rules()},
        {"ln_final.", "text_model.final_layer_norm."},
        {"text_projection", "text_projection.weight", nullptr, RuleKind::Transposed},
    };
    return rules;
}

// The UNet table for a layout, following diffusers'
// convert_diffusers_to_original_stable_diffusion.py: with L layers per block,
// down level i's resnet j is input_blocks.(L+1)*i+j+1, its downsampler
// input_blocks.(L+1)*(i+1).0.op; up block u (level levels-1-u) has L+1 layers
// at output_blocks.(L+1)*u+j, and its upsampler follows the last layer's
// resnet (and transformer, if any) in the same output block.
RuleTable build_unet_rules(const UnetLayout& layout) {
    const RuleTable* res = &unet_resnet_rules();
    const RuleTable* attention = &unet_transformer_rules();
    RuleTable r = {
        {"time_embed.0.", "time_embedding.linear_1."},
        {"time_embed.2.", "time_embedding.linear_2."},
        {"label_emb.0.0.", "add_embedding.linear_1."},  // SDXL's size/crop conditioning
        {"label_emb.0.2.", "add_embedding.linear_2."},
        {"input_blocks.0.0.", "conv_in."},
        {"middle_block.0.", "mid_block.resnets.0.", res},
        {"middle_block.1.", "mid_block.attentions.0.", attention},
        {"middle_block.2.", "mid_block.resnets.1.", res},
        {"out.0.", "conv_norm_out."},
        {"out.2.", "conv_out."},
    };
    const int stride = layout.layers_per_block + 1;
    auto s = [](int n) { return std::to_string(n); };
    for (int i = 0; i < layout.levels; ++i) {
        const bool attn = layout.has_attention(i);
        for (int j = 0; j < layout.layers_per_block; ++j) {
            const std::string input = "input_blocks." + s(stride * i + j + 1) + ".";
            const std::string down = "down_blocks." + s(i) + ".";
            r.push_back({input + "0.", down + "resnets." + s(j) + ".", res});
            if (attn) r.push_back({input + "1.", down + "attentions." + s(j) + ".", attention});
        }
        if (i + 1 < layout.levels)
            r.push_back(
                {"input_blocks." + s(stride * (i + 1)) + ".0.op.", "down_blocks." + s(i) + ".downsamplers.0.conv."});
    }
    for (int u = 0; u < layout.levels; ++u) {
        const bool attn = layout.has_attention(layout.levels - 1 - u);
        const std::string up = "up_blocks." + s(u) + ".";
        for (int j = 0; j < stride; ++j) {
            const std::string output = "output_blocks." + s(stride * u + j) + ".";
            r.push_back({output + "0.", up + "resnets." + s(j) + ".", res});
            if (attn) r.push_back({output + "1.", up + "attentions." + s(j) + ".", attention});
        }
        if (u + 1 < layout.levels)
            r.push_back({"output_blocks." + s(stride * u + layout.layers_per_block) + "." + s(attn ? 2 : 1) + ".",
                         up + "upsamplers.0."});
    }
    return r;
}

// ---------------------------------------------------------------------------
// Matching.

struct PatternMatch {
    size_t length = 0;       // characters of the name the pattern covers
    std::string_view index;  // what '#' matched
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::optional<PatternMatch> match_pattern(std::string_view pattern, std::string_view name) {
    PatternMatch m;
    size_t n = 0;
    for (char c : pattern) {
        if (c == '#') {
            const size_t start = n;
            while (n < name.size() && is_digit(name[n])) ++n;
            if (n == start) return std::nullopt;
            m.index = name.substr(start, n - start);
        } else {
            if (n >= name.size() || name[n] != c) return std::nullopt;
            ++n;
        }
    }
    const bool is_prefix = !pattern.empty() && pattern.back() == '.';
    if (is_prefix ? n == name.size() : n != name.size()) return std::nullopt;
    m.length = n;
    return m;
}

std::string fill_pattern(std::string_view pattern, std::string_view index) {
    std::string out;
    out.reserve(pattern.size() + index.size());
    for (char c : pattern) {
        if (c == '#')
            out.append(index);
        else
            out.push_back(c);
    }
    return out;
}

// The mapping a whole-name rule gives. `full` is the queried name, `offset`
// where this table's part of it starts.
NameMapping leaf_mapping(const RuleTable& table, const Rule& rule, Direction dir, std::string_view full, size_t offset,
                         std::string_view index) {
    NameMapping m;
    m.name = fill_pattern(pattern_to(rule, dir), index);
    m.sources = {std::string(full)};
    switch (rule.kind) {
        case RuleKind::Rename:
        case RuleKind::Alias: break;
        case RuleKind::Transposed: m.op = NameMapping::Op::Transpose; break;
        case RuleKind::Fused:
            m.part = rule.part;
            if (dir == Direction::ToDiffusers) {
                m.op = NameMapping::Op::Slice3;
            } else {
                // The ldm tensor needs all three diffusers tensors: name the siblings.
                m.op = NameMapping::Op::Concat3;
                m.sources.assign(3, std::string());
                for (const Rule& sibling : table) {
                    if (sibling.kind == RuleKind::Fused && sibling.ldm == rule.ldm && sibling.part >= 0 &&
                        sibling.part < 3)
                        m.sources[sibling.part] =
                            std::string(full.substr(0, offset)) + fill_pattern(sibling.diffusers, index);
                }
            }
            break;
    }
    return m;
}

// Maps full.substr(offset) through `table`. Target names in the result are
// relative to the table; sources are full names. The longest matching pattern
// wins; only the three parts of a fused tensor match equally well (ldm side).
std::vector<NameMapping> map_name(const RuleTable& table, Direction dir, std::string_view full, size_t offset) {
    const std::string_view rest = full.substr(offset);
    std::vector<NameMapping> best;
    size_t best_length = 0;
    for (const Rule& rule : table) {
        if (dir == Direction::ToDiffusers && rule.kind == RuleKind::Alias) continue;
        const std::optional<PatternMatch> match = match_pattern(pattern_from(rule, dir), rest);
        if (!match || match->length < best_length) continue;

        std::vector<NameMapping> found;
        if (match->length == rest.size()) {
            found.push_back(leaf_mapping(table, rule, dir, full, offset, match->index));
        } else {
            const std::string head = fill_pattern(pattern_to(rule, dir), match->index);
            if (rule.inner) {
                found = map_name(*rule.inner, dir, full, offset + match->length);
                for (NameMapping& f : found) f.name.insert(0, head);
            } else {
                NameMapping m;
                m.name = head + std::string(rest.substr(match->length));
                m.sources = {std::string(full)};
                found.push_back(std::move(m));
            }
        }
        if (found.empty()) continue;
        if (match->length > best_length) {
            best = std::move(found);
            best_length = match->length;
        } else {
            for (NameMapping& f : found) best.push_back(std::move(f));
        }
    }
    return best;
}

struct ComponentEntry {
    ModelComponent component;
    std::string_view prefix;
    const RuleTable* rules;
};

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

std::string_view diffusers_folder(ModelComponent component) {
    switch (component) {
        case ModelComponent::Unet: return "unet";
        case ModelComponent::Vae: return "vae";
        case ModelComponent::TextEncoder: return "text_encoder";
        case ModelComponent::TextEncoder2: return "text_encoder_2";
        case ModelComponent::Transformer: return "transformer";
    }
    return {};
}

std::string_view ldm_prefix(ModelFamily family, ModelComponent component) {
    // Qwen-Image: only the VAE has a table; the DiT and the LLM keep their names.
    if (family == ModelFamily::QwenImage) return component == ModelComponent::Vae ? "first_stage_model." : "";
    // Wan: the DiT and the VAE; the text and image encoders keep their names.
    if (family == ModelFamily::Wan) {
        if (component == ModelComponent::Transformer) return "model.diffusion_model.";
        return component == ModelComponent::Vae ? "first_stage_model." : "";
    }
    switch (component) {
        case ModelComponent::Unet: return "model.diffusion_model.";
        case ModelComponent::Vae: return "first_stage_model.";
        case ModelComponent::TextEncoder:
            switch (family) {
                case ModelFamily::SD1: return "cond_stage_model.transformer.";
                case ModelFamily::SD2: return "cond_stage_model.model.";
                case ModelFamily::SDXL: return "conditioner.embedders.0.transformer.";
                case ModelFamily::QwenImage:
                case ModelFamily::Wan: break;
            }
            return {};
        case ModelComponent::TextEncoder2: return family == ModelFamily::SDXL ? "conditioner.embedders.1.model." : "";
        case ModelComponent::Transformer: return "";
    }
    return {};
}

UnetLayout UnetLayout::for_family(ModelFamily family) {
    UnetLayout layout;
    if (family == ModelFamily::SDXL) {
        layout.levels = 3;
        layout.attention_levels = 0b110;
    }
    return layout;
}

struct NameMap::Tables {
    RuleTable unet;
    RuleTable vae;
    std::vector<ComponentEntry> components;
};

NameMap::NameMap(ModelFamily family) : NameMap(family, UnetLayout::for_family(family)) {}

NameMap::NameMap(ModelFamily family, const UnetLayout& unet, int vae_levels) : tables_(std::make_unique<Tables>()) {
    tables_->unet = build_unet_rules(unet);
    tables_->vae = build_vae_rules(vae_levels);
    // Which text-encoder convention sits under which prefix.
    const RuleTable* text1 = family == ModelFamily::SD2 ? &open_clip_rules() : &hf_clip_rules();
    const bool wan_vae = family == ModelFamily::QwenImage || family == ModelFamily::Wan;
    const std::array<std::pair<ModelComponent, const RuleTable*>, 5> components = {{
        {ModelComponent::Unet, &tables_->unet},
        {ModelComponent::Vae, wan_vae ? &wan_vae_rules() : &tables_->vae},
        {ModelComponent::TextEncoder, text1},
        {ModelComponent::TextEncoder2, &open_clip_rules()},
        {ModelComponent::Transformer, &wan_dit_rules()},
    }};
    for (const auto& [component, rules] : components) {
        const std::string_view prefix = ldm_prefix(family, component);
        if (!prefix.empty()) tables_->components.push_back({component, prefix, rules});
    }
}

NameMap::~NameMap() = default;
NameMap::NameMap(NameMap&&) noexcept = default;
NameMap& NameMap::operator=(NameMap&&) noexcept = default;

std::optional<NameMapping> NameMap::diffusers_to_ldm(ModelComponent component, std::string_view name) const {
    for (const ComponentEntry& entry : tables_->components) {
        if (entry.component != component) continue;
        std::vector<NameMapping> found = map_name(*entry.rules, Direction::ToLdm, name, 0);
        if (found.empty()) return std::nullopt;
        // Diffusers -> ldm is many-to-one at most, so there is exactly one.
        NameMapping m = std::move(found.front());
        m.name.insert(0, entry.prefix);
        return m;
    }
    return std::nullopt;
}

std::optional<DiffusersNames> NameMap::ldm_to_diffusers(std::string_view ldm_name) const {
    for (const ComponentEntry& entry : tables_->components) {
        if (ldm_name.substr(0, entry.prefix.size()) != entry.prefix) continue;
        std::vector<NameMapping> found = map_name(*entry.rules, Direction::ToDiffusers, ldm_name, entry.prefix.size());
        if (found.empty()) return std::nullopt;
        return DiffusersNames{entry.component, std::move(found)};
    }
    return std::nullopt;
}

namespace {

const NameMap& default_name_map(ModelFamily family) {
    static const NameMap sd1(ModelFamily::SD1);
    static const NameMap sd2(ModelFamily::SD2);
    static const NameMap sdxl(ModelFamily::SDXL);
    static const NameMap qwen_image(ModelFamily::QwenImage);
    static const NameMap wan(ModelFamily::Wan);
    switch (family) {
        case ModelFamily::SD1: return sd1;
        case ModelFamily::SD2: return sd2;
        case ModelFamily::SDXL: break;
        case ModelFamily::QwenImage: return qwen_image;
        case ModelFamily::Wan: return wan;
    }
    return sdxl;
}

}  // namespace

std::optional<NameMapping> diffusers_to_ldm(ModelFamily family, ModelComponent component, std::string_view name) {
    return default_name_map(family).diffusers_to_ldm(component, name);
}

std::optional<DiffusersNames> ldm_to_diffusers(ModelFamily family, std::string_view ldm_name) {
    return default_name_map(family).ldm_to_diffusers(ldm_name);
}

bool vae_attention_needs_reshape(std::string_view ldm_name) {
    // Standalone VAE files use the names without the checkpoint prefix.
    constexpr std::string_view checkpoint_prefix = "first_stage_model.";
    if (ldm_name.substr(0, checkpoint_prefix.size()) == checkpoint_prefix)
        ldm_name.remove_prefix(checkpoint_prefix.size());
    static constexpr std::array<std::string_view, 2> halves = {"encoder.mid.attn_1.", "decoder.mid.attn_1."};
    static constexpr std::array<std::string_view, 4> weights = {"q.weight", "k.weight", "v.weight", "proj_out.weight"};
    for (std::string_view half : halves) {
        if (ldm_name.substr(0, half.size()) != half) continue;
        const std::string_view rest = ldm_name.substr(half.size());
        for (std::string_view w : weights)
            if (rest == w) return true;
    }
    return false;
}

}  // namespace kiln::io
