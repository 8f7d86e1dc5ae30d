#include "pipeline/lora_file.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <map>
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
    {".diff", AdapterKind::Full, &LayerAdapter::diff},
    // Parts of another kind's layer (LoRA here means: the kind is not set by it).
    {".lora_mid.weight", AdapterKind::LoRA, &LayerAdapter::mid},
    {".hada_t1", AdapterKind::LoHa, &LayerAdapter::t1},
    {".hada_t2", AdapterKind::LoHa, &LayerAdapter::t2},
    {".lokr_t2", AdapterKind::LoKr, &LayerAdapter::t2},
    {".dora_scale", AdapterKind::LoRA, &LayerAdapter::dora_scale},
    {".diff_b", AdapterKind::LoRA, &LayerAdapter::diff_b},
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

int64_t dim(const HostTensor& t, size_t i) { return i < t.shape.size() ? t.shape[i] : 1; }

// A factor no model's weight is as large as: refused before it is made
// (the shapes come from the file; their product could be any size).
constexpr int64_t kMaxFactorElements = int64_t(1) << 28;

// LyCORIS's Tucker factor, einsum("i j k l, j r, i p -> p r k l", t, b, a):
// core t [I, J, kh, kw], b [J, R], a [I, P] -> [P, R, kh, kw]. Nullopt
// when the shapes do not chain or the factor would be too large.

std::optional<HostTensor> tucker_factor(const HostTensor& t, const HostTensor& b, const HostTensor& a) {
    const int64_t I = dim(t, 0), J = dim(t, 1), K = dim(t, 2) * dim(t, 3);
    const int64_t R = b.columns(), P = a.columns();
    if (t.shape.size() != 4 || b.rows() != J || a.rows() != I) return std::nullopt;
    if (double(P) * double(R) * double(K) > double(kMaxFactorElements)) return std::nullopt;
    // tb[i, r, k] = sum_j t[i, j, k] b[j, r]; then out[p, r, k] = sum_i a[i, p] tb[i, r, k].
    std::vector<double> tb(static_cast<size_t>(I * R * K), 0.0);
    for (int64_t i = 0; i < I; ++i)
        for (int64_t j = 0; j < J; ++j)
            for (int64_t k = 0; k < K; ++k) {
                const double tv = t.data[static_cast<size_t>((i * J + j) * K + k)];
                for (int64_t r = 0; r < R; ++r)
                    tb[static_cast<size_t>((i * R + r) * K + k)] += tv * b.data[static_cast<size_t>(j * R + r)];
            }
    HostTensor out{{P, R, dim(t, 2), dim(t, 3)}, std::vector<float>(static_cast<size_t>(P * R * K))};
    for (int64_t p = 0; p < P; ++p)
        for (int64_t rk = 0; rk < R * K; ++rk) {
            double sum = 0.0;
            for (int64_t i = 0; i < I; ++i)
                sum += a.data[static_cast<size_t>(i * P + p)] * tb[static_cast<size_t>(i * R * K + rk)];
            out.data[static_cast<size_t>(p * R * K + rk)] = static_cast<float>(sum);
        }
    return out;
}

// LoRA's Tucker core folded into down: mid [r, s, kh, kw] and down [s, in]
// give down [r, in, kh, kw], element (r, i, k) = sum_s mid[r, s, k] down[s, i].
std::optional<HostTensor> folded_down(const HostTensor& mid, const HostTensor& down) {
    const int64_t R = dim(mid, 0), S = dim(mid, 1), K = dim(mid, 2) * dim(mid, 3), in = down.columns();
    if (mid.shape.size() != 4 || down.rows() != S || R != S) return std::nullopt;
    if (double(R) * double(in) * double(K) > double(kMaxFactorElements)) return std::nullopt;
    HostTensor out{{R, in, dim(mid, 2), dim(mid, 3)}, std::vector<float>(static_cast<size_t>(R * in * K))};
    for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < in; ++i)
            for (int64_t k = 0; k < K; ++k) {
                double sum = 0.0;
                for (int64_t s = 0; s < S; ++s)
                    sum += double(mid.data[static_cast<size_t>((r * S + s) * K + k)]) *
                           down.data[static_cast<size_t>(s * in + i)];
                out.data[static_cast<size_t>((r * in + i) * K + k)] = static_cast<float>(sum);
            }
    return out;
}

