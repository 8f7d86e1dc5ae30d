#include "runtime/module_weights.h"

#include <algorithm>

#include "ggml-alloc.h"
#include "ggml-cpu.h"
#include "io/tensor_convert.h"

namespace kiln::runtime {
namespace {

// Enough tensor slots for the largest module kiln loads.
constexpr size_t kMaxModuleTensors = 8192;

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i)
        s += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
    return s + "]";
}

}  // namespace

ModuleWeights::ModuleWeights(const io::ModelFile& file, std::string prefix, io::WeightTypeRequest types)
    : file_(file), prefix_(std::move(prefix)), types_(std::move(types)), rule_matches_(types_.rules.size(), 0) {
    ggml_init_params params{ggml_tensor_overhead() * kMaxModuleTensors, nullptr, /*no_alloc=*/true};
    ctx_ = ggml_init(params);
}

const char* params_location_name(ParamsLocation location) {
    switch (location) {
        case ParamsLocation::ComputeDevice: return "device";
        case ParamsLocation::Host: return "cpu";
        case ParamsLocation::OtherDevice: return "other device";
        case ParamsLocation::Disk: return "disk";
    }
    return "?";
}

ModuleWeights::~ModuleWeights() {
    free_extras();
    if (buffer_) ggml_backend_buffer_free(buffer_);
    for (ggml_backend_buffer_t mapped : mapped_) ggml_backend_buffer_free(mapped);
    if (host_buffer_) ggml_backend_buffer_free(host_buffer_);
    if (host_ctx_) ggml_free(host_ctx_);
    if (ctx_) ggml_free(ctx_);
}

const io::TensorInfo* ModuleWeights::info(const std::string& name) const { return file_.find(prefix_ + name); }
bool ModuleWeights::has(const std::string& name) const { return info(name) != nullptr; }

ggml_tensor* ModuleWeights::optional(const std::string& name, const std::vector<int64_t>& shape) {
    return has(name) ? require(name, shape) : nullptr;
}

ggml_tensor* ModuleWeights::require(const std::string& name, const std::vector<int64_t>& shape) {
    return declare(name, shape, std::nullopt);
}

ggml_tensor* ModuleWeights::require_f32(const std::string& name, const std::vector<int64_t>& shape) {
    return declare(name, shape, GGML_TYPE_F32);
}

std::optional<ggml_type> ModuleWeights::requested_type(const std::string& name, const std::string& full) {
    if (types_.rules.empty()) return types_.all;
    std::vector<std::string> spellings{full};
    for (const std::string& prefix : types_.module_prefixes) spellings.push_back(prefix + name);
    const std::optional<size_t> rule = types_.rules.match(spellings);
    if (!rule) return types_.all;
    ++rule_matches_[*rule];
    return types_.rules.type(*rule);
}

