// A model family (docs/architecture.md, "Families"): a table plus one hook. It
// says which networks a model of the family is made of and under which
// tensor prefixes, how prompts become the diffusion network's inputs, its
// latent format, noise schedule, size stride and defaults. The pipeline only
// ever sees a family through this table; a family knows nothing of
// placement, budgets or how graphs run.
//
// Adding a family: write src/models/families/NAME.{h,cpp} filling one
// Family, and add one line to src/models/registry.cpp. A network the
// family needs that kiln lacks gets its own pair under src/models/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "models/nets/registry.h"

namespace kiln::models {

// The role a module plays; placement (--backend te=...,diffusion=...,vae=...)
// is by role, so every text encoder of a family goes where "te" says. A
// ControlNet (--control-net) is a module of its own role, "control".
enum class ModuleRole { TextEncoder, Diffusion, Vae, Control };
// "te", "diffusion", "vae", "control": the names of --backend and --params-backend.
const char* module_role_name(ModuleRole role);

// One network of a family. It is found in the given files by a tensor whose
// name is one of `prefixes` followed by one of the network's marker names
// (pipeline/model.cpp); empty `prefixes` accept any. In a file of its own
// (given by `flag`) any prefix is accepted.
struct ModuleSpec {
    std::string name;  // "clip_l", "clip_g", "unet", "vae": messages and the memory report
    ModuleRole role = ModuleRole::Diffusion;
    NetworkKind network = NetworkKind::Unet;
    std::vector<std::string> prefixes;
    // sd-cli's flag that supplies it as a separate file, for the error when
    // it is missing ("--clip_g").
    std::string flag;
    // A file given by `flag` that is not in ldm naming is read as this
    // component of the family's diffusers folders (diffusers_family), so
    // HF-named files work too: SDXL's bigG from text_encoder_2/.
    std::optional<io::ModelComponent> diffusers_component;
    // A text encoder a job runs without when no file holds it: zeros stand
    // for its hidden states (SD3's T5-XXL; TextEncoderUse::max_length rows).
    // A vision tower (Qwen-Image-Edit's) only edit jobs need.
    bool optional = false;
    // Also taken from the file given by this flag (Qwen2.5-VL's vision
    // tower, visual.*, inside the LLM's file given as --llm).
    std::string also_in_flag;
    // Wan 2.2 A14B's high-noise expert: a second diffusion network of the
    // main one's shape, from the file its flag gives and no other, that
    // samples the schedule's first steps (pipeline/experts.h). Optional.
    bool high_noise = false;
};

// How a prompt becomes an encoder's tokens; each layout has its tokenizer
// (src/text/): CLIP's BPE, T5's SentencePiece, the LLM's byte-level BPE.
enum class PromptLayout {
    ClipChunks,    // 77-token chunks with A1111 weights (CLIP)
    FixedLength,   // one sequence of max_length tokens, padded (T5)
    ChatTemplate,  // the whole prompt in the family's chat template (an LLM)
};

// How a text encoder's output feeds the diffusion network.
struct TextEncoderUse {
    std::string module;     // a ModuleSpec name
    int default_layer = 1;  // clip skip: 1 = last layer, 2 = penultimate
    // The encoder's final layer norm on the chosen layer (ldm's SD1/SD2 do;
    // sgm's SDXL embedders do not).
    bool final_norm = true;
    // The padding id after EOS; < 0: the tokenizer's EOS (OpenAI CLIP).
    int32_t pad_token = -1;
    // Its pooled, projected output is the start of the UNet's `y` vector
    // (SDXL), or the DiT's pooled vector (Flux's CLIP-L).
    bool pooled = false;
    // Its hidden states are part of the context (false: only its pooled
    // output is used, as Flux uses CLIP-L).
    bool context = true;
    PromptLayout layout = PromptLayout::ClipChunks;
    // T5: every prompt is one sequence of exactly this many tokens, EOS
    // included, padded with the pad id (BFL's max_length: Flux-dev 512,
    // schnell 256). 0: CLIP's 77-token chunks.
    int max_length = 0;
    // T5: the padding is masked out of the DiT's attention (Chroma, as
    // sd-cli does by default), all but `mask_pad_tokens` pad tokens after EOS.
    bool mask_padding = false;
    int mask_pad_tokens = 1;
    // T5: the padding is masked inside T5 and its rows of the hidden states
    // are zeros (Wan: the prompt's states then zero rows to max_length, as
    // Wan's T5 encoder and DiT pad them).
    bool zero_padding = false;
    // LLM: the prompt is wrapped in the family's chat template, chat_prefix +
    // prompt + chat_suffix, and encoded whole (no chunks, no padding, a
    // causal mask); A1111 weights apply to the prompt's own tokens only, as
    // sd-cli applies them. default_layer counts hidden states from the end
    // as HF's hidden_states[-default_layer] does (2: the output of every
    // layer but the last, without the final norm; Z-Image's).
    std::string chat_prefix;
    std::string chat_suffix;
    // LLM: the hidden states of chat_prefix's tokens are dropped after the
    // encoder, so the context is the prompt and chat_suffix (Qwen-Image: its
    // system turn, diffusers' prompt_template_encode_start_idx of 34 tokens).
    bool drop_prefix = false;
    // LLM: the special tokens the template is written in, each of which the
    // tokenizer must have as one added token (Qwen's <|im_start|>, Mistral's
    // [INST]): another model's tokenizer is refused when the model loads.
    std::vector<std::string> template_tokens;
    // LLM: its rope theta and RMSNorm epsilon where the file's metadata has
    // none (HF safetensors never have it; GGUFs do).
    LlmFileDefaults llm_defaults;
    // LLM: the prompt length (template included) kiln plan assumes; a job
    // runs with its prompt's own length. With max_length > 0, the prompt is
    // padded with the token `pad_text` or cut to exactly max_length tokens,
    // the padding masked inside the LLM and passed on to the DiT (FLUX.2
    // klein: 512 of "<|endoftext|>").
    int plan_tokens = 0;
    std::string pad_text;
    // LLM: the hidden states of a shorter prompt are padded with zero rows
    // to this many tokens after the encoder (FLUX.2-dev, as sd-cli pads
    // them: 512); a longer prompt keeps its length.
    int zero_pad_to = 0;
    // LLM: HF's hidden_states[k] for each k (0: the embeddings), joined
    // along the features, instead of default_layer (FLUX.2 klein: 9, 18, 27;
    // the layers after the last are never loaded).
    std::vector<int> hidden_states;
    // Encoders of one group sit side by side along the features; groups
    // follow one another along the tokens, each padded with zeros to the
    // diffusion network's context width (SD3: CLIP-L and CLIP-G in group 0,
    // T5 in group 1).
    int token_group = 0;
    // LLM, edit models (Qwen-Image-Edit): with reference images (-r) the
    // prompt shows them too, each through the vision module `vision_module`
    // (diffusers' QwenImageEditPlusPipeline): images_prefix, then for image
    // i = 1, 2, ... image_prompt with "{}" replaced by i and its image_pad
    // token standing for the vision module's rows of that image, then the
    // prompt and chat_suffix. images_prefix's tokens are dropped as
    // chat_prefix's are (drop_prefix). Each image enters the vision module
    // resized to about vision_area pixels, its aspect kept (diffusers'
    // CONDITION_IMAGE_SIZE, then the Qwen2-VL processor's sides).
    std::string vision_module;
    std::string images_prefix;
    std::string image_prompt;
    std::string image_pad;
    int vision_area = 0;
    // A CLIP in HF's naming that is an OpenCLIP tower (SD3's CLIP-G in
    // Stability's and ComfyUI's files): GELU, not OpenAI's quick GELU, and
    // its text_projection.weight projects the pooled output.
    bool hf_named_openclip = false;
};

struct Conditioning {
    // Hidden states of every encoder are concatenated along the width, in
    // this order (SDXL: CLIP-L 768 then CLIP-G 1280), group by group
    // (TextEncoderUse::token_group); the pooled outputs of those that pool
    // are concatenated in the same order (SD3: CLIP-L's then CLIP-G's).
    std::vector<TextEncoderUse> encoders;
    // SDXL's micro-conditioning: the UNet's `y` is the pooled vector then
    // sinusoidal embeddings of original size, crop and target size.
    bool size_embedding = false;
    // An empty negative prompt conditions the unconditional pass with zeros
    // (hidden states and pooled vector), as sgm's force_zero_embeddings,
    // A1111 and sd-cli do for SDXL.
    bool zero_empty_negative = false;
};

struct LatentFormat {
    int channels = 4;
    float scale = 0.18215f;  // latent = (vae latent - shift) * scale
    float shift = 0.0f;
    // The latent-to-RGB projection of --preview proj, one row per channel:
    // rgb = sum_c latent[c] * rgb_factors[c] + rgb_bias, in [-1, 1], on the
    // scaled latent the sampler works on (ComfyUI's latent_formats.py
    // latent_rgb_factors and latent_rgb_factors_bias; sd-cli's
    // latent-preview.h has the same numbers). Empty: no projection known.
    std::vector<std::array<float, 3>> rgb_factors;
    std::array<float, 3> rgb_bias{};
};

// What the diffusion network predicts: the noise (SD1.x, SD2.x base, SDXL),
// v (SD2.x 768-v, v-prediction SDXL files), or the rectified-flow velocity
// noise - x0 (Flux, Chroma).
enum class Prediction { Eps, V, Flow };

struct Schedule {
    // Eps and V: discrete DDPM betas (scaled linear, 1000 steps,
    // 0.00085..0.012), the schedule every UNet family here was trained with.
    // Flow: rectified flow with Flux's time shift mu
    // (pipeline/denoiser.h FlowSchedule).
    Prediction prediction = Prediction::Eps;
    // Flow: the shift when --flow-shift is not given; with
    // resolution_shift, BFL's mu from the image's token count instead
    // (Flux-dev: 0.5 at 256 tokens, 1.15 at 4096).
    float flow_mu = 0.0f;
    bool resolution_shift = false;
    // Flow: FLUX.2's mu from the image's token count and the step count
    // (BFL's compute_empirical_mu) instead.
    bool step_shift = false;
    // How --flow-shift reads, as sd-cli reads it per family: Flux's number
    // is mu itself (its FluxFlowDenoiser), SD3's and Z-Image's the factor
    // k = e^mu of s' = k s / (1 + (k - 1) s) (its DiscreteFlowDenoiser).
    bool flow_shift_factor = false;
    // sd-cli's --timestep-shift applies (NitroFusion's distillations of
    // SDXL): the network sees a shifted whole timestep (pipeline/generate.h).
    bool shifted_timestep = false;
};

struct Defaults {
    int width = 512;
    int height = 512;
    int steps = 20;
    float cfg_scale = 7.0f;
    std::string sampler = "euler_a";
    std::string scheduler = "discrete";
    // Distilled guidance (--guidance) for a DiT with a guidance embedding.
    float guidance = 3.5f;
};

// What a set of files holds, for detection: the files (-m, --diffusion-model,
// --clip_l, --clip_g, --vae) searched last to first.
struct FileSet {
    std::vector<const io::ModelFile*> files;

