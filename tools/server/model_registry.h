// The models a server offers: every model file and diffusers folder under
// --model-dir (or the one -m model), named by their path relative to it.
// Names resolve only inside the folder. Contexts are loaded on first use and
// kept while memory allows: the least recently used is freed when a load
// runs out of memory or more than --max-loaded-models are loaded.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "job_request.h"
#include "server_options.h"

namespace kiln::server {

struct ModelEntry {
    std::string name;    // "sd15.safetensors", "sdxl/base-diffusers": what requests name
    std::string path;    // the file or folder
    std::string family;  // as `kiln info` says ("SD1.x"), or "" when it could not tell
};

// A file a request may name as a model's separate part: what ComfyUI
// keeps in vae/ and text_encoders/ (or clip/), A1111 in VAE/. Named by its
// path in the model folder ("text_encoders/t5xxl_fp16.safetensors").
struct PartEntry {
    std::string name;
    std::string path;
    std::string kind;  // "vae" or "text_encoder"
};

// One device's memory books (kiln_memory_devices) as they stand.
struct DeviceMemory {
    std::string name;      // "RPC0", "CPU"
    uint64_t managed = 0;  // bytes counted now
    uint64_t peak = 0;     // the most counted at once since the device's books were opened
    uint64_t budget = 0;   // --max-vram's budget, 0 for none
};

// A load error in a request's terms where the server has a model folder:
// "pass --llm" becomes the request field that names the part.
std::string in_request_terms(const std::string& message);

class ModelRegistry {
  public:
    explicit ModelRegistry(const ServerOptions& options);
    ~ModelRegistry();
    ModelRegistry(const ModelRegistry&) = delete;
    ModelRegistry& operator=(const ModelRegistry&) = delete;

    // The models now on disk (the folder is read again each time, so models
    // copied in while the server runs are offered). Any thread.
    std::vector<ModelEntry> list();
    // The model `name` names: "" gives the default one. 400 naming `field`
    // for a path out of the folder (../, absolute, a symlink out) or a name
    // that is no model there. Any thread.
    ModelEntry resolve(const std::string& name, const std::string& field);

    // The model requests without a name get (A1111's sd_model_checkpoint):
    // the one set, else the first listed whose family kiln runs; "" for none.
    std::string default_model();
    void set_default_model(const std::string& name);

    // The part files of the folder (none without --model-dir). Any thread.
    std::vector<PartEntry> parts();
    // The part `name` names (its path in the folder, or its path in its
    // kind's folder); 400 naming `field` for one that is not listed.
    PartEntry resolve_part(const std::string& name, const std::string& field);

    // The loaded context for `model` with `parts`, loading it (and evicting
    // others) as needed. Only the job worker calls this, and it alone uses the contexts.
    kiln_status acquire(const ModelEntry& model, const ModelParts& parts, kiln_context** ctx, std::string* error);
    // The names of the loaded models, most recently used first. Any thread.
    std::vector<std::string> loaded();

    // The books of the devices the loaded models use, read now (a running
    // job's too), one entry per device: the models of the process share
    // each device's books. Any thread.
    std::vector<DeviceMemory> memory();

  private:
    void evict_least_recent();

    const ServerOptions& options_;
    std::mutex mutex_;
    std::string default_model_;
    std::map<std::string, std::string> family_cache_;  // path -> family
    std::set<std::string> warned_links_;               // symlinks out of the folder, reported once
    struct Loaded {
        std::string name;
        std::string parts;  // ModelParts::describe(): one model loaded with other parts is another context
        kiln_context* ctx;
    };
    std::list<Loaded> loaded_;  // most recently used first; a context leaves it before it is freed
};

}  // namespace kiln::server
