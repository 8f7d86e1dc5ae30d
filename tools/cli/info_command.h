// `kiln info FILE|FOLDER...`: what a model file holds, like gguf-dump for
// diffusion checkpoints: format, metadata, detected family, and each
// component with its tensor count, dtypes and bytes.
#pragma once

#include <ostream>

#include "args.h"

namespace kiln::cli {

// Prints the report to `out`; returns the process exit code (1 if a file
// cannot be read, after logging the error).
int run_info(const Options& options, std::ostream& out);

}  // namespace kiln::cli
