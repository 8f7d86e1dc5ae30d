// The weights of one module (text encoder, UNet, VAE): the model declares
// each tensor it needs by its name under the module's prefix and the shape it
// expects; load() checks the file agrees, allocates them on a backend and
// fills them from the model file, converted tensor by tensor to their compute
// type (tensor_convert.h). A wrong or missing tensor is an error naming it,
// found before any graph is built, so ggml never sees inconsistent shapes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "io/model_file.h"
#include "util/result.h"

namespace kiln::runtime {

class ModuleWeights {
  public:
    // `prefix` is prepended to every name ("model.diffusion_model.").
    // `weight_type`: --type, applied to matrices (compute_type's rule).
    ModuleWeights(const io::ModelFile& file, std::string prefix, std::optional<ggml_type> weight_type);
    ~ModuleWeights();
    ModuleWeights(const ModuleWeights&) = delete;
    ModuleWeights& operator=(const ModuleWeights&) = delete;

    // Declares a tensor. `shape` is outermost first as in PyTorch; -1 accepts
    // any size. Returns a tensor usable in graphs (data arrives with load()).
    // On a problem, records an error (reported by load()) and returns a
    // placeholder of the expected shape so declaration can go on.
    ggml_tensor* require(const std::string& name, const std::vector<int64_t>& shape);
    // As require(), held in F32 whatever the file and --type say: for tensors
    // used in element-wise ops (ggml adds F32 only), such as position embeddings.
    ggml_tensor* require_f32(const std::string& name, const std::vector<int64_t>& shape);
    // As require(), or nullptr when the file does not have the tensor.
    ggml_tensor* optional(const std::string& name, const std::vector<int64_t>& shape);
    bool has(const std::string& name) const;
    // The file's entry, or nullptr.
    const io::TensorInfo* info(const std::string& name) const;

    // Allocates every declared tensor on `backend` and copies the data in.
    // Fails with the first declaration problem or conversion error.
    Status load(ggml_backend_t backend);
    size_t bytes() const;
    size_t count() const { return declared_.size(); }

  private:
    ggml_tensor* declare(const std::string& name, const std::vector<int64_t>& shape,
                         std::optional<ggml_type> force_type);

    const io::ModelFile& file_;
    std::string prefix_;
    std::optional<ggml_type> weight_type_;
    ggml_context* ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    std::vector<std::pair<ggml_tensor*, const io::TensorInfo*>> declared_;
    std::vector<std::string> errors_;
};

}  // namespace kiln::runtime
