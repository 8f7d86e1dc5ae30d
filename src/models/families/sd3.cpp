#include "models/families/sd3.h"

namespace kiln::models {
namespace {

enum class Variant { Large, LargeTurbo, Medium35, Medium3 };

// Stability's names, or diffusers' SD3Transformer2DModel (transformer/ of a
// diffusers folder).
bool has_mmdit(const FileSet& files) {
    return files.find_suffix("joint_blocks.0.x_block.attn.qkv.weight") || files.find_suffix("pos_embed.pos_embed");
}

Variant variant_of(const FileSet& files) {
    if (files.find_suffix("joint_blocks.0.x_block.attn2.qkv.weight") ||
        files.find_suffix("transformer_blocks.0.attn2.to_q.weight"))
        return Variant::Medium35;
    if (!files.find_suffix("joint_blocks.0.x_block.attn.ln_q.weight") &&
        !files.find_suffix("transformer_blocks.0.attn.norm_q.weight"))
        return Variant::Medium3;
    return files.any_path_contains("turbo") ? Variant::LargeTurbo : Variant::Large;
}

template <Variant V>
int detect(const FileSet& files) {
    return has_mmdit(files) && variant_of(files) == V ? 3 : 0;
}

// sd3_infer.get_cond: both CLIPs' penultimate layers without the final norm
// (layer "hidden", index -2) in 77-token chunks, CLIP-L padded with EOS and
// CLIP-G with 0 (SDXL's tokenizers); T5-XXL over at least 77 tokens padded
// with 0 after EOS; CLIP-L's pooled output is the final-normed EOS state
// (return_projected_pooled=False), CLIG-G's goes through its projection.
Conditioning sd3_conditioning() {
    TextEncoderUse clip_l;
    clip_l.module = "clip_l";
    clip_l.default_layer = 2;
    clip_l.final_norm = false;
    clip_l.pooled = true;
    TextEncoderUse clip_g = clip_l;
    clip_g.module = "clip_g";
    clip_g.pad_token = 0;
    clip_g.hf_named_openclip = true;
    TextEncoderUse t5;
    t5.module = "t5xxl";
    t5.pad_token = 0;
    t5.layout = PromptLayout::FixedLength;
    t5.max_length = 77;
    t5.token_group = 1;
    Conditioning c;
    c.encoders = {clip_l, clip_g, t5};
    return c;
}

// ComfyUI's SD3 latent format (comfy/latent_formats.py).
LatentFormat sd3_latent_format() {
    LatentFormat l;
    l.channels = 16;
    l.scale = 1.5305f;
    l.shift = 0.0609f;
    l.rgb_factors = {{-0.0922f, -0.0175f, 0.0749f}, {0.0311f, 0.0633f, 0.0954f},    {0.1994f, 0.0927f, 0.0458f},
                     {0.0856f, 0.0339f, 0.0902f},   {0.0587f, 0.0272f, -0.0496f},   {-0.0006f, 0.1104f, 0.0309f},
                     {0.0978f, 0.0306f, 0.0427f},   {-0.0042f, 0.1038f, 0.1358f},   {-0.0194f, 0.0020f, 0.0669f},
                     {-0.0488f, 0.0130f, -0.0268f}, {0.0922f, 0.0988f, 0.0951f},    {-0.0278f, 0.0524f, -0.0542f},
                     {0.0332f, 0.0456f, 0.0895f},   {-0.0069f, -0.0030f, -0.0810f}, {-0.0596f, -0.0465f, -0.0293f},
                     {-0.1448f, -0.1463f, -0.1189f}};
    l.rgb_bias = {0.2394f, 0.2135f, 0.1925f};
    return l;
}

Family make(Variant v) {
    Family f;
    switch (v) {
        case Variant::Large:
            f.name = "SD3.5-Large";
            f.detect = detect<Variant::Large>;
            break;
        case Variant::LargeTurbo:
            f.name = "SD3.5-Large-Turbo";
            f.detect = detect<Variant::LargeTurbo>;
            break;
        case Variant::Medium35:
            f.name = "SD3.5-Medium";
            f.detect = detect<Variant::Medium35>;
            break;
        case Variant::Medium3:
            f.name = "SD3-Medium";
            f.detect = detect<Variant::Medium3>;
            break;
    }
    // Stability's and ComfyUI's all-in-one files: text_encoders.clip_l.transformer.,
    // text_encoders.clip_g.transformer., text_encoders.t5xxl.transformer.,
    // model.diffusion_model., first_stage_model.; each may come on its own
    // (--clip_l, --clip_g, --t5xxl, --diffusion-model, --vae), any prefix. A
    // diffusers StableDiffusion3Pipeline folder: CLIP-L in text_encoder/
    // (which the folder's SD renames make cond_stage_model.transformer.),
    // CLIP-G in text_encoder_2/, T5 in text_encoder_3/, the MMDiT in
    // transformer/, the VAE in vae/ (renamed to first_stage_model.).
    ModuleSpec t5{"t5xxl", ModuleRole::TextEncoder, NetworkKind::T5, {}, "--t5xxl", {}};
    t5.optional = true;
    f.modules = {{"clip_l",
                  ModuleRole::TextEncoder,
                  NetworkKind::ClipText,
                  {"text_encoders.clip_l.transformer.", "cond_stage_model.transformer."},
                  "--clip_l",
                  {}},
                 {"clip_g",
                  ModuleRole::TextEncoder,
                  NetworkKind::ClipText,
                  {"text_encoders.clip_g.transformer.", "text_encoder_2/"},
                  "--clip_g",
                  {}},
                 t5,
                 {"mmdit", ModuleRole::Diffusion, NetworkKind::Mmdit, {}, "--diffusion-model", {}},
                 {"vae", ModuleRole::Vae, NetworkKind::Vae, {}, "--vae", io::ModelComponent::Vae}};
    f.conditioning = sd3_conditioning();
    f.latent = sd3_latent_format();
    f.schedule.prediction = Prediction::Flow;
    f.schedule.flow_shift_factor = true;  // --flow-shift is the factor 3 of sd3_infer's SHIFT, as sd-cli reads it
    f.schedule.flow_mu = 1.0986123f;      // ln 3
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.steps = v == Variant::LargeTurbo ? 4 : 28;
    f.defaults.cfg_scale = v == Variant::LargeTurbo ? 1.0f : 4.5f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    return f;
}

}  // namespace

const Family& sd35_large_family() {
    static const Family family = make(Variant::Large);
    return family;
}
const Family& sd35_large_turbo_family() {
    static const Family family = make(Variant::LargeTurbo);
    return family;
}
const Family& sd35_medium_family() {
    static const Family family = make(Variant::Medium35);
    return family;
}
const Family& sd3_medium_family() {
    static const Family family = make(Variant::Medium3);
    return family;
}

}  // namespace kiln::models
