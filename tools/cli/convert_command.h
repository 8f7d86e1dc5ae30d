// `kiln -M convert -m MODEL -o OUT.gguf [--type TYPE]`: rewrites a model
// (any format kiln reads, several files or a folder) as one GGUF file,
// converted tensor by tensor, optionally re-quantised.
#pragma once

#include "args.h"

namespace kiln::cli {

int run_convert(const Options& options);

}  // namespace kiln::cli