// Folds a layer's Tucker cores into its factors; false when they do not chain.
bool fold_tucker(LayerAdapter& layer) {
    if (layer.kind == AdapterKind::LoRA && layer.mid) {
        auto down = folded_down(*layer.mid, *layer.down);
        if (!down) return false;
        layer.down = std::move(down);
        layer.mid.reset();
    }
    if (layer.kind == AdapterKind::LoHa && (layer.t1 || layer.t2)) {
        if (!layer.t1 || !layer.t2) return false;  // LyCORIS writes both
        layer.w1 = tucker_factor(*layer.t1, *layer.w1b, *layer.w1a);
        layer.w2 = tucker_factor(*layer.t2, *layer.w2b, *layer.w2a);
        if (!layer.w1 || !layer.w2 || layer.w1->shape != layer.w2->shape) return false;
        layer.t1.reset();
        layer.t2.reset();
    }
    if (layer.kind == AdapterKind::LoKr && layer.t2) {
        if (!layer.w2a || !layer.w2b) return false;
        layer.w2 = tucker_factor(*layer.t2, *layer.w2b, *layer.w2a);
        if (!layer.w2) return false;
        layer.t2.reset();
    }
    return true;
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
        case AdapterKind::Full: return "diff";
        case AdapterKind::BiasOnly: return "diff_b";
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
        case AdapterKind::Full:
        case AdapterKind::BiasOnly: return 1.0f;  // no alpha
    }
    return 1.0f;
}

int64_t LayerAdapter::out_rows() const {
    switch (kind) {
        case AdapterKind::LoRA: return up->rows();
        case AdapterKind::LoHa: return w1 ? w1->rows() : w1a->rows();
        case AdapterKind::LoKr: return (w1 ? w1->rows() : w1a->rows()) * (w2 ? w2->rows() : w2a->rows());
        case AdapterKind::Full: return diff->rows();
        case AdapterKind::BiasOnly: return diff_b->rows();
    }
    return 0;
}

