// `kiln [-M img_gen] -p PROMPT ...`: text-to-image and image-to-image through
// the C API (include/kiln.h), with a progress line per step and the images
// written with their parameters.
#pragma once

#include "args.h"

namespace kiln::cli {

int run_generate(const Options& options);
// `kiln -M metadata -i IMAGE`: prints the parameters stored in the image.
int run_metadata(const Options& options);

}  // namespace kiln::cli
