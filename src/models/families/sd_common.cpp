#include "models/families/sd_common.h"

namespace kiln::models {

ModuleSpec unet_module() { return {"unet", ModuleRole::Diffusion, NetworkKind::Unet, {}, "--diffusion-model", {}}; }

ModuleSpec vae_module() { return {"vae", ModuleRole::Vae, NetworkKind::Vae, {}, "--vae", io::ModelComponent::Vae}; }

ModuleSpec single_clip_module(const std::string& name) {
    return {name, ModuleRole::TextEncoder, NetworkKind::ClipText, {}, "--clip_l", {}};
}

int detect_sd_checkpoint(const FileSet& files, int64_t width, const std::string& encoder_prefix) {
    if (unet_context_width(files) == width) return 2;
    return files.any_name_contains(encoder_prefix) ? 1 : 0;
}

LatentFormat sd15_latent_format() {
    LatentFormat l;
    l.channels = 4;
    l.scale = 0.18215f;
    l.rgb_factors = {{0.3512f, 0.2297f, 0.3227f},
                     {0.3250f, 0.4974f, 0.2350f},
                     {-0.2829f, 0.1762f, 0.2721f},
                     {-0.2120f, -0.2616f, -0.7177f}};
    return l;
}

int64_t unet_context_width(const FileSet& files) {
    const io::TensorInfo* k = files.find_suffix("transformer_blocks.0.attn2.to_k.weight");
    return k && k->shape.size() == 2 ? k->shape[1] : 0;
}

}  // namespace kiln::models
