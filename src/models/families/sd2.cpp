#include "models/families/sd2.h"

#include "models/families/sd_common.h"

namespace kiln::models {
namespace {

int detect(const FileSet& files) { return detect_sd_checkpoint(files, 1024, "cond_stage_model.model."); }

Family make() {
    Family f;
    f.name = "SD2.x";
    f.detect = detect;
    f.diffusers_family = io::ModelFamily::SD2;
    f.modules = {single_clip_module("open_clip_h"), unet_module(), vae_module()};
    // ldm's FrozenOpenCLIPEmbedder: the penultimate layer through ln_final,
    // padded with zeros.
    f.latent = sd15_latent_format();
    f.conditioning.encoders = {{"open_clip_h", /*default_layer=*/2, /*final_norm=*/true, /*pad_token=*/0}};
    return f;
}

}  // namespace

const Family& sd2_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
