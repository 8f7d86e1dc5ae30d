#include "models/families/flux2.h"

#include <string>

namespace kiln::models {
namespace {

// A FLUX.2 DiT: its shared modulation layers, in BFL's names or diffusers'
// (Flux2Transformer2DModel: .linear). Scored above Flux.1's families, whose
// block names it shares.
bool has_flux2_dit(const FileSet& files) {
    for (const char* lin : {".lin.weight", ".linear.weight"}) {
        if (files.find_suffix(std::string("double_stream_modulation_img") + lin) &&
            files.find_suffix(std::string("single_stream_modulation") + lin))
            return true;
    }
    return false;
}

// BFL's file and repository names: flux-2-klein-base-4b.safetensors,
// FLUX.2-klein-base-9B/ (not a bare "base", which "database/" would match).
bool named_base(const FileSet& files) {
    return files.any_path_contains("klein-base") || files.any_path_contains("klein_base");
}

// [dev] is guidance-distilled: its DiT embeds the guidance; klein's does not.
bool has_guidance_embedding(const FileSet& files) {
    return files.find_suffix("guidance_in.in_layer.weight") ||
           files.find_suffix("time_guidance_embed.guidance_embedder.linear_1.weight");
}

int detect_klein(const FileSet& files) {
    return has_flux2_dit(files) && !has_guidance_embedding(files) && !named_base(files) ? 5 : 0;
}
int detect_klein_base(const FileSet& files) {
    return has_flux2_dit(files) && !has_guidance_embedding(files) && named_base(files) ? 5 : 0;
}
int detect_dev(const FileSet& files) { return has_flux2_dit(files) && has_guidance_embedding(files) ? 5 : 0; }

// BFL's Qwen3Embedder (flux2/text_encoder.py) and ComfyUI's KleinTokenizer:
// the user turn of Qwen's chat template with thinking closed, 512 tokens
// (the padding masked inside Qwen3, passed on to the DiT), hidden_states 9,
// 18 and 27 side by side.
TextEncoderUse qwen3_use() {
    TextEncoderUse use;
    use.module = "llm";
    use.layout = PromptLayout::ChatTemplate;
    use.final_norm = false;
    use.chat_prefix = "<|im_start|>user\n";
    use.chat_suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    use.template_tokens = {"<|im_start|>", "<|im_end|>"};
    use.max_length = 512;
    use.pad_text = "<|endoftext|>";
    use.plan_tokens = 512;
    use.hidden_states = {9, 18, 27};
    return use;
}

// BFL's Mistral3SmallEmbedder (flux2/text_encoder.py): the system and user
// turns of Mistral's chat template (BFL's SYSTEM_MESSAGE, its line break
// included), hidden_states 10, 20 and 30 side by side. The prompt is encoded
// unpadded and its states padded with zeros to 512 tokens, as sd-cli does
// (BFL pads the ids with <pad> and masks them; see docs/flux2.md).
TextEncoderUse mistral_use() {
    TextEncoderUse use;
    use.module = "llm";
    use.layout = PromptLayout::ChatTemplate;
    use.final_norm = false;
    use.chat_prefix =
        "<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You give structured responses "
        "focusing on object relationships, object\nattribution and actions without speculation.[/SYSTEM_PROMPT][INST]";
    use.chat_suffix = "[/INST]";
    use.template_tokens = {"<s>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]"};
    use.zero_pad_to = 512;
    use.plan_tokens = 512;
    use.hidden_states = {10, 20, 30};
    use.llm_defaults = {1e9f, 1e-5f};  // Mistral Small 3.x's config.json: rope_theta, rms_norm_eps
    return use;
}

// ComfyUI's Flux2 latent-to-RGB factors (comfy/latent_formats.py), one row
// per KL latent channel; it previews each 2x2 patch at twice the latent's
// resolution. kiln's projection is one pixel per latent pixel: each of a
// channel's four patch positions (c * 4 + pi * 2 + pj) takes a quarter of
// its row, so the preview is the mean over the patch.
LatentFormat flux2_latent_format() {
    static const float rows[32][3] = {
        {0.0058f, 0.0113f, 0.0073f},    {0.0495f, 0.0443f, 0.0836f},    {-0.0099f, 0.0096f, 0.0644f},
        {0.2144f, 0.3009f, 0.3652f},    {0.0166f, -0.0039f, -0.0054f},  {0.0157f, 0.0103f, -0.0160f},
        {-0.0398f, 0.0902f, -0.0235f},  {-0.0052f, 0.0095f, 0.0109f},   {-0.3527f, -0.2712f, -0.1666f},
        {-0.0301f, -0.0356f, -0.0180f}, {-0.0107f, 0.0078f, 0.0013f},   {0.0746f, 0.0090f, -0.0941f},
        {0.0156f, 0.0169f, 0.0070f},    {-0.0034f, -0.0040f, -0.0114f}, {0.0032f, 0.0181f, 0.0080f},
        {-0.0939f, -0.0008f, 0.0186f},  {0.0018f, 0.0043f, 0.0104f},    {0.0284f, 0.0056f, -0.0127f},
        {-0.0024f, -0.0022f, -0.0030f}, {0.1207f, -0.0026f, 0.0065f},   {0.0128f, 0.0101f, 0.0142f},
        {0.0137f, -0.0072f, -0.0007f},  {0.0095f, 0.0092f, -0.0059f},   {0.0000f, -0.0077f, -0.0049f},
        {-0.0465f, -0.0204f, -0.0312f}, {0.0095f, 0.0012f, -0.0066f},   {0.0290f, -0.0034f, 0.0025f},
        {0.0220f, 0.0169f, -0.0048f},   {-0.0332f, -0.0457f, -0.0468f}, {-0.0085f, 0.0389f, 0.0609f},
        {-0.0076f, 0.0003f, -0.0043f},  {-0.0111f, -0.0460f, -0.0614f},
    };
    LatentFormat l;
    l.channels = 128;
    l.scale = 1.0f;  // the autoencoder's latent is already normalised: no scale, no shift
    l.shift = 0.0f;
    for (const auto& row : rows) {
        for (int k = 0; k < 4; ++k) l.rgb_factors.push_back({row[0] / 4, row[1] / 4, row[2] / 4});
    }
    l.rgb_bias = {-0.0329f, -0.0718f, -0.0851f};
    return l;
}

// What every FLUX.2 shares: an LLM, the DiT, FLUX.2's autoencoder, BFL's
// schedule, reference images.
Family make_flux2() {
    Family f;
    f.modules = {{"llm", ModuleRole::TextEncoder, NetworkKind::Llm, {}, "--llm", {}},
                 {"flux2", ModuleRole::Diffusion, NetworkKind::Flux2Dit, {}, "--diffusion-model", {}},
                 // --vae also in diffusers' names (AutoencoderKLFlux2, a folder's vae/ alone).
                 {"vae", ModuleRole::Vae, NetworkKind::Flux2Vae, {}, "--vae", io::ModelComponent::Vae}};
    f.latent = flux2_latent_format();
    f.schedule.prediction = Prediction::Flow;
    f.schedule.step_shift = true;  // BFL's compute_empirical_mu; --flow-shift is mu itself, as Flux's
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.reference_images = true;
    return f;
}

Family make_klein(bool base) {
    Family f = make_flux2();
    f.name = base ? "FLUX.2-klein-base" : "FLUX.2-klein";
    f.detect = base ? detect_klein_base : detect_klein;
    f.conditioning.encoders = {qwen3_use()};
    // BFL's cli: klein 4 steps, no CFG; base 50 steps, CFG 4 against "".
    f.defaults.steps = base ? 50 : 4;
    f.defaults.cfg_scale = base ? 4.0f : 1.0f;
    f.defaults.guidance = 0.0f;
    return f;
}

// BFL's cli for [dev]: 50 steps, guidance 4 through the DiT's embedding, no
// CFG.
Family make_dev() {
    Family f = make_flux2();
    f.name = "FLUX.2-dev";
    f.detect = detect_dev;
    f.conditioning.encoders = {mistral_use()};
    f.defaults.steps = 50;
    f.defaults.cfg_scale = 1.0f;
    f.defaults.guidance = 4.0f;
    return f;
}

}  // namespace

const Family& flux2_klein_family() {
    static const Family family = make_klein(false);
    return family;
}

const Family& flux2_klein_base_family() {
    static const Family family = make_klein(true);
    return family;
}

const Family& flux2_dev_family() {
    static const Family family = make_dev();
    return family;
}

}  // namespace kiln::models
