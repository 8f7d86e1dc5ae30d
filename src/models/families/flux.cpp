#include "models/families/flux.h"

namespace kiln::models {
namespace {

bool has_guidance_embedding(const FileSet& files) {
    return files.find_suffix("guidance_in.in_layer.weight") ||
           files.find_suffix("time_text_embed.guidance_embedder.linear_1.weight");  // diffusers
}
bool has_chroma_approximator(const FileSet& files) { return files.any_name_contains("distilled_guidance_layer."); }

int detect_dev(const FileSet& files) {
    return has_flux_dit(files) && has_guidance_embedding(files) && !has_chroma_approximator(files) ? 3 : 0;
}

// Fill's img_in takes 384 features (the 16-channel latent's 64 in 2x2
// patches, the masked image's 64 and the 8x8 mask's 256), where dev's takes
// 64 and the Canny and Depth models 128.
int detect_fill(const FileSet& files) {
    const io::TensorInfo* img_in = files.find_suffix("img_in.weight");
    if (!img_in) img_in = files.find_suffix("x_embedder.weight");  // diffusers
    const bool fill = img_in && img_in->shape.size() == 2 && img_in->shape[1] > 2 * 64;
    return fill && detect_dev(files) ? 4 : 0;
}

int detect_schnell(const FileSet& files) {
    return has_flux_dit(files) && !has_guidance_embedding(files) && !has_chroma_approximator(files) ? 3 : 0;
}

ModuleSpec clip_l_pooled_module() {
    return {"clip_l", ModuleRole::TextEncoder, NetworkKind::ClipText, {}, "--clip_l", {}};
}

// BFL's HFEmbedder: CLIP-L's pooler output (the final-normed EOS token of the
// last layer, no projection) over one 77-token chunk padded with EOS; T5's
// last hidden state over exactly `t5_length` tokens padded with 0.
Conditioning flux_conditioning(int t5_length) {
    Conditioning c;
    TextEncoderUse clip;
    clip.module = "clip_l";
    clip.pooled = true;
    clip.context = false;
    TextEncoderUse t5;
    t5.module = "t5xxl";
    t5.pad_token = 0;
    t5.layout = PromptLayout::FixedLength;
    t5.max_length = t5_length;
    c.encoders = {clip, t5};
    return c;
}

Family make(bool dev) {
    Family f;
    f.name = dev ? "Flux.1-dev" : "Flux.1-schnell";
    f.detect = dev ? detect_dev : detect_schnell;
    f.modules = {clip_l_pooled_module(), flux_t5_module(), flux_dit_module(), flux_vae_module()};
    f.conditioning = flux_conditioning(dev ? 512 : 256);
    f.latent = flux_latent_format();
    f.schedule.prediction = Prediction::Flow;
    // BFL: dev shifts by the image's token count (1.15 at 1024x1024),
    // schnell not at all.
    f.schedule.resolution_shift = dev;
    f.schedule.flow_mu = dev ? 1.15f : 0.0f;
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.steps = dev ? 20 : 4;
    f.defaults.cfg_scale = 1.0f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 3.5f;
    // Kontext-dev has dev's weights layout; reference images are its input.
    f.reference_images = dev;
    return f;
}

// Flux.1-Fill-dev: dev with the masked image and mask as extra inputs
// (models::LatentConcat::MaskedImageThenPixelMask); BFL's and diffusers'
// guidance for it is 30.
Family make_fill() {
    Family f = make(true);
    f.name = "Flux.1-Fill-dev";
    f.detect = detect_fill;
    f.defaults.guidance = 30.0f;
    f.reference_images = false;
    return f;
}

}  // namespace

bool has_flux_dit(const FileSet& files) {
    return files.find_suffix("double_blocks.0.img_attn.qkv.weight") ||
           files.find_suffix("single_transformer_blocks.0.proj_mlp.weight");  // diffusers' transformer/
}

ModuleSpec flux_t5_module() {
    // HF's T5EncoderModel names (text_encoder_2/ of a diffusers folder) are
    // the ones the network reads: no renaming.
    return {"t5xxl", ModuleRole::TextEncoder, NetworkKind::T5, {}, "--t5xxl", {}};
}

ModuleSpec flux_dit_module() {
    return {"flux", ModuleRole::Diffusion, NetworkKind::FluxDit, {}, "--diffusion-model", {}};
}

ModuleSpec flux_vae_module() {
    return {"vae", ModuleRole::Vae, NetworkKind::Vae, {}, "--vae", io::ModelComponent::Vae};
}

LatentFormat flux_latent_format() {
    LatentFormat l;
    l.channels = 16;
    l.scale = 0.3611f;
    l.shift = 0.1159f;
    // ComfyUI's Flux latent format (sd-cli uses it for Flux and Z-Image).
    l.rgb_factors = {{-0.0346f, 0.0244f, 0.0681f},  {0.0034f, 0.0210f, 0.0687f},    {0.0275f, -0.0668f, -0.0433f},
                     {-0.0174f, 0.0160f, 0.0617f},  {0.0859f, 0.0721f, 0.0329f},    {0.0004f, 0.0383f, 0.0115f},
                     {0.0405f, 0.0861f, 0.0915f},   {-0.0236f, -0.0185f, -0.0259f}, {-0.0245f, 0.0250f, 0.1180f},
                     {0.1008f, 0.0755f, -0.0421f},  {-0.0515f, 0.0201f, 0.0011f},   {0.0428f, -0.0012f, -0.0036f},
                     {0.0817f, 0.0765f, 0.0749f},   {-0.1264f, -0.0522f, -0.1103f}, {-0.0280f, -0.0881f, -0.0499f},
                     {-0.1262f, -0.0982f, -0.0778f}};
    l.rgb_bias = {-0.0329f, -0.0718f, -0.0851f};
    return l;
}

const Family& flux_dev_family() {
    static const Family family = make(true);
    return family;
}

const Family& flux_fill_family() {
    static const Family family = make_fill();
    return family;
}

const Family& flux_schnell_family() {
    static const Family family = make(false);
    return family;
}

}  // namespace kiln::models
