// Reference images (Flux.1-Kontext's -r) as sd-cli prepares them before the
// VAE encodes them: resized to about the output's area, at most 1024x1024,
// keeping their aspect ratio, with sd-cli's nearest-pixel resample
// (--disable-auto-resize-ref-image keeps their own size).
#pragma once

#include "image/image.h"

namespace kiln::pipeline {

struct ReferenceSize {
    int width = 0, height = 0;
};

// sd-cli's size for a ref_w x ref_h reference and an out_w x out_h output:
// area A = min(1024 * 1024, out_w * out_h); width sqrt(A * ref_w / ref_h)
// (the product and division in integers, as sd-cli), height width * ref_h /
// ref_w, each rounded to a multiple of `stride` (at least one stride, at
// most image::kMaxDimension).
ReferenceSize auto_reference_size(int ref_w, int ref_h, int out_w, int out_h, int stride);

// `image` at width x height by sd-cli's nearest rule: output pixel (x, y)
// is input pixel (x * in_w / width, y * in_h / height), in integers.
image::Image nearest_resized(const image::Image& image, int width, int height);

}  // namespace kiln::pipeline
