// A loaded model: its files, its family (models/registry.h) and a generic
// list of modules, each a network with a role, the device placement chose
// (pipeline/placement.h) and an executor that runs its graphs under the
// memory system (runtime/executor.h). Nothing here is specific to one
// family: which networks, under which prefixes, and what the family's
// defaults, latent format and conditioning are come from the family table.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/tensor_type_rules.h"
#include "models/family.h"
#include "models/nets/controlnet.h"
#include "models/nets/registry.h"
#include "models/nets/taesd.h"
#include "models/nets/vae.h"
#include "models/network.h"
#include "pipeline/denoiser.h"
#include "pipeline/embeddings.h"
#include "pipeline/hires_fix.h"
#include "pipeline/placement.h"
#include "runtime/device_budget.h"
#include "runtime/executor.h"
#include "runtime/weight_store.h"
#include "text/clip_tokenizer.h"
#include "text/llm_tokenizer.h"
#include "text/t5_tokenizer.h"
#include "util/result.h"

namespace kiln::pipeline {

struct ModelPaths {
    std::vector<std::string> model;  // -m: checkpoint(s) or a diffusers folder
    std::string diffusion_model;     // --diffusion-model
    // --high-noise-diffusion-model: Wan 2.2 A14B's high-noise expert (the
    // low-noise one is --diffusion-model).
    std::string high_noise_diffusion_model;
    std::string vae;                 // --vae
    std::string clip_l;              // --clip_l
    std::string clip_g;              // --clip_g
    std::string t5xxl;               // --t5xxl
    std::string llm;                 // --llm: an LLM text encoder (Z-Image's Qwen3-4B)
    std::string llm_vision;          // --llm_vision: the LLM's vision tower (Qwen-Image-Edit's Qwen2.5-VL)
    std::string clip_vision;         // --clip_vision: CLIP vision (Wan 2.1 image-to-video's)
    // --tokenizer: PATH (CLIP's), or per encoder "t5xxl=PATH,llm=PATH,clip_l=PATH".
    std::string tokenizer;
    std::string embeddings;   // --embd-dir: textual-inversion embeddings
    std::string control_net;  // --control-net: a ControlNet for the UNet (models/nets/controlnet.h)
    // --taesd: a tiny autoencoder's decoder (models/nets/taesd.h) for --preview
    // tae and, unless ModelOptions::taesd_preview_only, the final decode.
    std::string taesd;
};

// --lora-apply-mode: how a LoRA changes a weight (pipeline/loras.h).
enum class LoraApplyMode {
    Auto,         // merged into float weights, beside quantized ones at run time
    Immediately,  // merged into every weight it changes (quantized ones requantized)
    AtRuntime,    // beside every weight, as a low-rank product in the graph
};

struct ModelOptions {
    std::optional<ggml_type> weight_type;  // --type
    io::TensorTypeRules tensor_type_rules;  // --tensor-type-rules, before --type
    std::optional<Prediction> prediction;  // --prediction; default: metadata, else the family's
    int threads = 0;
    // --backend (module -> device), --params-backend, --offload-to-cpu,
    // --auto-fit and --max-vram (pipeline/placement.h).
    PlacementRequest placement;
    runtime::ExecutorOptions executor;  // --disable-segmented-compute, --disable-prefetch
    bool eager_load = false;            // --eager-load: read every module's weights at start
    bool plan_only = false;             // kiln plan / --dry-run: place modules, load no weights
    std::string lora_dir;               // --lora-model-dir: where <lora:NAME:W> finds NAME
    LoraApplyMode lora_apply_mode = LoraApplyMode::Auto;
    // --taesd-preview-only: the tiny autoencoder makes previews only; the
    // final image still comes from the VAE.
    bool taesd_preview_only = false;
    // --qwen-image-zero-cond-t: Qwen-Image-Edit-2511's reference tokens at
    // timestep 0, for files that do not say so (__index_timestep_zero__).
    bool zero_cond_t = false;
    // The job auto-fit checks its placement against (0: the model's
    // defaults), and its hires fix (pipeline/request.h).
    int job_width = 0;
    int job_height = 0;
    std::optional<HiresFix> job_hires;
};

// --tokenizer: a path (CLIP's tokenizer, the flag's meaning in sd-cli), or
// per encoder "t5xxl=PATH" / "llm=PATH" / "clip_l=PATH", comma-separated. An
// item that is not ENCODER=PATH, or an unknown encoder, is an invalid request.
struct TokenizerPaths {
    std::string clip;
    std::string t5;
    std::string llm;
};
Result<TokenizerPaths> parse_tokenizer_flag(const std::string& value);

// The family's defaults, overridden by a file's "kiln.default.*" metadata.
using ModelDefaults = models::Defaults;

// One network of the model and its runner: the network (any of the
// registry's, held by the seam of models/network.h), the weights it declared
// (their residency is the runtime's), where its graphs compute and the
// executor that runs them.
struct Module {
    models::ModuleSpec spec;
    std::string prefix;  // where its tensors live in `file`
    const io::ModelFile* file = nullptr;
    // Declared before the network: the network's tensors live in them.
    std::unique_ptr<runtime::ModuleWeights> params;
    std::unique_ptr<models::Network> network;
    std::unique_ptr<runtime::Executor> executor;
    // Where its graphs compute (placement decides; the graph builders take
    // it as a build option).
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    // Placement's record for its role, its executor's name ("te",
    // "te.clip_g"), the backend its weights load for, and the buffer type
    // its params live in (null: RAM or the mapped file).
    ModulePlacement* placement = nullptr;
    std::string executor_name;
    ggml_backend_t backend = nullptr;
    ggml_backend_buffer_type_t params_buft = nullptr;