ggml_tensor* ModuleWeights::declare(const std::string& name, const std::vector<int64_t>& shape,
                                    std::optional<ggml_type> force_type) {
    const std::string full = prefix_ + name;
    const io::TensorInfo* t = file_.find(full);
    std::vector<int64_t> actual = shape;
    for (int64_t& d : actual) d = d < 0 ? 1 : d;
    ggml_type type = GGML_TYPE_F32;
    if (!t) {
        errors_.push_back("missing tensor '" + full + "'");
    } else {
        // Aligned from the innermost dimension: leading dimensions of 1 hold
        // no data, and writers differ on them (ggml's GGUF writer drops
        // them, so Wan's [1, 6, dim] modulation can arrive as [6, dim]).
        bool match = true;
        const size_t rank = std::max(shape.size(), t->shape.size());
        for (size_t i = 0; match && i < rank; ++i) {
            const int64_t want = i < shape.size() ? shape[shape.size() - 1 - i] : 1;
            const int64_t have = i < t->shape.size() ? t->shape[t->shape.size() - 1 - i] : 1;
            match = want < 0 || want == have;
            if (match && i < shape.size()) actual[shape.size() - 1 - i] = have;
        }
        if (!match) {
            errors_.push_back("tensor '" + full + "' has shape " + t->shape_string() + ", expected " +
                              shape_text(shape));
            t = nullptr;
        } else if (!io::dtype_is_weight(t->dtype)) {
            // Caught here, before any graph: ggml's kernels abort on integer weights.
            errors_.push_back("tensor '" + full + "' has dtype " + io::dtype_name(t->dtype) +
                              "; weights must be floating point or quantized");
            t = nullptr;
        } else {
            type = force_type ? *force_type : io::compute_type(*t, requested_type(name, full));
        }
    }
    if (actual.size() > GGML_MAX_DIMS) {
        // A 3-D convolution's [out, in, kt, kh, kw] (Wan's CausalConv3d): ggml
        // has four dimensions, so the outer ones fold into the fourth, ne [kw,
        // kh, kt, in * out], as ggml_conv_3d takes its kernel. The bytes of a
        // contiguous tensor are the same either way.
        int64_t outer = 1;
        for (size_t d = 0; d + GGML_MAX_DIMS - 1 < actual.size(); ++d) outer *= actual[d];
        actual.erase(actual.begin(), actual.end() - (GGML_MAX_DIMS - 1));
        actual.insert(actual.begin(), outer);
    }
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    for (size_t d = 0; d < actual.size(); ++d) ne[d] = actual[actual.size() - 1 - d];
    ggml_tensor* tensor = ggml_new_tensor(ctx_, type, std::max<int>(1, static_cast<int>(actual.size())), ne);
    ggml_set_name(tensor, full.c_str());
    if (t) {
        declared_.emplace_back(tensor, t);
        by_tensor_[tensor] = {t, nullptr};
    }
    return tensor;
}

Status ModuleWeights::declaration_status() const {
    if (errors_.empty()) return Status::Ok();
    std::string message = errors_.front();
    if (errors_.size() > 1) message += " (and " + std::to_string(errors_.size() - 1) + " more problems)";
    return Error::bad_file(message);
}

