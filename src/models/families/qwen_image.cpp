#include "models/families/qwen_image.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "models/families/wan.h"

namespace kiln::models {
namespace {

// The DiT's img_mod is Qwen-Image's name alone among the DiTs kiln reads,
// and txt_norm (the RMSNorm on the encoder's states) its own input.
bool has_qwen_image_dit(const FileSet& files) {
    return files.find_suffix("transformer_blocks.0.img_mod.1.weight") && files.find_suffix("txt_norm.weight");
}

// The first Edit release has 2509's weights in shape: its diffusers folder
// names its pipeline (model_index.json's QwenImageEditPipeline, where 2509
// and 2511 say QwenImageEditPlusPipeline), and its files are named for it
// (ComfyUI's qwen_image_edit_fp8_e4m3fn.safetensors, QuantStack's
// Qwen-Image-Edit-Q4_K_M.gguf): "edit" without a later release's mark.
bool is_first_edit_release(const FileSet& files) {
    for (const io::ModelFile* f : files.files) {
        const std::string pipeline = f->metadata_string("diffusers.pipeline", "");
        if (!pipeline.empty()) {
            if (pipeline == "QwenImageEditPipeline") return true;
            continue;  // a folder's file names say nothing
        }
        for (const io::SourceFile& s : f->sources()) {
            std::string name = std::filesystem::path(s.path).filename().string();
            std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
            const bool later = name.find("2509") != std::string::npos || name.find("2511") != std::string::npos ||
                               name.find("plus") != std::string::npos;
            if (name.find("edit") != std::string::npos && !later) return true;
        }
    }
    return false;
}

int detect(const FileSet& files) { return has_qwen_image_dit(files) ? 3 : 0; }
int detect_first_edit(const FileSet& files) {
    return has_qwen_image_dit(files) && is_first_edit_release(files) ? 4 : 0;
}

// diffusers' QwenImagePipeline (and sd-cli): the prompt in Qwen's chat
// template after Qwen-Image's system turn, encoded whole with a causal mask;
// HF's hidden_states[-1] (the final-normed last layer), of which the system
// turn's 34 tokens (prompt_template_encode_start_idx) are dropped.
TextEncoderUse qwen25_vl_use(bool first_edit) {
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
    if (first_edit) {
        // The first release (diffusers' QwenImageEditPipeline): the same
        // system turn, the image without "Picture 1: ", and the vision image
        // at about 1024 x 1024 pixels, the size that pipeline gives the VAE.
        use.image_prompt = "<|vision_start|><|image_pad|><|vision_end|>";
        use.vision_area = 1024 * 1024;
    }
    // A prompt of about 100 words under the template, its system turn included.
    use.plan_tokens = 194;
    return use;
}

Family make(bool first_edit) {
    Family f;
    f.name = first_edit ? "Qwen-Image-Edit" : "Qwen-Image";
    f.detect = first_edit ? detect_first_edit : detect;
    f.modules = {{"llm", ModuleRole::TextEncoder, NetworkKind::Llm, {}, "--llm", {}},
                 {"qwen_image", ModuleRole::Diffusion, NetworkKind::QwenImageDit, {}, "--diffusion-model", {}},
                 // Also in diffusers' names (AutoencoderKLQwenImage, a
                 // folder's vae/ alone), renamed by io/name_map.h's table.
                 {"vae", ModuleRole::Vae, NetworkKind::WanVae, {}, "--vae", io::ModelComponent::Vae},
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
    // (and the prompt, through the vision tower); 2509 takes up to three,
    // the first release's template has one image's place.
    f.reference_images = true;
    f.max_reference_images = first_edit ? 1 : 3;
    f.conditioning.encoders = {qwen25_vl_use(first_edit)};
    // Wan 2.1's VAE, which normalises its latent per channel itself.
    f.latent = wan21_latent_format();
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
    static const Family family = make(false);
    return family;
}

const Family& qwen_image_edit_first_family() {
    static const Family family = make(true);
    return family;
}

}  // namespace kiln::models