    runtime::ModuleWeights& weights() { return *params; }
    const runtime::ModuleWeights& weights() const { return *params; }
    const char* role() const { return models::module_role_name(spec.role); }
};

// A text encoder as the family's conditioning uses it.
struct TextEncoder {
    const models::TextEncoderUse* use = nullptr;
    const models::TextEncoderNetwork* network = nullptr;
    runtime::Executor* executor = nullptr;
    const runtime::ModuleWeights* weights = nullptr;
    // A CLIP's textual-inversion vectors (--embd-dir), for the token ids
    // after the tokenizer's vocabulary.
    EmbeddingTable embeddings;

    // The width of what it gives per token: its hidden states, or several
    // layers' side by side (TextEncoderUse::hidden_states).
    int64_t width() const {
        return network->width() * std::max<int64_t>(1, static_cast<int64_t>(use->hidden_states.size()));
    }
};

class Model;

// The job's seams on the model's targets while this lives (Model::seams).
class SeamsScope {
  public:
    SeamsScope(Model& model, nn::Seams seams);
    ~SeamsScope();
    SeamsScope(const SeamsScope&) = delete;
    SeamsScope& operator=(const SeamsScope&) = delete;

  private:
    Model& model_;
    nn::Seams before_;
};

class Model {
  public:
    // Opens the files, detects the family and builds its modules; errors name
    // the file and what is missing ("no clip_g found in ...; pass --clip_g").
    static Result<std::unique_ptr<Model>> load(const ModelPaths& paths, const ModelOptions& options);
    ~Model();

    const models::Family& family() const { return *family_; }
    // The family and its variant ("SD1.x inpainting"), for messages.
    const std::string& family_label() const { return family_label_; }
    const std::string& name() const { return name_; }  // the model file's stem, for image metadata
    // The one file -m (or --diffusion-model without -m) named, whose stem is
    // name(): what image metadata's "Model hash" is of; "" for a diffusers
    // folder, several -m files or a split file, which have no one hash.
    const std::string& model_file() const { return model_file_; }
    Prediction prediction() const { return prediction_; }
    const ModelDefaults& defaults() const { return defaults_; }
    // The family's scale unless the metadata ("kiln.vae.scale_factor") says otherwise.
    float latent_scale() const { return latent_scale_; }
    // latent = (VAE latent - shift) * scale (Flux: 0.1159).
    float latent_shift() const { return latent_format().shift; }
    // The family's latent format of this model's VAE (Family::other_latents).
    const models::LatentFormat& latent_format() const;
    // Image sizes must be multiples of this: the VAE's downscale times the
    // UNet's 2^(levels-1) or the DiT's patch size.
    int size_stride() const;
    // The latent's channels (the VAE's).
    int64_t latent_channels() const { return vae().format().latent_channels; }
    // Whether --preview proj can show this model's latent: the family's
    // latent-to-RGB factors have one row per latent channel.
    bool has_latent_projection() const {
        return static_cast<int64_t>(latent_format().rgb_factors.size()) == latent_channels();
    }
    // The noise table of a width x height job of `steps` steps: the DDPM's,
    // or the flow schedule with --flow-shift (`flow_shift`) or the family's
    // shift (FLUX.2's depends on the steps).
    std::unique_ptr<NoiseSchedule> noise_schedule(int width, int height, int steps,
                                                  std::optional<float> flow_shift) const;

