// What a model file holds, read from tensor names and shapes alone: its
// components (diffusion model, text encoders, VAE, others),
// each with tensor count, dtypes and bytes. This is what `kiln info` prints
// and what a loader uses to route tensors to the right module.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/model_file.h"

namespace kiln::io {

enum class ComponentKind { DiffusionModel, TextEncoder, Vae, Other };
const char* component_kind_name(ComponentKind kind);

struct ComponentSummary {
    ComponentKind kind = ComponentKind::Other;
    std::string name;    // "unet", "clip_l", "open_clip_h", "vae", ...
    std::string prefix;  // tensor-name prefix shared by its tensors ("" if none)
    size_t tensor_count = 0;
    uint64_t bytes = 0;
    int64_t parameters = 0;
    std::map<std::string, size_t> dtype_counts;  // "F16" -> 686
};

// The family is the registry's to say (models/registry.h).
struct ModelSummary {
    std::vector<ComponentSummary> components;  // in the order above, Others last
    size_t tensor_count = 0;
    uint64_t bytes = 0;
};

ModelSummary summarize_model(const ModelFile& model);

}  // namespace kiln::io
