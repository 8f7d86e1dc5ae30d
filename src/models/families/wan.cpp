#include "models/families/wan.h"

namespace kiln::models {
namespace {

// The DiT's cross-attention with per-projection RMSNorms and its 3-D patch
// embedding are Wan's alone among the DiTs kiln reads; in diffusers' names
// (WanTransformer3DModel, a transformer/ file given alone) attn2's.
int detect(const FileSet& files) {
    if (!files.find_suffix("patch_embedding.weight")) return 0;
    return files.find_suffix("blocks.0.cross_attn.norm_k.weight") ||
                   (files.find_suffix("blocks.0.attn2.norm_k.weight") &&
                    files.find_suffix("condition_embedder.time_proj.weight"))
               ? 3
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
    // Each DiT and the VAE also in diffusers' names (a folder's transformer/
    // or vae/ given alone), renamed by io/name_map.h's tables.
    f.modules = {
        {"t5xxl", ModuleRole::TextEncoder, NetworkKind::T5, {}, "--t5xxl", {}},
        {"wan", ModuleRole::Diffusion, NetworkKind::WanDit, {}, "--diffusion-model", io::ModelComponent::Transformer},
        {"vae", ModuleRole::Vae, NetworkKind::WanVae, {}, "--vae", io::ModelComponent::Vae}};
    // Wan 2.2 A14B: the high-noise expert (wan2.2_t2v_high_noise_14B_*),
    // while --diffusion-model gives the low-noise one.
    ModuleSpec high_noise{"high_noise", ModuleRole::Diffusion,          NetworkKind::WanDit,
                          {},           "--high-noise-diffusion-model", io::ModelComponent::Transformer};
    high_noise.optional = true;
    high_noise.high_noise = true;
    f.modules.push_back(high_noise);
    // Wan 2.1 I2V and FLF2V: CLIP vision reads the first (and last) frame
    // for the DiT's image context (sd-cli's --clip_vision,
    // clip_vision_h.safetensors); only jobs on those DiTs need it.
    ModuleSpec clip_vision{"clip_vision", ModuleRole::TextEncoder, NetworkKind::ClipVision, {}, "--clip_vision", {}};
    clip_vision.optional = true;
    f.modules.push_back(clip_vision);
    // Its diffusers folders (Wan-AI/Wan2.1-T2V-1.3B-Diffusers and the
    // I2V, FLF2V and VACE ones): transformer/ and vae/ take the original
    // names; text_encoder/ and image_encoder/ keep HF's.
    f.diffusers_family = io::ModelFamily::Wan;
    f.conditioning.encoders = {umt5_use()};
    f.latent = wan21_latent_format();
    f.other_latents = {wan22_latent_format()};
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

LatentFormat wan22_latent_format() {
    LatentFormat latent;
    latent.channels = 48;
    latent.scale = 1.0f;
    latent.shift = 0.0f;
    // ComfyUI's Wan22 latent format (latent_formats.py).
    latent.rgb_factors = {
        {0.0119f, 0.0103f, 0.0046f},    {-0.1062f, -0.0504f, 0.0165f},  {0.0140f, 0.0409f, 0.0491f},
        {-0.0813f, -0.0677f, 0.0607f},  {0.0656f, 0.0851f, 0.0808f},    {0.0264f, 0.0463f, 0.0912f},
        {0.0295f, 0.0326f, 0.0590f},    {-0.0244f, -0.0270f, 0.0025f},  {0.0443f, -0.0102f, 0.0288f},
        {-0.0465f, -0.0090f, -0.0205f}, {0.0359f, 0.0236f, 0.0082f},    {-0.0776f, 0.0854f, 0.1048f},
        {0.0564f, 0.0264f, 0.0561f},    {0.0006f, 0.0594f, 0.0418f},    {-0.0319f, -0.0542f, -0.0637f},
        {-0.0268f, 0.0024f, 0.0260f},   {0.0539f, 0.0265f, 0.0358f},    {-0.0359f, -0.0312f, -0.0287f},
        {-0.0285f, -0.1032f, -0.1237f}, {0.1041f, 0.0537f, 0.0622f},    {-0.0086f, -0.0374f, -0.0051f},
        {0.0390f, 0.0670f, 0.2863f},    {0.0069f, 0.0144f, 0.0082f},    {0.0006f, -0.0167f, 0.0079f},
        {0.0313f, -0.0574f, -0.0232f},  {-0.1454f, -0.0902f, -0.0481f}, {0.0714f, 0.0827f, 0.0447f},
        {-0.0304f, -0.0574f, -0.0196f}, {0.0401f, 0.0384f, 0.0204f},    {-0.0758f, -0.0297f, -0.0014f},
        {0.0568f, 0.1307f, 0.1372f},    {-0.0055f, -0.0310f, -0.0380f}, {0.0239f, -0.0305f, 0.0325f},
        {-0.0663f, -0.0673f, -0.0140f}, {-0.0416f, -0.0047f, -0.0023f}, {0.0166f, 0.0112f, -0.0093f},
        {-0.0211f, 0.0011f, 0.0331f},   {0.1833f, 0.1466f, 0.2250f},    {-0.0368f, 0.0370f, 0.0295f},
        {-0.3441f, -0.3543f, -0.2008f}, {-0.0479f, -0.0489f, -0.0420f}, {-0.0660f, -0.0153f, 0.0800f},
        {-0.0101f, 0.0068f, 0.0156f},   {-0.0690f, -0.0452f, -0.0927f}, {-0.0145f, 0.0041f, 0.0015f},
        {0.0421f, 0.0451f, 0.0373f},    {0.0504f, -0.0483f, -0.0356f},  {-0.0837f, 0.0168f, 0.0055f}};
    latent.rgb_bias = {0.0317f, -0.0878f, -0.1388f};
    return latent;
}

const Family& wan_family() {
    static const Family family = make();
    return family;
}

}  // namespace kiln::models
