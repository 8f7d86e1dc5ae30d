// Resampling of float planes as PyTorch's F.interpolate does it, for the
// networks whose original code resizes tensors rather than 8-bit images
// (Wan's CLIPModel.visual: mode='bicubic', align_corners=False).
#pragma once

#include <vector>

namespace kiln::image {

// `planes` (channel after channel, each height rows of width values) resized
// to out_width x out_height with torch's upsample_bicubic2d: Keys' cubic
// with a = -0.75, source position (x + 0.5) in / out - 0.5, the four taps
// clamped to the border, no antialiasing when shrinking (torch's default).
std::vector<float> resize_planes_bicubic(const std::vector<float>& planes, int channels, int width, int height,
                                         int out_width, int out_height);

}  // namespace kiln::image
