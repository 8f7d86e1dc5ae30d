#include "models/families/chroma.h"

#include "models/families/flux.h"

namespace kiln::models {
namespace {

int detect(const FileSet& files) {
    return has_flux_dit(files) && files.any_name_contains("distilled_guidance_layer.") ? 4 : 0;
}

Family make() {
    Family f;
    f.name = "Chroma";
    f.detect = detect;
    f.modules = {flux_t5_module(), flux_dit_module(), flux_vae_module()};
    // sd-cli's default: T5 unmasked, its padding masked out of the DiT's
    // attention but for one pad token after EOS.
    TextEncoderUse t5;
    t5.module = "t5xxl";
    t5.pad_token = 0;
    t5.layout = PromptLayout::FixedLength;
    t5.max_length = 512;
    t5.mask_padding = true;
    t5.mask_pad_tokens = 1;
    f.conditioning.encoders = {t5};
    f.latent = flux_latent_format();
    f.schedule.prediction = Prediction::Flow;
    f.schedule.flow_mu = 1.0f;  // ComfyUI's Chroma sampling shift
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.steps = 20;
    f.defaults.cfg_scale = 4.0f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    return f;
}

}  // namespace

const Family& chroma_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
