// ESRGAN upscaling from the command line, through the C API's kiln_upscaler:
// `kiln -M upscale -i IMAGE --upscale-model FILE [-o OUT]` for an existing
// image (its parameters text kept, the upscaler added), and the upscaler
// that `--upscale-model` runs on every generated image.
#pragma once

#include <memory>

#include "args.h"
#include "kiln.h"

namespace kiln::cli {

struct UpscalerDeleter {
    void operator()(kiln_upscaler* upscaler) const { kiln_upscaler_free(upscaler); }
};
using UpscalerPtr = std::unique_ptr<kiln_upscaler, UpscalerDeleter>;

// Loads options.upscale_model with options.upscale_tile_size; on failure
// logs the error, sets *exit_code and returns null.
UpscalerPtr load_upscaler(const Options& options, int* exit_code);

// Replaces `image` by its upscale (options.upscale_repeats times); on
// failure logs the error and returns the exit code (`image` unchanged).
int upscale_in_place(kiln_upscaler* upscaler, const Options& options, kiln_image& image);

int run_upscale(const Options& options);

}  // namespace kiln::cli