    // The first tensor (from the last file back) whose name ends with `suffix`.
    const io::TensorInfo* find_suffix(const std::string& suffix) const;
    bool any_name_contains(const std::string& part) const;
    // Whether a file's path contains `word` (lower case), any case: the one
    // thing that tells apart releases with the same weights (Z-Image Turbo
    // and Base, FLUX.2 klein and klein base).
    bool any_path_contains(const std::string& word) const;
};

struct Family {
    std::string name;  // "SD1.x", "SD2.x", "SDXL": kiln info and image metadata
    // How strongly `files` look like this family: 0 = not at all; the
    // registry takes the highest. Reads names and shapes only.
    int (*detect)(const FileSet& files) = nullptr;
    std::vector<ModuleSpec> modules;
    // The name map of the family's diffusers folders (io/name_map.h).
    io::ModelFamily diffusers_family = io::ModelFamily::SD1;
    Conditioning conditioning;
    LatentFormat latent;
    // The latents of other VAEs the family takes, each picked by its channel
    // count (Wan 2.2's 48-channel one beside Wan 2.1's 16).
    std::vector<LatentFormat> other_latents;
    Schedule schedule;
    Defaults defaults;
    // Reference images (-r, Flux.1-Kontext) are image tokens the DiT
    // attends to; families that were not trained on them refuse them.
    bool reference_images = false;
    // The most reference images a job may give (0: no limit of the family's).
    int max_reference_images = 0;
    // The size stride is not a constant of the family: it is the VAE's
    // downscale times the diffusion network's own (2^(levels-1) for a UNet),
    // read from the loaded networks (pipeline/model.h, size_stride()).
};

}  // namespace kiln::models
