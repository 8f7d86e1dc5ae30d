// The weights of one module (text encoder, UNet, VAE): the model declares
// each tensor it needs by its name under the module's prefix and the shape it
// expects; load() checks the file agrees, allocates them on a backend and
// fills them from the model file, converted tensor by tensor to their compute
// type (tensor_convert.h). A wrong or missing tensor, or one of a dtype the
// network cannot compute with (integer or boolean), is an error naming it,
// found before any graph is built, so ggml never sees inconsistent shapes.
//
// Where the weights live between uses is the module's params location:
// on its compute device (bound once, the plain case), in RAM (a host copy;
// the memory system makes compute copies on the device when a segment needs
// them) or on disk (no copy at all: each compute copy is read again from the
// model file). The tensors handed to graphs are always the compute tensors;
// for host and disk params they are bound to device memory by the weight
// residency manager (runtime/weight_residency.h) only while needed.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml-backend.h"
#include "io/model_file.h"
#include "io/tensor_type_rules.h"
#include "io/weight_declarer.h"
#include "runtime/weight_patches.h"
#include "util/result.h"

namespace kiln::runtime {

enum class ParamsLocation { ComputeDevice, Host, OtherDevice, Disk };

// Marks a buffer of weights on a device as ggml's weights usage, which is
// what lets ggml's RPC client send a large tensor as its hash to a server
// that keeps a tensor cache (kiln rpc-server --cache). Host buffers are left
// unmarked: ggml's scheduler would then run their ops on the backend
// holding the weights, where kiln's CPU compute lets BLAS take them.
void mark_weight_buffer(ggml_backend_buffer_t buffer);

// "device", "cpu", "other device", "disk".
const char* params_location_name(ParamsLocation location);

// The declaring interface (io/weight_declarer.h) with residency behind it.
class ModuleWeights final : public io::WeightDeclarer {
  public:
    // `prefix` is prepended to every name ("model.diffusion_model.").
    // `types`: --type and --tensor-type-rules, applied to matrices
    // (compute_type's rule).
    ModuleWeights(const io::ModelFile& file, std::string prefix, io::WeightTypeRequest types);
    ModuleWeights(const io::ModelFile& file, std::string prefix, std::optional<ggml_type> weight_type)
        : ModuleWeights(file, std::move(prefix), io::WeightTypeRequest{weight_type, {}, {}}) {}
    ~ModuleWeights();
    ModuleWeights(const ModuleWeights&) = delete;
    ModuleWeights& operator=(const ModuleWeights&) = delete;

    // io::WeightDeclarer. Declared tensors are usable in graphs; their data
    // arrives with load().
    const io::ModelFile& file() const override { return file_; }
    const std::string& prefix() const override { return prefix_; }
    ggml_tensor* require(const std::string& name, const std::vector<int64_t>& shape) override;
    ggml_tensor* require_f32(const std::string& name, const std::vector<int64_t>& shape) override;
    ggml_tensor* optional(const std::string& name, const std::vector<int64_t>& shape) override;
    bool has(const std::string& name) const override;
    const io::TensorInfo* info(const std::string& name) const override;

    // The declaration problems (a missing tensor, a wrong shape or dtype), as
    // one error (BadFile) naming the first; Ok when there are none. The
    // loader asks right after a network declared itself, so kiln plan and a
    // job refuse the same files with the same words.
    Status declaration_status() const;
    // Allocates every declared tensor on `backend` and copies the data in
    // (on the CPU, tensors stored as computed point into the mapped file
    // instead). Fails with the first declaration problem or conversion error.
    Status load(ggml_backend_t backend);
    // Places the params: ComputeDevice is load(compute_backend); Host and
    // OtherDevice fill a copy in `params_buft` (RAM, or another device's
    // memory) and leave the compute tensors unbound; Disk checks the
    // declarations and reads nothing.
    Status load_params(ParamsLocation location, ggml_backend_t compute_backend,
                       ggml_backend_buffer_type_t params_buft = nullptr);
    // Bytes the params take in `buft` (alignment included).
    uint64_t allocation_size(ggml_backend_buffer_type_t buft) const;
    bool loaded() const { return buffer_ || !mapped_.empty() || host_buffer_ || location_ == ParamsLocation::Disk; }
    ParamsLocation params_location() const { return location_; }
    // Records where the params will be before they are loaded, so plans
    // made before loading (lazy loading, kiln plan) see it.
    void set_params_location(ParamsLocation location) { location_ = location; }
    // Bytes allocated on the compute device by load() (0 for host/disk params).
    size_t bytes() const;
    // Bytes of all declared tensors in their compute types.
    uint64_t declared_bytes() const;
    size_t count() const { return declared_.size(); }
    // How many declared tensors each of --tensor-type-rules' rules matched.
    const std::vector<size_t>& rule_matches() const { return rule_matches_; }

