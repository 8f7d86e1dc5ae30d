#include "runtime/module_weights.h"

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

ModuleWeights::ModuleWeights(const io::ModelFile& file, std::string prefix, std::optional<ggml_type> weight_type)
    : file_(file), prefix_(std::move(prefix)), weight_type_(weight_type) {
    ggml_init_params params{ggml_tensor_overhead() * kMaxModuleTensors, nullptr, /*no_alloc=*/true};
    ctx_ = ggml_init(params);
}

ModuleWeights::~ModuleWeights() {
    if (buffer_) ggml_backend_buffer_free(buffer_);
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
        bool match = t->shape.size() == shape.size();
        for (size_t i = 0; match && i < shape.size(); ++i) match = shape[i] < 0 || shape[i] == t->shape[i];
        if (!match) {
            errors_.push_back("tensor '" + full + "' has shape " + t->shape_string() + ", expected " +
                              shape_text(shape));
            t = nullptr;
        } else {
            actual = t->shape;
            type = force_type ? *force_type : io::compute_type(*t, weight_type_);
        }
    }
    if (actual.size() > GGML_MAX_DIMS) {
        errors_.push_back("tensor '" + full + "' has more than 4 dimensions");
        actual.resize(GGML_MAX_DIMS);
        t = nullptr;
    }
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    for (size_t d = 0; d < actual.size(); ++d) ne[d] = actual[actual.size() - 1 - d];
    ggml_tensor* tensor = ggml_new_tensor(ctx_, type, std::max<int>(1, static_cast<int>(actual.size())), ne);
    ggml_set_name(tensor, full.c_str());
    if (t) declared_.emplace_back(tensor, t);
    return tensor;
}

Status ModuleWeights::load(ggml_backend_t backend) {
    if (!errors_.empty()) {
        std::string message = errors_.front();
        if (errors_.size() > 1) message += " (and " + std::to_string(errors_.size() - 1) + " more problems)";
        return Error{file_.sources().front().path + ": " + message};
    }
    if (buffer_) return Status::Ok();
    buffer_ = ggml_backend_alloc_ctx_tensors(ctx_, backend);
    if (!buffer_ && !declared_.empty()) return Error{"out of memory allocating " + prefix_ + "* weights"};
    for (auto& [tensor, info] : declared_) {
        auto data = io::convert_tensor(*info, file_.data(*info), tensor->type);
        if (!data.ok()) return Error{file_.sources()[info->source].path + ": " + data.error().message};
        ggml_backend_tensor_set(tensor, data->data(), 0, data->size());
    }
    return Status::Ok();
}

size_t ModuleWeights::bytes() const { return buffer_ ? ggml_backend_buffer_get_size(buffer_) : 0; }

}  // namespace kiln::runtime
