#include "pipeline/lora_file.h"

#include <cmath>
#include <cstring>
#include <map>

#include <algorithm>
#include <thread>

#include "ggml-cpu.h"
#include "ggml.h"
#include "io/model_file.h"
#include "io/tensor_convert.h"

namespace kiln::pipeline {
namespace {

// The suffix after a layer's name -> which factor it is.
struct Suffix {
    const char* text;
    AdapterKind kind;
    std::optional<HostTensor> LayerAdapter::*part;  // null: alpha
};
const Suffix kSuffixes[] = {
    {".lora_down.weight", AdapterKind::LoRA, &LayerAdapter::down},
    {".lora_up.weight", AdapterKind::LoRA, &LayerAdapter::up},
    {".lora_A.weight", AdapterKind::LoRA, &LayerAdapter::down},
    {".lora_B.weight", AdapterKind::LoRA, &LayerAdapter::up},
    {".lora_A.default.weight", AdapterKind::LoRA, &LayerAdapter::down},
    {".lora_B.default.weight", AdapterKind::LoRA, &LayerAdapter::up},
    {".lora.down.weight", AdapterKind::LoRA, &LayerAdapter::down},
    {".lora.up.weight", AdapterKind::LoRA, &LayerAdapter::up},
    {".lora_linear_layer.down.weight", AdapterKind::LoRA, &LayerAdapter::down},
    {".lora_linear_layer.up.weight", AdapterKind::LoRA, &LayerAdapter::up},
    {".hada_w1_a", AdapterKind::LoHa, &LayerAdapter::w1a},
    {".hada_w1_b", AdapterKind::LoHa, &LayerAdapter::w1b},
    {".hada_w2_a", AdapterKind::LoHa, &LayerAdapter::w2a},
    {".hada_w2_b", AdapterKind::LoHa, &LayerAdapter::w2b},
    {".lokr_w1", AdapterKind::LoKr, &LayerAdapter::w1},
    {".lokr_w1_a", AdapterKind::LoKr, &LayerAdapter::w1a},
    {".lokr_w1_b", AdapterKind::LoKr, &LayerAdapter::w1b},
    {".lokr_w2", AdapterKind::LoKr, &LayerAdapter::w2},
    {".lokr_w2_a", AdapterKind::LoKr, &LayerAdapter::w2a},
    {".lokr_w2_b", AdapterKind::LoKr, &LayerAdapter::w2b},
    {".alpha", AdapterKind::LoRA, nullptr},
};

bool ends_with(const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

// a [m, k] @ b [k, n] -> [m, n], row-major, on ggml's CPU kernels: a
// full-rank delta of a large model is billions of multiply-adds.
std::vector<float> matmul(const HostTensor& a, const HostTensor& b) {
    const int64_t m = a.rows(), k = a.columns(), n = b.columns();
    const size_t bytes = static_cast<size_t>(m * k + 2 * k * n + m * n) * sizeof(float) + 8 * ggml_tensor_overhead() +
                         ggml_graph_overhead() + 4096;
    ggml_init_params params{bytes, nullptr, /*no_alloc=*/false};
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* ta = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    ggml_tensor* tb = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, k);
    std::memcpy(ta->data, a.data.data(), ggml_nbytes(ta));
    std::memcpy(tb->data, b.data.data(), ggml_nbytes(tb));
    // ggml_mul_mat(x [k, n], y [k, m]) is [n, m]: element (j, i) = sum_p x(p, j) y(p, i).
    ggml_tensor* c = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, tb)), ta);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, c);
    const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    ggml_cplan plan = ggml_graph_plan(graph, threads, nullptr);
    std::vector<uint8_t> work(plan.work_size);
    plan.work_data = work.data();
    ggml_graph_compute(graph, &plan);
    std::vector<float> out(static_cast<size_t>(m * n));
    std::memcpy(out.data(), c->data, out.size() * sizeof(float));
    ggml_free(ctx);
    return out;
}

// A LoKr factor: given whole, or as a @ b.
HostTensor factor(const std::optional<HostTensor>& whole, const std::optional<HostTensor>& a,
                  const std::optional<HostTensor>& b) {
    if (whole) return *whole;
    return HostTensor{{a->rows(), b->columns()}, matmul(*a, *b)};
}

}  // namespace

int64_t HostTensor::columns() const {
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return n;
}

const char* adapter_kind_name(AdapterKind kind) {
    switch (kind) {
        case AdapterKind::LoRA: return "LoRA";
        case AdapterKind::LoHa: return "LoHa";
        case AdapterKind::LoKr: return "LoKr";
    }
    return "?";
}

float LayerAdapter::scale() const {
    if (!alpha) return 1.0f;
    switch (kind) {
        case AdapterKind::LoRA: return *alpha / static_cast<float>(down->rows());
        case AdapterKind::LoHa: return *alpha / static_cast<float>(w1b->rows());
        case AdapterKind::LoKr:
            if (w2b) return *alpha / static_cast<float>(w2b->rows());
            if (w1b) return *alpha / static_cast<float>(w1b->rows());
            return 1.0f;
    }
    return 1.0f;
}

int64_t LayerAdapter::out_rows() const {
    switch (kind) {
        case AdapterKind::LoRA: return up->rows();
        case AdapterKind::LoHa: return w1a->rows();
        case AdapterKind::LoKr: return (w1 ? w1->rows() : w1a->rows()) * (w2 ? w2->rows() : w2a->rows());
    }
    return 0;
}

int64_t LayerAdapter::in_columns() const {
    switch (kind) {
        case AdapterKind::LoRA: return down->columns();
        case AdapterKind::LoHa: return w1b->columns();
        case AdapterKind::LoKr: return (w1 ? w1->columns() : w1b->columns()) * (w2 ? w2->columns() : w2b->columns());
    }
    return 0;
}

