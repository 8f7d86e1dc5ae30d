// An image as the networks take it: planar RGB floats at a given size.
#pragma once

#include <vector>

#include "image/image.h"
#include "util/result.h"

namespace kiln::pipeline {

// The range of rgb_planes' values: the VAE's [-1, 1], or the ControlNet's [0, 1].
enum class PixelRange { Signed, Unit };

// `source` as planar RGB floats at width x height (resized when its size
// differs): ne [width, height, 3] in ggml's order.
Result<std::vector<float>> rgb_planes(const image::Image& source, int width, int height, PixelRange range);

}  // namespace kiln::pipeline
