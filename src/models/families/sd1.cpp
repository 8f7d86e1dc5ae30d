#include "models/families/sd1.h"

#include "models/families/sd_common.h"

namespace kiln::models {
namespace {

int detect(const FileSet& files) { return detect_sd_checkpoint(files, 768, "cond_stage_model.transformer."); }

Family make() {
    Family f;
    f.name = "SD1.x";
    f.detect = detect;
    f.diffusers_family = io::ModelFamily::SD1;
    f.modules = {single_clip_module("clip_l"), unet_module(), vae_module()};
    // ldm's FrozenCLIPEmbedder: the last layer through the final layer norm,
    // padded with EOS.
    f.latent = sd15_latent_format();
    f.conditioning.encoders = {{"clip_l", /*default_layer=*/1, /*final_norm=*/true, /*pad_token=*/-1}};
    return f;
}

}  // namespace

const Family& sd1_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
