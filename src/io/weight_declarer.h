// The declaring half of a network's weights: a network (src/models/nets/)
// and the building blocks it is made of (src/nn/) name each tensor they need
// and the shape they expect, and get back a tensor to build graphs with.
// Where the data lives and when it arrives (residency, budgets, params
// locations) is the implementation's business: runtime::ModuleWeights for a
// model, so networks never include a runtime header.
//
// Contract of every declaration: `name` is relative to prefix(); `shape` is
// outermost first as in PyTorch, -1 accepting any size. A problem (missing,
// wrong shape, unusable dtype) is recorded and reported when the weights are
// loaded, naming the tensor, and a placeholder of the expected shape is
// returned so declaration can go on: a network declares everything, then the
// caller learns every problem at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"
#include "io/model_file.h"

namespace kiln::io {

class WeightDeclarer {
  public:
    virtual ~WeightDeclarer() = default;

    // The file the tensors come from, for configuration from its tensors
    // and metadata before declaring.
    virtual const ModelFile& file() const = 0;
    // Prepended to every declared name ("model.diffusion_model.").
    virtual const std::string& prefix() const = 0;

    virtual ggml_tensor* require(const std::string& name, const std::vector<int64_t>& shape) = 0;
    // As require(), held in F32 whatever the file and --type say: for tensors
    // used in element-wise ops (ggml adds F32 only), such as position embeddings.
    virtual ggml_tensor* require_f32(const std::string& name, const std::vector<int64_t>& shape) = 0;
    // As require(), or nullptr when the file does not have the tensor.
    virtual ggml_tensor* optional(const std::string& name, const std::vector<int64_t>& shape) = 0;
    virtual bool has(const std::string& name) const = 0;
    // The file's entry for a name under prefix(), or nullptr.
    virtual const TensorInfo* info(const std::string& name) const = 0;
};

}  // namespace kiln::io
