#include "models/families/qwen_image.h"

namespace kiln::models {
namespace {

// The DiT's img_mod is Qwen-Image's name alone among the DiTs kiln reads,
// and txt_norm (the RMSNorm on the encoder's states) its own input.
int detect(const FileSet& files) {
    return files.find_suffix("transformer_blocks.0.img_mod.1.weight") && files.find_suffix("txt_norm.weight") ? 3 : 0;
}

// diffusers' QwenImagePipeline (and sd-cli): the prompt in Qwen's chat
// template after Qwen-Image's system turn, encoded whole with a causal mask;
// HF's hidden_states[-1] (the final-normed last layer), of which the system
// turn's 34 tokens (prompt_template_encode_start_idx) are dropped.
TextEncoderUse qwen25_vl_use() {
    TextEncoderUse use;
    use.module = "llm";
    use.default_layer = 1;
    use.final_norm = true;
    use.layout = PromptLayout::ChatTemplate;
    use.chat_prefix =
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
        "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
    use.chat_suffix = "<|im_end|>\n<|im_start|>assistant\n";
    use.drop_prefix = true;
    use.template_tokens = {"<|im_start|>", "<|im_end|>"};
    // A prompt of about 100 words under the template, its system turn included.
    use.plan_tokens = 194;
    return use;
}

Family make() {
    Family f;
    f.name = "Qwen-Image";
    f.detect = detect;
    f.modules = {{"llm", ModuleRole::TextEncoder, NetworkKind::Llm, {}, "--llm", {}},
                 {"qwen_image", ModuleRole::Diffusion, NetworkKind::QwenImageDit, {}, "--diffusion-model", {}},
                 {"vae", ModuleRole::Vae, NetworkKind::WanVae, {}, "--vae", {}}};
    f.conditioning.encoders = {qwen25_vl_use()};
    // The VAE normalises its latent per channel itself (Wan 2.1's mean and std).
    f.latent.channels = 16;
    f.latent.scale = 1.0f;
    f.latent.shift = 0.0f;
    f.schedule.prediction = Prediction::Flow;
    // sd-cli's docs/qwen_image.md runs it with --flow-shift 3: the flow
    // table's time shifted by a factor of 3, as SD3's and Z-Image's.
    f.schedule.flow_shift_factor = true;
    f.schedule.flow_mu = 1.0986123f;  // ln 3
    // diffusers' default size (default_sample_size 128 latent pixels);
    // sd-cli's example's cfg 2.5 (diffusers' true_cfg_scale is 4 over 50 steps).
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.steps = 20;
    f.defaults.cfg_scale = 2.5f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    return f;
}

}  // namespace

const Family& qwen_image_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
