#include "models/registry.h"

#include <algorithm>
#include <cctype>

#include "models/families/chroma.h"
#include "models/families/flux.h"
#include "models/families/flux2.h"
#include "models/families/qwen_image.h"
#include "models/families/sd1.h"
#include "models/families/sd2.h"
#include "models/families/sd3.h"
#include "models/families/sdxl.h"
#include "models/families/wan.h"
#include "models/families/z_image.h"

namespace kiln::models {

const std::vector<const Family*>& families() {
    static const std::vector<const Family*> kFamilies = {
        &sd1_family(),
        &sd2_family(),
        &sdxl_family(),
        &flux_dev_family(),
        &flux_fill_family(),
        &flux_schnell_family(),
        &chroma_family(),
        &z_image_turbo_family(),
        &z_image_base_family(),
        &flux2_klein_family(),
        &flux2_klein_base_family(),
        &flux2_dev_family(),
        &sd35_large_family(),
        &sd35_large_turbo_family(),
        &sd35_medium_family(),
        &sd3_medium_family(),
        &qwen_image_family(),
        &qwen_image_edit_first_family(),
        &wan_family(),
    };
    return kFamilies;
}

namespace {

// Families kiln recognises in `kiln info` but cannot run yet.
std::string recognised_label(const FileSet& files) {
    if (files.any_name_contains("double_blocks.")) return "Flux (an unknown variant)";
    // A text encoder alone (what --llm and --t5xxl take).
    if (files.find_suffix("self_attn.q_norm.weight") || files.find_suffix("attn_q_norm.weight")) {
        return "Qwen3 (an LLM text encoder)";
    }
    // Qwen2's attention has biases and no QK norms (Qwen2.5-VL's text model).
    if (files.find_suffix("self_attn.q_proj.bias") || files.find_suffix("attn_q.bias")) {
        return "Qwen2 (an LLM text encoder)";
    }
    if (files.find_suffix("decoder.conv1.weight") && files.find_suffix("decoder.head.2.weight")) {
        return "Wan 2.1 VAE";
    }
    if (files.find_suffix("SelfAttention.relative_attention_bias.weight") ||
        files.find_suffix("enc.blk.0.attn_rel_b.weight")) {
        return "T5 (a text encoder)";
    }
    if (files.find_suffix("input_blocks.0.0.weight")) return "UNet (unknown context width)";
    bool vae_only = false;
    for (const io::ModelFile* f : files.files) {
        for (const io::TensorInfo& t : f->tensors()) {
            const bool vae = t.name.rfind("encoder.", 0) == 0 || t.name.rfind("decoder.", 0) == 0 ||
                             t.name.rfind("quant_conv", 0) == 0 || t.name.rfind("post_quant_conv", 0) == 0;
            if (!vae) return "unknown";
            vae_only = true;
        }
    }
    return vae_only ? "VAE" : "unknown";
}

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

}  // namespace

Detection detect_family(const FileSet& files) {
    Detection best;
    int best_score = 0;
    for (const Family* family : families()) {
        const int score = family->detect(files);
        if (score > best_score) {
            best_score = score;
            best.family = family;
        }
    }
    if (!best.family) {
        best.label = recognised_label(files);
        return best;
    }
    best.label = best.family->name;
    // Kontext-dev has Flux.1-dev's layout; only its name tells them apart.
    if (best.family->reference_images) {
        for (const io::ModelFile* f : files.files) {
            for (const io::SourceFile& s : f->sources()) {
                if (lower(s.path).find("kontext") != std::string::npos) best.label = "Flux.1-Kontext-dev";
            }
        }
    }
    // A UNet whose first convolution takes latent, mask and masked image.
    const io::TensorInfo* conv_in = files.find_suffix("input_blocks.0.0.weight");
    if (conv_in && conv_in->shape.size() == 4 && conv_in->shape[1] == 2 * best.family->latent.channels + 1) {
        best.label += " inpainting";
    }
    return best;
}

Result<const Family*> find_family(const std::string& name) {
    std::string names;
    for (const Family* family : families()) {
        if (lower(family->name) == lower(name) || lower(family->name) == lower(name) + ".x") return family;
        names += (names.empty() ? "" : ", ") + family->name;
    }
    return Error::invalid_request("unknown model family '" + name + "' (valid: " + names + ")");
}

const char* module_role_name(ModuleRole role) {
    switch (role) {
        case ModuleRole::TextEncoder: return "te";
        case ModuleRole::Diffusion: return "diffusion";
        case ModuleRole::Vae: return "vae";
        case ModuleRole::Control: return "control";
    }
    return "?";
}

const io::TensorInfo* FileSet::find_suffix(const std::string& suffix) const {
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
        for (const io::TensorInfo& t : (*it)->tensors()) {
            if (t.name.size() >= suffix.size() &&
                t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
                return &t;
            }
        }
    }
    return nullptr;
}

bool FileSet::any_path_contains(const std::string& word) const {
    for (const io::ModelFile* f : files) {
        for (const io::SourceFile& s : f->sources()) {
            std::string path = s.path;
            std::transform(path.begin(), path.end(), path.begin(), [](unsigned char c) { return std::tolower(c); });
            if (path.find(word) != std::string::npos) return true;
        }
    }
    return false;
}

bool FileSet::any_name_contains(const std::string& part) const {
    for (const io::ModelFile* f : files) {
        for (const io::TensorInfo& t : f->tensors()) {
            if (t.name.find(part) != std::string::npos) return true;
        }
    }
    return false;
}

}  // namespace kiln::models
