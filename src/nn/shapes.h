// Shape checks for graph builders that return an error, not an assert, when
// a caller's input tensor has the wrong shape.
#pragma once

#include <string>
#include <vector>

#include "ggml.h"

namespace kiln::nn {

// "[64, 16, 2]": the tensor's ne up to its last dimension above 1.
std::string ne_string(const ggml_tensor* t);
std::string ne_string(const std::vector<int64_t>& ne);
// Whether t's ne is `ne` followed by ones.
bool has_ne(const ggml_tensor* t, const std::vector<int64_t>& ne);

}  // namespace kiln::nn
