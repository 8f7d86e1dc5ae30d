// The text `kiln info` prints for a model: its files, metadata, detected
// family and components (tensor count, parameters, bytes, dtypes), and
// optionally every tensor with its dtype, shape and byte range.
#pragma once

#include <string>

#include "io/model_file.h"

namespace kiln::io {

// `label` is how the model was named (a path or folder); `family` what the
// family registry detected (models/registry.h: io reads files, it does not
// know families).
std::string describe_model(const ModelFile& model, const std::string& label, const std::string& family,
                           bool list_tensors);

}  // namespace kiln::io
