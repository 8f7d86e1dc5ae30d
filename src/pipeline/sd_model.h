// A loaded Stable Diffusion 1.x / 2.x model: its files, tokenizer, text
// encoder, UNet and VAE, with weights on the CPU backend. Which modules and
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
#include "runtime/compute.h"
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
    // --backend: module ("diffusion", "te", "vae") -> ggml device name; a
    // module not named computes on the CPU.
    std::map<std::string, std::string> placement;
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
    // Where each module's graphs run (several modules may share one).
    runtime::Compute& text_encoder_compute() { return *te_compute_; }
    runtime::Compute& diffusion_compute() { return *diffusion_compute_; }
    runtime::Compute& vae_compute() { return *vae_compute_; }

  private:
    StableDiffusionModel() = default;

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
    std::vector<std::unique_ptr<runtime::Compute>> computes_;  // one per device used
    runtime::Compute* te_compute_ = nullptr;
    runtime::Compute* diffusion_compute_ = nullptr;
    runtime::Compute* vae_compute_ = nullptr;
};

}  // namespace kiln::pipeline
