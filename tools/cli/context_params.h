// kiln's context flags (-m's companions, devices, the memory system) as the
// C API takes them; shared by generation, `kiln plan` and `kiln serve`.
#pragma once

#include "args.h"
#include "kiln.h"

namespace kiln::cli {

// Every field but model_path, plan_only and the job size. The strings point
// into `options`, which must outlive the result.
kiln_context_params context_params_of(const Options& options);

}  // namespace kiln::cli