void mark_weight_buffer(ggml_backend_buffer_t buffer) {
    if (buffer && !ggml_backend_buffer_is_host(buffer)) {
        ggml_backend_buffer_set_usage(buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
}

Status ModuleWeights::load(ggml_backend_t backend) {
    if (Status s = declaration_status(); !s.ok()) return s.error().in_context(file_.sources().front().path + ": ");
    if (buffer_ || !mapped_.empty()) return Status::Ok();
    if (ggml_backend_is_cpu(backend)) return load_mapped();
    buffer_ = ggml_backend_alloc_ctx_tensors(ctx_, backend);
    if (!buffer_ && !declared_.empty())
        return Error::out_of_memory("out of memory allocating " + prefix_ + "* weights");
    mark_weight_buffer(buffer_);
    for (auto& [tensor, info] : declared_) KILN_TRY(fill(tensor, *info, tensor));
    return Status::Ok();
}

Status ModuleWeights::load_mapped() {
    // Weights stored as they are computed point into the mapped model file:
    // no copy, no start-up time, and the page cache shares them. The rest
    // (converted, or re-quantised by --type) get a buffer of their own.
    std::vector<std::pair<ggml_tensor*, const io::TensorInfo*>> converted;
    std::vector<ggml_backend_buffer_t> by_source(file_.sources().size(), nullptr);
    for (auto& [tensor, info] : declared_) {
        const io::MappedFile& map = *file_.sources()[info->source].map;
        const uint8_t* data = file_.data(*info);
        const bool inside = data >= map.data() && data + ggml_nbytes(tensor) <= map.data() + map.size();
        if (io::dtype_from_ggml(tensor->type) != info->dtype || !inside) {
            converted.emplace_back(tensor, info);
            continue;
        }
        ggml_backend_buffer_t& buffer = by_source[info->source];
        if (!buffer) {
            // ggml never writes weights; the mapping stays read-only.
            buffer = ggml_backend_cpu_buffer_from_ptr(const_cast<uint8_t*>(map.data()), map.size());
            if (!buffer) return Error{"cannot map " + file_.sources()[info->source].path + " for the CPU"};
            mapped_.push_back(buffer);
        }
        if (ggml_backend_tensor_alloc(buffer, tensor, const_cast<uint8_t*>(data)) != GGML_STATUS_SUCCESS) {
            return Error{"cannot place weight '" + std::string(tensor->name) + "' in its mapped file"};
        }
    }
    if (converted.empty()) return Status::Ok();
    const ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type();
    const uint64_t alignment = ggml_backend_buft_get_alignment(cpu);
    uint64_t size = 0;
    for (auto& [tensor, info] : converted) {
        size += (ggml_backend_buft_get_alloc_size(cpu, tensor) + alignment - 1) / alignment * alignment;
    }
    buffer_ = ggml_backend_buft_alloc_buffer(cpu, size);
    if (!buffer_) return Error::out_of_memory("out of memory allocating " + prefix_ + "* weights");
    ggml_tallocr talloc = ggml_tallocr_new(buffer_);
    for (auto& [tensor, info] : converted) {
        if (ggml_tallocr_alloc(&talloc, tensor) != GGML_STATUS_SUCCESS) {
            return Error{"cannot place weight '" + std::string(tensor->name) + "'"};
        }
        KILN_TRY(fill(tensor, *info, tensor));
    }
    return Status::Ok();
}

Status ModuleWeights::fill(ggml_tensor* target, const io::TensorInfo& info, const ggml_tensor* compute) const {
    // Stored as computed: straight from the mapped file, no copy in between.
    if (io::dtype_from_ggml(compute->type) == info.dtype) {
        ggml_backend_tensor_set(target, file_.data(info), 0, ggml_nbytes(compute));
        return Status::Ok();
    }
    auto data = io::convert_tensor(info, file_.data(info), compute->type);
    if (!data.ok()) return data.error().in_context(file_.sources()[info.source].path + ": ");
    ggml_backend_tensor_set(target, data->data(), 0, data->size());
    return Status::Ok();
}

uint64_t ModuleWeights::allocation_size(ggml_backend_buffer_type_t buft) const {
    return ggml_backend_alloc_ctx_tensors_from_buft_size(ctx_, buft);
}

Status ModuleWeights::load_params(ParamsLocation location, ggml_backend_t compute_backend,
                                  ggml_backend_buffer_type_t params_buft) {
    if (location == ParamsLocation::ComputeDevice) return load(compute_backend);
    if (!errors_.empty()) return load(compute_backend);  // reports the declaration problems
    location_ = location;
    if (location == ParamsLocation::Disk || host_buffer_) return Status::Ok();
    ggml_init_params params{ggml_tensor_overhead() * std::max<size_t>(1, declared_.size()), nullptr, true};
    host_ctx_ = ggml_init(params);
    for (auto& [tensor, info] : declared_) by_tensor_[tensor].second = ggml_dup_tensor(host_ctx_, tensor);
    host_buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(
        host_ctx_,
        params_buft && location == ParamsLocation::OtherDevice ? params_buft : ggml_backend_cpu_buffer_type());
    if (!host_buffer_ && !declared_.empty()) {
        return Error::out_of_memory(
            "out of memory allocating " + prefix_ + "* weights in " +
            (location == ParamsLocation::Host ? std::string("RAM") : ggml_backend_buft_name(params_buft)));
    }
    mark_weight_buffer(host_buffer_);
    for (auto& [tensor, info] : declared_) KILN_TRY(fill(by_tensor_[tensor].second, *info, tensor));
    return Status::Ok();
}

bool ModuleWeights::owns(const ggml_tensor* tensor) const { return by_tensor_.count(tensor) != 0; }

uint64_t ModuleWeights::declared_bytes() const {
    uint64_t total = extra_bytes();
    for (const auto& [tensor, info] : declared_) total += ggml_nbytes(tensor);
    return total;
}

Result<const void*> ModuleWeights::params_data(const ggml_tensor* tensor, std::vector<uint8_t>& staging) const {
    auto it = by_tensor_.find(tensor);
    if (it == by_tensor_.end()) return Error{std::string("'") + tensor->name + "' is not a weight of " + prefix_};
    const auto& [info, host_twin] = it->second;
    if (!info && !host_twin) {  // an extra on the compute device
        staging.resize(ggml_nbytes(tensor));
        ggml_backend_tensor_get(tensor, staging.data(), 0, staging.size());
        return static_cast<const void*>(staging.data());
    }
    if (host_twin && ggml_backend_buffer_is_host(host_twin->buffer)) return static_cast<const void*>(host_twin->data);
    if (host_twin) {
        staging.resize(ggml_nbytes(host_twin));
        ggml_backend_tensor_get(host_twin, staging.data(), 0, staging.size());
        return static_cast<const void*>(staging.data());
    }
    if (io::dtype_from_ggml(tensor->type) == info->dtype) return static_cast<const void*>(file_.data(*info));
    auto data = io::convert_tensor(*info, file_.data(*info), tensor->type);
    if (!data.ok()) return data.error().in_context(file_.sources()[info->source].path + ": ");
    staging = std::move(data).value();
    return static_cast<const void*>(staging.data());
}

size_t ModuleWeights::bytes() const {
    size_t total = buffer_ ? ggml_backend_buffer_get_size(buffer_) : 0;
    if (extra_buffer_ && !extra_host_ctx_) total += ggml_backend_buffer_get_size(extra_buffer_);
    return total;
}

uint64_t ModuleWeights::extra_bytes() const {
    uint64_t total = 0;
    for (const ggml_tensor* t : extras_) total += ggml_nbytes(t);
    return total;
}

void ModuleWeights::free_extras() {
    for (ggml_tensor* t : extras_) by_tensor_.erase(t);
    extras_.clear();
    patches_.clear();
    if (extra_buffer_) ggml_backend_buffer_free(extra_buffer_);
    extra_buffer_ = nullptr;
    if (extra_host_ctx_) ggml_free(extra_host_ctx_);
    extra_host_ctx_ = nullptr;
    if (extra_ctx_) ggml_free(extra_ctx_);
    extra_ctx_ = nullptr;
}

Result<std::vector<ggml_tensor*>> ModuleWeights::set_extras(std::vector<Extra> extras, ggml_backend_t compute_backend) {
    free_extras();
    if (extras.empty()) return std::vector<ggml_tensor*>{};
    ggml_init_params params{ggml_tensor_overhead() * extras.size(), nullptr, /*no_alloc=*/true};
    extra_ctx_ = ggml_init(params);
    for (const Extra& e : extras) {
        int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
        for (size_t d = 0; d < e.ne.size() && d < GGML_MAX_DIMS; ++d) ne[d] = e.ne[d];
        ggml_tensor* t = ggml_new_tensor(extra_ctx_, e.type, static_cast<int>(std::max<size_t>(1, e.ne.size())), ne);
        ggml_set_name(t, e.name.c_str());
        if (ggml_nbytes(t) != e.data.size()) {
            free_extras();
            return Error{"extra weight '" + e.name + "': " + std::to_string(e.data.size()) + " bytes for " +
                         std::to_string(ggml_nbytes(t))};
        }
        extras_.push_back(t);
    }
    // On the compute device when the module's params are there; otherwise
    // in RAM, as host twins the memory system copies from when a segment
    // needs them (unbound compute tensors, as the module's own).
    const bool on_device = location_ == ParamsLocation::ComputeDevice;
    std::vector<ggml_tensor*> holders = extras_;
    if (!on_device) {
        ggml_init_params host{ggml_tensor_overhead() * extras.size(), nullptr, /*no_alloc=*/true};
        extra_host_ctx_ = ggml_init(host);
        for (ggml_tensor*& h : holders) h = ggml_dup_tensor(extra_host_ctx_, h);
    }
    extra_buffer_ = on_device ? ggml_backend_alloc_ctx_tensors(extra_ctx_, compute_backend)
                              : ggml_backend_alloc_ctx_tensors_from_buft(extra_host_ctx_, ggml_backend_cpu_buffer_type());
    if (!extra_buffer_) {
        free_extras();
        return Error::out_of_memory("out of memory allocating the adapter weights of " + prefix_ + "*");
    }
    for (size_t i = 0; i < extras.size(); ++i) {
        ggml_backend_tensor_set(holders[i], extras[i].data.data(), 0, extras[i].data.size());
        by_tensor_[extras_[i]] = {nullptr, on_device ? nullptr : holders[i]};
    }
    return extras_;
}

}  // namespace kiln::runtime
