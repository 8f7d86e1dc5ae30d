#include "models/families/z_image.h"

#include "models/families/flux.h"

namespace kiln::models {
namespace {

// The DiT's pad tokens are Z-Image's own: Lumina-2's NextDiT, its ancestor,
// has the refiners but no x_pad_token.
bool has_z_image_dit(const FileSet& files) {
    return files.find_suffix("x_pad_token") && files.find_suffix("cap_pad_token") &&
           files.any_name_contains("context_refiner.0.");
}

int detect_turbo(const FileSet& files) { return has_z_image_dit(files) && files.any_path_contains("turbo") ? 3 : 0; }
int detect_base(const FileSet& files) { return has_z_image_dit(files) && !files.any_path_contains("turbo") ? 3 : 0; }

// diffusers' ZImagePipeline and sd-cli: the user turn of Qwen's chat
// template with the assistant turn opened (apply_chat_template with
// add_generation_prompt and thinking enabled adds no think block), every
// token of it attended to, the hidden states of hidden_states[-2].
TextEncoderUse qwen3_use() {
    TextEncoderUse use;
    use.module = "llm";
    use.default_layer = 2;
    use.final_norm = false;
    use.layout = PromptLayout::ChatTemplate;
    use.chat_prefix = "<|im_start|>user\n";
    use.chat_suffix = "<|im_end|>\n<|im_start|>assistant\n";
    use.template_tokens = {"<|im_start|>", "<|im_end|>"};
    // A prompt of about 100 words under the template.
    use.plan_tokens = 160;
    return use;
}

Family make(bool turbo) {
    Family f;
    f.name = turbo ? "Z-Image-Turbo" : "Z-Image";
    f.detect = turbo ? detect_turbo : detect_base;
    f.modules = {{"llm", ModuleRole::TextEncoder, NetworkKind::Llm, {}, "--llm", {}},
                 {"z_image", ModuleRole::Diffusion, NetworkKind::ZImageDit, {}, "--diffusion-model", {}},
                 flux_vae_module()};
    f.conditioning.encoders = {qwen3_use()};
    f.latent = flux_latent_format();
    f.schedule.prediction = Prediction::Flow;
    // The scheduler configs of both releases: FlowMatchEulerDiscrete with a
    // fixed shift of 3 (no resolution shift), sd-cli's default for Z-Image.
    f.schedule.flow_shift_factor = true;
    f.schedule.flow_mu = 1.0986123f;  // ln 3
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.steps = turbo ? 8 : 28;
    f.defaults.cfg_scale = turbo ? 1.0f : 5.0f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    return f;
}

}  // namespace

const Family& z_image_turbo_family() {
    static const Family family = make(true);
    return family;
}

const Family& z_image_base_family() {
    static const Family family = make(false);
    return family;
}

}  // namespace kiln::models
