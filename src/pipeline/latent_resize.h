// Resizing a latent (planar [channels, h, w]) as PyTorch's
// F.interpolate does, for the hires fix's latent upscalers: A1111's
// "Latent" (bilinear, align_corners=False, no antialiasing),
// "Latent (nearest)" and "Latent (nearest-exact)".
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::pipeline {

// Nearest: torch's "nearest", source floor(i * in / out); NearestExact:
// "nearest-exact", source floor((i + 0.5) * in / out), the pixel whose area
// holds the output pixel's centre.
enum class LatentResize { Bilinear, Nearest, NearestExact };

// latent: planar [channels, h, w] -> planar [channels, out_h, out_w].
// Requires latent.size() == channels * w * h and every size >= 1.
std::vector<float> resize_latent(const std::vector<float>& latent, int64_t channels, int64_t w, int64_t h,
                                 int64_t out_w, int64_t out_h, LatentResize mode);

}  // namespace kiln::pipeline
