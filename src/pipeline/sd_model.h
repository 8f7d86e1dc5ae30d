// A loaded Stable Diffusion 1.x / 2.x model: its files, tokenizer, text
// encoder, UNet and VAE, each run by an executor on the device placement
// chose (pipeline/placement.h, runtime/executor.h). Which modules and
// which family come from the tensors (io/model_summary.h, models/*).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "models/vae.h"
#include "pipeline/clip_tokenizer.h"
#include "pipeline/denoiser.h"
#include "pipeline/embeddings.h"
#include "pipeline/placement.h"
#include "runtime/device_budget.h"
#include "runtime/executor.h"
#include "runtime/weight_store.h"
#include "util/result.h"

namespace kiln::pipeline {

struct ModelPaths {
    std::vector<std::string> model;  // -m: checkpoint(s) or a diffusers folder
    std::string diffusion_model;     // --diffusion-model
    std::string vae;                 // --vae
    std::string clip_l;              // --clip_l
    std::string tokenizer;           // --tokenizer
    std::string embeddings;          // --embd-dir: textual-inversion embeddings
};

struct ModelOptions {
    std::optional<ggml_type> weight_type;  // --type
    std::optional<Prediction> prediction;  // --prediction; default: metadata, else eps
    int threads = 0;
    // --backend (module -> device), --params-backend, --offload-to-cpu,
    // --auto-fit and --max-vram (pipeline/placement.h).
    PlacementRequest placement;
    runtime::ExecutorOptions executor;  // --disable-segmented-compute, --disable-prefetch
    bool eager_load = false;            // --eager-load: read every module's weights at start
    bool plan_only = false;             // kiln plan / --dry-run: place modules, load no weights
    // The job auto-fit checks its placement against (0: the model's defaults).
    int job_width = 0;
    int job_height = 0;
};

// Defaults a model file may carry in its metadata ("kiln.default.*").
struct ModelDefaults {
    int width = 512;
    int height = 512;
    int steps = 20;
    float cfg_scale = 7.0f;
    std::string sampler = "euler_a";
    std::string scheduler = "discrete";
};

class StableDiffusionModel {
  public:
    // Opens the files, detects the family and builds the modules; errors name
    // the file and what is missing ("no VAE in ...; pass --vae").
    static Result<std::unique_ptr<StableDiffusionModel>> load(const ModelPaths& paths, const ModelOptions& options);

    const std::string& family() const { return family_; }
    const std::string& name() const { return name_; }  // the model file's stem, for image metadata
    Prediction prediction() const { return prediction_; }
    const ModelDefaults& defaults() const { return defaults_; }
    // 0.18215 for SD1/SD2 unless the metadata says otherwise.
    float latent_scale() const { return latent_scale_; }
    // SD1: 1 (last layer); SD2: 2 (penultimate).
    int default_clip_skip() const { return default_clip_skip_; }
    // 49407 (EOS) for SD1's CLIP; 0 for SD2's OpenCLIP.
    int32_t pad_token() const { return pad_token_; }

    const ClipTokenizer& tokenizer() const { return *tokenizer_; }
    // Textual-inversion vectors for token ids from the vocabulary's end on.
    const EmbeddingTable& embeddings() const { return embeddings_; }
    const models::ClipTextEncoder& text_encoder() const { return *clip_; }
    const models::Unet& unet() const { return *unet_; }
    const models::Vae& vae() const { return *vae_; }
    // Each module's runner under the memory system.
    runtime::Executor& text_encoder_compute() { return *te_executor_; }
    runtime::Executor& diffusion_compute() { return *diffusion_executor_; }
    runtime::Executor& vae_compute() { return *vae_executor_; }
    const std::vector<ModulePlacement>& placement() const { return placement_; }
    const ModuleBytes& module_bytes() const { return module_bytes_; }
    // The ledgers of the devices in use, by device name.
    const std::map<std::string, std::unique_ptr<runtime::DeviceLedger>>& ledgers() const { return ledgers_; }
    // Frees the compute copies and workspaces the memory system keeps
    // between jobs (a job ended with an error, or the caller wants the room).
    void release_caches();

  private:
    StableDiffusionModel() = default;
    Status place_modules(const ModelOptions& options);

    std::vector<std::unique_ptr<io::ModelFile>> files_;
    std::string family_, name_;
    Prediction prediction_ = Prediction::Eps;
    ModelDefaults defaults_;
    float latent_scale_ = 0.18215f;
    int default_clip_skip_ = 1;
    int32_t pad_token_ = 49407;
    std::unique_ptr<ClipTokenizer> tokenizer_;
    EmbeddingTable embeddings_;
    std::unique_ptr<models::ClipTextEncoder> clip_;
    std::unique_ptr<models::Unet> unet_;
    std::unique_ptr<models::Vae> vae_;
    std::vector<ModulePlacement> placement_;
    ModuleBytes module_bytes_;
    // Declared before the executors: they unregister from the stores.
    std::map<std::string, std::unique_ptr<runtime::DeviceLedger>> ledgers_;
    std::map<std::string, std::unique_ptr<runtime::WeightStore>> stores_;
    std::unique_ptr<runtime::Executor> te_executor_;
    std::unique_ptr<runtime::Executor> diffusion_executor_;
    std::unique_ptr<runtime::Executor> vae_executor_;
};

}  // namespace kiln::pipeline