    // CLIP's tokenizer; only when the family has a CLIP encoder.
    bool has_clip_tokenizer() const { return tokenizer_ != nullptr; }
    const text::ClipTokenizer& tokenizer() const { return *tokenizer_; }
    // The tokenizer of an encoder (by its family's PromptLayout), loaded.
    const text::Tokenizer& tokenizer_of(const TextEncoder& encoder) const;
    // T5's tokenizer; only when the family has a T5 encoder.
    const text::T5Tokenizer& t5_tokenizer() const { return *t5_tokenizer_; }
    // The LLM's tokenizer; only when the family has an LLM encoder.
    const text::LlmTokenizer& llm_tokenizer() const { return *llm_tokenizer_; }
    // Textual-inversion vectors for token ids from the vocabulary's end on
    // (the first text encoder's width).
    // The text encoders in the order of the family's conditioning.
    const std::vector<TextEncoder>& text_encoders() const { return text_encoders_; }
    // The family's optional encoders no file held (SD3's T5): zeros stand
    // for their hidden states.
    const std::vector<const models::TextEncoderUse*>& absent_text_encoders() const { return absent_text_encoders_; }
    // A T5 of the family masks its padding out of the DiT's attention (Chroma).
    bool masks_text_padding() const {
        for (const TextEncoder& encoder : text_encoders_) {
            if (encoder.use->mask_padding) return true;
        }
        return false;
    }
    // The job's seams (--circular): while a SeamsScope lives, the targets of
    // the diffusion network, the ControlNet, the VAE and the tiny autoencoder
    // carry them, so every graph the job builds (previews, tiles and hires
    // passes too) wraps the image's edges. The vision tower's and text
    // encoders' never do: they read input images and prompts.
    nn::Seams seams() const { return seams_; }
    nn::ComputeTarget with_seams(nn::ComputeTarget target) const { return {target.place, seams_}; }
    // The diffusion network (a UNet, a DiT) by its interface: what it takes
    // is capabilities(), never its kind.
    // While the high-noise expert is in use (use_high_noise_expert), these
    // four are the expert's: the steps it samples run the same code.
    const models::DiffusionNetwork& diffusion() const { return *sampling()->network->as_diffusion(); }
    const runtime::ModuleWeights& diffusion_weights() const { return sampling()->weights(); }
    // The family's autoencoder by its interface (models/network.h).
    const models::AutoencoderNetwork& vae() const { return *vae_->network->as_autoencoder(); }
    const runtime::ModuleWeights& vae_weights() const { return vae_->weights(); }
    runtime::Executor& diffusion_compute() { return *sampling()->executor; }
    nn::ComputeTarget diffusion_target() const { return with_seams(sampling()->target); }
    // Wan 2.2 A14B's high-noise expert (--high-noise-diffusion-model): a
    // second diffusion module ("diffusion.high_noise") of the main one's
    // shape, placed with it, its weights and copies in the same books, so a
    // budget that holds one expert evicts it when the other starts
    // (pipeline/experts.h).
    bool has_high_noise_expert() const { return high_noise_ != nullptr; }
    void use_high_noise_expert(bool on) { high_noise_in_use_ = on && high_noise_ != nullptr; }
    bool high_noise_expert_in_use() const { return high_noise_in_use_; }
    // The high-noise expert's executor and its file's stem (image metadata);
    // only with has_high_noise_expert().
    runtime::Executor& high_noise_compute() { return *high_noise_->executor; }
    std::string high_noise_expert_name() const;
    nn::ComputeTarget vae_target() const { return with_seams(vae_->target); }
    runtime::Executor& vae_compute() { return *vae_->executor; }
    // The vision tower, a "te" module: the LLM's (Qwen-Image-Edit's, from
    // --llm_vision or the --llm file's visual.*) or CLIP vision (Wan 2.1
    // image-to-video's, from --clip_vision); only when has_vision().
    bool has_vision() const { return vision_ != nullptr; }
    const models::VisionEncoderNetwork& vision() const { return *vision_->network->as_vision_encoder(); }
    runtime::Executor& vision_compute() { return *vision_->executor; }
    nn::ComputeTarget vision_target() const { return vision_->target; }
    // --taesd's decoder, a module of the "vae" role (placed and budgeted with
    // the VAE); only when has_taesd().
    bool has_taesd() const { return taesd_ != nullptr; }
    const models::Taesd& taesd() const { return static_cast<const models::Taesd&>(*taesd_->network); }
    runtime::Executor& taesd_compute() { return *taesd_->executor; }
    nn::ComputeTarget taesd_target() const { return with_seams(taesd_->target); }
    // Whether the final image is decoded by the tiny autoencoder (--taesd
    // without --taesd-preview-only, as sd-cli does) instead of the VAE.
    bool taesd_decodes_images() const { return taesd_ && !taesd_preview_only_; }
    // The ControlNet given with --control-net, a module of its own ("control").
    bool has_control_net() const { return control_ != nullptr; }
    const models::ControlNet& control_net() const { return static_cast<const models::ControlNet&>(*control_->network); }
    const runtime::ModuleWeights& control_weights() const { return control_->weights(); }
    runtime::Executor& control_compute() { return *control_->executor; }
    nn::ComputeTarget control_target() const { return with_seams(control_->target); }
    // The ControlNet file's stem, for image metadata.
    std::string control_net_name() const;
    // Every module, text encoders first, then diffusion, then the VAE, then
    // the ControlNet.
    const std::vector<std::unique_ptr<Module>>& modules() const { return modules_; }

