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
    // Edit (2509, 2511; diffusers' QwenImageEditPlusPipeline): the edit
    // system turn (diffusers drops its 64 tokens), then each -r image as
    // "Picture i: " and its vision tokens, the image at 384 x 384 pixels'
    // area for the vision tower.
    use.vision_module = "llm_vision";
    use.images_prefix =
        "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
        "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
        "image that meets the user's requirements while maintaining consistency with the original input where "
        "appropriate.<|im_end|>\n<|im_start|>user\n";
    use.image_prompt = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>";
    use.image_pad = "<|image_pad|>";
    use.vision_area = 384 * 384;
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
                 // In diffusers' names (AutoencoderKLQwenImage) only inside
                 // a diffusers folder (io/name_map.h): alone, its
                 // decoder.conv_in marks it as the original names do.
                 {"vae", ModuleRole::Vae, NetworkKind::WanVae, {}, "--vae", {}},
                 // Edit jobs' vision tower: sd-cli's --llm_vision (an mmproj
                 // GGUF), or visual.* in the --llm file (ComfyUI's, HF's).
                 {"llm_vision",
                  ModuleRole::TextEncoder,
                  NetworkKind::QwenVision,
                  {},
                  "--llm_vision",
                  {},
                  /*optional=*/true,
                  /*also_in_flag=*/"--llm"}};
    // Its diffusers folders (Qwen/Qwen-Image, Qwen-Image-Edit-2509):
    // transformer/ and text_encoder/ (Qwen2_5_VLForConditionalGeneration,
    // the text model under model. or model.language_model., the vision
    // tower under visual. or model.visual.) keep their names; vae/ takes
    // Wan 2.1's original names.
    f.diffusers_family = io::ModelFamily::QwenImage;
    // Qwen-Image-Edit: -r images join the image tokens as reference latents
    // (and the prompt, through the vision tower); 2509 takes up to three.
    f.reference_images = true;
    f.max_reference_images = 3;
    f.conditioning.encoders = {qwen25_vl_use()};
    // The VAE normalises its latent per channel itself (Wan 2.1's mean and std).
    f.latent.channels = 16;
    f.latent.scale = 1.0f;
    f.latent.shift = 0.0f;
    // ComfyUI's Wan21 latent format (latent_formats.py), on the normalised latent.
    f.latent.rgb_factors = {{-0.1299f, -0.1692f, 0.2932f},  {0.0671f, 0.0406f, 0.0442f},  {0.3568f, 0.2548f, 0.1747f},
                            {0.0372f, 0.2344f, 0.1420f},    {0.0313f, 0.0189f, -0.0328f}, {0.0296f, -0.0956f, -0.0665f},
                            {-0.3477f, -0.4059f, -0.2925f}, {0.0166f, 0.1902f, 0.1975f},  {-0.0412f, 0.0267f, -0.1364f},
                            {-0.1293f, 0.0740f, 0.1636f},   {0.0680f, 0.3019f, 0.1128f},  {0.0032f, 0.0581f, 0.0639f},
                            {-0.1251f, 0.0927f, 0.1699f},   {0.0060f, -0.0633f, 0.0005f}, {0.3477f, 0.2275f, 0.2950f},
                            {0.1984f, 0.0913f, 0.1861f}};
    f.latent.rgb_bias = {-0.1835f, -0.0868f, -0.3360f};
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
