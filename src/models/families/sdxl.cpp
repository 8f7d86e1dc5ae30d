#include "models/families/sdxl.h"

#include "models/families/sd_common.h"

namespace kiln::models {
namespace {

int detect(const FileSet& files) {
    if (files.any_name_contains("label_emb.") || files.any_name_contains("conditioner.embedders.1.")) return 3;
    if (unet_context_width(files) == 2048) return 2;
    return 0;
}

Family make() {
    Family f;
    f.name = "SDXL";
    f.detect = detect;
    f.diffusers_family = io::ModelFamily::SDXL;
    f.modules = {
        {"clip_l",
         ModuleRole::TextEncoder,
         NetworkKind::ClipText,
         {"conditioner.embedders.0.transformer."},
         "--clip_l",
         {}},
        {"clip_g",
         ModuleRole::TextEncoder,
         NetworkKind::ClipText,
         {"conditioner.embedders.1.model."},
         "--clip_g",
         io::ModelComponent::TextEncoder2},
        unet_module(),
        vae_module(),
    };
    // sgm's FrozenCLIPEmbedder (layer "hidden", index 11) and
    // FrozenOpenCLIPEmbedder2 (layer "penultimate", legacy False): the
    // penultimate layers without a final norm; bigG's pooled output through
    // text_projection starts the UNet's y. open_clip pads with 0.
    f.conditioning.encoders = {
        {"clip_l", /*default_layer=*/2, /*final_norm=*/false, /*pad_token=*/-1},
        {"clip_g", /*default_layer=*/2, /*final_norm=*/false, /*pad_token=*/0, /*pooled=*/true},
    };
    f.conditioning.size_embedding = true;
    f.schedule.shifted_timestep = true;
    f.conditioning.zero_empty_negative = true;
    // ComfyUI's SDXL latent format: its scale and preview projection.
    f.latent.scale = 0.13025f;
    f.latent.rgb_factors = {{0.3651f, 0.4232f, 0.4341f},
                            {-0.2533f, -0.0042f, 0.1068f},
                            {0.1076f, 0.1111f, -0.0362f},
                            {-0.3165f, -0.2492f, -0.2188f}};
    f.latent.rgb_bias = {0.1084f, -0.0175f, -0.0011f};
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    return f;
}

}  // namespace

const Family& sdxl_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
