#include "models/families/wan.h"

namespace kiln::models {
namespace {

// The DiT's cross-attention with per-projection RMSNorms and its 3-D patch
// embedding are Wan's alone among the DiTs kiln reads.
int detect(const FileSet& files) {
    return files.find_suffix("blocks.0.cross_attn.norm_k.weight") && files.find_suffix("patch_embedding.weight") ? 3
                                                                                                                 : 0;
}

// Wan's T5EncoderModel: umT5-XXL over the prompt, EOS and padding to 512
// tokens, the padding masked in its attention; the DiT takes the prompt's
// rows (EOS included) followed by zero rows up to 512 (WanModel pads the
// context it is given), which zero_padding makes here.
TextEncoderUse umt5_use() {
    TextEncoderUse use;
    use.module = "t5xxl";
    use.pad_token = 0;
    use.layout = PromptLayout::FixedLength;
    use.max_length = 512;
    use.zero_padding = true;
    return use;
}

Family make() {
    Family f;
    f.name = "Wan";
    f.detect = detect;
    // sd-cli's flags: --t5xxl for umT5 (umt5_xxl_fp16.safetensors in HF's
    // names, city96's GGUFs in llama.cpp's), --diffusion-model, --vae.
    f.modules = {{"t5xxl", ModuleRole::TextEncoder, NetworkKind::T5, {}, "--t5xxl", {}},
                 {"wan", ModuleRole::Diffusion, NetworkKind::WanDit, {}, "--diffusion-model", {}},
                 {"vae", ModuleRole::Vae, NetworkKind::WanVae, {}, "--vae", {}}};
    // Wan 2.2 A14B: the high-noise expert (wan2.2_t2v_high_noise_14B_*),
    // while --diffusion-model gives the low-noise one.
    ModuleSpec high_noise{"high_noise", ModuleRole::Diffusion,          NetworkKind::WanDit,
                          {},           "--high-noise-diffusion-model", {}};
    high_noise.optional = true;
    high_noise.high_noise = true;
    f.modules.push_back(high_noise);
    // Wan 2.1 I2V and FLF2V: CLIP vision reads the first (and last) frame
    // for the DiT's image context (sd-cli's --clip_vision,
    // clip_vision_h.safetensors); only jobs on those DiTs need it.
    ModuleSpec clip_vision{"clip_vision", ModuleRole::TextEncoder, NetworkKind::ClipVision, {}, "--clip_vision", {}};
    clip_vision.optional = true;
    f.modules.push_back(clip_vision);
    f.conditioning.encoders = {umt5_use()};
    f.latent = wan21_latent_format();
    f.schedule.prediction = Prediction::Flow;
    // Wan's FlowUniPCMultistepScheduler shifts the flow table by a factor
    // (sample_shift), as sd-cli's --flow-shift reads it for Wan; 3 is
    // sd-cli's example and Wan's choice at 480p.
    f.schedule.flow_shift_factor = true;
    f.schedule.flow_mu = 1.0986123f;  // ln 3
    // sd-cli's Wan example: 832x480, cfg 6, euler.
    f.defaults.width = 832;
    f.defaults.height = 480;
    f.defaults.steps = 20;
    f.defaults.cfg_scale = 6.0f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    return f;
}

}  // namespace

LatentFormat wan21_latent_format() {
    LatentFormat latent;
    latent.channels = 16;
    latent.scale = 1.0f;
    latent.shift = 0.0f;
    // ComfyUI's Wan21 latent format (latent_formats.py), on the normalised latent.
    latent.rgb_factors = {{-0.1299f, -0.1692f, 0.2932f},  {0.0671f, 0.0406f, 0.0442f},  {0.3568f, 0.2548f, 0.1747f},
                          {0.0372f, 0.2344f, 0.1420f},    {0.0313f, 0.0189f, -0.0328f}, {0.0296f, -0.0956f, -0.0665f},
                          {-0.3477f, -0.4059f, -0.2925f}, {0.0166f, 0.1902f, 0.1975f},  {-0.0412f, 0.0267f, -0.1364f},
                          {-0.1293f, 0.0740f, 0.1636f},   {0.0680f, 0.3019f, 0.1128f},  {0.0032f, 0.0581f, 0.0639f},
                          {-0.1251f, 0.0927f, 0.1699f},   {0.0060f, -0.0633f, 0.0005f}, {0.3477f, 0.2275f, 0.2950f},
                          {0.1984f, 0.0913f, 0.1861f}};
    latent.rgb_bias = {-0.1835f, -0.0868f, -0.3360f};
    return latent;
}

const Family& wan_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