Result<std::vector<float>> LayerAdapter::dense_delta(int64_t out, int64_t in) const {
    if (out_rows() != out || in_columns() != in) {
        return Error::bad_file("adapter '" + key + "' changes a " + std::to_string(out_rows()) + "x" +
                               std::to_string(in_columns()) + " weight; the model's is " + std::to_string(out) + "x" +
                               std::to_string(in));
    }
    const float s = scale();
    std::vector<float> delta;
    if (kind == AdapterKind::LoRA) {
        delta = matmul(HostTensor{{up->rows(), up->columns()}, up->data}, HostTensor{{down->rows(), in}, down->data});
    } else if (kind == AdapterKind::LoHa) {
        delta = matmul(*w1a, *w1b);
        const std::vector<float> second = matmul(*w2a, *w2b);
        for (size_t i = 0; i < delta.size(); ++i) delta[i] *= second[i];
    } else {
        // kron(A [a, b], B [c, d]) [a c, b d]: element (i c + k, j d + l) = A(i, j) B(k, l).
        const HostTensor a = factor(w1, w1a, w1b), b = factor(w2, w2a, w2b);
        const int64_t ar = a.rows(), ac = a.columns(), br = b.rows(), bc = b.columns();
        delta.assign(static_cast<size_t>(out * in), 0.0f);
        for (int64_t i = 0; i < ar; ++i)
            for (int64_t j = 0; j < ac; ++j) {
                const float aij = a.data[static_cast<size_t>(i * ac + j)];
                for (int64_t k = 0; k < br; ++k)
                    for (int64_t l = 0; l < bc; ++l) {
                        delta[static_cast<size_t>((i * br + k) * in + j * bc + l)] =
                            aij * b.data[static_cast<size_t>(k * bc + l)];
                    }
            }
    }
    for (float& v : delta) v *= s;
    return delta;
}

Result<AdapterFile> read_adapter_file(const std::string& path) {
    auto file = io::ModelFile::open({path});
    if (!file.ok()) {
        return file.error().kind == ErrorKind::Internal ? file.error().as(ErrorKind::BadFile) : file.error();
    }
    AdapterFile out;
    out.path = path;
    std::map<std::string, LayerAdapter> layers;
    for (const io::TensorInfo& info : file->tensors()) {
        const Suffix* match = nullptr;
        for (const Suffix& s : kSuffixes) {
            if (ends_with(info.name, s.text) && (!match || std::strlen(s.text) > std::strlen(match->text))) match = &s;
        }
        if (!match) {
            out.unused.push_back(info.name);
            continue;
        }
        const std::string key = info.name.substr(0, info.name.size() - std::strlen(match->text));
        LayerAdapter& layer = layers[key];
        layer.key = key;
        auto data = io::convert_tensor(info, file->data(info), GGML_TYPE_F32);
        if (!data.ok()) return data.error().in_context(path + ": ");
        std::vector<float> values(data->size() / sizeof(float));
        std::memcpy(values.data(), data->data(), values.size() * sizeof(float));
        if (!match->part) {
            if (values.size() != 1 || !std::isfinite(values[0])) {
                return Error::bad_file(path + ": '" + info.name + "' must be one finite number");
            }
            layer.alpha = values[0];
            continue;
        }
        if (info.shape.empty() || info.element_count() == 0) {
            return Error::bad_file(path + ": '" + info.name + "' has shape " + info.shape_string());
        }
        if (match->kind != AdapterKind::LoRA) layer.kind = match->kind;
        layer.*(match->part) = HostTensor{info.shape, std::move(values)};
    }
    for (auto& [key, layer] : layers) {
        const std::string where = path + ": adapter '" + key + "'";
        bool complete = false;
        switch (layer.kind) {
            case AdapterKind::LoRA: complete = layer.down && layer.up; break;
            case AdapterKind::LoHa: complete = layer.w1a && layer.w1b && layer.w2a && layer.w2b; break;
            case AdapterKind::LoKr:
                complete = (layer.w1 || (layer.w1a && layer.w1b)) && (layer.w2 || (layer.w2a && layer.w2b));
                break;
        }
        if (!complete) {
            if (!layer.down && !layer.up && !layer.w1a && !layer.w1 && !layer.w2 && !layer.w2a) {
                out.unused.push_back(key + ".alpha");  // an alpha with no factors
                continue;
            }
            return Error::bad_file(where + " lacks one of its " + adapter_kind_name(layer.kind) + " factors");
        }
        // The factors must chain: inner dimensions agree.
        bool chains = true;
        if (layer.kind == AdapterKind::LoRA) {
            chains = layer.up->columns() == layer.down->rows();
        } else if (layer.kind == AdapterKind::LoHa) {
            chains = layer.w1a->columns() == layer.w1b->rows() && layer.w2a->columns() == layer.w2b->rows() &&
                     layer.w1a->rows() == layer.w2a->rows() && layer.w1b->columns() == layer.w2b->columns();
        } else {
            chains = (layer.w1 || layer.w1a->columns() == layer.w1b->rows()) &&
                     (layer.w2 || layer.w2a->columns() == layer.w2b->rows());
        }
        if (!chains) return Error::bad_file(where + ": its factors' shapes do not chain");
        out.layers.push_back(std::move(layer));
    }
    if (out.layers.empty()) {
        return Error::bad_file(path + ": no LoRA, LoHa or LoKr weights in it (" + std::to_string(out.unused.size()) +
                               " tensors, none named like an adapter)");
    }
    return out;
}

}  // namespace kiln::pipeline
