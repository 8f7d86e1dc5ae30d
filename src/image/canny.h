// sd-cli's `--canny` preprocessor for ControlNet condition images
// (stable-diffusion.cpp's preprocessing.hpp, preprocess_canny with the
// constants sd-cli passes): the same edge image, so a ControlNet job given
// a photo and --canny conditions on what sd-cli's would.
//
// The steps, in float as sd-cli computes them: grey (0.2989 R + 0.5870 G +
// 0.1140 B of the [0, 1] samples); a 5x5 Gaussian blur (sigma 1.4, zero
// padding, the kernel not normalised); 3x3 Sobel gradients; the magnitude
// scaled to a maximum of 1; non-maximum suppression; a threshold at 8% of
// the largest value (strong, 1.0) and 8% of that (weak, 0.8); a 3-pixel
// black border; and one pass of hysteresis promoting weak pixels with a
// strong neighbour. sd-cli's quirks are kept on purpose: its suppression
// compares every direction below 157.5 degrees with the vertical
// neighbours, and its hysteresis looks at six of the eight neighbours.
#pragma once

#include "image/image.h"

namespace kiln::image {

// The edge image of an RGB or RGBA image (alpha ignored), RGB, same size:
// white edges on black.
Image canny_edges(const Image& image);

}  // namespace kiln::image