    const std::vector<ModulePlacement>& placement() const { return placement_; }
    // --type: the weights are converted into RAM of their own, not read from
    // the mapped model file.
    bool converts_weights() const { return converts_weights_; }
    // The modules in placement's priority order: diffusion, ControlNet, text
    // encoders, VAE.
    const std::vector<Module*>& modules_by_priority() const { return by_priority_; }
    // Whether auto-fit chose the placement (--auto-fit, no --backend or
    // --params-backend): pipeline/auto_fit.h may then refine it.
    bool auto_fit() const { return auto_fit_; }
    // Keeps a module's params in RAM (weights are copied to its device when a
    // graph needs them), giving back what they held on the device's books.
    Status keep_params_in_ram(Module& module);
    // Loads every module's weights now (--eager-load) instead of when its
    // first graph runs.
    Status load_weights();
    const ModuleBytes& module_bytes() const { return module_bytes_; }
    // The ledgers of the devices in use, by device name.
    const std::map<std::string, std::shared_ptr<runtime::DeviceLedger>>& ledgers() const { return ledgers_; }
    // RAM's ledger (the CPU's, shared with every model of the process), which
    // counts a job's decoded images even when no module computes on the CPU.
    runtime::DeviceLedger& host_ledger() { return *host_ledger_; }
    // Frees the compute copies and workspaces the memory system keeps
    // between jobs (a job ended with an error, or the caller wants the room).
    void release_caches();
    // As release_caches(), and forgets which weights the stores' blocks
    // held: a module's extra weights (LoRA) were replaced, and new tensors
    // may reuse the old ones' addresses. The encoded constants go too.
    void forget_weight_copies();
    // What the weights make of a job's size alone, kept for the next job of
    // that size (VACE's all-grey inactive clip, pipeline/vace_context.cpp),
    // by a key that names what it is and the size.
    std::map<std::string, std::vector<float>>& encoded_constants() { return encoded_constants_; }

    // Cancellation (kiln_cancel): any thread may request it; generate()
    // clears it when a job starts and checks it at every denoising step, and
    // the executors before every graph they run.
    void request_cancel() { cancel_.store(true); }
    // --lora-model-dir and --lora-apply-mode; the LoRAs the modules carry now
    // (pipeline/loras.h keeps them), as "path\tstrength" lines.
    const std::string& lora_dir() const { return lora_dir_; }
    LoraApplyMode lora_apply_mode() const { return lora_apply_mode_; }
    std::string& applied_loras() { return applied_loras_; }
    // Bytes of LoRA weights counted on a device's ledger, to give back when they change.
    std::vector<std::pair<runtime::DeviceLedger*, uint64_t>>& lora_reservations() { return lora_reservations_; }
    void clear_cancel() {
        cancel_.store(false);
        interrupt_.store(false);
        skip_.store(false);
    }
    bool cancel_requested() const { return cancel_.load(); }
    // A1111's interrupt (kiln_interrupt): sampling stops at its next step and
    // the job ends with the image it has; cleared with the cancel.
    void request_interrupt() { interrupt_.store(true); }
    bool interrupt_requested() const { return interrupt_.load(); }
    // A1111's skip (kiln_skip): the same for the image being made alone; the
    // batch goes on. Taken (cleared) when that image is done.
    void request_skip() { skip_.store(true); }
    bool skip_requested() const { return skip_.load(); }
    bool take_skip() { return skip_.exchange(false); }
    // Sampling is to stop at the next step and keep what it has.
    bool cut_short() const { return interrupt_requested() || skip_requested(); }

