// Which model file a benchmark opens: the one -m names, or kiln's default.
#pragma once

#include <string>

#include "util/result.h"

namespace kiln::bench {

// `given` when it exists, or kiln's default model when `given` is empty
// (tools/cli/default_model.h). The error names the missing file.
Result<std::string> resolve_model_path(const std::string& given);

}  // namespace kiln::bench
