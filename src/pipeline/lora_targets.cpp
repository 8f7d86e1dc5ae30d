#include "pipeline/lora_targets.h"

#include <algorithm>
#include <map>

#include "io/name_map.h"

namespace kiln::pipeline {
namespace {

// kohya writes a path's dots as underscores; every key is compared that way.
std::string normalized(std::string key) {
    for (char& c : key) {
        if (c == '.') c = '_';
    }
    return key;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// How LoRA files prefix a diffusion network's layer paths: bare, kohya's
// (lora_unet_, lora_transformer_), ComfyUI's and diffusers'.
constexpr const char* kDiffusionKeyPrefixes[] = {"", "lora_unet_", "diffusion_model.", "transformer.",
                                                 "lora_transformer_"};
bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void LoraTargets::add(const std::string& key, const std::vector<size_t>& targets) {
    auto [it, inserted] = by_key_.emplace(normalized(key), targets);
    if (!inserted && it->second != targets) it->second.clear();  // two weights answer to it: never guess
}

LoraTargets::LoraTargets(Model& model, bool high_noise_expert) {
    const io::ModelFamily family = model.family().diffusers_family;
    // The SD name tables: the UNet's paths and HF CLIP's (also Flux's CLIP-L).
    const std::optional<io::UnetLayout> layout = model.diffusion().unet_layout();
    const io::NameMap names = layout ? io::NameMap(family, *layout) : io::NameMap(family);
    for (const auto& owned : model.modules()) {
        Module& module = *owned;
        if (!module.network->takes_lora() || module.spec.high_noise != high_noise_expert) continue;
        const bool diffusion = module.spec.role == models::ModuleRole::Diffusion;
        const io::ModelComponent component =
            module.spec.diffusers_component
                ? *module.spec.diffusers_component
                : (diffusion                                     ? io::ModelComponent::Unet
                   : module.spec.role == models::ModuleRole::Vae ? io::ModelComponent::Vae
                                                                 : io::ModelComponent::TextEncoder);
        // Where the module's tensors start in its file ("cond_stage_model.transformer."),
        // which may be above where its network reads them from ("...text_model.").
        const std::string& prefix = module.prefix;
        std::unordered_map<std::string, ggml_tensor*> by_name;  // for each layer's bias
        struct FusedParts {
            int parts = 0;
            std::vector<std::pair<int, size_t>> targets;  // part, target
        };
        std::map<std::string, FusedParts> fused_parts;  // by the fused layer's stem
        for (const auto& [tensor, info] : module.weights().declared()) by_name[info->name] = tensor;
        for (const auto& [tensor, info] : module.weights().declared()) {
            if (info->shape.size() < 2 || !starts_with(info->name, prefix)) continue;
            const std::string rel = info->name.substr(prefix.size());
            std::string stem;
            if (ends_with(rel, ".weight"))
                stem = rel.substr(0, rel.size() - 7);
            else if (ends_with(rel, "_weight"))
                stem = rel.substr(0, rel.size() - 7);  // OpenCLIP's in_proj_weight
            else
                continue;
            LoraTarget whole{&module, tensor, info->name, 0, info->shape[0], 0};
            const std::string bias_name = info->name.substr(0, info->name.size() - 6) + "bias";  // "weight" off
            if (auto b = by_name.find(bias_name); b != by_name.end()) whole.bias = b->second;
            whole.columns = 1;
            for (size_t d = 1; d < info->shape.size(); ++d) whole.columns *= info->shape[d];
            const size_t index = targets_.size();
            targets_.push_back(whole);

            // The checkpoint's own names, and ComfyUI's "diffusion_model." form.
            add(prefix + stem, {index});
            if (starts_with(prefix, "model.")) add(prefix.substr(6) + stem, {index});
            if (diffusion) {
                for (const char* p : kDiffusionKeyPrefixes) add(p + stem, {index});
            }
            // Other namings of the same layer: diffusers' and HF's (SD
            // families' name tables), or a DiT's split projections.
            std::vector<std::pair<std::string, int>> aliases;  // stem, part (-1: whole)
            int parts = 1;
            if (module.network->uses_sd_name_tables()) {
                const std::string ldm = std::string(io::ldm_prefix(family, component)) + rel;
                if (auto mapped = names.ldm_to_diffusers(ldm)) {
                    for (const io::NameMapping& m : mapped->tensors) {
                        if (!ends_with(m.name, ".weight")) continue;
                        const bool slice = m.op == io::NameMapping::Op::Slice3;
                        if (slice) parts = 3;
                        aliases.emplace_back(m.name.substr(0, m.name.size() - 7), slice ? m.part : -1);
                    }
                }
            } else if (diffusion) {
                const std::vector<std::string> split = module.network->lora_split_names(stem);
                parts = static_cast<int>(split.size());
                for (size_t i = 0; i < split.size(); ++i) {
                    if (split[i] != stem) aliases.emplace_back(split[i], split.size() > 1 ? static_cast<int>(i) : -1);
                }
            }
            // The weight under another naming that holds its rows' halves the
            // other way round: a target of its own that swaps them.
            const bool swapped = diffusion && module.network->lora_other_name_swaps_halves(stem);
            auto turned = [&](const std::string& other) {
                LoraTarget t = whole;
                t.swap_halves = true;
                t.name = info->name + " (" + other + ", its halves swapped)";
                targets_.push_back(t);
                return targets_.size() - 1;
            };
            for (const auto& [alias, part] : aliases) {
                size_t target = index;
                if (part < 0 && swapped) {
                    target = turned(alias);
                } else if (part >= 0) {
                    // q, k and v are each `in` rows of the fused weight (its
                    // input is the model width); a single block's proj_mlp
                    // takes the rest.
                    LoraTarget range = whole;
                    const int64_t each = parts == 3 ? whole.rows / 3 : info->shape[1];
                    range.first_row = each * part;
                    range.rows = part == parts - 1 ? whole.rows - range.first_row : each;
                    range.name = info->name + " rows " + std::to_string(range.first_row) + "-" +
                                 std::to_string(range.first_row + range.rows - 1) + " (" + alias + ")";
                    target = targets_.size();
                    targets_.push_back(range);
                }
                if (diffusion) {
                    for (const char* p : kDiffusionKeyPrefixes) add(p + alias, {target});
                    add("unet." + alias, {target});
                } else if (component == io::ModelComponent::TextEncoder2) {
                    for (const char* p : {"lora_te2_", "text_encoder_2."}) add(p + alias, {target});
                } else if (component == io::ModelComponent::TextEncoder) {
                    for (const char* p : {"lora_te_", "lora_te1_", "text_encoder."}) add(p + alias, {target});
                }
            }
            // The other way round: the layer another naming fuses this
            // weight into (BFL's qkv for diffusers' to_q), or names it.
            if (!diffusion) continue;
            if (const auto fused = module.network->lora_fused_layer(stem)) {
                if (fused->parts == 1) {
                    const size_t target = swapped ? turned(fused->stem) : index;
                    for (const char* p : kDiffusionKeyPrefixes) add(p + fused->stem, {target});
                } else {
                    FusedParts& group = fused_parts[fused->stem];
                    group.parts = fused->parts;
                    group.targets.emplace_back(fused->part, index);
                }
            }
        }
        // Each fused layer whose parts are all here: part i takes the rows
        // after the parts before it.
        for (const auto& [fused_stem, group] : fused_parts) {
            std::vector<std::pair<int, size_t>> parts = group.targets;
            std::sort(parts.begin(), parts.end());
            bool whole_set = static_cast<int>(parts.size()) == group.parts;
            for (size_t i = 0; whole_set && i < parts.size(); ++i) whole_set = parts[i].first == static_cast<int>(i);
            if (!whole_set) continue;
            int64_t layer_rows = 0;
            for (const auto& [part, target] : parts) layer_rows += targets_[target].rows;
            std::vector<size_t> members;
            int64_t first = 0;
            for (const auto& [part, target] : parts) {
                LoraTarget member = targets_[target];
                member.layer_first_row = first;
                member.layer_rows = layer_rows;
                member.name += " (rows " + std::to_string(first) + "-" + std::to_string(first + member.rows - 1) +
                               " of " + fused_stem + ")";
                first += member.rows;
                members.push_back(targets_.size());
                targets_.push_back(member);
            }
            for (const char* p : kDiffusionKeyPrefixes) add(p + fused_stem, members);
        }
    }
}

std::vector<const LoraTarget*> LoraTargets::find(const std::string& layer_key) const {
    std::string key = normalized(layer_key);
    for (const char* wrapper : {"base_model_model_"}) {  // PEFT's wrapper around the model
        if (starts_with(key, wrapper)) key = key.substr(std::string(wrapper).size());
    }
    std::vector<const LoraTarget*> found;
    if (auto it = by_key_.find(key); it != by_key_.end()) {
        for (size_t target : it->second) found.push_back(&targets_[target]);
    }
    return found;
}

}  // namespace kiln::pipeline