  private:
    friend class SeamsScope;
    Model() = default;
    Status load_networks(const ModelPaths& paths, const ModelOptions& options);
    Status load_control_net(const std::string& path, const ModelOptions& options);
    Status load_taesd(const std::string& path, const ModelOptions& options);
    Status load_clip_tokenizer(const std::string& flag_path, const std::string& embeddings_dir);
    // Makes the module's weights and its network from the registry.
    Status create_network(Module& module, const models::NetworkOptions& options,
                          const ModelOptions& model_options) const;
    void report_tensor_type_rules(const io::TensorTypeRules& rules) const;
    // The diffusion network checked against what the encoders and VAE make.
    Status check_conditioning() const;
    Status load_llm_tokenizer(const std::string& flag_path, const TextEncoder& encoder);
    // Its tokenizer's ids fit the encoder's embedding table (BadFile otherwise).
    Status check_tokenizer_fits(const TextEncoder& encoder) const;
    Status read_metadata(const ModelOptions& options);
    // Placement's guess: executors, devices' books, params locations; the
    // weights load lazily from wherever the params are when first needed.
    Status place_modules(const ModelOptions& options);
    Status place_params(Module& module, runtime::ParamsLocation where);
    Result<ggml_backend_dev_t> device_of(const std::string& name) const;
    // Layer split: the executor's later devices (--backend diffusion=A&B).
    Status add_split_devices(Module& m, int threads);
    // The device's books, shared with every other model of the process.
    runtime::DeviceLedger& ledger_for(const std::string& name, ggml_backend_dev_t dev);

    std::vector<std::unique_ptr<io::ModelFile>> files_;
    const models::Family* family_ = nullptr;
    std::string family_label_, name_, model_file_;
    Prediction prediction_ = Prediction::Eps;
    ModelDefaults defaults_;
    float latent_scale_ = 0.18215f;
    std::unique_ptr<text::ClipTokenizer> tokenizer_;
    std::unique_ptr<text::T5Tokenizer> t5_tokenizer_;
    std::unique_ptr<text::LlmTokenizer> llm_tokenizer_;
    std::vector<ModulePlacement> placement_;
    std::vector<Module*> by_priority_;
    runtime::BudgetSpec budgets_;
    bool auto_fit_ = false;
    ModuleBytes module_bytes_;
    // The networks (their weights) outlive this model's hold on the stores
    // that keep copies of them, and the stores outlive the executors that
    // use them: ~Model() ends the executors, drops the copies from the
    // stores, gives back the params bytes it reserved, then the rest.
    std::vector<std::unique_ptr<Module>> modules_;
    std::vector<TextEncoder> text_encoders_;
    std::vector<const models::TextEncoderUse*> absent_text_encoders_;
    // The device books this model uses (runtime/device_books.h, shared).
    std::map<std::string, std::shared_ptr<runtime::DeviceLedger>> ledgers_;
    std::map<std::string, std::shared_ptr<runtime::WeightStore>> stores_;
    std::shared_ptr<runtime::DeviceLedger> host_ledger_;
    bool converts_weights_ = false;
    // Params kept on a device, by executor name: the ledger and the bytes.
    std::map<std::string, std::pair<runtime::DeviceLedger*, uint64_t>> reserved_params_;
    Module* diffusion_ = nullptr;
    Module* high_noise_ = nullptr;
    bool high_noise_in_use_ = false;
    nn::Seams seams_;
    // The diffusion module a sampling step runs: the main one, or the high-noise expert in use.
    const Module* sampling() const { return high_noise_in_use_ ? high_noise_ : diffusion_; }
    Module* sampling() { return high_noise_in_use_ ? high_noise_ : diffusion_; }
    // The high-noise expert is the main network's kind, shape and width (BadFile otherwise).
    Status check_high_noise_expert() const;
    Status check_image_context() const;
    Module* vae_ = nullptr;
    Module* control_ = nullptr;
    Module* taesd_ = nullptr;
    Module* vision_ = nullptr;
    ModulePlacement vision_placement_;  // its role's device, params in RAM (Model::place_modules)
    bool taesd_preview_only_ = false;
    std::atomic<bool> cancel_{false};
    std::atomic<bool> interrupt_{false};
    std::atomic<bool> skip_{false};
    std::string lora_dir_;
    LoraApplyMode lora_apply_mode_ = LoraApplyMode::Auto;
    std::string applied_loras_;
    std::map<std::string, std::vector<float>> encoded_constants_;
    std::vector<std::pair<runtime::DeviceLedger*, uint64_t>> lora_reservations_;
};

}  // namespace kiln::pipeline
