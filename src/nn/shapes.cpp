#include "nn/shapes.h"

namespace kiln::nn {

std::string ne_string(const ggml_tensor* t) {
    std::string s = "[";
    for (int i = 0; i < ggml_n_dims(t); ++i) s += (i ? ", " : "") + std::to_string(t->ne[i]);
    return s + "]";
}

std::string ne_string(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

bool has_ne(const ggml_tensor* t, const std::vector<int64_t>& ne) {
    for (int i = 0; i < GGML_MAX_DIMS; ++i) {
        if (t->ne[i] != (i < static_cast<int>(ne.size()) ? ne[i] : 1)) return false;
    }
    return true;
}

}  // namespace kiln::nn