int64_t LayerAdapter::in_columns() const {
    switch (kind) {
        case AdapterKind::LoRA: return down->columns();
        case AdapterKind::LoHa: return w1 ? w1->columns() : w1b->columns();
        case AdapterKind::LoKr: return (w1 ? w1->columns() : w1b->columns()) * (w2 ? w2->columns() : w2b->columns());
        case AdapterKind::Full: return diff->columns();
        case AdapterKind::BiasOnly: return 0;
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
        delta = w1 ? w1->data : matmul(*w1a, *w1b);
        const std::vector<float> second = w2 ? w2->data : matmul(*w2a, *w2b);
        for (size_t i = 0; i < delta.size(); ++i) delta[i] *= second[i];
    } else if (kind == AdapterKind::Full) {
        delta = diff->data;
    } else if (kind == AdapterKind::LoKr) {
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
        // An infinite or NaN factor makes every weight it touches so: say so
        // now, not after a job that ends in "non-finite values".
        if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); })) {
            return Error::bad_file(path + ": '" + info.name + "' holds a value that is not a finite number");
        }
        if (match->kind != AdapterKind::LoRA) layer.kind = match->kind;
        layer.*(match->part) = HostTensor{info.shape, std::move(values)};
    }
    for (auto& [key, layer] : layers) {
        const std::string where = path + ": adapter '" + key + "'";
        const bool factors = layer.down || layer.up || layer.w1a || layer.w1b || layer.w1 || layer.w2 || layer.w2a ||
                             layer.w2b || layer.diff;
        if (!factors && layer.diff_b) layer.kind = AdapterKind::BiasOnly;
        bool complete = false;
        switch (layer.kind) {
            case AdapterKind::LoRA: complete = layer.down && layer.up; break;
            case AdapterKind::LoHa: complete = layer.w1a && layer.w1b && layer.w2a && layer.w2b; break;
            case AdapterKind::LoKr:
                complete = (layer.w1 || (layer.w1a && layer.w1b)) && (layer.w2 || (layer.w2a && layer.w2b));
                break;
            case AdapterKind::Full: complete = !layer.down && !layer.up && !layer.w1a && !layer.w1 && !layer.w2a; break;
            case AdapterKind::BiasOnly: complete = !layer.mid && !layer.t1 && !layer.t2 && !layer.dora_scale; break;
        }
        if (!complete) {
            if (!factors && !layer.diff_b) {
                // An alpha, core or magnitude with no factors.
                for (const char* part :
                     {".alpha", ".lora_mid.weight", ".hada_t1", ".hada_t2", ".lokr_t2", ".dora_scale"})
                    out.unused.push_back(key + part);
                continue;
            }
            return Error::bad_file(where + " lacks one of its " + adapter_kind_name(layer.kind) +
                                   " factors, or mixes them with another kind's");
        }
        if (layer.diff_b && layer.diff_b->columns() != 1) {
            return Error::bad_file(where + ": diff_b has shape " + std::to_string(layer.diff_b->rows()) + "x" +
                                   std::to_string(layer.diff_b->columns()) + "; a bias change is one value per row");
        }
        if (layer.kind == AdapterKind::BiasOnly) {
            out.layers.push_back(std::move(layer));
            continue;
        }
        if (!fold_tucker(layer)) {
            return Error::bad_file(where +
                                   ": its Tucker cores and factors do not chain (or make a factor larger "
                                   "than any weight)");
        }
        // The factors must chain: inner dimensions agree.
        bool chains = true;
        if (layer.kind == AdapterKind::LoRA) {
            chains = layer.up->columns() == layer.down->rows();
        } else if (layer.kind == AdapterKind::Full) {
            chains = true;
        } else if (layer.kind == AdapterKind::LoHa && layer.w1) {
            chains = true;  // checked as the cores were folded
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

Result<LayerAdapter> adapter_rows(const LayerAdapter& layer, int64_t first, int64_t count, bool swap_halves) {
    const int64_t total = layer.out_rows();
    if (first < 0 || count <= 0 || first + count > total || (swap_halves && total % 2 != 0)) {
        return Error::bad_file("adapter '" + layer.key + "' changes " + std::to_string(total) +
                               " rows, which cannot hold rows " + std::to_string(first) + "-" +
                               std::to_string(first + count - 1) + (swap_halves ? " with its halves swapped" : ""));
    }
    // Row i of the part is this row of the layer's change.
    auto source_row = [&](int64_t i) {
        const int64_t r = first + i;
        return swap_halves ? (r + total / 2) % total : r;
    };
    auto rows_of = [&](const HostTensor& t) {
        HostTensor out{t.shape, {}};
        out.shape[0] = count;
        const size_t width = static_cast<size_t>(t.columns());
        out.data.reserve(width * static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) {
            const auto from = t.data.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(source_row(i)) * width);
            out.data.insert(out.data.end(), from, from + static_cast<std::ptrdiff_t>(width));
        }
        return out;
    };
    LayerAdapter part;
    part.key = layer.key;
    part.kind = layer.kind;
    if (layer.dora_scale) {
        if (layer.dora_scale->rows() != total || layer.dora_scale->columns() != 1) {
            return Error::bad_file("adapter '" + layer.key +
                                   "': DoRA magnitudes per input channel on a layer this model keeps as several "
                                   "weights cannot be split between them");
        }
        part.dora_scale = rows_of(*layer.dora_scale);
    }
    if (layer.diff_b) part.diff_b = rows_of(*layer.diff_b);
    if (layer.kind == AdapterKind::BiasOnly) return part;
    if (layer.kind == AdapterKind::LoRA) {
        part.down = layer.down;
        part.up = rows_of(*layer.up);
        part.alpha = layer.alpha;
        return part;
    }
    auto dense = layer.dense_delta(total, layer.in_columns());
    if (!dense.ok()) return dense.error();
    std::vector<int64_t> shape = {total};
    if (layer.kind == AdapterKind::Full)
        shape = layer.diff->shape;
    else
        shape.push_back(layer.in_columns());
    part.kind = AdapterKind::Full;
    part.diff = rows_of(HostTensor{shape, std::move(dense).value()});
    return part;
}

Status apply_dora(const LayerAdapter& layer, std::vector<float>& weight, int64_t first_row, int64_t rows,
                  int64_t columns, const std::vector<float>& delta, float strength) {
    const HostTensor& m = *layer.dora_scale;
    const int64_t n = static_cast<int64_t>(m.data.size());
    float* w = weight.data() + first_row * columns;
    std::vector<double> norm;
    const bool per_row = m.rows() == rows && n == rows;
    int64_t group = 0;  // the input axis: columns per input channel (kh * kw)
    if (per_row) {
        // ComfyUI: the norm of each row of W itself.
        norm.assign(static_cast<size_t>(rows), 0.0);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < columns; ++c) norm[size_t(r)] += double(w[r * columns + c]) * w[r * columns + c];
    } else if (m.rows() == 1 && n > 0 && columns % n == 0) {
        // The norm of each input channel of W + delta, over rows and kernel positions.
        group = columns / n;
        norm.assign(static_cast<size_t>(n), 0.0);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < columns; ++c) {
                const double v = double(w[r * columns + c]) + delta[size_t(r * columns + c)];
                norm[size_t(c / group)] += v * v;
            }
    } else {
        return Error::bad_file("adapter '" + layer.key + "': dora_scale has " + std::to_string(n) +
                               " values; its weight has " + std::to_string(rows) + " rows and " +
                               std::to_string(columns) + " columns");
    }
    for (double& v : norm) v = std::sqrt(v) + FLT_EPSILON;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < columns; ++c) {
            const size_t at = size_t(r * columns + c);
            const size_t which = per_row ? size_t(r) : size_t(c / group);
            const double scaled = (double(w[at]) + delta[at]) * m.data[which] / norm[which];
            w[at] = static_cast<float>(w[at] + strength * (scaled - w[at]));
        }
    return Status::Ok();
}

}  // namespace kiln::pipeline