    // Weights from outside the model file (LoRA factors, merged layers):
    // one set at a time, replaced whole between jobs, the base weights
    // untouched. They live where the module's params live (allocated now on
    // the compute device, or in RAM for host, other-device and disk params,
    // whose compute copies the memory system makes as for any weight), and
    // count as this module's weights in owns(), declared_bytes() and
    // params_data(). `patches` says how graphs use them (apply_patches).
    struct Extra {
        std::string name;
        std::vector<int64_t> ne;  // ggml order, innermost first
        ggml_type type = GGML_TYPE_F32;
        std::vector<uint8_t> data;  // ggml_nbytes of it
    };
    // Returns the tensors made for `extras`, in order, to key `patches` on
    // (set_patches). An empty list removes the current set.
    Result<std::vector<ggml_tensor*>> set_extras(std::vector<Extra> extras, ggml_backend_t compute_backend);
    void set_patches(WeightPatches patches) { patches_ = std::move(patches); }
    const WeightPatches& patches() const { return patches_; }
    // The graph ending at `out` with this module's patches applied (every
    // graph builder passes its output through this).
    ggml_tensor* apply_patches(ggml_context* ctx, ggml_tensor* out) const {
        return apply_weight_patches(ctx, out, patches_);
    }
    // Bytes of the extras (counted in declared_bytes()).
    uint64_t extra_bytes() const;
    // The declared weights, in declaration order, with their file entries.
    const std::vector<std::pair<ggml_tensor*, const io::TensorInfo*>>& declared() const { return declared_; }

    // Whether `tensor` is one of this module's compute tensors.
    bool owns(const ggml_tensor* tensor) const;
    // The compute-type bytes of a compute tensor from its params: a pointer
    // into the RAM copy (Host; `staging` untouched), or the tensor copied
    // from the other device or read and converted from the model file into
    // `staging`.
    Result<const void*> params_data(const ggml_tensor* tensor, std::vector<uint8_t>& staging) const;

  private:
    // The type --type or the first matching rule asks for the tensor `name`
    // (`full` in the file), counted in rule_matches().
    std::optional<ggml_type> requested_type(const std::string& name, const std::string& full);
    ggml_tensor* declare(const std::string& name, const std::vector<int64_t>& shape,
                         std::optional<ggml_type> force_type);
    Status load_mapped();
    // Writes the file's tensor `info`, in `compute`'s type, into `target`.
    Status fill(ggml_tensor* target, const io::TensorInfo& info, const ggml_tensor* compute) const;

    const io::ModelFile& file_;
    std::string prefix_;
    io::WeightTypeRequest types_;
    std::vector<size_t> rule_matches_;
    ggml_context* ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    // On the CPU: the model file's mappings, which weights stored as
    // computed point into (load_mapped).
    std::vector<ggml_backend_buffer_t> mapped_;
    ParamsLocation location_ = ParamsLocation::ComputeDevice;
    // Host / other-device params: a twin of each compute tensor.
    ggml_context* host_ctx_ = nullptr;
    ggml_backend_buffer_t host_buffer_ = nullptr;
    std::unordered_map<const ggml_tensor*, std::pair<const io::TensorInfo*, ggml_tensor*>> by_tensor_;
    std::vector<std::pair<ggml_tensor*, const io::TensorInfo*>> declared_;
    std::vector<std::string> errors_;
    // set_extras(): the tensors, their buffer, and host twins when the
    // params are not on the compute device.
    void free_extras();
    ggml_context* extra_ctx_ = nullptr;
    ggml_context* extra_host_ctx_ = nullptr;
    ggml_backend_buffer_t extra_buffer_ = nullptr;
    std::vector<ggml_tensor*> extras_;
    WeightPatches patches_;
};

}  // namespace kiln::runtime
