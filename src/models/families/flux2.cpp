#include "models/families/flux2.h"

namespace kiln::models {
namespace {

// A FLUX.2 DiT: its shared modulation layers. Scored above Flux.1's
// families, whose block names it shares.
bool has_flux2_dit(const FileSet& files) {
    return files.find_suffix("double_stream_modulation_img.lin.weight") &&
           files.find_suffix("single_stream_modulation.lin.weight");
}

int detect_klein(const FileSet& files) { return has_flux2_dit(files) && !files.any_path_contains("base") ? 5 : 0; }
int detect_klein_base(const FileSet& files) { return has_flux2_dit(files) && files.any_path_contains("base") ? 5 : 0; }

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
    use.max_length = 512;
    use.pad_text = "<|endoftext|>";
    use.plan_tokens = 512;
    use.hidden_states = {9, 18, 27};
    return use;
}

Family make(bool base) {
    Family f;
    f.name = base ? "FLUX.2-klein-base" : "FLUX.2-klein";
    f.detect = base ? detect_klein_base : detect_klein;
    f.modules = {{"llm", ModuleRole::TextEncoder, NetworkKind::Llm, {}, "--llm", {}},
                 {"flux2", ModuleRole::Diffusion, NetworkKind::Flux2Dit, {}, "--diffusion-model", {}},
                 {"vae", ModuleRole::Vae, NetworkKind::Flux2Vae, {}, "--vae", {}}};
    f.conditioning.encoders = {qwen3_use()};
    // The autoencoder's latent is already normalised: no scale, no shift.
    f.latent.channels = 128;
    f.latent.scale = 1.0f;
    f.latent.shift = 0.0f;
    f.schedule.prediction = Prediction::Flow;
    f.schedule.step_shift = true;  // BFL's compute_empirical_mu; --flow-shift is mu itself, as Flux's
    f.defaults.width = 1024;
    f.defaults.height = 1024;
    // BFL's cli: klein 4 steps, no CFG; base 50 steps, CFG 4 against "".
    f.defaults.steps = base ? 50 : 4;
    f.defaults.cfg_scale = base ? 4.0f : 1.0f;
    f.defaults.sampler = "euler";
    f.defaults.scheduler = "discrete";
    f.defaults.guidance = 0.0f;
    f.reference_images = true;
    return f;
}

}  // namespace

const Family& flux2_klein_family() {
    static const Family family = make(false);
    return family;
}

const Family& flux2_klein_base_family() {
    static const Family family = make(true);
    return family;
}

}  // namespace kiln::models
